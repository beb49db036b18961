"""pycds.bf16.functional against the float64 oracle in reference.py.

Sizes: N batch, C input channels, H x W input, K output channels, KH x KW
kernel, S stride, P padding, D dilation, G groups.

Tolerances (see reference.dot_bound), with u = 2^-8 the unit roundoff of
BF16's 8-bit significand and gamma_n = n*2^-24/(1 - n*2^-24):

* inputs pre-rounded to BF16 (the oracle sees the very values the kernel
  multiplies; products are exact in fp32): ``|y - ref| <= gamma_{2n+6} * mag``
  elementwise, ``mag = sum |x||w| + |b|`` and n = C/G*KH*KW terms;
* raw fp32 inputs (the layer's own rounding included): add ``(2u + u^2) * mag``;
* pooling, batch norm, softmax are fp32 throughout: ``rtol = 1e-6`` (a few
  fp32 ulps), ``atol = 1e-6`` for values near zero.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as R
from pycds.bf16 import functional as F
from pycds.bf16 import layers as L
from pycds.bf16.convert import to_bf16

FP32_RTOL = 1e-6
FP32_ATOL = 1e-6


@st.composite
def conv_cases(draw):
    G = draw(st.sampled_from([1, 1, 2, 3]))
    N = draw(st.integers(1, 3))
    C = G * draw(st.integers(1, 4))
    K = G * draw(st.integers(1, 5))
    KH = draw(st.sampled_from([1, 3, 5, 7]))
    KW = draw(st.sampled_from([1, 2, 3, 7]))
    S = draw(st.integers(1, 3))
    P = draw(st.integers(0, 3))
    D = draw(st.integers(1, 2))
    H = draw(st.integers(max(1, D * (KH - 1) + 1 - 2 * P), max(1, D * (KH - 1) + 1 - 2 * P) + 9))
    W = draw(st.integers(max(1, D * (KW - 1) + 1 - 2 * P), max(1, D * (KW - 1) + 1 - 2 * P) + 9))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return N, C, H, W, K, KH, KW, S, P, D, G, bias, seed


def _conv_inputs(N, C, H, W, K, KH, KW, G, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((K, C // G, KH, KW)).astype(np.float32)
    b = rng.standard_normal(K).astype(np.float32) if bias else None
    return x, w, b


class TestConv2d:
    @settings(max_examples=60, deadline=None)
    @given(conv_cases(), st.sampled_from(["NCHW", "NHWC"]), st.booleans())
    def test_against_reference(self, case, layout, prerounded):
        N, C, H, W, K, KH, KW, S, P, D, G, bias, seed = case
        x, w, b = _conv_inputs(N, C, H, W, K, KH, KW, G, bias, seed)
        if prerounded:
            x, w = R.bf16_round(x).astype(np.float32), R.bf16_round(w).astype(np.float32)
        ref = R.conv2d(x, w, b, S, P, D, G)  # (N, K, OH, OW) float64
        mag = R.conv2d(np.abs(x), np.abs(w), None if b is None else np.abs(b), S, P, D, G)
        xin = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        y = F.conv2d(xin, w, b, stride=S, padding=P, dilation=D, groups=G, layout=layout)
        assert y.dtype == np.float32
        if layout == "NHWC":
            y = y.transpose(0, 3, 1, 2)
        R.assert_within(y, ref, R.dot_bound(mag, C // G * KH * KW, prerounded),
                        f"conv2d N,C,H,W,K,KH,KW,S,P,D,G={case[:11]} {layout}")

    def test_output_shape_formula(self):
        N, C, H, W, K = 2, 3, 17, 12, 4
        y = F.conv2d(np.zeros((N, C, H, W), np.float32), np.zeros((K, C, 7, 3), np.float32),
                     stride=(2, 3), padding=(3, 1), dilation=(1, 2))
        assert y.shape == (N, K, (H + 6 - 6 - 1) // 2 + 1, (W + 2 - 4 - 1) // 3 + 1)

    def test_prepacked_equals_unpacked(self):
        x, w, b = _conv_inputs(2, 4, 9, 9, 6, 3, 3, 2, True, 1)
        packed = F.pack_conv_weight(w, groups=2)
        assert packed.shape == w.shape
        np.testing.assert_array_equal(F.conv2d(x, packed, b, 2, 1, groups=2),
                                      F.conv2d(x, w, b, 2, 1, groups=2))

    @pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
    @pytest.mark.parametrize("contiguous", [True, False])
    def test_residual_is_accumulated_in_place(self, layout, contiguous):
        N, C, H, W, K, S, P = 2, 3, 6, 5, 4, 2, 1
        x, w, b = _conv_inputs(N, C, H, W, K, 3, 3, 1, True, 4)
        ref = R.conv2d(R.bf16_round(x), R.bf16_round(w), b, S, P)  # (N, K, OH, OW) float64
        mag = R.conv2d(np.abs(R.bf16_round(x)), np.abs(R.bf16_round(w)), np.abs(b), S, P)
        r = np.random.default_rng(5).standard_normal(ref.shape).astype(np.float32)
        expect, bound = ref + r, R.dot_bound(mag + np.abs(r), C * 9, True)
        if layout == "NHWC":
            x, r = x.transpose(0, 2, 3, 1), r.transpose(0, 2, 3, 1)
            expect, bound = expect.transpose(0, 2, 3, 1), bound.transpose(0, 2, 3, 1)
        # NCHW-contiguous r is *not* contiguous in NHWC order, and vice versa
        r = np.ascontiguousarray(r) if contiguous else np.asfortranarray(r)
        y = F.conv2d(x, w, b, S, P, layout=layout, residual=r)
        assert y.shape == expect.shape
        assert np.shares_memory(y, r)  # overwritten in place, like BLAS's C
        R.assert_within(y, expect, bound, "conv2d + residual")
        with pytest.raises(ValueError, match="residual must be float32 with shape"):
            F.conv2d(x, w, b, S, P, layout=layout, residual=np.zeros((1, 2, 3, 4), np.float32))

    def test_bf16_weight_inputs(self):
        # uint16 bits and ml_dtypes.bfloat16 weights give the same result as the fp32 weight.
        x, w, b = _conv_inputs(1, 3, 6, 6, 2, 3, 3, 1, True, 2)
        wb = to_bf16(w)
        y = F.conv2d(x, w, b, padding=1)
        np.testing.assert_array_equal(F.conv2d(x, wb, b, padding=1), y)
        np.testing.assert_array_equal(F.conv2d(x, to_bf16(w, out="ml_dtypes"), b, padding=1), y)

    @pytest.mark.parametrize("kwargs, match", [
        (dict(x=np.zeros((1, 5, 8, 8), np.float32)), "channels"),
        (dict(x=np.zeros((5, 8, 8), np.float32)), "4-D"),
        (dict(groups=2), "divisible"),
        (dict(padding=0, x=np.zeros((1, 4, 2, 2), np.float32)), "larger than"),
        (dict(layout="HWCN"), "layout"),
    ])
    def test_errors(self, kwargs, match):
        args = dict(x=np.zeros((1, 4, 8, 8), np.float32), w=np.zeros((3, 4, 3, 3), np.float32))
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            F.conv2d(args.pop("x"), args.pop("w"), **args)


class TestConv2dBf16:
    """BF16 NHWC in and out, post-ops fused: the float64 reference of
    conv + bias + residual, ReLU, one BF16 rounding at the end."""

    @settings(max_examples=50, deadline=None)
    @given(conv_cases(), st.booleans(), st.booleans())
    def test_against_reference(self, case, with_res, relu):
        N, C, H, W, K, KH, KW, S, P, D, G, bias, seed = case
        x, w, b = _conv_inputs(N, C, H, W, K, KH, KW, G, bias, seed)
        x, w = R.bf16_round(x).astype(np.float32), R.bf16_round(w).astype(np.float32)
        ref = R.conv2d(x, w, b, S, P, D, G)  # (N, K, OH, OW) float64
        mag = R.conv2d(np.abs(x), np.abs(w), None if b is None else np.abs(b), S, P, D, G)
        res = None
        if with_res:
            res = to_bf16(np.random.default_rng(seed ^ 1).standard_normal(
                (N, ref.shape[2], ref.shape[3], K)).astype(np.float32))  # NHWC
            r = F.as_float32(res).transpose(0, 3, 1, 2).astype(np.float64)
            ref, mag = ref + r, mag + np.abs(r)
        xin = to_bf16(np.ascontiguousarray(x.transpose(0, 2, 3, 1)))  # (N, H, W, C) BF16
        y = F.conv2d_bf16(xin, w, b, stride=S, padding=P, dilation=D, groups=G,
                          residual=res, relu=relu)
        assert y.dtype == np.uint16 and y.flags.c_contiguous
        if res is not None:
            assert y.base is res or y is res or np.shares_memory(y, res)
        err_v = R.dot_bound(mag, C // G * KH * KW, True)
        if relu:
            ref = np.maximum(ref, 0.0)
        R.assert_within(F.as_float32(y).transpose(0, 3, 1, 2), ref,
                        err_v + R.U_BF16 * (np.abs(ref) + err_v),
                        f"conv2d_bf16 N,C,H,W,K,KH,KW,S,P,D,G={case[:11]}")

    @pytest.mark.parametrize("kernel", ["generic", "fallback", "avx512fma", "avx2fma"])
    def test_other_kernels(self, kernel):
        # the portable C kernel (scalar post-ops), the numpy fallback and the
        # FMA kernels of CPUs without BF16 instructions (where this CPU has them)
        from pycds.bf16 import gemm
        if kernel not in ("fallback",) + gemm.NATIVE_KERNELS:
            pytest.skip(f"this CPU cannot run {kernel}")
        prev = gemm._select_kernel(kernel)
        try:
            for case in [(1, 4, 9, 8, 6, 3, 3, 1, 1, 1, 1, True, 1),
                         (2, 6, 7, 5, 4, 3, 1, 2, 1, 1, 2, False, 2),
                         (1, 8, 5, 5, 16, 1, 1, 1, 0, 1, 1, True, 3)]:
                self.test_against_reference.hypothesis.inner_test(self, case, True, True)
        finally:
            gemm._select_kernel(prev)

    def test_same_as_fp32_conv_rounded(self):
        rng = np.random.default_rng(5)
        x = to_bf16(rng.standard_normal((2, 9, 7, 16)).astype(np.float32))  # NHWC
        w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
        b = rng.standard_normal(8).astype(np.float32)
        y32 = F.conv2d(F.as_float32(x), w, b, padding=1, layout="NHWC")
        y = F.conv2d_bf16(x, w, b, padding=1)
        diff = np.abs(F.as_float32(y) - y32)
        assert (diff <= 2.0 ** -8 * np.abs(y32) + 1e-6).all()

    def test_errors(self):
        x = np.zeros((1, 4, 4, 3), np.uint16)
        w = np.zeros((2, 3, 1, 1), np.float32)
        with pytest.raises(ValueError, match="residual"):
            F.conv2d_bf16(x, w, residual=np.zeros((1, 4, 4, 3), np.uint16))
        with pytest.raises(ValueError, match="channels"):
            F.conv2d_bf16(np.zeros((1, 4, 4, 5), np.uint16), w)

    @pytest.mark.parametrize("groups", [1, 2])
    @pytest.mark.parametrize("bias", [np.zeros(7, np.float32), np.zeros(3, np.float32),
                                      np.float32(1.0), np.zeros((1, 4), np.float32),
                                      np.zeros(4, np.complex64)])
    def test_bias_checked(self, groups, bias):
        # as conv2d: a bias of the wrong length is an error, not truncated
        x = np.zeros((1, 4, 4, 2), np.uint16)
        w = np.zeros((4, 2 // groups, 1, 1), np.float32)
        with pytest.raises(ValueError, match=r"bias must (have shape \(4,\)|be real)"):
            F.conv2d_bf16(x, w, bias, groups=groups)
        with pytest.raises(ValueError, match=r"bias must (have shape \(4,\)|be real)"):
            F.conv2d(x, w, bias, groups=groups, layout="NHWC")
        conv = L.Conv2d(2, 4, 1, groups=groups, layout="NHWC")
        conv.bias = bias
        with pytest.raises(ValueError, match=r"bias must (have shape \(4,\)|be real)"):
            conv.bf16(x)


class TestLinear:
    @settings(max_examples=30, deadline=None)
    @given(st.integers(1, 9), st.integers(1, 300), st.integers(1, 70), st.booleans(), st.booleans(),
           st.integers(0, 2 ** 32 - 1))
    def test_against_reference(self, N, IN, OUT, bias, prerounded, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((N, IN)).astype(np.float32)
        w = rng.standard_normal((OUT, IN)).astype(np.float32)
        b = rng.standard_normal(OUT).astype(np.float32) if bias else None
        if prerounded:
            x, w = R.bf16_round(x).astype(np.float32), R.bf16_round(w).astype(np.float32)
        y = F.linear(x, w, b)
        mag = R.linear(np.abs(x), np.abs(w), None if b is None else np.abs(b))
        R.assert_within(y, R.linear(x, w, b), R.dot_bound(mag, IN, prerounded), "linear")
        np.testing.assert_array_equal(F.linear(x, F.pack_linear_weight(w), b), y)

    def test_feature_mismatch(self):
        with pytest.raises(ValueError, match="in_features=3"):
            F.linear(np.zeros((2, 4), np.float32), np.zeros((5, 3), np.float32))

    def test_bf16_bias_is_bits(self):
        # uint16 is BF16 bits here as everywhere in pycds.bf16: 0x3F80 is
        # 1.0, not 16256.0 (the same for conv2d_bf16: functional._check_bias).
        rng = np.random.default_rng(3)
        x, w = rng.standard_normal((2, 3), np.float32), rng.standard_normal((5, 3), np.float32)
        bits = np.full(5, 0x3F80, np.uint16)
        np.testing.assert_array_equal(F.linear(x, w, bits), F.linear(x, w, np.ones(5, np.float32)))
        np.testing.assert_array_equal(F.linear(x, w, to_bf16(np.ones(5, np.float32), out="ml_dtypes")),
                                      F.linear(x, w, np.ones(5, np.float32)))
        from pycds.bf16 import gemm
        a, b = to_bf16(x), gemm.pack(to_bf16(w.T.copy()))
        np.testing.assert_array_equal(gemm.sbgemm_fused(a, b, bias=bits),
                                      gemm.sbgemm_fused(a, b, bias=np.ones(5, np.float32)))

    @pytest.mark.parametrize("bias", [np.ones(1, np.float32), np.ones((2, 5), np.float32),
                                      np.ones(4, np.float32), np.float32(1.0),
                                      np.ones(5, np.complex64)])
    def test_bias_checked(self, bias):
        # shape (out_features,) only: no broadcasting of (1,) or (N, out)
        x, w = np.zeros((2, 3), np.float32), np.zeros((5, 3), np.float32)
        with pytest.raises(ValueError, match=r"bias must (have shape \(5,\)|be real)"):
            F.linear(x, w, bias)
        lin = L.Linear(3, 5)
        lin.bias = bias
        with pytest.raises(ValueError, match=r"bias must (have shape \(5,\)|be real)"):
            lin(x)


@st.composite
def pool_cases(draw):
    N = draw(st.integers(1, 3))
    C = draw(st.integers(1, 4))
    K = draw(st.integers(1, 4))
    S = draw(st.integers(1, 3))
    P = draw(st.integers(0, K // 2))
    D = draw(st.integers(1, 2))
    lo = max(1, D * (K - 1) + 1 - 2 * P)
    H = draw(st.integers(lo, lo + 8))
    W = draw(st.integers(lo, lo + 8))
    return N, C, H, W, K, S, P, D


class TestPooling:
    @settings(max_examples=40, deadline=None)
    @given(pool_cases(), st.sampled_from(["NCHW", "NHWC"]))
    def test_max_pool(self, case, layout):
        N, C, H, W, K, S, P, D = case
        x = np.random.default_rng(sum(case)).standard_normal((N, C, H, W)).astype(np.float32)
        xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
        y = F.max_pool2d(xin, K, S, P, D, layout=layout)
        if layout == "NHWC":
            y = y.transpose(0, 3, 1, 2)
        np.testing.assert_array_equal(y, R.max_pool2d(x, K, S, P, D))  # a selection: exact

    @settings(max_examples=40, deadline=None)
    @given(pool_cases(), st.sampled_from(["NCHW", "NHWC"]), st.booleans())
    def test_avg_pool(self, case, layout, count_include_pad):
        N, C, H, W, K, S, P, _ = case
        x = np.random.default_rng(sum(case)).standard_normal((N, C, H, W)).astype(np.float32)
        xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
        y = F.avg_pool2d(xin, K, S, P, count_include_pad, layout=layout)
        if layout == "NHWC":
            y = y.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(y, R.avg_pool2d(x, K, S, P, count_include_pad),
                                   rtol=FP32_RTOL, atol=FP32_ATOL)

    @settings(max_examples=40, deadline=None)
    @given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 12), st.integers(1, 12),
           st.integers(1, 7), st.integers(1, 7), st.sampled_from(["NCHW", "NHWC"]))
    def test_adaptive_avg_pool(self, N, C, H, W, OH, OW, layout):
        x = np.random.default_rng(H * W).standard_normal((N, C, H, W)).astype(np.float32)
        xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
        y = F.adaptive_avg_pool2d(xin, (OH, OW), layout=layout)
        if layout == "NHWC":
            y = y.transpose(0, 3, 1, 2)
        assert y.shape == (N, C, OH, OW)
        np.testing.assert_allclose(y, R.adaptive_avg_pool2d(x, OH, OW), rtol=FP32_RTOL, atol=FP32_ATOL)

    def test_max_pool_of_nonnegative_bf16_bits(self):
        # after a ReLU, BF16 bits pool as int16 exactly as the values do (ResNet-50's stem)
        x = to_bf16(np.abs(np.random.default_rng(9).standard_normal((2, 11, 10, 5)))
                    .astype(np.float32))  # NHWC, >= 0
        got = F.max_pool2d(x.view(np.int16), 3, 2, 1, layout="NHWC").view(np.uint16)
        want = F.max_pool2d(F.as_float32(x), 3, 2, 1, layout="NHWC")
        np.testing.assert_array_equal(F.as_float32(got), want)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
    def test_max_pool_keeps_dtype(self, dtype):
        x = np.arange(16, dtype=dtype).reshape(1, 1, 4, 4)
        y = F.max_pool2d(x, 2)
        assert y.dtype == dtype and y.tolist() == [[[[5, 7], [13, 15]]]]

    @pytest.mark.parametrize("kwargs, exc", [
        (dict(kernel_size=(2.7, 3)), TypeError), (dict(kernel_size="33"), TypeError),
        (dict(kernel_size=(True, True)), TypeError), (dict(kernel_size=True), TypeError),
        (dict(kernel_size=2.0), TypeError), (dict(kernel_size=None), TypeError),
        (dict(kernel_size=2, stride=(1, "1")), TypeError),
        (dict(kernel_size=2, padding=-1), ValueError),
        (dict(kernel_size=(2, 2, 2)), ValueError),
    ])
    def test_pool_params_checked(self, kwargs, exc):
        x = np.zeros((1, 1, 6, 6), np.float32)
        with pytest.raises(exc, match=r"must be an int or a pair of ints|non-negative"):
            F.max_pool2d(x, **kwargs)

    def test_max_pool_padding_limit(self):
        with pytest.raises(ValueError, match="at most half"):
            F.max_pool2d(np.zeros((1, 1, 6, 6), np.float32), 2, padding=2)


class TestBatchNorm:
    def _params(self, C, seed=0):
        rng = np.random.default_rng(seed)
        return (rng.standard_normal(C).astype(np.float32), rng.uniform(0.5, 2, C).astype(np.float32),
                rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32))

    @pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
    def test_against_reference(self, layout):
        N, C, H, W = 2, 5, 4, 3
        mean, var, gamma, beta = self._params(C)
        x = np.random.default_rng(1).standard_normal((N, C, H, W)).astype(np.float32)
        xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
        y = F.batch_norm(xin, mean, var, gamma, beta, layout=layout)
        if layout == "NHWC":
            y = y.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(y, R.batch_norm(x, mean, var, gamma, beta), rtol=1e-5, atol=FP32_ATOL)

    @settings(max_examples=25, deadline=None)
    @given(st.integers(1, 2), st.integers(1, 6), st.integers(1, 8), st.sampled_from([1, 3, 7]),
           st.integers(1, 2), st.integers(0, 3), st.integers(0, 2 ** 32 - 1))
    def test_fold(self, N, C, H, K, S, P, seed):
        # bn(conv(x, w) + b) == conv(x, w_folded) + b_folded, in float64 (fold is exact math).
        rng = np.random.default_rng(seed)
        Kout = C + 1
        H = max(H, K - 2 * P)
        x = rng.standard_normal((N, C, H, H))
        w = rng.standard_normal((Kout, C, K, K)).astype(np.float32)
        b = rng.standard_normal(Kout).astype(np.float32)
        mean, var, gamma, beta = self._params(Kout, seed % 1000)
        wf, bf = F.fold_batch_norm(w, b, gamma, beta, mean, var)
        assert wf.dtype == np.float32 and bf.dtype == np.float32 and wf.shape == w.shape
        lhs = R.batch_norm(R.conv2d(x, w, b, S, P), mean, var, gamma, beta)
        rhs = R.conv2d(x, wf, bf, S, P)
        mag = R.conv2d(np.abs(x), np.abs(wf), np.abs(bf), S, P)
        # folded parameters are rounded to fp32 once: relative 2^-24 per term
        R.assert_within(rhs, lhs, 4 * R.U_FP32 * (mag + np.abs(lhs)) + 1e-12, "fold")

    def test_fold_without_bias_and_bad_length(self):
        wf, bf = F.fold_batch_norm(np.ones((2, 1, 1, 1), np.float32), None, np.ones(2), np.zeros(2),
                                   np.zeros(2), np.ones(2), eps=0.0)
        np.testing.assert_array_equal(bf, 0)
        np.testing.assert_array_equal(wf, 1)
        with pytest.raises(ValueError, match=r"shape \(2,\)"):
            F.fold_batch_norm(np.ones((2, 1, 1, 1)), None, np.ones(3), np.zeros(2), np.zeros(2), np.ones(2))


class TestElementwise:
    def test_relu(self):
        x = np.array([-1.5, -0.0, 0.0, 2.0, np.nan], np.float32)
        y = F.relu(x)
        np.testing.assert_array_equal(y[:4], [0, 0, 0, 2])
        assert np.isnan(y[4]) and x[0] == -1.5
        F.relu(x, inplace=True)
        assert x[0] == 0

    def test_relu_bf16_commutes_with_rounding(self):
        x = np.random.default_rng(1).standard_normal(1000).astype(np.float32) * 100
        x[:6] = [-0.0, 0.0, np.inf, -np.inf, 1e-40, -1e-40]  # signed zeros, infinities, subnormals
        b = to_bf16(x)
        np.testing.assert_array_equal(F.relu_bf16(b), to_bf16(F.relu(x)) & np.uint16(0x7FFF))
        assert F.relu_bf16(b).dtype == np.uint16 and b[0] == 0x8000  # not in place by default
        F.relu_bf16(b, inplace=True)
        assert b[0] == 0 and (b < 0x8000).all()

    def test_softmax(self):
        x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32) * 30
        y = F.softmax(x)
        np.testing.assert_allclose(y, R.softmax(x), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(y.sum(axis=-1), 1, rtol=1e-6)
        assert np.isfinite(F.softmax(np.array([[1e30, 0]], np.float32))).all()

    def test_flatten(self):
        x = np.arange(24).reshape(2, 3, 2, 2)
        np.testing.assert_array_equal(F.flatten(x), x.reshape(2, 12))
        assert F.flatten(x, 2).shape == (2, 3, 4)
