"""im2col / col2im: convolution as one matrix product, via strided views.

Exports
-------
conv_output_size(H, KH, S=1, P=0, D=1)
    The output length of a convolution or pooling window along one axis.
pad2d(x, P, value=0, layout="NCHW")
    Zero (or ``value``) padding of the two spatial axes.
im2col(x, kernel_size, stride=1, padding=0, dilation=1, layout="NCHW")
    Patches of an image batch as rows of a matrix, ``(N*OH*OW, C*KH*KW)``.
col2im(cols, x_shape, kernel_size, stride=1, padding=0, dilation=1, layout="NCHW")
    The adjoint of ``im2col`` (overlapping patches summed back), for training.

The lowering follows Chellapilla, Puri and Simard, "High Performance
Convolutional Neural Networks for Document Processing" (IWFHR 2006): each
output pixel's receptive field becomes one row, the filters become the
columns of a second matrix, and the convolution is their product.  The
windows come from ``numpy.lib.stride_tricks.sliding_window_view`` (a
zero-copy view); the only copy is the final ``reshape`` into a contiguous
matrix, so there is no Python loop over pixels.

Two memory layouts are supported.  ``"NCHW"`` (PyTorch's) orders the
columns as ``(C, KH, KW)``, which matches ``weight.reshape(K, C*KH*KW)`` of
a PyTorch ``(K, C, KH, KW)`` weight.  ``"NHWC"`` orders them ``(KH, KW,
C)``, which matches ``weight.transpose(0, 2, 3, 1).reshape(K, KH*KW*C)``;
its copy moves runs of ``C`` contiguous elements, and a 1x1 stride-1
convolution needs no copy at all.  For BF16 bits (uint16) in NHWC, the
copy is done natively (``bf16k_im2col_nhwc``: one ``memcpy`` of ``C``
channels per tap, zeros for padding, two threads for large images), which
skips the padded copy of the image and numpy's six-dimensional strided copy
(3x faster on ResNet-50's layers here); any other dtype or layout takes the
numpy path, and both give the same matrix.
"""

import operator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pycds.bf16._native import ffi as _ffi, lib as _lib

__all__ = ["conv_output_size", "pad2d", "im2col", "col2im", "LAYOUTS"]

LAYOUTS = ("NCHW", "NHWC")


def _int(e, name, v):
    # An int (operator.index: Python and numpy integers), never a bool.
    if isinstance(e, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}")
    try:
        return operator.index(e)
    except TypeError:
        raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}") from None


# int or pair of ints -> (int, int).  TypeError for anything that is not an
# integer (floats, bools, strings, None); ValueError for a sequence that is
# not a pair, or a negative value (the callers check the lower bounds).
def _pair(v, name):
    given = v
    if isinstance(v, (str, bytes, set, frozenset, dict)):
        # (a set or dict has no order: which entry is the height?)
        raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}")
    try:
        v = (_int(v, name, v),) * 2
    except TypeError:
        try:
            items = list(v)
        except TypeError:
            raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}") from None
        if len(items) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}") from None
        v = tuple(_int(e, name, v) for e in items)
    if v[0] < 0 or v[1] < 0:
        raise ValueError(f"{name} must be non-negative, got {given!r}")
    return v


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def conv_output_size(H, KH, S=1, P=0, D=1):
    """Output length of a sliding window along one spatial axis.

    Parameters
    ----------
    H : int
        Input length.
    KH : int
        Window (kernel) length, >= 1.
    S : int
        Stride, >= 1.
    P : int
        Padding added on both ends, >= 0.
    D : int
        Dilation, >= 1.

    Returns
    -------
    int
        ``OH = (H + 2*P - D*(KH - 1) - 1) // S + 1`` (PyTorch ``Conv2d``,
        ``ceil_mode=False``).

    Raises
    ------
    ValueError
        If a parameter is out of range, or the dilated window
        ``D*(KH - 1) + 1`` is longer than the padded input ``H + 2*P``.
    """
    if KH < 1 or S < 1 or D < 1 or P < 0 or H < 0:
        raise ValueError(
            f"need H >= 0, KH >= 1, S >= 1, P >= 0, D >= 1; "
            f"got H={H}, KH={KH}, S={S}, P={P}, D={D}"
        )
    span = D * (KH - 1) + 1
    if span > H + 2 * P:
        raise ValueError(
            f"dilated kernel span {span} (KH={KH}, D={D}) is larger than the "
            f"padded input {H + 2 * P} (H={H}, P={P})"
        )
    return (H + 2 * P - span) // S + 1


