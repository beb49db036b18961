"""CNN layers as plain classes: PyTorch names, ``__call__`` is the forward.

Exports
-------
Conv2d, Linear, BatchNorm2d
    Parameterised layers.  Convolution and linear weights are held in BF16
    (``np.uint16`` bit patterns) and packed for ``sbgemm`` once, when the
    weight is assigned; biases and batch-norm parameters stay float32.
MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, ReLU, Flatten, Dropout, Sequential
    Parameter-free layers and the container.

Style follows tinygrad's ``nn`` module: no base class, ``weight``/``bias``
attributes named as in PyTorch, and the forward pass is ``__call__(x)``.
Spatial layers take ``layout="NCHW"`` (PyTorch's) or ``"NHWC"`` (what the
models in :mod:`pycds.bf16.models` use internally; see
:mod:`pycds.bf16.functional`).  Layers are for inference only.
"""

import numpy as np

from pycds.bf16 import functional as F

__all__ = [
    "Conv2d",
    "Linear",
    "BatchNorm2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    "ReLU",
    "Flatten",
    "Dropout",
    "Sequential",
]


def _uniform_init(rng, shape, fan_in):
    # PyTorch's default Conv/Linear init (kaiming_uniform_ with a=sqrt(5)):
    # U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike.
    bound = 1.0 / np.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def _as_bias(bias, n):
    # None or (n,) float32, C-contiguous; ValueError as functional's checks.
    b = F._check_bias(bias, n)
    return None if b is None else np.ascontiguousarray(b)


