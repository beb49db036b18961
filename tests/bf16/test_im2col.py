"""im2col / col2im: shapes, values against explicit patches, adjointness, errors.

Sizes: N batch, C channels, H x W input, KH x KW kernel, S stride, P padding,
D dilation.  im2col only moves data, so its results must match exactly.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycds.bf16.im2col import col2im, conv_output_size, im2col, pad2d

from reference import out_size


@st.composite
def geometries(draw):
    N = draw(st.integers(1, 3))
    C = draw(st.integers(1, 5))
    KH = draw(st.sampled_from([1, 2, 3, 5, 7]))
    KW = draw(st.sampled_from([1, 2, 3, 5, 7]))
    S = draw(st.integers(1, 3))
    P = draw(st.integers(0, 3))
    D = draw(st.integers(1, 3))
    hmin = max(1, D * (KH - 1) + 1 - 2 * P)  # smallest input the dilated kernel fits
    wmin = max(1, D * (KW - 1) + 1 - 2 * P)
    H = draw(st.integers(hmin, hmin + 8))
    W = draw(st.integers(wmin, wmin + 8))
    return N, C, H, W, KH, KW, S, P, D


def explicit_cols(x, KH, KW, S, P, D):
    # Row per output pixel, built pixel by pixel (the obvious definition), NCHW order.
    N, C, H, W = x.shape
    OH, OW = out_size(H, KH, S, P, D), out_size(W, KW, S, P, D)
    xp = np.zeros((N, C, H + 2 * P, W + 2 * P), x.dtype)
    xp[:, :, P:P + H, P:P + W] = x
    rows = []
    for n in range(N):
        for oh in range(OH):
            for ow in range(OW):
                patch = xp[n, :, oh * S:oh * S + D * (KH - 1) + 1:D, ow * S:ow * S + D * (KW - 1) + 1:D]
                rows.append(patch.reshape(-1))  # (C*KH*KW,) in (C, KH, KW) order
    return np.array(rows).reshape(N * OH * OW, C * KH * KW)


class TestOutputSize:
    @pytest.mark.parametrize("H, K, S, P, D, OH", [
        (224, 7, 2, 3, 1, 112),   # ResNet conv1
        (224, 11, 4, 2, 1, 55),   # AlexNet conv1
        (112, 3, 2, 1, 1, 56),    # ResNet maxpool
        (8, 3, 1, 1, 1, 8),       # same padding
        (10, 3, 1, 0, 2, 6),      # dilation
        (5, 5, 1, 0, 1, 1),
    ])
    def test_known(self, H, K, S, P, D, OH):
        assert conv_output_size(H, K, S, P, D) == OH

    def test_too_small(self):
        with pytest.raises(ValueError, match="larger than the padded input"):
            conv_output_size(4, 3, 1, 0, 2)

    def test_bad_params(self):
        with pytest.raises(ValueError, match="S >= 1"):
            conv_output_size(4, 3, 0)


class TestIm2col:
    @settings(max_examples=60, deadline=None)
    @given(geometries(), st.sampled_from([np.float32, np.uint16]))
    def test_matches_explicit_patches(self, geom, dtype):
        N, C, H, W, KH, KW, S, P, D = geom
        rng = np.random.default_rng(N * 1000 + C * 100 + H * 10 + W)
        x = rng.integers(1, 60000, size=(N, C, H, W)).astype(dtype)
        OH, OW = out_size(H, KH, S, P, D), out_size(W, KW, S, P, D)
        cols = im2col(x, (KH, KW), S, P, D)
        assert cols.shape == (N * OH * OW, C * KH * KW)
        assert cols.dtype == x.dtype
        np.testing.assert_array_equal(cols, explicit_cols(x, KH, KW, S, P, D))
        # NHWC: same rows, columns in (KH, KW, C) order.
        cols_nhwc = im2col(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), (KH, KW), S, P, D, "NHWC")
        expect = explicit_cols(x, KH, KW, S, P, D).reshape(-1, C, KH, KW).transpose(0, 2, 3, 1)
        np.testing.assert_array_equal(cols_nhwc, expect.reshape(N * OH * OW, KH * KW * C))

    def test_out_scratch(self):
        # BF16 NHWC goes through the native copy; `out` is reused when big enough
        x = np.random.default_rng(2).integers(0, 65535, (2, 9, 7, 6)).astype(np.uint16)
        want = im2col(x, 3, 2, 1, 1, "NHWC")
        big = np.full(want.size + 11, 7, np.uint16)
        got = im2col(x, 3, 2, 1, 1, "NHWC", out=big)
        np.testing.assert_array_equal(got, want)
        assert np.shares_memory(got, big) and (big[want.size:] == 7).all()
        for unusable in (np.empty(want.size - 1, np.uint16), np.empty(want.size, np.float32),
                         np.empty((want.size, 1), np.uint16)):
            got = im2col(x, 3, 2, 1, 1, "NHWC", out=unusable)
            np.testing.assert_array_equal(got, want)
            assert not np.shares_memory(got, unusable)

    def test_nhwc_1x1_is_a_view(self):
        N, H, W, C = 2, 5, 6, 8
        x = np.arange(N * H * W * C, dtype=np.uint16).reshape(N, H, W, C)
        cols = im2col(x, 1, layout="NHWC")
        assert cols.shape == (N * H * W, C)
        assert np.shares_memory(cols, x)

    def test_rectangular_params(self):
        N, C, H, W = 1, 2, 9, 7
        x = np.random.default_rng(0).standard_normal((N, C, H, W)).astype(np.float32)
        cols = im2col(x, (3, 1), (2, 1), (1, 0), (1, 1))
        assert cols.shape == (N * out_size(H, 3, 2, 1) * out_size(W, 1, 1, 0), C * 3)

    @pytest.mark.parametrize("bad, match", [
        (dict(x=np.zeros((2, 3, 4))), "4-D"),
        (dict(layout="CHWN"), "layout"),
        (dict(kernel_size=(1, 2, 3)), "pair"),
        (dict(kernel_size=9), "larger than"),
    ])
    def test_errors(self, bad, match):
        args = dict(x=np.zeros((1, 2, 4, 4), np.float32), kernel_size=3)
        args.update(bad)
        with pytest.raises(ValueError, match=match):
            im2col(args.pop("x"), **args)


    @pytest.mark.parametrize("shape", [(1, 0, 3, 2), (1, 3, 0, 2), (2, 0, 0, 2)])
    def test_empty_image_nhwc_bf16(self, shape):
        # all padding: zeros, as for float32 and NCHW (the native path too)
        x = np.zeros(shape, np.uint16)
        cols = im2col(x, 3, 1, 2, 1, "NHWC")
        want = im2col(x.astype(np.float32), 3, 1, 2, 1, "NHWC")
        assert cols.dtype == np.uint16 and cols.shape == want.shape
        assert not cols.any()
        scratch = np.full(cols.size + 5, 7, np.uint16)
        assert not im2col(x, 3, 1, 2, 1, "NHWC", out=scratch).any()
        nchw = im2col(x.transpose(0, 3, 1, 2), 3, 1, 2, 1, "NCHW")
        assert nchw.shape == cols.shape and not nchw.any()

    @pytest.mark.parametrize("param, value, exc", [
        ("kernel_size", (2.7, 3), TypeError), ("kernel_size", "33", TypeError),
        ("kernel_size", b"33", TypeError), ("kernel_size", (True, True), TypeError),
        ("stride", False, TypeError), ("stride", 1.0, TypeError),
        ("dilation", np.float64(1.0), TypeError), ("padding", None, TypeError),
        ("padding", -1, ValueError), ("padding", (0, -2), ValueError),
        ("kernel_size", (), ValueError), ("kernel_size", [3], ValueError),
        ("kernel_size", {1, 2}, TypeError), ("stride", {1: 1, 2: 2}, TypeError),
    ])
    def test_junk_params(self, param, value, exc):
        x = np.zeros((1, 2, 6, 6), np.float32)
        with pytest.raises(exc, match=param):
            im2col(x, **dict(dict(kernel_size=3), **{param: value}))

    def test_int_like_params(self):
        x = np.arange(72, dtype=np.float32).reshape(1, 2, 6, 6)
        want = im2col(x, (3, 2), (2, 1))
        np.testing.assert_array_equal(im2col(x, (np.int64(3), np.int32(2)), np.array([2, 1])), want)
        np.testing.assert_array_equal(im2col(x, [3, 2], [np.uint8(2), 1]), want)
        np.testing.assert_array_equal(im2col(x, np.array(2), 2), im2col(x, (2, 2), (2, 2)))


class TestPad2d:
    def test_value_and_layout(self):
        x = np.ones((1, 2, 3, 3), np.float32)
        xp = pad2d(x, 1, -np.inf)
        assert xp.shape == (1, 2, 5, 5)
        assert np.isneginf(xp[0, 0, 0]).all() and (xp[:, :, 1:4, 1:4] == 1).all()
        xn = pad2d(np.ones((1, 3, 3, 2)), (2, 0), 0, "NHWC")
        assert xn.shape == (1, 7, 3, 2)
        assert pad2d(x, 0) is x


class TestCol2im:
    @settings(max_examples=40, deadline=None)
    @given(geometries(), st.sampled_from(["NCHW", "NHWC"]))
    def test_adjoint(self, geom, layout):
        # <im2col(x), g> == <x, col2im(g)>: col2im is the transpose of the linear map im2col.
        N, C, H, W, KH, KW, S, P, D = geom
        rng = np.random.default_rng(7)
        shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
        x = rng.standard_normal(shape)
        cols = im2col(x, (KH, KW), S, P, D, layout)
        g = rng.standard_normal(cols.shape)
        back = col2im(g, shape, (KH, KW), S, P, D, layout)
        assert back.shape == shape
        lhs, rhs = float((cols * g).sum()), float((x * back).sum())
        assert abs(lhs - rhs) <= 1e-9 * (np.abs(cols * g).sum() + 1)

    def test_shape_error(self):
        with pytest.raises(ValueError, match="cols must have shape"):
            col2im(np.zeros((3, 3)), (1, 1, 4, 4), 3)
