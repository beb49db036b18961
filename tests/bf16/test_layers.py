"""pycds.bf16.layers: PyTorch-named parameters, BF16 storage, forward vs the float64 oracle.

Sizes: N batch, C input channels, H x W input, K output channels, KH x KW
kernel, S stride, P padding.  Tolerances as in test_functional.py: raw fp32
inputs, so ``|y - ref| <= (gamma_{2n+6} + 2u + u^2) * sum|x||w|`` with
u = 2^-8 (BF16's 8-bit significand), n = C*KH*KW; fp32-only layers use
``rtol = atol = 1e-6``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as R
from pycds.bf16 import functional as F
from pycds.bf16 import layers as L
from pycds.bf16.convert import to_float32


class TestConv2d:
    def test_default_init_is_pytorch_like(self):
        conv = L.Conv2d(4, 6, 3, bias=True)
        assert conv.weight.shape == (6, 4, 3, 3) and conv.weight.dtype == np.uint16
        assert conv.bias.shape == (6,) and conv.bias.dtype == np.float32
        bound = 1 / np.sqrt(4 * 9)
        assert np.abs(to_float32(conv.weight)).max() <= bound * (1 + 2 ** -8)
        assert np.abs(conv.bias).max() <= bound
        assert L.Conv2d(4, 6, 3, bias=False).bias is None

    @settings(max_examples=30, deadline=None)
    @given(st.integers(1, 2), st.integers(1, 6), st.integers(5, 11), st.integers(1, 6),
           st.sampled_from([1, 3, 5, 7]), st.integers(1, 2), st.integers(0, 3),
           st.sampled_from(["NCHW", "NHWC"]), st.integers(0, 2 ** 32 - 1))
    def test_forward_against_reference(self, N, C, H, K, KH, S, P, layout, seed):
        rng = np.random.default_rng(seed)
        H = max(H, KH - 2 * P)
        W = H + 1
        x = rng.standard_normal((N, C, H, W)).astype(np.float32)
        conv = L.Conv2d(C, K, KH, S, P, layout=layout, rng=rng)
        w = to_float32(conv.weight)  # exactly what the layer multiplies
        xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
        y = conv(xin)
        if layout == "NHWC":
            y = y.transpose(0, 3, 1, 2)
        mag = R.conv2d(np.abs(x), np.abs(w), np.abs(conv.bias), S, P)
        R.assert_within(y, R.conv2d(x, w, conv.bias, S, P), R.dot_bound(mag, C * KH * KH, False),
                        f"Conv2d N,C,H,K,KH,S,P={(N, C, H, K, KH, S, P)}")

    def test_from_params_and_weight_assignment_repacks(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
        w1, w2 = rng.standard_normal((2, 5, 4, 3, 3)).astype(np.float32)
        b = rng.standard_normal(5).astype(np.float32)
        conv = L.Conv2d.from_params(w1, b, stride=2, padding=1)
        assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (4, 5, (3, 3))
        np.testing.assert_array_equal(conv(x), F.conv2d(x, w1, b, 2, 1))
        conv.weight = w2
        np.testing.assert_array_equal(conv(x), F.conv2d(x, w2, b, 2, 1))
        with pytest.raises(ValueError, match=r"weight must have shape \(5, 4, 3, 3\)"):
            conv.weight = np.zeros((5, 4, 1, 1), np.float32)

    def test_grouped(self):
        conv = L.Conv2d(6, 4, 3, padding=1, groups=2)
        assert conv.weight.shape == (4, 3, 3, 3)
        x = np.random.default_rng(0).standard_normal((1, 6, 5, 5)).astype(np.float32)
        np.testing.assert_array_equal(conv(x), F.conv2d(x, conv.weight, conv.bias, 1, 1, groups=2))
        with pytest.raises(ValueError, match="divisible by groups=4"):
            L.Conv2d(6, 4, 3, groups=4)


class TestLinear:
    def test_forward_against_reference(self):
        N, IN, OUT = 3, 50, 7
        rng = np.random.default_rng(0)
        lin = L.Linear(IN, OUT, rng=rng)
        assert lin.weight.shape == (OUT, IN) and lin.weight.dtype == np.uint16
        x = rng.standard_normal((N, IN)).astype(np.float32)
        w = to_float32(lin.weight)
        mag = R.linear(np.abs(x), np.abs(w), np.abs(lin.bias))
        R.assert_within(lin(x), R.linear(x, w, lin.bias), R.dot_bound(mag, IN, False), "Linear")

    def test_from_params(self):
        w = np.arange(6, dtype=np.float32).reshape(2, 3)
        lin = L.Linear.from_params(w, np.ones(2, np.float32))
        np.testing.assert_array_equal(lin(np.eye(3, dtype=np.float32)), w.T + 1)
        with pytest.raises(ValueError, match=r"bias must have shape \(2,\)"):
            L.Linear.from_params(w, np.ones(3))


class TestParameterFree:
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 8)).astype(np.float32)

    @pytest.mark.parametrize("layer, ref", [
        (L.MaxPool2d(3, 2, 1), lambda x: R.max_pool2d(x, 3, 2, 1)),
        (L.MaxPool2d(2), lambda x: R.max_pool2d(x, 2)),
        (L.AvgPool2d(3, 2, 1), lambda x: R.avg_pool2d(x, 3, 2, 1)),
        (L.AvgPool2d(2, count_include_pad=False), lambda x: R.avg_pool2d(x, 2, 2, 0, False)),
        (L.AdaptiveAvgPool2d((4, 3)), lambda x: R.adaptive_avg_pool2d(x, 4, 3)),
        (L.AdaptiveAvgPool2d(1), lambda x: R.adaptive_avg_pool2d(x, 1, 1)),
        (L.ReLU(), R.relu),
        (L.Dropout(0.5), lambda x: x),
    ])
    def test_against_reference(self, layer, ref):
        np.testing.assert_allclose(layer(self.x), ref(self.x), rtol=1e-6, atol=1e-6)

    def test_nhwc_layers_match_nchw(self):
        xn = self.x.transpose(0, 2, 3, 1)
        for make in (lambda lay: L.MaxPool2d(3, 2, 1, layout=lay),
                     lambda lay: L.AvgPool2d(2, layout=lay),
                     lambda lay: L.AdaptiveAvgPool2d((2, 5), layout=lay)):
            np.testing.assert_allclose(make("NHWC")(xn).transpose(0, 3, 1, 2), make("NCHW")(self.x),
                                       rtol=1e-6, atol=1e-6)

    def test_flatten_nhwc_gives_pytorch_order(self):
        np.testing.assert_array_equal(L.Flatten(layout="NHWC")(self.x.transpose(0, 2, 3, 1)),
                                      self.x.reshape(2, -1))

    def test_relu_inplace(self):
        x = self.x.copy()
        assert L.ReLU(inplace=True)(x) is x and (x >= 0).all()


class TestBatchNorm2d:
    def test_defaults_and_forward(self):
        bn = L.BatchNorm2d(3)
        np.testing.assert_allclose(bn(TestParameterFree.x), TestParameterFree.x / np.sqrt(1 + 1e-5), rtol=1e-6)
        rng = np.random.default_rng(1)
        bn.weight, bn.bias = rng.standard_normal((2, 3)).astype(np.float32)
        bn.running_mean, bn.running_var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3)
        x = TestParameterFree.x
        np.testing.assert_allclose(bn(x), R.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias),
                                   rtol=1e-5, atol=1e-6)


class TestSequential:
    def test_chain_against_reference(self):
        # A small LeNet-like chain; two BF16 layers, tolerance per layer as above, propagated
        # through ReLU/max (1-Lipschitz) and the second layer's |w| (mag2 uses |y1| bound).
        rng = np.random.default_rng(2)
        N, C, H, W, K = 2, 3, 10, 10, 4
        conv = L.Conv2d(C, K, 3, padding=1, rng=rng)
        net = L.Sequential(conv, L.ReLU(), L.MaxPool2d(2), L.Flatten(), L.Linear(K * 25, 6, rng=rng))
        assert len(net) == 5 and net[0] is conv and list(net)[1].__class__ is L.ReLU
        x = rng.standard_normal((N, C, H, W)).astype(np.float32)
        w1, lin = to_float32(conv.weight), net[4]
        w2 = to_float32(lin.weight)
        h = R.max_pool2d(R.relu(R.conv2d(x, w1, conv.bias, 1, 1)), 2).reshape(N, -1)
        ref = R.linear(h, w2, lin.bias)
        e1 = R.dot_bound(R.conv2d(np.abs(x), np.abs(w1), np.abs(conv.bias), 1, 1), C * 9, False)
        e1 = R.max_pool2d(e1, 2).reshape(N, -1)  # worst per-pool error, passed on by relu/max
        mag2 = R.linear(np.abs(h) + e1, np.abs(w2), np.abs(lin.bias))
        bound = R.dot_bound(mag2, K * 25, False) + R.linear(e1, np.abs(w2))
        R.assert_within(net(x), ref, bound, "Sequential")
        assert "Conv2d(3, 4" in repr(net)
