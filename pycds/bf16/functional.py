"""NumPy CNN inference operators: BF16 convolution and linear, fp32 elsewhere.

Exports
-------
conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", residual=None)
    2-D convolution (cross-correlation, as PyTorch) by im2col + ``sbgemm``.
conv2d_bf16(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, residual=None, relu=False)
    The same on BF16 NHWC activations, returning BF16 NHWC: bias, a BF16
    shortcut and the ReLU applied inside the GEMM (``sbgemm_fused``).
pack_conv_weight(w, groups=1) -> PackedConv
    Reorder and pack a convolution weight once, at model load.
linear(x, w, bias=None)
    ``x @ w.T + bias`` by ``sbgemm``.
pack_linear_weight(w) -> PackedB
relu, max_pool2d, avg_pool2d, adaptive_avg_pool2d, batch_norm, softmax, flatten
    fp32 operators.
relu_bf16(b)
    ReLU on BF16 bit patterns (used between convolutions).
fold_batch_norm(conv_w, conv_b, gamma, beta, mean, var, eps=1e-5) -> (w, b)
    Fold an inference-mode batch norm into the preceding convolution.
as_bf16(a), as_float32(a)
    Coerce float32 / BF16 (uint16 bits or ``ml_dtypes.bfloat16``) arrays.

Numerics: convolution and linear inputs (activations and weights) are
rounded to BF16 (8-bit significand, round to nearest even); products are
exact in fp32 and summed in fp32 by ``sbgemm``.  Biases, batch-norm
parameters, pooling and softmax stay fp32, as in llm.c's mixed precision.

Layouts: every spatial operator takes ``layout="NCHW"`` (PyTorch's, the
default) or ``"NHWC"``.  The convolution itself always runs NHWC: its
im2col copies runs of ``C`` contiguous channels, a 1x1 convolution needs no
im2col copy at all, and the GEMM result ``(N*OH*OW, K)`` *is* the NHWC
output.  NCHW calls transpose at the edges; the models in
:mod:`pycds.bf16.models` run NHWC end to end and transpose only their input.
"""

import numpy as np

from pycds.bf16.convert import to_bf16, to_float32
from pycds.bf16.gemm import PackedB, _check_bias, pack, sbgemm, sbgemm_fused
from pycds.bf16.im2col import LAYOUTS, _pair, conv_output_size, im2col, pad2d

__all__ = [
    "conv2d",
    "pack_conv_weight",
    "PackedConv",
    "linear",
    "pack_linear_weight",
    "relu",
    "relu_bf16",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "batch_norm",
    "fold_batch_norm",
    "softmax",
    "flatten",
    "as_bf16",
    "as_float32",
    "to_nhwc",
    "to_nchw",
]


# --------------------------------------------------------------------------
# dtype and layout helpers


def _is_bf16(a):
    return a.dtype == np.uint16 or a.dtype.name == "bfloat16"


def as_bf16(a):
    """Return `a` as BF16 bit patterns.

    Parameters
    ----------
    a : array_like of float32/float64/float16, uint16 (BF16 bits) or ml_dtypes.bfloat16, any shape

    Returns
    -------
    ndarray of uint16, shape ``a.shape``
        BF16 bits: floats rounded to nearest even; BF16 input returned as its
        bits without copying.
    """
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return a
    if a.dtype.name == "bfloat16":
        return a.view(np.uint16)
    return to_bf16(a)


def as_float32(a):
    """Return `a` as float32, widening BF16 (uint16 or ml_dtypes) exactly.

    Parameters
    ----------
    a : array_like of float or BF16, any shape

    Returns
    -------
    ndarray of float32, shape ``a.shape``
    """
    a = np.asarray(a)
    if _is_bf16(a):
        return to_float32(a)
    return np.asarray(a, dtype=np.float32)


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def to_nhwc(x):
    """NCHW -> NHWC view.

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W)

    Returns
    -------
    ndarray, shape (N, H, W, C)
        A transposed view (no copy).
    """
    return x.transpose(0, 2, 3, 1)


