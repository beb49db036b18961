"""float32 <-> bfloat16 conversion on ``np.uint16`` bit patterns.

Exports
-------
to_bf16(x, rounding="nearest", out="uint16")
    float32 (or anything castable to it) -> BF16 bit patterns.
to_float32(b)
    BF16 bit patterns (uint16) or ``ml_dtypes.bfloat16`` -> float32, exact.

BF16 is the high half of an IEEE 754 binary32: 1 sign bit, 8 exponent bits,
7 stored significand bits.  Storage is ``np.uint16`` (llm.c's trick: numpy
has no bf16 dtype); ``out="ml_dtypes"`` gives an ``ml_dtypes.bfloat16`` view
of the same bytes.  The conversions are integer bit manipulations (no float
rounding mode is involved), so results are identical on every platform:
vectorised numpy for small arrays, and for arrays of 4096+ elements the
native loop in ``pycds.bf16._kernels`` (AVX512 integer ops when available,
two threads from 2**18 elements), which gives the same bits.  Checked
against ml_dtypes over all 2**32 float32 patterns
(``scripts/bf16_exhaustive.py``; see ``docs/bf16.md``).
"""

import numpy as np

from pycds.bf16._native import ffi as _ffi, lib as _lib

__all__ = ["to_bf16", "to_float32", "BF16_NAN", "ROUNDINGS"]

# Arrays at least this large go through the native loop; smaller ones use
# numpy, which is faster for them (same bits either way).
_NATIVE_MIN = 1 << 12
_ROUND_CODE = {"nearest": 0, "truncate": 1}  # BF16K_ROUND_* in bf16_kernels.h

# Canonical quiet NaN (positive); the sign of the input is kept.  Matches
# ml_dtypes (Eigen) bit for bit, and PyTorch up to the sign bit.
BF16_NAN = 0x7FC0
ROUNDINGS = ("nearest", "truncate")
_OUTS = ("uint16", "ml_dtypes")
_F32 = np.dtype(np.float32)  # builtin dtypes are singletons: `is` tests
_U16 = np.dtype(np.uint16)


def _ml_bfloat16():
    # Imported lazily: ml_dtypes is only needed for the ml_dtypes views.
    import ml_dtypes

    return ml_dtypes.bfloat16


