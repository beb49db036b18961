"""BF16 x BF16 -> FP32 matrix multiply (``sbgemm``), kernel picked at run time.

Exports
-------
sbgemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False)
    ``C = alpha * op(A) @ op(B) + beta * C``, the semantics of OpenBLAS
    ``cblas_sbgemm`` (row-major, ``CblasRowMajor``).
sbgemm_fused(a, b, bias=None, residual=None, relu=False, out=None, alpha=1.0, trans_a=False, gelu=False)
    ``BF16(act(alpha * op(A) @ B + bias + residual))``: sbgemm with its
    post-ops applied per tile while the fp32 tile is in cache (oneDNN's
    "post-ops"), returning BF16; what a convolution layer with a folded
    batch norm, a ReLU and a ResNet shortcut needs, in one pass, or a
    transformer's first MLP layer (bias + GELU).
pack(b, trans_b=False) -> PackedB
    Reorder BF16 weights once (at model load) into the active kernel's panel
    layout, like a oneDNN weight reorder; ``sbgemm`` takes it as `b`.
PackedB
    The packed-weights object.
kernel_name() -> str
    The kernel in use: ``"avx512bf16"``, ``"avx512fma"``, ``"avx2fma"``,
    ``"bfmmla"`` or ``"fallback"``.
Bf16KernelError
    Raised when the native kernel returns an error code.

Module attributes: ``HW_KERNEL`` is the hardware kernel found by the C
detection (``"none"`` if there is none), ``NATIVE_KERNELS`` every native
kernel this CPU can run (``HW_KERNEL`` first, ``"generic"`` last),
``ENV_KERNEL`` the override variable.

Kernels
-------
The native module ``pycds.bf16._kernels`` (cffi, ``native/bf16/``) picks at
import time, with CPU feature detection in C:

* ``avx512bf16`` -- x86-64 with AVX512-BF16 (``__builtin_cpu_supports``):
  12x32 ``vdpbf16ps`` (Intel intrinsics guide ``_mm512_dpbf16_ps``)
  micro-kernel in a BLIS-style blocked driver, work split over pthreads.
* ``avx512fma`` / ``avx2fma`` -- x86-64 without BF16 instructions, with
  AVX-512F, or AVX2 and FMA: the same driver widens BF16 to fp32 while
  packing (packed weights stay BF16, half the bytes of fp32) and runs a
  12x32 zmm or 6x16 ymm fp32 FMA micro-kernel.
* ``bfmmla`` -- aarch64 with FEAT_BF16 (``getauxval(AT_HWCAP2) &
  HWCAP2_BF16``): 8x8 ``BFMMLA`` (Arm ACLE ``vbfmmlaq_f32``) micro-kernel in
  the same driver; tested under ``qemu-aarch64 -cpu max``.
* ``fallback`` -- anywhere: BF16 blocks widened to fp32 (exact) and
  multiplied by numpy's sgemm (OpenBLAS).  Products of two BF16 values are
  exact in fp32, so every kernel differs from exact arithmetic only by fp32
  summation error.

Set ``PYCDS_BF16_KERNEL=fallback`` in the environment (read at import) to
force the fallback on any machine; ``PYCDS_BF16_KERNEL=generic`` selects a
portable C micro-kernel in the native driver (slow; it lets the driver be
tested anywhere), and the name of any kernel in ``NATIVE_KERNELS`` selects
it (e.g. ``avx2fma`` on a CPU with AVX512-BF16, to test or time it).  The native module is required: if it
cannot be imported, importing this module fails.  cffi releases the GIL
during the native calls, so sbgemm runs concurrently with other Python
threads.  Details, error bound and benchmarks: ``docs/bf16.md``.
"""

import os
import struct
import warnings

import numpy as np

from pycds.bf16.convert import _is_bfloat16, _real_dtype, bf16_bits, to_bf16, to_float32

from pycds.bf16._native import ffi as _ffi, lib as _lib

__all__ = ["sbgemm", "sbgemm_fused", "pack", "PackedB", "kernel_name", "Bf16KernelError",
           "layer_norm_rows", "gelu_f32", "attention"]

ENV_KERNEL = "PYCDS_BF16_KERNEL"

_ACT_NONE, _ACT_RELU, _ACT_GELU = 0, 1, 2  # BF16K_ACT_* in bf16_kernels.h

# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (Eigen's generic_fast_erf_float),
# the coefficients of bf16_driver.c's erf_f32, highest power first.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)
_GELU_NEG_LIMIT = -16.0  # below: GELU is -0 in fp32