def to_nchw(x):
    """NHWC -> NCHW view.

    Parameters
    ----------
    x : ndarray, shape (N, H, W, C)

    Returns
    -------
    ndarray, shape (N, C, H, W)
        A transposed view (no copy).
    """
    return x.transpose(0, 3, 1, 2)


def _check4d(x, name="x", layout="NCHW"):
    if x.ndim != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {x.shape}")


# --------------------------------------------------------------------------
# convolution


class PackedConv:
    """A convolution weight in BF16, reordered and packed for ``sbgemm``.

    Build with :func:`pack_conv_weight` once, at model load.

    Attributes
    ----------
    out_channels : int
        ``K``.
    in_channels : int
        ``C`` (all groups).
    kernel_size : (int, int)
        ``(KH, KW)``.
    groups : int
    packed : list of PackedB
        One per group; group ``g`` stands for op(B) of shape
        ``(KH*KW*C/groups, K/groups)`` with rows ordered ``(KH, KW, C/groups)``
        (the NHWC im2col column order).
    """

    __slots__ = ("out_channels", "in_channels", "kernel_size", "groups", "packed")

    def __init__(self, out_channels, in_channels, kernel_size, groups, packed):
        self.out_channels = out_channels
        self.in_channels = in_channels
        self.kernel_size = kernel_size
        self.groups = groups
        self.packed = packed

    @property
    def shape(self):
        """``(K, C/groups, KH, KW)``, the PyTorch weight shape."""
        return (self.out_channels, self.in_channels // self.groups) + tuple(self.kernel_size)

    def __repr__(self):
        return f"PackedConv(shape={self.shape}, groups={self.groups})"


def pack_conv_weight(w, groups=1):
    """Round a conv weight to BF16, reorder it for NHWC im2col and pack it.

    Parameters
    ----------
    w : ndarray of float32 or BF16 (uint16 bits / ml_dtypes.bfloat16), shape (K, C/groups, KH, KW)
        PyTorch ``Conv2d.weight`` layout.  Float input is rounded to BF16.
    groups : int
        ``K`` must be divisible by `groups`.

    Returns
    -------
    PackedConv
        ``groups`` PackedB panels, each op(B) of shape (KH*KW*C/groups, K/groups).

    Raises
    ------
    ValueError
        If `w` is not 4-D or `K` is not divisible by `groups`.
    """
    w = np.asarray(w)
    if w.ndim != 4:
        raise ValueError(f"w must be 4-D (K, C/groups, KH, KW), got shape {w.shape}")
    K, Cg, KH, KW = w.shape
    if groups < 1 or K % groups:
        raise ValueError(f"out channels K={K} must be divisible by groups={groups}")
    wb = as_bf16(w).transpose(0, 2, 3, 1).reshape(K, KH * KW * Cg)  # (K, KH*KW*Cg)
    Kg = K // groups
    packed = [pack(wb[g * Kg:(g + 1) * Kg], trans_b=True) for g in range(groups)]
    return PackedConv(K, Cg * groups, (KH, KW), groups, packed)


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", residual=None):
    """2-D convolution with BF16 inputs and fp32 accumulation.

    Computes, like ``torch.nn.functional.conv2d`` (cross-correlation),
    ``out[n, k, oh, ow] = bias[k] + sum_{c, i, j} x[n, g*C/G + c, oh*SH - PH + i*DH,
    ow*SW - PW + j*DW] * w[k, c, i, j]`` with ``g = k // (K/G)``.

    Parameters
    ----------
    x : ndarray of float32 (or BF16), shape (N, C, H, W), or (N, H, W, C) if ``layout="NHWC"``
        Activations; rounded to BF16 (nearest even) before the product.
        BF16 input (uint16 bits or ``ml_dtypes.bfloat16``) is used as is.
    w : ndarray of float32 or BF16, shape (K, C/groups, KH, KW); or PackedConv
        Weights (PyTorch layout).  Pass a :class:`PackedConv` from
        :func:`pack_conv_weight` to skip the per-call reorder and packing.
    bias : ndarray of float32, shape (K,), optional
        Added in fp32 (BF16, uint16 bits or ml_dtypes, is widened exactly;
        other real dtypes are cast; no broadcasting).
    stride, padding, dilation : int or (int, int)
        ``(SH, SW)``, ``(PH, PW)`` (zeros), ``(DH, DW)``.
    groups : int
        ``G``; C and K must be divisible by it.  Must equal ``w.groups`` for
        a PackedConv.
    layout : {"NCHW", "NHWC"}
        Layout of `x` and of the result.
    residual : ndarray of float32, shape of the result, optional
        Added to the result (a ResNet shortcut), through ``sbgemm``'s
        ``beta = 1`` when it is C-contiguous in `layout`'s NHWC order; it is
        then **overwritten** with the result and returned (like BLAS's C).

    Returns
    -------
    ndarray of float32, shape (N, K, OH, OW), or (N, OH, OW, K) if NHWC
        ``OH = (H + 2*PH - DH*(KH-1) - 1)//SH + 1`` and likewise ``OW``.
        NHWC results are C-contiguous; NCHW results are a transposed view
        of a C-contiguous NHWC buffer.

    Raises
    ------
    ValueError
        On rank, channel or group mismatch (message gives got vs expected),
        if the kernel does not fit the padded input, if `bias` is not a real
        array of shape (K,), if `residual` has the wrong shape, or if
        `stride`, `padding` or `dilation` is negative or not a pair.
    TypeError
        If `stride`, `padding` or `dilation` is not an int or a pair of
        ints (see :func:`pycds.bf16.im2col.im2col`).

    Notes
    -----
    im2col lowering (Chellapilla et al. 2006) in the NHWC column order
    ``(KH, KW, C)``; one ``sbgemm`` per group writes its slice of the output
    columns in place.  The bias (and `residual`) enter as sbgemm's ``C``
    operand with ``beta = 1``, so the output is written once.
    """
    _check_layout(layout)
    x = np.asarray(x)
    _check4d(x, "x", layout)
    if layout == "NCHW":
        x = to_nhwc(x)
    N, H, W, C = x.shape
    pw, S, P, D, OH, OW = _conv_geometry(x.shape, w, groups, stride, padding, dilation)
    K = pw.out_channels
    out, beta = _accumulator(residual, bias, (N, OH, OW, K), layout)  # (N*OH*OW, K) float32
    xb = np.ascontiguousarray(as_bf16(x))  # (N, H, W, C) uint16
    if groups == 1:
        cols = im2col(xb, pw.kernel_size, S, P, D, "NHWC")  # (N*OH*OW, KH*KW*C)
        sbgemm(cols, pw.packed[0], c=out, beta=beta)  # (N*OH*OW, K)
    else:
        Cg, Kg = C // groups, K // groups
        for g in range(groups):
            cols = im2col(xb[..., g * Cg:(g + 1) * Cg], pw.kernel_size, S, P, D,
                          "NHWC")  # (N*OH*OW, KH*KW*Cg)
            sbgemm(cols, pw.packed[g], c=out[:, g * Kg:(g + 1) * Kg], beta=beta)
    if residual is not None and not np.shares_memory(out, residual):
        # residual was not C-contiguous in NHWC order: accumulated in a copy.
        out = out.reshape(N, OH, OW, K)
        residual[...] = to_nchw(out) if layout == "NCHW" else out
        return residual
    out = out.reshape(N, OH, OW, K)
    return to_nchw(out) if layout == "NCHW" else out


def conv2d_bf16(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, residual=None,
                relu=False, workspace=None):
    """2-D convolution of BF16 NHWC activations to BF16 NHWC, post-ops fused.

    ``out = BF16(relu(conv(x, w) + bias + residual))`` with the geometry of
    :func:`conv2d`; the bias, the shortcut and the ReLU are applied by
    :func:`pycds.bf16.gemm.sbgemm_fused` to each tile of the GEMM while it
    is in cache, so the fp32 result never reaches memory and the next
    layer reads half the bytes (what oneDNN's fused convolution post-ops
    and PyTorch's bf16 inference do).

    Parameters
    ----------
    x : ndarray of BF16 (uint16 bits or ``ml_dtypes.bfloat16``), shape (N, H, W, C)
    w : PackedConv, or ndarray of float32/BF16 of shape (K, C/groups, KH, KW)
    bias : ndarray of float32, shape (K,), optional
    stride, padding, dilation, groups
        As for :func:`conv2d`.
    residual : ndarray of uint16 (BF16 bits), shape (N, OH, OW, K), C-contiguous, optional
        Added before the ReLU.  It may be overwritten: the result is written
        into it when it has exactly that shape (and returned).
    relu : bool
        ReLU on the rounded result (negative values and -0 become +0; see
        :func:`relu_bf16`).
    workspace : ndarray of uint16, 1-D, optional
        Scratch for the im2col matrix (see :func:`pycds.bf16.im2col.im2col`'s
        `out`); a network reuses one for all its layers.  Not thread-safe:
        one workspace per thread.

    Returns
    -------
    ndarray of uint16, shape (N, OH, OW, K)
        BF16 bits, C-contiguous.

    Raises
    ------
    ValueError
        As :func:`conv2d` (a `bias` that is not of shape (K,) included), and
        if `residual` is not C-contiguous BF16 of the output's shape.
    TypeError
        As :func:`conv2d`.
    """
    xb = np.ascontiguousarray(as_bf16(x))  # (N, H, W, C) uint16
    _check4d(xb, "x", "NHWC")
    N, H, W, C = xb.shape
    pw, S, P, D, OH, OW = _conv_geometry(xb.shape, w, groups, stride, padding, dilation)
    (KH, KW), K = pw.kernel_size, pw.out_channels
    bias = _check_bias(bias, K)  # (K,) float32 or None
    if residual is not None:
        residual = as_bf16(residual)
        if residual.shape != (N, OH, OW, K) or not residual.flags.c_contiguous:
            raise ValueError(f"residual must be C-contiguous BF16 of shape {(N, OH, OW, K)}, "
                             f"got {residual.dtype} {residual.shape}")
        res = residual.reshape(N * OH * OW, K)
        out = res if residual.flags.writeable else np.empty_like(res)
    else:
        res = None
        out = np.empty((N * OH * OW, K), dtype=np.uint16)
    Cg, Kg = C // groups, K // groups
    for g in range(groups):
        xg = xb if groups == 1 else xb[..., g * Cg:(g + 1) * Cg]
        cols = im2col(xg, (KH, KW), S, P, D, "NHWC", out=workspace)  # (N*OH*OW, KH*KW*Cg)
        ks = slice(g * Kg, (g + 1) * Kg)
        sbgemm_fused(cols, pw.packed[g], bias=None if bias is None else bias[ks],
                     residual=None if res is None else res[:, ks], relu=relu,
                     out=out[:, ks])
    return out.reshape(N, OH, OW, K)


def _conv_geometry(shape, w, groups, stride, padding, dilation):
    # Pack `w` if it is not, check it against an NHWC input of `shape`:
    # -> (PackedConv, (SH, SW), (PH, PW), (DH, DW), OH, OW).
    pw = w if isinstance(w, PackedConv) else pack_conv_weight(w, groups)
    if pw.groups != groups:
        raise ValueError(f"groups={groups} does not match the packed weight's groups={pw.groups}")
    N, H, W, C = shape
    if C != pw.in_channels:
        raise ValueError(
            f"x has {C} channels, weight {pw.shape} with groups={groups} expects {pw.in_channels}"
        )
    (KH, KW), S = pw.kernel_size, _pair(stride, "stride")
    P, D = _pair(padding, "padding"), _pair(dilation, "dilation")
    OH = conv_output_size(H, KH, S[0], P[0], D[0])
    OW = conv_output_size(W, KW, S[1], P[1], D[1])
    return pw, S, P, D, OH, OW


def _accumulator(residual, bias, shape, layout):
    # The sbgemm C operand (M, K) float32 and its beta: bias broadcast, plus residual.
    N, OH, OW, K = shape
    bias = _check_bias(bias, K)  # (K,) float32 or None
    if residual is None:
        if bias is None:
            return np.empty((N * OH * OW, K), dtype=np.float32), 0.0
        out = np.empty((N * OH * OW, K), dtype=np.float32)
        out[...] = bias  # (M, K) <- (K,)
        return out, 1.0
    expected = (N, K, OH, OW) if layout == "NCHW" else shape
    if residual.shape != expected or residual.dtype != np.float32:
        raise ValueError(f"residual must be float32 with shape {expected}, got "
                         f"{residual.dtype} {residual.shape}")
    r = to_nhwc(residual) if layout == "NCHW" else residual  # (N, OH, OW, K)
    out = r.reshape(N * OH * OW, K) if r.flags.c_contiguous else np.array(r).reshape(N * OH * OW, K)
    if bias is not None:
        out += bias
    return out, 1.0


# --------------------------------------------------------------------------
# linear


def pack_linear_weight(w):
    """Round a ``Linear.weight`` to BF16 and pack it as op(B) = w.T.

    Parameters
    ----------
    w : ndarray of float32 or BF16, shape (out_features, in_features)

    Returns
    -------
    PackedB
        op(B) of shape (in_features, out_features).

    Raises
    ------
    ValueError
        If `w` is not 2-D.
    """
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D (out_features, in_features), got shape {w.shape}")
    return pack(as_bf16(w), trans_b=True)


def linear(x, w, bias=None):
    """Return ``x @ w.T + bias``: BF16 inputs, fp32 accumulation.

    Parameters
    ----------
    x : ndarray of float32 (or BF16), shape (N, in_features)
        Rounded to BF16 before the product.
    w : ndarray of float32 or BF16, shape (out_features, in_features); or PackedB
        PyTorch ``Linear.weight`` layout, or :func:`pack_linear_weight` output.
    bias : ndarray of float32, shape (out_features,), optional
        Added in fp32 (BF16, uint16 bits or ml_dtypes, is widened exactly;
        other real dtypes are cast; no broadcasting).

    Returns
    -------
    ndarray of float32, shape (N, out_features)

    Raises
    ------
    ValueError
        If `x` is not 2-D, the feature sizes differ, or `bias` is not a real
        array of shape (out_features,).
    """
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (N, in_features), got shape {x.shape}")
    pw = w if isinstance(w, PackedB) else pack_linear_weight(w)
    if x.shape[1] != pw.k:
        raise ValueError(f"x has {x.shape[1]} features, weight expects in_features={pw.k}")
    bias = _check_bias(bias, pw.n)  # (out_features,) float32 or None
    xb = np.ascontiguousarray(as_bf16(x))  # (N, in_features) uint16
    if bias is None:
        return sbgemm(xb, pw)  # (N, out_features)
    out = np.empty((x.shape[0], pw.n), dtype=np.float32)
    out[...] = bias  # (N, out_features) <- (out_features,)
    return sbgemm(xb, pw, c=out, beta=1.0)


# --------------------------------------------------------------------------
# elementwise


def relu(x, inplace=False):
    """``max(x, 0)`` elementwise.

    Parameters
    ----------
    x : ndarray of float32, any shape
    inplace : bool
        Overwrite `x` (it must be writeable).

    Returns
    -------
    ndarray of float32, shape ``x.shape``
        NaN propagates (``np.maximum``).
    """
    return np.maximum(x, np.float32(0), out=x if inplace else None)


def relu_bf16(b, inplace=False):
    """``max(b, 0)`` on BF16 bit patterns, as one int16 pass.

    Positive BF16 values (and +NaN) are positive int16 with the same order,
    negative values (and -0) are negative int16, so an integer max with 0
    is the ReLU.  Because rounding to nearest is monotone and keeps signs,
    ``relu_bf16(to_bf16(x)) == to_bf16(relu(x))`` for every non-NaN x; it lets a
    network round a convolution output first and apply its ReLU on half the
    bytes.

    Parameters
    ----------
    b : ndarray of uint16, any shape
        BF16 bit patterns.
    inplace : bool
        Overwrite `b`.

    Returns
    -------
    ndarray of uint16, shape ``b.shape``
        Negative values and -0 become +0.  A NaN with the sign bit set also
        becomes +0, whereas ``relu`` on fp32 keeps NaN.
    """
    v = b.view(np.int16)
    return np.maximum(v, np.int16(0), out=v if inplace else None).view(np.uint16)


def softmax(x, axis=-1):
    """Numerically stable softmax.

    Parameters
    ----------
    x : ndarray of float, any shape
    axis : int

    Returns
    -------
    ndarray, float32 or float64 (as `x`), shape ``x.shape``
        Non-negative, sums to 1 along `axis`.
    """
    x = np.asarray(x)
    if x.dtype.kind != "f" or _is_bf16(x):
        x = as_float32(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def flatten(x, start_dim=1):
    """Merge the dimensions from `start_dim` on, like ``torch.flatten``.

    Parameters
    ----------
    x : ndarray, shape (N, d1, d2, ...)
    start_dim : int

    Returns
    -------
    ndarray, shape ``x.shape[:start_dim] + (prod(x.shape[start_dim:]),)``
        C order (so NCHW flattens channel-major, as PyTorch).
    """
    return x.reshape(x.shape[:start_dim] + (-1,))


# --------------------------------------------------------------------------
# pooling


def _pool_geometry(x, kernel_size, stride, padding, dilation, layout):
    _check_layout(layout)
    x = np.asarray(x)
    _check4d(x, "x", layout)
    KH, KW = _pair(kernel_size, "kernel_size")
    SH, SW = _pair(kernel_size if stride is None else stride, "stride")
    PH, PW = _pair(padding, "padding")
    DH, DW = _pair(dilation, "dilation")
    if 2 * PH > KH or 2 * PW > KW:
        raise ValueError(
            f"padding must be at most half the kernel size, got padding={(PH, PW)} "
            f"for kernel_size={(KH, KW)}"
        )
    H, W = x.shape[2:4] if layout == "NCHW" else x.shape[1:3]
    OH = conv_output_size(H, KH, SH, PH, DH)
    OW = conv_output_size(W, KW, SW, PW, DW)
    return x, (KH, KW), (SH, SW), (PH, PW), (DH, DW), (OH, OW)


def _offset_slices(xp, i, j, S, D, O, layout):
    # Strided view of xp at kernel offset (i, j): every output pixel's tap.
    # -> (N, C, OH, OW) or (N, OH, OW, C)
    (SH, SW), (DH, DW), (OH, OW) = S, D, O
    h0, w0 = i * DH, j * DW
    hs = slice(h0, h0 + SH * (OH - 1) + 1, SH)
    ws = slice(w0, w0 + SW * (OW - 1) + 1, SW)
    return xp[:, :, hs, ws] if layout == "NCHW" else xp[:, hs, ws, :]


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, layout="NCHW"):
    """2-D max pooling, as ``torch.nn.functional.max_pool2d``.

    With ``ceil_mode=False``.

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W), or (N, H, W, C) if NHWC
        (any real dtype works: an int16 view of non-negative BF16 bits, as
        after a ReLU, pools exactly, since their integer order is their
        value order).
    kernel_size : int or (int, int)
        ``(KH, KW)``.
    stride : int or (int, int), optional
        Defaults to `kernel_size`.
    padding : int or (int, int)
        Implicit ``-inf`` padding (the dtype's minimum for integers), at
        most half the kernel.
    dilation : int or (int, int)
    layout : {"NCHW", "NHWC"}

    Returns
    -------
    ndarray, dtype of `x` (float32 for float32 input), shape (N, C, OH, OW) or (N, OH, OW, C)
        ``OH = (H + 2*PH - DH*(KH-1) - 1)//SH + 1``; C-contiguous in `layout`.
        Pooling only selects values, so they are `x`'s, exactly.

    Raises
    ------
    ValueError
        If `x` is not 4-D, padding exceeds half the kernel, the window
        does not fit, or a parameter is negative or not a pair.
    TypeError
        If `kernel_size`, `stride`, `padding` or `dilation` is not an int or
        a pair of ints (see :func:`pycds.bf16.im2col.im2col`).

    Notes
    -----
    A loop over the ``KH*KW`` kernel offsets, each a vectorised
    ``np.maximum`` of strided views; never a loop over pixels.
    """
    x, (KH, KW), S, P, D, O = _pool_geometry(x, kernel_size, stride, padding, dilation, layout)
    # Padding never wins: -inf, or the dtype's minimum for integer input.
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = pad2d(x, P, fill, layout)
    out = None
    for i in range(KH):
        for j in range(KW):
            v = _offset_slices(xp, i, j, S, D, O, layout)  # (N, C, OH, OW) / (N, OH, OW, C)
            if out is None:
                out = v.copy()
            else:
                np.maximum(out, v, out=out)
    return out


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True, layout="NCHW"):
    """2-D average pooling, as ``torch.nn.functional.avg_pool2d``.

    With ``ceil_mode=False``.

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W), or (N, H, W, C) if NHWC
    kernel_size : int or (int, int)
    stride : int or (int, int), optional
        Defaults to `kernel_size`.
    padding : int or (int, int)
        Zero padding, at most half the kernel.
    count_include_pad : bool
        Divide by ``KH*KW`` (True, PyTorch's default) or by the number of
        non-padding taps.
    layout : {"NCHW", "NHWC"}

    Returns
    -------
    ndarray of float32, shape (N, C, OH, OW) or (N, OH, OW, C)
        ``OH = (H + 2*PH - KH)//SH + 1``.

    Raises
    ------
    ValueError, TypeError
        As :func:`max_pool2d`.
    """
    x, (KH, KW), S, P, D, O = _pool_geometry(x, kernel_size, stride, padding, 1, layout)
    x = np.asarray(x, dtype=np.float32)
    xp = pad2d(x, P, 0, layout)
    out = None
    for i in range(KH):
        for j in range(KW):
            v = _offset_slices(xp, i, j, S, D, O, layout)
            if out is None:
                out = v.copy()
            else:
                out += v
    if count_include_pad or P == (0, 0):
        out *= np.float32(1.0 / (KH * KW))
    else:
        H, W = (x.shape[2], x.shape[3]) if layout == "NCHW" else (x.shape[1], x.shape[2])
        ones = pad2d(np.ones((1, 1, H, W), np.float32), P, 0, "NCHW")
        cnt = sum(_offset_slices(ones, i, j, S, D, O, "NCHW") for i in range(KH) for j in range(KW))
        cnt = cnt[0, 0] if layout == "NCHW" else cnt[0, 0][:, :, None]  # (OH, OW) or (OH, OW, 1)
        out /= cnt
    return out