def pad2d(x, P, value=0, layout="NCHW"):
    """Pad the two spatial axes of an image batch.

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W) or (N, H, W, C)
        Any dtype (float32 activations or uint16 BF16 bit patterns, where
        ``value=0`` is +0.0).
    P : int or (int, int)
        Padding ``(PH, PW)`` added on both sides of H and W.
    value : scalar
        Fill value (``-inf`` for max pooling).
    layout : {"NCHW", "NHWC"}

    Returns
    -------
    ndarray, same dtype, shape (N, C, H + 2*PH, W + 2*PW) or (N, H + 2*PH, W + 2*PW, C)
        A new C-contiguous array; `x` itself when ``PH == PW == 0``.

    Raises
    ------
    ValueError
        If `layout` is unknown or `P` is negative or not a pair.
    TypeError
        If `P` is not an int or a pair of ints.
    """
    _check_layout(layout)
    PH, PW = _pair(P, "padding")
    if PH == 0 and PW == 0:
        return x
    if layout == "NCHW":
        N, C, H, W = x.shape
        xp = np.full((N, C, H + 2 * PH, W + 2 * PW), value, dtype=x.dtype)
        xp[:, :, PH:PH + H, PW:PW + W] = x
    else:
        N, H, W, C = x.shape
        xp = np.full((N, H + 2 * PH, W + 2 * PW, C), value, dtype=x.dtype)
        xp[:, PH:PH + H, PW:PW + W, :] = x
    return xp


def _windows(xp, KH, KW, SH, SW, DH, DW, OH, OW, layout):
    # Strided view of every (dilated) window of a padded batch, zero copy:
    #   NCHW -> (N, C, OH, OW, KH, KW);  NHWC -> (N, OH, OW, C, KH, KW).
    axes = (2, 3) if layout == "NCHW" else (1, 2)
    spanH, spanW = DH * (KH - 1) + 1, DW * (KW - 1) + 1
    v = sliding_window_view(xp, (spanH, spanW), axis=axes)
    if layout == "NCHW":
        return v[:, :, :SH * (OH - 1) + 1:SH, :SW * (OW - 1) + 1:SW, ::DH, ::DW]
    return v[:, :SH * (OH - 1) + 1:SH, :SW * (OW - 1) + 1:SW, :, ::DH, ::DW]


def im2col(x, kernel_size, stride=1, padding=0, dilation=1, layout="NCHW", out=None):
    """Unfold the patches of an image batch into the rows of a matrix.

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W) (``layout="NCHW"``) or (N, H, W, C)
        Any dtype; typically uint16 BF16 bit patterns (half the bytes to
        move) or float32.
    kernel_size : int or (int, int)
        ``(KH, KW)``.
    stride : int or (int, int)
        ``(SH, SW)``, >= 1.
    padding : int or (int, int)
        Zero padding ``(PH, PW)`` on both sides, >= 0.
    dilation : int or (int, int)
        ``(DH, DW)``, >= 1.
    layout : {"NCHW", "NHWC"}
        Memory layout of `x`; also fixes the column order (see Returns).
    out : ndarray of uint16, 1-D, C-contiguous, optional
        Scratch for the result when `x` is BF16 bits (uint16) in NHWC: the
        matrix is written into its first ``N*OH*OW*C*KH*KW`` elements and
        returned as a view of it, which spares the page faults of a fresh
        array per call (two thirds of the copy's time here).  Ignored when
        too small, or for other dtypes and layouts.

    Returns
    -------
    cols : ndarray, dtype of `x`, shape (N*OH*OW, C*KH*KW)
        Row ``(n*OH + oh)*OW + ow`` holds the receptive field of output pixel
        ``(oh, ow)`` of image ``n``, with
        ``OH = (H + 2*PH - DH*(KH-1) - 1)//SH + 1`` and likewise ``OW``.
        Columns are ordered ``(C, KH, KW)`` for NCHW and ``(KH, KW, C)`` for
        NHWC.  C-contiguous; for NHWC with a 1x1 kernel, stride 1 and no
        padding it is a reshaped view of `x` when `x` is C-contiguous.

    Raises
    ------
    ValueError
        If `x` is not 4-D, `layout` is unknown, a parameter is negative or a
        sequence of other than two ints, or the window does not fit (see
        `conv_output_size`).
    TypeError
        If `kernel_size`, `stride`, `padding` or `dilation` is not an int or
        a pair of ints (floats, bools and strings are refused, as PyTorch
        does; numpy integers are ints).

    See Also
    --------
    col2im : the adjoint (used by the backward pass of a convolution).

    Notes
    -----
    Chellapilla et al. 2006, section 3 ("unfolding" the input).  The copy
    made by the final reshape is the whole cost; the windows are a view.
    """
    _check_layout(layout)
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D {layout}, got shape {x.shape}")
    KH, KW = _pair(kernel_size, "kernel_size")
    SH, SW = _pair(stride, "stride")
    PH, PW = _pair(padding, "padding")
    DH, DW = _pair(dilation, "dilation")
    if layout == "NCHW":
        N, C, H, W = x.shape
    else:
        N, H, W, C = x.shape
    OH = conv_output_size(H, KH, SH, PH, DH)
    OW = conv_output_size(W, KW, SW, PW, DW)
    if layout == "NHWC" and KH == KW == 1 and PH == PW == 0:
        # 1x1: the "patch" is the pixel itself; stride just subsamples.
        return x[:, ::SH, ::SW, :].reshape(N * OH * OW, C)  # (N*OH*OW, C)
    if layout == "NHWC" and x.dtype == np.uint16 and N * OH * OW and C:
        return _im2col_native(np.ascontiguousarray(x), (KH, KW), (SH, SW), (PH, PW),
                              (DH, DW), N * OH * OW, out)
    xp = pad2d(x, (PH, PW), 0, layout)
    v = _windows(xp, KH, KW, SH, SW, DH, DW, OH, OW, layout)
    if layout == "NCHW":
        v = v.transpose(0, 2, 3, 1, 4, 5)  # (N, OH, OW, C, KH, KW)
    else:
        v = v.transpose(0, 1, 2, 4, 5, 3)  # (N, OH, OW, KH, KW, C)
    return v.reshape(N * OH * OW, C * KH * KW)  # (N*OH*OW, C*KH*KW), the copy