def to_bf16(x, rounding="nearest", out="uint16"):
    """Convert float32 values to BF16.

    Parameters
    ----------
    x : array_like of float32, any shape
        Values to convert.  Other floating and integer dtypes are first cast
        to float32 by numpy (float64 input is therefore rounded twice; pass
        float32 for single rounding).  An ``ml_dtypes.bfloat16`` array is
        returned as a copy of its bit patterns.
    rounding : {"nearest", "truncate"}
        ``"nearest"``: IEEE 754 roundTiesToEven on the 16 dropped bits, as
        ``vcvtneps2bf16``, PyTorch and ml_dtypes do.  Finite values whose
        rounding overflows become +-inf; subnormals are rounded, not flushed.
        ``"truncate"``: drop the low 16 bits (round toward zero), as
        TensorFlow's original bfloat16 did.
    out : {"uint16", "ml_dtypes"}
        Return BF16 bit patterns as ``np.uint16``, or an
        ``ml_dtypes.bfloat16`` view of the same buffer.

    Returns
    -------
    ndarray of uint16 (or ml_dtypes.bfloat16), shape ``x.shape``
        BF16 bit patterns, C-contiguous, always a new array (a 0-d array for
        a scalar `x`, NaN included).  Any NaN becomes the canonical quiet
        NaN ``sign | 0x7FC0`` (quiet bit set; payload not kept), as
        ml_dtypes does; +-inf, +-0 and signs are kept.

    Raises
    ------
    ValueError
        If `rounding` or `out` is not one of the allowed values, or `x` is
        not real numbers: complex, bool, strings, datetimes, objects
        (``None`` included); or if `x` is uint16 (reserved for BF16 bit
        patterns: use :func:`to_float32` on those, or cast integers to
        float32 first).

    Notes
    -----
    Round-to-nearest-even on the bit pattern ``u`` (uint32) is
    ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``: adding 0x7FFF carries into the
    kept half exactly when the dropped half exceeds 0x8000, and the lsb term
    breaks the 0x8000 tie toward an even result.  A carry out of the
    largest finite exponent yields the inf pattern 0x7F80, which is the
    IEEE overflow result for round-to-nearest.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if out not in _OUTS:
        raise ValueError(f"out must be one of {_OUTS}, got {out!r}")
    x = np.asarray(x)
    if x.dtype == np.uint16:
        raise ValueError(
            "x has dtype uint16, which this API reserves for BF16 bit "
            "patterns; cast to float32 first to convert integers"
        )
    if x.dtype is not _F32 and _is_bfloat16(x.dtype):
        bits = np.array(x.view(np.uint16), order="C")  # a copy, as documented
    elif not _real_dtype(x.dtype):
        raise ValueError(f"x must be real (floating or integer), got dtype {x.dtype}")
    else:
        f = np.asarray(x, dtype=np.float32, order="C")  # keeps 0-d shape
        if f.size >= _NATIVE_MIN:
            bits = _native_from_f32(f, rounding)
        else:
            # 1-D while rounding: numpy arithmetic on 0-d arrays gives scalars
            bits = _round_bits(f.reshape(-1).view(np.uint32), rounding).reshape(f.shape)
    if out == "ml_dtypes":
        return bits.view(_ml_bfloat16())
    return bits


def _native_from_f32(f, rounding):
    # f: C-contiguous float32, any shape -> uint16, same shape (native loop).
    bits = np.empty(f.shape, dtype=np.uint16)
    rc = _lib.bf16k_from_f32(
        _ffi.cast("const float *", _ffi.from_buffer(f)),
        _ffi.cast("uint16_t *", _ffi.from_buffer(bits, require_writable=True)),
        f.size, _ROUND_CODE[rounding])
    if rc != 0:
        raise RuntimeError(f"bf16k_from_f32 failed with code {rc}")
    return bits


def _native_to_f32(b):
    # b: C-contiguous uint16, any shape -> float32, same shape (native loop).
    out = np.empty(b.shape, dtype=np.float32)
    rc = _lib.bf16k_to_f32(
        _ffi.cast("const uint16_t *", _ffi.from_buffer(b)),
        _ffi.cast("float *", _ffi.from_buffer(out, require_writable=True)),
        b.size)
    if rc != 0:
        raise RuntimeError(f"bf16k_to_f32 failed with code {rc}")
    return out


def _round_bits(u, rounding):
    # u: uint32 bit patterns of float32, at least 1-D -> uint16, same shape.
    mag = u & np.uint32(0x7FFFFFFF)
    if rounding == "nearest":
        r = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
        r >>= np.uint32(16)
    else:
        r = u >> np.uint32(16)
    r = r.astype(np.uint16)
    nan = mag > np.uint32(0x7F800000)
    if nan.any():
        sign = (u[nan] >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
        r[nan] = sign | np.uint16(BF16_NAN)
    return r


def _is_bfloat16(dt):
    """Return whether numpy dtype dt is ml_dtypes.bfloat16.

    Whether numpy dtype `dt` is ``ml_dtypes.bfloat16`` (by name: ml_dtypes
    is not imported for this).  The kind test first: ``dtype.name`` costs
    about a microsecond, a good part of a small GEMM's Python time."""
    return dt.kind == "V" and dt.name == "bfloat16"


def _real_dtype(dt):
    """Return whether numpy dtype dt holds real numbers.

    Whether numpy dtype `dt` holds real numbers: floating, integer (uint16
    included: BF16 bits where the caller takes them so) or
    ``ml_dtypes.bfloat16``; not complex, bool, strings, datetimes, objects."""
    return dt.kind in "fiu" or _is_bfloat16(dt)


def bf16_bits(x, name):
    """Return x as uint16 BF16 bits; raise ValueError for other dtypes.

    `x` as BF16 bit patterns: a uint16 array as is, an ``ml_dtypes.bfloat16``
    array viewed as uint16 (no copy).  Raises ValueError naming `name` for
    any other dtype (floats are not rounded here; see :func:`to_bf16`)."""
    x = np.asarray(x)
    if x.dtype is _U16:
        return x
    if _is_bfloat16(x.dtype):
        return x.view(np.uint16)
    if x.dtype != np.uint16:
        raise ValueError(
            f"{name} must hold BF16 as uint16 bit patterns or ml_dtypes.bfloat16, "
            f"got dtype {x.dtype}"
        )
    return x


def to_float32(b):
    """Widen BF16 to float32 exactly.

    Parameters
    ----------
    b : ndarray of uint16 or ml_dtypes.bfloat16, any shape
        BF16 bit patterns (uint16), or an ``ml_dtypes.bfloat16`` array.

    Returns
    -------
    ndarray of float32, shape ``b.shape``
        ``b`` placed in the high half of a binary32 (``u32 = b << 16``), so
        every value, NaN payload and sign is kept exactly.

    Raises
    ------
    ValueError
        If `b` is neither uint16 nor ml_dtypes.bfloat16.
    """
    b = bf16_bits(b, "b")
    if b.size >= _NATIVE_MIN and b.flags.c_contiguous:
        return _native_to_f32(b)
    # (1-D while shifting: numpy arithmetic on a 0-d array gives a scalar.)
    wide = b.reshape(-1).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32).reshape(b.shape)