def _adaptive_bounds(n_in, n_out):
    # PyTorch's adaptive pooling bins: [floor(i*n_in/n_out), ceil((i+1)*n_in/n_out)).
    i = np.arange(n_out)
    return (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)


def adaptive_avg_pool2d(x, output_size, layout="NCHW"):
    """Adaptive average pooling (``torch.nn.functional.adaptive_avg_pool2d``).

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W), or (N, H, W, C) if NHWC
    output_size : int or (int, int)
        ``(OH, OW)``; output cell ``(i, j)`` averages input rows
        ``floor(i*H/OH) .. ceil((i+1)*H/OH) - 1`` and likewise columns.
    layout : {"NCHW", "NHWC"}

    Returns
    -------
    ndarray of float32, shape (N, C, OH, OW) or (N, OH, OW, C)

    Raises
    ------
    ValueError
        If `x` is not 4-D or `output_size` is not positive.
    TypeError
        If `output_size` is not an int or a pair of ints.

    Notes
    -----
    Vectorised with a summed-area table (float64) and fancy indexing;
    ``OH = OW = 1`` is a plain mean and ``(OH, OW) == (H, W)`` returns `x`.
    """
    _check_layout(layout)
    x = np.asarray(x, dtype=np.float32)
    _check4d(x, "x", layout)
    OH, OW = _pair(output_size, "output_size")
    if OH < 1 or OW < 1:
        raise ValueError(f"output_size must be positive, got {(OH, OW)}")
    hax, wax = (2, 3) if layout == "NCHW" else (1, 2)
    H, W = x.shape[hax], x.shape[wax]
    if (OH, OW) == (H, W):
        return x
    if (OH, OW) == (1, 1):
        return x.mean(axis=(hax, wax), keepdims=True, dtype=np.float32)
    xs = x if layout == "NHWC" else to_nhwc(x)  # (N, H, W, C)
    sat = np.zeros((xs.shape[0], H + 1, W + 1, xs.shape[3]), dtype=np.float64)
    np.cumsum(np.cumsum(xs, axis=1, dtype=np.float64), axis=2, out=sat[:, 1:, 1:])
    h0, h1 = _adaptive_bounds(H, OH)
    w0, w1 = _adaptive_bounds(W, OW)
    s = (sat[:, h1][:, :, w1] - sat[:, h0][:, :, w1]
         - sat[:, h1][:, :, w0] + sat[:, h0][:, :, w0])  # (N, OH, OW, C)
    area = ((h1 - h0)[:, None] * (w1 - w0)[None, :])[None, :, :, None]  # (1, OH, OW, 1)
    out = (s / area).astype(np.float32)
    return np.ascontiguousarray(to_nchw(out)) if layout == "NCHW" else out