class Conv2d:
    """2-D convolution layer (``torch.nn.Conv2d``) with BF16 weights.

    Parameters
    ----------
    in_channels, out_channels : int
        ``C`` and ``K``.
    kernel_size : int or (int, int)
    stride, padding, dilation : int or (int, int)
    groups : int
    bias : bool
        Whether the layer has a bias.
    layout : {"NCHW", "NHWC"}
        Layout of the activations this layer consumes and produces.
    rng : numpy.random.Generator or False, optional
        For PyTorch's default initialisation ``U(-1/sqrt(fan_in),
        1/sqrt(fan_in))``; seed 0 if None.  ``False`` skips initialisation
        (``weight`` stays None until assigned); :meth:`from_params` builds
        from trained weights that way.

    Attributes
    ----------
    weight : ndarray of uint16, shape (K, C/groups, KH, KW)
        BF16 bit patterns.  Assigning any float32/BF16 array of that shape
        rounds it to BF16 and re-packs it (the only time packing happens).
    bias : ndarray of float32, shape (K,), or None
        Checked when the layer runs (ValueError for another shape).

    Raises
    ------
    ValueError
        If the channels are not divisible by `groups`, `layout` is unknown,
        or a geometry parameter is negative or not a pair.
    TypeError
        If `kernel_size`, `stride`, `padding` or `dilation` is not an int or
        a pair of ints (see :func:`pycds.bf16.im2col.im2col`).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, layout="NCHW", rng=None):
        KH, KW = F._pair(kernel_size, "kernel_size")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels={in_channels} and out_channels={out_channels} must be "
                f"divisible by groups={groups}"
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = (KH, KW)
        self.stride = F._pair(stride, "stride")
        self.padding = F._pair(padding, "padding")
        self.dilation = F._pair(dilation, "dilation")
        self.groups = groups
        F._check_layout(layout)
        self.layout = layout
        self._packed = None
        self._weight = None
        if rng is not False:
            rng = np.random.default_rng(0) if rng is None else rng
            fan_in = in_channels // groups * KH * KW
            self.weight = _uniform_init(rng, (out_channels, in_channels // groups, KH, KW), fan_in)
            self.bias = _uniform_init(rng, (out_channels,), fan_in) if bias else None

    @classmethod
    def from_params(cls, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
        """Build from trained parameters (no random initialisation).

        Parameters
        ----------
        weight : ndarray of float32 or BF16, shape (K, C/groups, KH, KW)
        bias : ndarray of float32, shape (K,), optional
        stride, padding, dilation, groups, layout
            As for the constructor.

        Returns
        -------
        Conv2d

        Raises
        ------
        ValueError
            If `weight` is not 4-D or `bias` is not real or not of shape (K,).
        """
        weight = np.asarray(weight)
        if weight.ndim != 4:
            raise ValueError(f"weight must be 4-D (K, C/groups, KH, KW), got shape {weight.shape}")
        K, Cg, KH, KW = weight.shape
        self = cls(Cg * groups, K, (KH, KW), stride, padding, dilation, groups,
                   bias=bias is not None, layout=layout, rng=False)
        self.weight = weight
        self.bias = _as_bias(bias, K)
        return self

    @property
    def weight(self):
        return self._weight

    @weight.setter
    def weight(self, w):
        expected = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        w = np.asarray(w)
        if w.shape != expected:
            raise ValueError(f"weight must have shape {expected}, got {w.shape}")
        self._weight = np.ascontiguousarray(F.as_bf16(w))  # (K, C/groups, KH, KW) uint16
        self._packed = F.pack_conv_weight(self._weight, self.groups)

    def __call__(self, x, residual=None):
        """Convolve x; return the float32 output in the layer's layout.

        x : (N, C, H, W) or (N, H, W, C) float32
        -> (N, K, OH, OW) or (N, OH, OW, K) float32.

        `residual` (optional, the output's shape) is added and overwritten
        with the result; see :func:`pycds.bf16.functional.conv2d`.
        """
        return F.conv2d(x, self._packed, self.bias, self.stride, self.padding, self.dilation,
                        self.groups, self.layout, residual)

    def bf16(self, x, residual=None, relu=False, workspace=None):
        """Convolve BF16 NHWC x, bias, residual and ReLU fused; return BF16.

        x : (N, H, W, C) BF16 (uint16 bits) -> (N, OH, OW, K) BF16, NHWC whatever
        ``layout`` says; bias, `residual` (BF16, overwritten with the result) and ReLU
        fused into the GEMM; `workspace`: im2col scratch.  See
        :func:`pycds.bf16.functional.conv2d_bf16`."""
        return F.conv2d_bf16(x, self._packed, self.bias, self.stride, self.padding,
                             self.dilation, self.groups, residual, relu, workspace)

    def __repr__(self):
        return (f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}, layout={self.layout!r})")


class Linear:
    """Fully connected layer (``torch.nn.Linear``) with BF16 weights.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
    rng : numpy.random.Generator or False, optional
        As for :class:`Conv2d`.

    Attributes
    ----------
    weight : ndarray of uint16, shape (out_features, in_features)
        BF16 bit patterns; assigning re-packs.
    bias : ndarray of float32, shape (out_features,), or None
        Checked when the layer runs (ValueError for another shape).
    """

    def __init__(self, in_features, out_features, bias=True, rng=None):
        self.in_features, self.out_features = in_features, out_features
        self._packed = None
        self._weight = None
        if rng is not False:
            rng = np.random.default_rng(0) if rng is None else rng
            self.weight = _uniform_init(rng, (out_features, in_features), in_features)
            self.bias = _uniform_init(rng, (out_features,), in_features) if bias else None

    @classmethod
    def from_params(cls, weight, bias=None):
        """Build from trained parameters.

        Parameters
        ----------
        weight : ndarray of float32 or BF16, shape (out_features, in_features)
        bias : ndarray of float32, shape (out_features,), optional

        Returns
        -------
        Linear

        Raises
        ------
        ValueError
            If `weight` is not 2-D or `bias` is not real or not of shape
            (out_features,).
        """
        weight = np.asarray(weight)
        if weight.ndim != 2:
            raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {weight.shape}")
        self = cls(weight.shape[1], weight.shape[0], bias=bias is not None, rng=False)
        self.weight = weight
        self.bias = _as_bias(bias, weight.shape[0])
        return self

    @property
    def weight(self):
        return self._weight

    @weight.setter
    def weight(self, w):
        expected = (self.out_features, self.in_features)
        w = np.asarray(w)
        if w.shape != expected:
            raise ValueError(f"weight must have shape {expected}, got {w.shape}")
        self._weight = np.ascontiguousarray(F.as_bf16(w))  # (out, in) uint16
        self._packed = F.pack_linear_weight(self._weight)

    def __call__(self, x):
        """x : (N, in_features) float32 -> (N, out_features) float32."""
        return F.linear(x, self._packed, self.bias)

    def __repr__(self):
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None})")


class BatchNorm2d:
    """Inference batch norm (``torch.nn.BatchNorm2d`` in eval mode), fp32.

    Parameters
    ----------
    num_features : int
        ``C``.
    eps : float
    layout : {"NCHW", "NHWC"}

    Attributes
    ----------
    weight, bias, running_mean, running_var : ndarray of float32, shape (C,)
        Initialised to 1, 0, 0, 1 (PyTorch's defaults).

    Notes
    -----
    The models fold batch norms into the preceding convolution at load
    (:func:`pycds.bf16.functional.fold_batch_norm`); this layer is for
    networks where that is not possible.
    """

    def __init__(self, num_features, eps=1e-5, layout="NCHW"):
        F._check_layout(layout)
        self.num_features, self.eps, self.layout = num_features, eps, layout
        self.weight = np.ones(num_features, np.float32)
        self.bias = np.zeros(num_features, np.float32)
        self.running_mean = np.zeros(num_features, np.float32)
        self.running_var = np.ones(num_features, np.float32)

    def __call__(self, x):
        """x : (N, C, H, W) or (N, H, W, C) float32 -> same shape float32."""
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.eps, self.layout)

    def __repr__(self):
        return f"BatchNorm2d({self.num_features}, eps={self.eps}, layout={self.layout!r})"


class MaxPool2d:
    """Max pooling (``torch.nn.MaxPool2d``, ``ceil_mode=False``).

    See ``functional.max_pool2d``."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, layout="NCHW"):
        F._check_layout(layout)
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.layout = layout

    def __call__(self, x):
        """Max-pool x; return the result in the layer's layout.

        x : (N, C, H, W) or (N, H, W, C) float32
        -> (N, C, OH, OW) or (N, OH, OW, C)."""
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.layout)

    def __repr__(self):
        return (f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, layout={self.layout!r})")


class AvgPool2d:
    """Average pooling (``torch.nn.AvgPool2d``, ``ceil_mode=False``).

    See ``functional.avg_pool2d``."""

    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad=True, layout="NCHW"):
        F._check_layout(layout)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.count_include_pad, self.layout = count_include_pad, layout

    def __call__(self, x):
        """Average-pool x; return the result in the layer's layout.

        x : (N, C, H, W) or (N, H, W, C) float32
        -> (N, C, OH, OW) or (N, OH, OW, C)."""
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.count_include_pad,
                            self.layout)

    def __repr__(self):
        return (f"AvgPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, layout={self.layout!r})")