def _im2col_native(x, kernel_size, stride, padding, dilation, m, out=None):
    # x: (N, H, W, C) uint16 C-contiguous -> (m, KH*KW*C) uint16, in `out`
    # (1-D uint16 scratch) when it is big enough.
    N, H, W, C = x.shape
    (KH, KW), (SH, SW), (PH, PW), (DH, DW) = kernel_size, stride, padding, dilation
    size = m * KH * KW * C
    if out is not None and out.dtype == np.uint16 and out.ndim == 1 and \
            out.flags.c_contiguous and out.flags.writeable and out.size >= size:
        cols = out[:size].reshape(m, KH * KW * C)
    else:
        cols = np.empty((m, KH * KW * C), dtype=np.uint16)
    rc = _lib.bf16k_im2col_nhwc(_ffi.cast("const uint16_t *", _ffi.from_buffer(x)), N, H, W, C,
                                KH, KW, SH, SW, PH, PW, DH, DW,
                                _ffi.cast("uint16_t *", _ffi.from_buffer(cols, require_writable=True)),
                                cols.size)
    if rc != 0:   # arguments im2col's own checks let through but C refuses
        raise ValueError(f"bf16k_im2col_nhwc: {_ffi.string(_lib.bf16k_strerror(rc)).decode()}")
    return cols


def col2im(cols, x_shape, kernel_size, stride=1, padding=0, dilation=1, layout="NCHW"):
    """Fold rows of patches back into an image batch, summing overlaps.

    The adjoint of `im2col`: ``<im2col(x), g> == <x, col2im(g)>`` for all
    `x`, `g`.  Used for the input gradient of a convolution when training.

    Parameters
    ----------
    cols : ndarray of float, shape (N*OH*OW, C*KH*KW)
        Column order as `im2col` produces it for `layout`.
    x_shape : tuple of int
        ``(N, C, H, W)`` or ``(N, H, W, C)``: the shape of the image batch.
    kernel_size, stride, padding, dilation, layout
        As for `im2col`.

    Returns
    -------
    ndarray, dtype of `cols`, shape `x_shape`

    Raises
    ------
    ValueError
        If `cols` does not have the shape `im2col` would give for `x_shape`,
        or for bad parameters as `im2col`.
    TypeError
        For non-integer parameters, as `im2col`.

    Notes
    -----
    Loops over the ``KH*KW`` kernel offsets (not over pixels); each step
    adds one strided slab of ``N*C*OH*OW`` elements.
    """
    _check_layout(layout)
    KH, KW = _pair(kernel_size, "kernel_size")
    SH, SW = _pair(stride, "stride")
    PH, PW = _pair(padding, "padding")
    DH, DW = _pair(dilation, "dilation")
    if layout == "NCHW":
        N, C, H, W = x_shape
    else:
        N, H, W, C = x_shape
    OH = conv_output_size(H, KH, SH, PH, DH)
    OW = conv_output_size(W, KW, SW, PW, DW)
    expected = (N * OH * OW, C * KH * KW)
    if cols.shape != expected:
        raise ValueError(f"cols must have shape {expected} for x_shape {tuple(x_shape)}, got {cols.shape}")
    if layout == "NCHW":
        c = cols.reshape(N, OH, OW, C, KH, KW).transpose(0, 3, 4, 5, 1, 2)  # (N, C, KH, KW, OH, OW)
        xp = np.zeros((N, C, H + 2 * PH, W + 2 * PW), dtype=cols.dtype)
        for i in range(KH):
            for j in range(KW):
                h0, w0 = i * DH, j * DW
                xp[:, :, h0:h0 + SH * (OH - 1) + 1:SH, w0:w0 + SW * (OW - 1) + 1:SW] += c[:, :, i, j]
        return xp[:, :, PH:PH + H, PW:PW + W]
    c = cols.reshape(N, OH, OW, KH, KW, C)
    xp = np.zeros((N, H + 2 * PH, W + 2 * PW, C), dtype=cols.dtype)
    for i in range(KH):
        for j in range(KW):
            h0, w0 = i * DH, j * DW
            xp[:, h0:h0 + SH * (OH - 1) + 1:SH, w0:w0 + SW * (OW - 1) + 1:SW, :] += c[:, :, :, i, j, :]
    return xp[:, PH:PH + H, PW:PW + W, :]