# --------------------------------------------------------------------------
# batch norm


def batch_norm(x, running_mean, running_var, weight=None, bias=None, eps=1e-5, layout="NCHW"):
    """Inference-mode batch normalisation over the channel axis.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` per channel.

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W) or (N, H, W, C) if NHWC; or (N, C)
    running_mean, running_var : ndarray of float32, shape (C,)
    weight, bias : ndarray of float32, shape (C,), optional
        gamma (default 1) and beta (default 0).
    eps : float
    layout : {"NCHW", "NHWC"}

    Returns
    -------
    ndarray of float32, shape ``x.shape``

    Raises
    ------
    ValueError
        If the parameter lengths differ from the channel count.
    """
    _check_layout(layout)
    x = np.asarray(x, dtype=np.float32)
    cax = 1 if (layout == "NCHW" or x.ndim == 2) else x.ndim - 1
    C = x.shape[cax]
    scale, shift = _bn_scale_shift(C, running_mean, running_var, weight, bias, eps)
    bshape = [1] * x.ndim
    bshape[cax] = C
    return x * scale.astype(np.float32).reshape(bshape) + shift.astype(np.float32).reshape(bshape)


def _bn_scale_shift(C, mean, var, gamma, beta, eps):
    # -> scale, shift: float64, shape (C,), with y = x*scale + shift.
    mean = np.asarray(mean, np.float64)
    var = np.asarray(var, np.float64)
    gamma = np.ones(C) if gamma is None else np.asarray(gamma, np.float64)
    beta = np.zeros(C) if beta is None else np.asarray(beta, np.float64)
    for name, p in (("running_mean", mean), ("running_var", var), ("weight", gamma), ("bias", beta)):
        if p.shape != (C,):
            raise ValueError(f"{name} must have shape ({C},), got {p.shape}")
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale


def fold_batch_norm(conv_w, conv_b, gamma, beta, mean, var, eps=1e-5):
    """Fold an inference batch norm into the convolution that feeds it.

    ``bn(conv(x, w) + b) == conv(x, w * s) + (b - mean) * s + beta`` with
    ``s = gamma / sqrt(var + eps)`` per output channel.

    Parameters
    ----------
    conv_w : ndarray of float32 or BF16, shape (K, C/groups, KH, KW)
    conv_b : ndarray of float32, shape (K,), or None
        torchvision's ResNet convolutions have no bias (None means zeros).
    gamma, beta, mean, var : ndarray of float32, shape (K,)
        ``bn.weight``, ``bn.bias``, ``bn.running_mean``, ``bn.running_var``;
        gamma/beta may be None (1/0).
    eps : float
        ``bn.eps`` (torchvision: 1e-5).

    Returns
    -------
    w : ndarray of float32, shape (K, C/groups, KH, KW)
        Folded weight, in fp32 (the caller rounds it to BF16 once).
    b : ndarray of float32, shape (K,)
        Folded bias.

    Raises
    ------
    ValueError
        If a parameter's length is not K.
    """
    w = as_float32(conv_w)
    K = w.shape[0]
    b = np.zeros(K, np.float64) if conv_b is None else np.asarray(conv_b, np.float64)
    if b.shape != (K,):
        raise ValueError(f"conv bias must have shape ({K},), got {b.shape}")
    scale, shift = _bn_scale_shift(K, mean, var, gamma, beta, eps)
    w = (w * scale.reshape((K,) + (1,) * (w.ndim - 1))).astype(np.float32)  # (K, C/groups, KH, KW)
    return w, (b * scale + shift).astype(np.float32)