# Fallback blocking: fp32 blocks of B are kept <= _FB_BLOCK_BYTES so a
# converted block stays in L2 while sgemm consumes it.
_FB_KB = 512
_FB_BLOCK_BYTES = 1 << 21


class Bf16KernelError(RuntimeError):
    """A native BF16 kernel returned an error code."""


def _check(rc):
    # C functions return 0 or a negative BF16K_E_* code.
    if rc < 0:
        msg = _ffi.string(_lib.bf16k_strerror(int(rc))).decode()
        if rc == -1:
            raise MemoryError(f"pycds.bf16._kernels: {msg}")
        raise Bf16KernelError(f"pycds.bf16._kernels error {rc}: {msg}")
    return rc


def _native_params():
    # (name, NR, KU, layout id) of the selected native kernel, or None;
    # asked of C once per kernel (four C calls cost a small GEMM 1-2 us).
    name = _ffi.string(_lib.bf16k_kernel_name()).decode()
    got = _params_of.get(name)
    if got is None:
        p = _ffi.new("int[3]")
        if _lib.bf16k_kernel_params(p, p + 1, p + 2) != 0:
            return None
        got = _params_of[name] = (name, p[1], p[2], int(_lib.bf16k_packed_layout()))
    return got


_params_of = {}  # kernel name -> _native_params() (fixed per kernel)


# Hardware kernel found by the C detection ("none" if there is none), and
# every native kernel this CPU can run (HW_KERNEL first, "generic" last).
HW_KERNEL = _ffi.string(_lib.bf16k_kernel_name()).decode()
NATIVE_KERNELS = tuple(_ffi.string(_lib.bf16k_available_kernels()).decode().split())