class AdaptiveAvgPool2d:
    """Adaptive average pooling to ``output_size``.

    As ``torch.nn.AdaptiveAvgPool2d``."""

    def __init__(self, output_size, layout="NCHW"):
        F._check_layout(layout)
        self.output_size, self.layout = output_size, layout

    def __call__(self, x):
        """Adaptive-average-pool x; return the result in the layer's layout.

        x : (N, C, H, W) or (N, H, W, C) float32
        -> (N, C, OH, OW) or (N, OH, OW, C)."""
        return F.adaptive_avg_pool2d(x, self.output_size, self.layout)

    def __repr__(self):
        return f"AdaptiveAvgPool2d(output_size={self.output_size}, layout={self.layout!r})"


class ReLU:
    """ReLU, ``max(x, 0)``.

    ``inplace=True`` overwrites the input (torchvision's models do)."""

    def __init__(self, inplace=False):
        self.inplace = inplace

    def __call__(self, x):
        """x : float32, any shape -> same shape."""
        return F.relu(x, self.inplace)

    def __repr__(self):
        return f"ReLU(inplace={self.inplace})"


class Flatten:
    """Flatten from `start_dim` in NCHW element order (``torch.nn.Flatten``).

    With ``layout="NHWC"`` a 4-D input ``(N, H, W, C)`` is first viewed as
    ``(N, C, H, W)``, so the features come out channel-major exactly as
    PyTorch orders them and PyTorch-trained ``Linear`` weights apply.
    """

    def __init__(self, start_dim=1, layout="NCHW"):
        F._check_layout(layout)
        self.start_dim, self.layout = start_dim, layout

    def __call__(self, x):
        """x : (N, ...) -> (N, prod(...)) in NCHW order."""
        if self.layout == "NHWC" and x.ndim == 4:
            x = F.to_nchw(x)
        return F.flatten(x, self.start_dim)

    def __repr__(self):
        return f"Flatten(start_dim={self.start_dim}, layout={self.layout!r})"


class Dropout:
    """Identity at inference (``torch.nn.Dropout`` in eval mode).

    Keeps PyTorch's indices."""

    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, x):
        return x

    def __repr__(self):
        return f"Dropout(p={self.p})"


class Sequential:
    """Apply layers in order (``torch.nn.Sequential``).

    Index ``i`` names ``"{i}.weight"``.

    Parameters
    ----------
    *layers : callable
        Each maps an ndarray to an ndarray.
    """

    def __init__(self, *layers):
        self.layers = list(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        inner = "".join(f"\n  ({i}): {layer!r}" for i, layer in enumerate(self.layers))
        return f"Sequential({inner}\n)"