def _as_bf16_bits(x, name):
    # -> ndarray of uint16 (2-D), without copying when possible.
    x = bf16_bits(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
    return x


class PackedB:
    """BF16 weights reordered once for the active ``sbgemm`` kernel.

    Build with :func:`pack`; do not construct directly.

    Attributes
    ----------
    k, n : int
        Shape of ``op(B)``: (K, N).
    layout : str
        Kernel the data was packed for: ``"fallback"`` (contiguous (K, N)
        uint16) or a native kernel name (panels of NR columns, k-units of KU).
    data : ndarray of uint16, shape (K, N) or (ceil(N/NR) * ceil(K/KU) * NR * KU,)
        The packed bit patterns.
    """

    __slots__ = ("k", "n", "layout", "data", "_nr", "_ku", "_layout_id")

    def __init__(self, k, n, layout, data, nr=0, ku=0, layout_id=-1):
        self.k = k
        self.n = n
        self.layout = layout
        self.data = data
        self._nr = nr
        self._ku = ku
        self._layout_id = layout_id

    @property
    def shape(self):
        """(K, N): the shape of ``op(B)`` this object stands for."""
        return (self.k, self.n)

    @property
    def nbytes(self):
        """Bytes held by the packed data."""
        return self.data.nbytes

    def __repr__(self):
        return f"PackedB(k={self.k}, n={self.n}, layout={self.layout!r})"

    def to_rowmajor(self):
        """Return op(B) as ndarray of uint16, shape (K, N), C-contiguous."""
        if self.layout == "fallback":
            return self.data
        k, n, nr, ku = self.k, self.n, self._nr, self._ku
        kunits = -(-k // ku)
        panels = -(-n // nr)
        d = self.data.reshape(panels, kunits, nr, ku)
        d = d.transpose(1, 3, 0, 2).reshape(kunits * ku, panels * nr)
        return np.ascontiguousarray(d[:k, :n])  # (K, N)


def _initial_kernel():
    want = os.environ.get(ENV_KERNEL, "").strip().lower()
    if want in NATIVE_KERNELS:
        _check(_lib.bf16k_select_kernel(want.encode()))
        return want
    auto = HW_KERNEL if HW_KERNEL != "none" else "fallback"
    if want not in ("", "auto", "fallback"):
        choices = ", ".join(repr(c) for c in ("auto", "fallback") + NATIVE_KERNELS)
        warnings.warn(
            f"{ENV_KERNEL}={want!r} is not available here (choices: "
            f"{choices}); using {auto!r}",
            RuntimeWarning,
            stacklevel=2,
        )
    return "fallback" if want == "fallback" else auto


_kernel = _initial_kernel()


def _set_num_threads(n):
    # Worker threads of the native kernel (n <= 0: online CPUs); returns it.
    return int(_lib.bf16k_set_num_threads(int(n)))


def _select_kernel(name):
    # Testing hook: switch kernels in-process (not while another thread is
    # in sbgemm); returns the previous name.
    global _kernel
    if name != "fallback" and name not in NATIVE_KERNELS:
        raise ValueError(
            f"kernel must be one of {('fallback',) + NATIVE_KERNELS}, "
            f"got {name!r}"
        )
    if name != "fallback":
        _check(_lib.bf16k_select_kernel(name.encode()))
    prev, _kernel = _kernel, name
    return prev


def kernel_name():
    """Name of the active kernel.

    Returns
    -------
    str
        ``"avx512bf16"``, ``"avx512fma"``, ``"avx2fma"``, ``"bfmmla"`` or
        ``"fallback"`` (or ``"generic"``, the portable C kernel, when
        selected for testing).
    """
    return _kernel


def pack(b, trans_b=False):
    """Reorder BF16 weights once into the active kernel's layout.

    Parameters
    ----------
    b : ndarray of uint16 or ml_dtypes.bfloat16, shape (K, N), or (N, K) if `trans_b`
        BF16 bit patterns.
    trans_b : bool
        If True, `b` is stored transposed (e.g. a PyTorch ``Linear.weight`` of
        shape (out_features, in_features)) and ``op(B) = b.T``.

    Returns
    -------
    PackedB
        Stands for op(B) of shape (K, N).

    Raises
    ------
    ValueError
        If `b` is not 2-D or not BF16.
    """
    b = _as_bf16_bits(b, "b")
    if _kernel == "fallback":
        op_b = b.T if trans_b else b  # (K, N)
        return PackedB(op_b.shape[0], op_b.shape[1], "fallback",
                       np.array(op_b, dtype=np.uint16, order="C"))  # a copy
    return _native_pack(b, trans_b)


def _native_pack(b, trans_b):
    # b: stored (K, N) or (N, K) uint16 -> PackedB for the selected kernel.
    name, nr, ku, layout_id = _native_params()
    b = np.ascontiguousarray(b)
    ld = b.shape[1]
    k, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    rs, cs = (1, ld) if trans_b else (ld, 1)  # op(B)[kk, j] = b[kk*rs + j*cs]
    length = _check(_lib.bf16k_packed_b_len(k, n))
    data = np.empty(length, dtype=np.uint16)  # panels * kunits * NR * KU
    _check(_lib.bf16k_pack_b(
        _ffi.cast("const uint16_t *", _ffi.from_buffer(b)), k, n, rs, cs,
        _ffi.cast("uint16_t *", _ffi.from_buffer(data, require_writable=True)),
        length))
    return PackedB(k, n, name, data, nr, ku, layout_id)


def _check_args(a, b, c, trans_a, trans_b, f32_a=False):
    # f32_a: a float32 `a` is taken as is (sbgemm rounds it), else BF16 bits.
    if f32_a:
        a = np.asarray(a)
        if a.dtype != np.float32 and a.dtype != np.uint16 and not _is_bfloat16(a.dtype):
            raise ValueError("a must hold BF16 (uint16 bit patterns or "
                             "ml_dtypes.bfloat16) or float32, got dtype "
                             f"{a.dtype}")
    if f32_a and a.dtype == np.float32:
        if a.ndim != 2:
            raise ValueError(f"a must be 2-D, got shape {a.shape}")
    else:
        a = _as_bf16_bits(a, "a")
    op_a = a.T if trans_a else a  # (M, K)
    m, k = op_a.shape
    if isinstance(b, PackedB):
        if trans_b:
            raise ValueError("trans_b must be False when b is a PackedB "
                             "(transposition is fixed at pack time)")
        kb, n = b.k, b.n
    else:
        b = _as_bf16_bits(b, "b")
        kb, n = b.T.shape if trans_b else b.shape
    if kb != k:
        raise ValueError(
            f"inner dimensions differ: op(a) is {m}x{k}, op(b) is {kb}x{n}"
        )
    if c is not None:
        if not isinstance(c, np.ndarray) or c.dtype != np.float32:
            raise ValueError(
                f"c must be an ndarray of float32, got "
                f"{getattr(c, 'dtype', type(c).__name__)}"
            )
        if not c.flags.writeable:
            raise ValueError("c must be writeable")
        if c.shape != (m, n):
            raise ValueError(f"c must have shape {(m, n)}, got {c.shape}")
    return op_a, b, m, n, k


def sbgemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False):
    """Return C = alpha*op(A)@op(B) + beta*C: BF16 inputs, fp32 accumulation.

    Follows the OpenBLAS ``cblas_sbgemm`` interface (row-major): inputs are
    BF16, accumulation and output are fp32.

    Parameters
    ----------
    a : ndarray of uint16, ml_dtypes.bfloat16 or float32, shape (M, K), or (K, M) if `trans_a`
        BF16 bit patterns, or float32 values rounded to BF16 inside the call
        (nearest even, as :func:`pycds.bf16.convert.to_bf16`; the result is
        bit for bit that of ``sbgemm(to_bf16(a), ...)``).  The FMA kernels
        round float32 A while they pack it, in one pass (no BF16 copy); the
        others convert it first.
    b : ndarray of uint16 or ml_dtypes.bfloat16, shape (K, N), or (N, K) if `trans_b`; or PackedB
        BF16 bit patterns, or weights from :func:`pack`.
    c : ndarray of float32, shape (M, N), optional
        Output; updated in place when given (any strides).  If None a new
        array is returned and `beta` is ignored.
    alpha, beta : float
        Scalars (converted to fp32 first: an alpha that underflows fp32 is
        0).  With ``beta == 0`` `c` is not read, so NaN/inf in it do not
        propagate.  With ``alpha == 0`` or ``K == 0`` the result is
        ``beta * C`` (zeros if ``beta == 0``) and the values of `a` and `b`
        are not used, so inf/NaN in them (or a NaN `alpha` with ``K == 0``)
        do not propagate.
        Both are the BLAS convention: the reference BLAS ``sgemm``'s quick
        return, which OpenBLAS's level-3 driver behind ``cblas_sbgemm``
        follows.
    trans_a, trans_b : bool
        Use the transpose of `a` / `b`.

    Returns
    -------
    ndarray of float32, shape (M, N)
        `c` itself when given, else a new C-contiguous array.

    Raises
    ------
    ValueError
        On bad dtype, rank or shape (the message gives got vs expected), a
        read-only `c`, or `trans_b` with a PackedB.
    Bf16KernelError
        If the native kernel reports an error (e.g. out of memory).

    Notes
    -----
    Error bound: the BF16 inputs are exact and every product ``a_ik*b_kj``
    is exact in fp32 (8 + 8 significand bits <= 24), so the only error is
    fp32 summation: ``|C - C_exact| <= gamma_n * (|alpha| * sum_k |a_ik b_kj|
    + |beta c_ij|)`` with ``gamma_n = n*u/(1 - n*u)``, ``u = 2**-24``,
    ``n <= 2K + 4`` for every kernel here.  The AVX512-BF16 and BFMMLA
    instructions flush BF16 subnormal inputs and fp32 subnormal results to
    zero (Intel SDM ``VDPBF16PS``), which adds an absolute error below
    ``K * 2**-126 * max|operand|``; the FMA kernels keep subnormals.
    """
    op_a, b, m, n, k = _check_args(a, b, c, trans_a, trans_b, f32_a=True)
    alpha = _fp32(alpha)
    beta = _fp32(beta)
    out = c if c is not None else np.empty((m, n), dtype=np.float32)
    if c is None:
        beta = 0.0
    f32_a = op_a.dtype == np.float32
    if _kernel == "fallback":
        if f32_a:
            op_a = to_bf16(op_a)
        _fallback(op_a, b, out, m, n, k, alpha, beta, trans_b)
        return out
    a_st, a_rs, a_cs, b = _native_operands(op_a, b, trans_a, trans_b)
    direct = out.flags.c_contiguous
    dst = out if direct else np.ascontiguousarray(out)  # (M, N)
    run, a_type = ((_lib.bf16k_sbgemm_f32a, "const float *") if f32_a else
                   (_lib.bf16k_sbgemm_packed, "const uint16_t *"))
    _check(run(
        m, n, k, alpha,
        _ffi.cast(a_type, _ffi.from_buffer(a_st)), a_rs, a_cs,
        _ffi.cast("const uint16_t *", _ffi.from_buffer(b.data)), b.data.size,
        b._layout_id, beta,
        _ffi.cast("float *", _ffi.from_buffer(dst, require_writable=True)), n))
    if not direct:
        out[...] = dst
    return out


def _fp32(x):
    # A scalar rounded to fp32 (what the kernels use), as a Python float.
    # struct's "f" is C's (float) cast, the rounding of np.float32(x); it
    # refuses what overflows, which numpy (errstate: about 2 us) makes inf.
    x = float(x)
    try:
        return _F32_STRUCT.unpack(_F32_STRUCT.pack(x))[0]
    except OverflowError:
        with np.errstate(over="ignore"):
            return float(np.float32(x))


_F32_STRUCT = struct.Struct("f")


def sbgemm_fused(a, b, bias=None, residual=None, relu=False, out=None, alpha=1.0,
                 trans_a=False, gelu=False):
    """``out = BF16(act(alpha * op(A) @ B + bias + residual))``, in one pass.

    sbgemm (BF16 inputs, fp32 accumulation) whose post-ops run on each
    fp32 tile of the product while it is in cache, as oneDNN's matmul
    post-ops do: add the bias row, add a BF16 residual, GELU (fp32), round
    to BF16 (round-to-nearest-even, as :func:`pycds.bf16.convert.to_bf16`),
    ReLU.
    No fp32 result is ever written to memory, which is what makes a
    network of BF16 activations cheaper than rounding fp32 activations
    between layers.

    Parameters
    ----------
    a : ndarray of BF16 (uint16 bits or ``ml_dtypes.bfloat16``), shape (M, K) (or (K, M) with `trans_a`)
    b : PackedB, or ndarray of BF16, shape (K, N)
        Weights; packed with :func:`pack` once for repeated use.
    bias : ndarray of float32, shape (N,), optional
        Added in fp32 to every row (BF16, uint16 bits or ml_dtypes, is
        widened exactly; other real dtypes are cast; no broadcasting).
    residual : ndarray of uint16 (BF16 bits), shape (M, N), optional
        Added in fp32 (a ResNet shortcut).  May be `out` itself.  Unit
        column stride, any row stride.
    relu : bool
        ReLU on the rounded value: negative results, -0 and NaNs with the
        sign bit become +0 (as :func:`pycds.bf16.functional.relu_bf16`).
    out : ndarray of uint16, shape (M, N), C-contiguous rows, optional
        Written with the result (rows may be a strided slice of a wider
        array: row stride ``out.strides[0]``).  Rows that are reversed or
        overlap (row stride below N, e.g. ``x[::-1]``) go through a
        temporary copy, with the same result.
    alpha : float
        Scale of the product (converted to fp32).  ``alpha == 0`` or
        ``K == 0``: the post-ops of a zero product, the values of `a` and
        `b` not used (as :func:`sbgemm`).
    gelu : bool
        GELU on the fp32 sum before rounding, the exact form
        ``0.5 v (1 + erf(v / sqrt(2)))`` (Hendrycks & Gimpel 2016; BERT's
        ``hidden_act="gelu"``), with erf from a rational approximation
        (absolute error <= 5e-7; :func:`gelu_f32` does the same steps in numpy).

    Returns
    -------
    ndarray of uint16, shape (M, N)
        BF16 bit patterns (`out` if given).

    Raises
    ------
    ValueError
        On shape or dtype mismatch (message gives got vs expected; `bias`
        not real numbers, such as complex), or if `out` / `residual` do not
        have unit column stride, or `out` is read-only, or both `relu` and
        `gelu` are set.
    Bf16KernelError
        If the native kernel reports an error (e.g. out of memory).

    Notes
    -----
    Error: that of :func:`sbgemm` for the fp32 value, then one BF16
    rounding (relative error <= 2**-9).  The additions happen in fp32 in the
    order ``(alpha * AB + bias) + residual``.
    """
    if relu and gelu:
        raise ValueError("relu and gelu are exclusive: pass at most one")
    act = _ACT_RELU if relu else (_ACT_GELU if gelu else _ACT_NONE)
    op_a, b, m, n, k = _check_args(a, b, None, trans_a, False)
    bias = _check_bias(bias, n)
    if bias is not None:
        bias = np.ascontiguousarray(bias)
    res = None
    if residual is not None:
        res = _as_bf16_bits(residual, "residual")
        if res.shape != (m, n) or (m and n and (res.strides[1] != 2 or res.strides[0] % 2)):
            raise ValueError(f"residual must be BF16 of shape ({m}, {n}) with unit column "
                             f"stride, got {res.dtype} {res.shape}")
    if out is None:
        out = np.empty((m, n), dtype=np.uint16)
    elif out.dtype != np.uint16 or out.shape != (m, n) or \
            (m and n and (out.strides[1] != 2 or out.strides[0] % 2)) or not out.flags.writeable:
        raise ValueError(f"out must be writable uint16 of shape ({m}, {n}) with unit column "
                         f"stride, got {out.dtype} {out.shape}")
    alpha = _fp32(alpha)
    if m == 0 or n == 0:
        return out
    # The C side takes rows `ld` >= n elements apart: reversed or overlapping
    # rows go through a copy (the residual is read before `out` is written,
    # so a residual that is `out` itself is still right).
    if res is not None and not _rows_apart(res):
        res = np.ascontiguousarray(res)  # (M, N)
    dst = out if _rows_apart(out) else np.empty((m, n), dtype=np.uint16)
    ldo = dst.strides[0] // 2 if m > 1 else n
    ldr = (res.strides[0] // 2 if m > 1 else n) if res is not None else 0
    bias_p = _ffi.cast("const float *", _ffi.from_buffer(bias)) if bias is not None else _ffi.NULL
    res_p = (_ffi.cast("const uint16_t *", _ffi.from_buffer(_base_view(res)))
             if res is not None else _ffi.NULL)
    dst_p = _ffi.cast("uint16_t *", _ffi.from_buffer(_base_view(dst), require_writable=True))
    if _kernel == "fallback":
        # numpy's fp32 product, then the native kernels' own epilogue.
        acc = np.empty((m, n), dtype=np.float32)  # (M, N)
        _fallback(op_a, b, acc, m, n, k, alpha, 0.0, False)
        _check(_lib.bf16k_postops(m, n, _ffi.cast("const float *", _ffi.from_buffer(acc)), n,
                                  bias_p, res_p, ldr, act, dst_p, ldo))
    else:
        a_st, a_rs, a_cs, b = _native_operands(op_a, b, trans_a, False)
        _check(_lib.bf16k_sbgemm_fused(
            m, n, k, alpha,
            _ffi.cast("const uint16_t *", _ffi.from_buffer(a_st)), a_rs, a_cs,
            _ffi.cast("const uint16_t *", _ffi.from_buffer(b.data)), b.data.size, b._layout_id,
            bias_p, res_p, ldr, act, dst_p, ldo))
    if dst is not out:
        out[...] = dst
    return out


def _check_bias(bias, n):
    # None, or a real array of shape (n,) -> None or (n,) float32 (a copy
    # only when it is not float32 already).  No broadcasting.  uint16 is
    # BF16 bits, as everywhere in pycds.bf16 (widened exactly).  The check of
    # sbgemm_fused and of pycds.bf16.functional's convolutions and linear.
    if bias is None:
        return None
    b = np.asarray(bias)
    if not _real_dtype(b.dtype):
        raise ValueError(f"bias must be real (float), got dtype {b.dtype}")
    if b.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {b.shape}")
    if b.dtype == np.uint16 or _is_bfloat16(b.dtype):
        return to_float32(b)
    return np.asarray(b, dtype=np.float32)


def gelu_f32(v):
    """Exact-form GELU of float32 `v`, the operations of the native post-op.

    ``0.5 * v * (1 + erf(v / sqrt(2)))`` in fp32, erf from the rational
    approximation above (x clamped to [-4, 4]); values below -16 give -0
    (as the native code: -inf too), NaN stays NaN.  Returns a new float32
    array of `v`'s shape.  Each step rounds to fp32 in the C code's order,
    so the result matches the native one (up to the last bit of erf's
    division).
    """
    v = np.asarray(v, dtype=np.float32)
    f = np.float32
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.clip(v * f(0.70710678118654752), f(-4.0), f(4.0))  # NaN stays NaN
        x2 = x * x
        p = np.full_like(x2, f(_ERF_P[0]))
        for c in _ERF_P[1:]:
            p = p * x2 + f(c)
        q = np.full_like(x2, f(_ERF_Q[0]))
        for c in _ERF_Q[1:]:
            q = q * x2 + f(c)
        g = (f(0.5) * v) * (f(1.0) + (x * p) / q)
    g[v < f(_GELU_NEG_LIMIT)] = f(-0.0)
    return g


def _rows_apart(x):
    # True if the rows of 2-D uint16 `x` (unit column stride) are at least a
    # row's length apart, in increasing order: what the C side's `ld` takes.
    m, n = x.shape
    return m <= 1 or x.strides[0] >= 2 * n


def _base_view(x):
    # A 1-D view of the memory of 2-D `x` (rows possibly strided) from its
    # first element to its last, for cffi (which wants a contiguous buffer).
    m, n = x.shape
    span = (m - 1) * (x.strides[0] // x.itemsize) + n if m and n else 0
    return np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(x.itemsize,))


def _native_operands(op_a, b, trans_a, trans_b):
    """Return (a_st, a_rs, a_cs, bp): A and B as the native kernels take them.

    A and B as the native kernels take them: ``(a_st, a_rs, a_cs, bp)``
    with op(A)[i, kk] = a_st[i*a_rs + kk*a_cs] (`a_st` C-contiguous: the
    stored A, transposed back when `trans_a`) and `bp` a PackedB for the
    active kernel (packed now if `b` is not, or was packed for another)."""
    if isinstance(b, PackedB) and b.layout != _kernel:
        b = _native_pack(b.to_rowmajor(), False)
    elif not isinstance(b, PackedB):
        b = _native_pack(b, trans_b)
    a_st = np.ascontiguousarray(op_a.T if trans_a else op_a)  # stored (M, K) or (K, M)
    lda = a_st.shape[1]
    a_rs, a_cs = (1, lda) if trans_a else (lda, 1)
    return a_st, a_rs, a_cs, b


def _fallback(op_a, b, out, m, n, k, alpha, beta, trans_b):
    # op_a: (M, K) uint16 view; b: PackedB or uint16 array; out: (M, N) fp32.
    if k == 0 or alpha == 0.0:
        # BLAS quick return (see sbgemm): C := beta*C, A and B not read.
        if beta == 0.0:
            out[...] = 0.0
        else:
            out *= np.float32(beta)
        return out
    if isinstance(b, PackedB):
        op_b = b.to_rowmajor()  # (K, N)
    else:
        op_b = b.T if trans_b else b  # (K, N)
    acc = np.zeros((m, n), dtype=np.float32)  # (M, N)
    if k > 0 and n > 0 and m > 0:
        kb = _FB_KB
        nb = max(64, _FB_BLOCK_BYTES // (4 * kb))
        for k0 in range(0, k, kb):
            k1 = min(k, k0 + kb)
            a_blk = to_float32(op_a[:, k0:k1])  # (M, kb)
            for n0 in range(0, n, nb):
                n1 = min(n, n0 + nb)
                b_blk = to_float32(op_b[k0:k1, n0:n1])  # (kb, nb)
                acc[:, n0:n1] += a_blk @ b_blk
    if alpha != 1.0:
        acc *= np.float32(alpha)
    if beta == 0.0:
        out[...] = acc
    else:
        out *= np.float32(beta)
        out += acc
    return out


def layer_norm_rows(x, gamma, beta, eps, bias=None, out=None, out_bf16=None):
    """LayerNorm each row of fp32 `x` plus `bias`, in one native pass.

    ``y = (v - mean(v)) / sqrt(var(v) + eps) * gamma + beta`` with
    ``v = x + bias`` and the biased variance, per row, as
    ``torch.nn.LayerNorm`` over the last dimension (Ba et al. 2016).  With
    a GEMM that accumulated the residual into `x` (``sbgemm(..., c=x,
    beta=1)``) this is a transformer's "bias + residual + LayerNorm", and
    the BF16 copy feeds the next GEMM without another pass.

    Parameters
    ----------
    x : ndarray of float32, shape (M, N), unit column stride
    gamma, beta : ndarray of float32, shape (N,)
    eps : float
        Added to the variance (BERT: 1e-12).
    bias : ndarray of float32, shape (N,), optional
    out : ndarray of float32, shape (M, N), unit column stride, optional
        fp32 result; may be `x` itself (in place).  None: not written
        unless `out_bf16` is None too (then a new array).
    out_bf16 : ndarray of uint16, shape (M, N), unit column stride, optional
        BF16 bits of the result (round to nearest even).

    Returns
    -------
    (ndarray of float32 or None, ndarray of uint16 or None)
        `out` and `out_bf16`.

    Raises
    ------
    ValueError
        On dtype, shape or stride mismatch (got vs expected), or N == 0.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2:
        raise ValueError(f"x must be a 2-D float32 ndarray, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {np.shape(x)}")
    m, n = x.shape
    if n == 0:
        raise ValueError("x must have at least one column")
    vecs = [np.ascontiguousarray(v, dtype=np.float32) if v is not None else None
            for v in (gamma, beta, bias)]
    for name, v in zip(("gamma", "beta", "bias"), vecs):
        if v is not None and v.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {v.shape}")
    if out is None and out_bf16 is None:
        out = np.empty((m, n), dtype=np.float32)
    for name, arr, dt in (("x", x, np.float32), ("out", out, np.float32),
                          ("out_bf16", out_bf16, np.uint16)):
        if arr is None:
            continue
        ok = (arr.dtype == dt and arr.shape == (m, n)
              and (m == 0 or (arr.strides[1] == arr.itemsize
                              and arr.strides[0] >= n * arr.itemsize
                              and arr.strides[0] % arr.itemsize == 0)))
        if not ok or (name != "x" and not arr.flags.writeable):
            raise ValueError(f"{name} must be {'writable ' if name != 'x' else ''}"
                             f"{np.dtype(dt).name} of shape ({m}, {n}) with unit column "
                             f"stride and increasing rows, got {arr.dtype} {arr.shape}")
    if m == 0:
        return out, out_bf16

    def ptr(arr, ctype, writable=False):
        if arr is None:
            return _ffi.NULL
        buf = _base_view(arr) if arr.ndim == 2 else arr
        return _ffi.cast(ctype, _ffi.from_buffer(buf, require_writable=writable))

    def ld(arr):
        return arr.strides[0] // arr.itemsize if arr is not None and m > 1 else n

    g, bt, bs = vecs
    _check(_lib.bf16k_layernorm(
        ptr(x, "const float *"), m, n, ld(x), ptr(bs, "const float *"),
        ptr(g, "const float *"), ptr(bt, "const float *"), float(eps),
        ptr(out, "float *", True), ld(out), ptr(out_bf16, "uint16_t *", True), ld(out_bf16)))
    return out, out_bf16


def attention(qkv, batch, num_heads, key_bias, scale=None, out=None):
    """Multi-head scaled dot-product attention from packed BF16 Q, K, V.

    ``softmax(Q_h K_h^T * scale + key_bias) V_h`` for every sequence and
    head h (Vaswani et al. 2017, "Attention Is All You Need").  With a
    native kernel, both products run on the sbgemm micro-kernel (BF16
    products, fp32 sums), the softmax in fp32 (row maximum subtracted), and
    the probabilities are rounded to BF16 before the product with V, as
    PyTorch's BF16 attention does; with the ``fallback`` kernel, portable C
    in fp32 throughout.  One native call; the (sequence, head) pairs run on
    the sbgemm worker threads.

    Parameters
    ----------
    qkv : ndarray of uint16 (BF16 bits), shape (B*T, 3*H), unit column stride
        Row ``b*T + t``: Q, K and V of token t of sequence b side by side,
        each H = num_heads * d values, head h at ``[h*d, (h+1)*d)``
        (what one GEMM against ``[Wq; Wk; Wv]`` gives).
    batch : int
        B.
    num_heads : int
    key_bias : ndarray of float32, shape (B, T)
        Added to every score of key t: 0, or a large negative number (-1e30)
        for padding (its softmax weight is then exactly 0).
    scale : float, optional
        Default ``1/sqrt(d)``.
    out : ndarray of uint16, shape (B*T, H), unit column stride, optional

    Returns
    -------
    ndarray of uint16, shape (B*T, H)
        The context, BF16 bits, heads side by side (`out` if given).

    Raises
    ------
    ValueError
        On dtype or shape mismatch (got vs expected).
    """
    qkv = _as_bf16_bits(qkv, "qkv")
    rows, three_h = qkv.shape
    if batch < 0 or (batch == 0 and rows) or (batch and rows % batch) or num_heads <= 0 \
            or three_h % (3 * num_heads):
        raise ValueError(f"qkv of shape {qkv.shape} is not (batch*T, 3*H) for batch={batch}, "
                         f"num_heads={num_heads}")
    t = rows // batch if batch else 0
    h = three_h // 3
    d = h // num_heads
    kb = np.ascontiguousarray(key_bias, dtype=np.float32)
    if kb.shape != (batch, t):
        raise ValueError(f"key_bias must have shape ({batch}, {t}), got {kb.shape}")
    if out is None:
        out = np.empty((rows, h), np.uint16)
    elif (out.dtype != np.uint16 or out.shape != (rows, h) or not out.flags.writeable
          or (rows > 1 and (out.strides[1] != 2 or out.strides[0] < 2 * h))):
        raise ValueError(f"out must be writable uint16 of shape ({rows}, {h}) with unit column "
                         f"stride, got {out.dtype} {out.shape}")
    if rows == 0:
        return out
    if qkv.strides[1] != 2 or (rows > 1 and qkv.strides[0] < 2 * three_h):
        qkv = np.ascontiguousarray(qkv)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    ldq = qkv.strides[0] // 2 if rows > 1 else three_h
    ldc = out.strides[0] // 2 if rows > 1 else h
    _check(_lib.bf16k_attention(
        _ffi.cast("const uint16_t *", _ffi.from_buffer(_base_view(qkv))), ldq, batch, t,
        num_heads, d, _ffi.cast("const float *", _ffi.from_buffer(kb)), _fp32(scale),
        int(_kernel != "fallback"), _ffi.cast("uint16_t *", _ffi.from_buffer(_base_view(out), require_writable=True)), ldc))
    return out
