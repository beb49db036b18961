"""AlexNet, ResNet-50 and the LeNet-style digits CNN, built from state dicts.

Exports
-------
AlexNet, ResNet50, LeNetDigits
    Inference models.  Build with ``Model(state_dict)`` or
    ``Model.from_file(path)``; call with a float32 NCHW batch.
alexnet_shapes(num_classes=1000), resnet50_shapes(num_classes=1000), lenet_digits_shapes()
    The expected state-dict keys and shapes (torchvision's names).
load_state_dict(path), save_state_dict(state_dict, path, metadata=None)
    ``.npz`` and ``.safetensors`` weight files.
load_lenet_digits(), load_digits_test()
    The shipped trained digits model and its held-out test split.

Topologies and parameter names follow torchvision (``models/alexnet.py``:
Krizhevsky et al. 2012 as in the "one weird trick" variant;
``models/resnet.py``: He et al. 2016, ResNet v1.5 with the stride on the
3x3 convolution), so ``torchvision.models.resnet50().state_dict()``
converted to numpy loads as is.  LeNet follows LeCun et al. 1998
("Gradient-Based Learning Applied to Document Recognition"): two
convolution + subsampling stages and two fully connected layers, scaled to
the 8x8 scans of scikit-learn's digits.

At load every ``convX``/``bnX`` pair is folded into one convolution with a
bias (:func:`pycds.bf16.functional.fold_batch_norm`), rounded to BF16 once
and packed once; the folded layers keep the convolution's name.  The
models run NHWC internally (one transpose of the input) and return what
torchvision returns.

State-dict values may be float32/float64/float16, ``ml_dtypes.bfloat16``, or
``np.uint16`` (taken as BF16 bit patterns); other integer arrays are cast to
float, and any other dtype (complex, bool, strings, objects) is refused.
``num_batches_tracked`` keys are ignored.
"""

import json
import os
import threading
import zipfile
import zlib

import numpy as np

from pycds.bf16 import functional as F
from pycds.bf16.convert import _real_dtype
from pycds.bf16.layers import (
    AdaptiveAvgPool2d,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
)

__all__ = [
    "AlexNet",
    "ResNet50",
    "LeNetDigits",
    "alexnet_shapes",
    "resnet50_shapes",
    "lenet_digits_shapes",
    "random_state_dict",
    "load_state_dict",
    "save_state_dict",
    "load_lenet_digits",
    "load_digits_test",
    "LENET_DIGITS_FILE",
    "DIGITS_TEST_FILE",
    "TRAINING_KEY",
]

LENET_DIGITS_FILE = "lenet_digits.safetensors"
DIGITS_TEST_FILE = "digits_test.npz"
TRAINING_KEY = "pycds.training"  # safetensors metadata key: JSON training record

_NHWC = "NHWC"


# --------------------------------------------------------------------------
# weight files


def load_state_dict(path):
    """Read a state dict from ``.npz`` or ``.safetensors``.

    Parameters
    ----------
    path : str or os.PathLike
        ``*.npz`` (``numpy.load``; uint16 arrays are BF16 bits) or
        ``*.safetensors`` (``safetensors.numpy.load_file``; its BF16 dtype
        arrives as ``ml_dtypes.bfloat16``).

    Returns
    -------
    dict of str to ndarray
        Parameter name -> array, as stored.

    Raises
    ------
    ValueError
        If the suffix is neither ``.npz`` nor ``.safetensors``, or the file
        is not a valid file of that format (truncated, garbage, a ``.npy``
        named ``.npz``, object arrays): the message names the file, and the
        parser's own exception (numpy's, zipfile's, or safetensors'
        ``SafetensorError``) is the ``__cause__``.
    OSError
        If the file cannot be opened or read (``FileNotFoundError``, ...).
    """
    path = os.fspath(path)
    if path.endswith(".npz"):
        try:
            z = np.load(path, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):   # a .npy file
                raise ValueError(f"a single {type(z).__name__}, not an .npz archive")
            with z:
                return {k: z[k] for k in z.files}
        except (ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
            raise ValueError(f"not a valid .npz file: {path!r} ({exc})") from exc
    if path.endswith(".safetensors"):
        if _safetensors_has_bf16(path):
            import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype name safetensors asks numpy for)
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return load_file(path)
        except (SafetensorError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a valid .safetensors file: {path!r} ({exc})") from exc
    raise ValueError(f"weights file must end in .npz or .safetensors, got {path!r}")


def _safetensors_has_bf16(path):
    # Whether the header of safetensors file `path` lists a BF16 tensor, so
    # that numpy needs ml_dtypes' bfloat16 (importing ml_dtypes costs about
    # 0.4 s, more than reading all-MiniLM-L6-v2's 90 MB of fp32).  True when
    # the header cannot be read: load_file then reports the problem.
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if n <= 100 << 20 else None
    except (OSError, ValueError):
        return True
    if not isinstance(header, dict):
        return True
    return any(isinstance(v, dict) and v.get("dtype") == "BF16" for v in header.values())


def save_state_dict(state_dict, path, metadata=None):
    """Write a state dict to ``.npz`` or ``.safetensors``.

    Parameters
    ----------
    state_dict : dict of str to ndarray
        float arrays, ``ml_dtypes.bfloat16`` or uint16 BF16 bits.  In
        ``.npz`` BF16 is stored as uint16 bits; in ``.safetensors`` as its
        ``BF16`` dtype (uint16 input is viewed as bfloat16).
    path : str or os.PathLike
    metadata : dict of str to str, optional
        Stored in the safetensors header (ignored for ``.npz``).

    Raises
    ------
    ValueError
        If the suffix is neither ``.npz`` nor ``.safetensors``.
    """
    path = os.fspath(path)
    if path.endswith(".npz"):
        arrays = {k: (v.view(np.uint16) if v.dtype.name == "bfloat16" else v)
                  for k, v in ((k, np.asarray(v)) for k, v in state_dict.items())}
        np.savez(path, **arrays)
        return
    if path.endswith(".safetensors"):
        import ml_dtypes
        from safetensors.numpy import save_file

        arrays = {k: np.ascontiguousarray(v.view(ml_dtypes.bfloat16) if v.dtype == np.uint16 else v)
                  for k, v in ((k, np.asarray(v)) for k, v in state_dict.items())}
        save_file(arrays, path, metadata=metadata)
        return
    raise ValueError(f"weights file must end in .npz or .safetensors, got {path!r}")


def _real(a):
    # True if `a` holds real numbers: float, integer or ml_dtypes.bfloat16.
    return _real_dtype(np.asarray(a).dtype)


def _check_state_dict(sd, shapes, model):
    # All problems at once (pypa/installer style): missing, unexpected, bad
    # shape, not real numbers.
    keys = {k for k in sd if not k.endswith("num_batches_tracked")}
    issues = [f"missing {k!r}" for k in shapes if k not in keys]
    issues += [f"unexpected {k!r}" for k in sorted(keys - shapes.keys())]
    issues += [f"{k!r}: expected shape {shapes[k]}, got {tuple(np.shape(sd[k]))}"
               for k in shapes if k in keys and tuple(np.shape(sd[k])) != shapes[k]]
    issues += [f"{k!r}: dtype {np.asarray(sd[k]).dtype} is not real numbers "
               f"(float, integer or BF16)" for k in shapes if k in keys and not _real(sd[k])]
    if issues:
        raise ValueError(f"state dict does not fit {model}: " + "; ".join(issues))


def _f32(a):
    return F.as_float32(a)


def _conv(sd, name, stride=1, padding=0, bias=True):
    # Conv2d from "<name>.weight" / "<name>.bias".
    b = _f32(sd[name + ".bias"]) if bias else None
    return Conv2d.from_params(sd[name + ".weight"], b, stride, padding, layout=_NHWC)


def _conv_bn(sd, conv, bn, stride=1, padding=0):
    # Conv2d with batch norm "<bn>.*" folded in (torchvision convs have no bias).
    w, b = F.fold_batch_norm(sd[conv + ".weight"], None, _f32(sd[bn + ".weight"]),
                             _f32(sd[bn + ".bias"]), _f32(sd[bn + ".running_mean"]),
                             _f32(sd[bn + ".running_var"]))
    return Conv2d.from_params(w, b, stride, padding, layout=_NHWC)


def _linear(sd, name):
    return Linear.from_params(sd[name + ".weight"], _f32(sd[name + ".bias"]))


def _num_classes(sd, key, default=1000):
    # Rows of the last layer's 2-D weight; `default` when it is missing or
    # misshapen (then _check_state_dict reports it: ValueError).
    shape = np.shape(sd[key]) if key in sd else ()
    return int(shape[0]) if len(shape) == 2 else default


class _StateDictModel:
    """A network built from a state dict of numpy arrays."""

    @classmethod
    def from_file(cls, path):
        """Return a model loaded from ``.npz`` / ``.safetensors``.

        See :func:`load_state_dict`."""
        return cls(load_state_dict(path))


# --------------------------------------------------------------------------
# AlexNet


def alexnet_shapes(num_classes=1000):
    """Parameter names and shapes of torchvision's ``alexnet(num_classes)``.

    Returns
    -------
    dict of str to tuple of int
        ``features.{0,3,6,8,10}.{weight,bias}``, ``classifier.{1,4,6}.{weight,bias}``.
    """
    convs = {0: (64, 3, 11), 3: (192, 64, 5), 6: (384, 192, 3), 8: (256, 384, 3), 10: (256, 256, 3)}
    fcs = {1: (4096, 256 * 6 * 6), 4: (4096, 4096), 6: (num_classes, 4096)}
    shapes = {}
    for i, (K, C, KH) in convs.items():
        shapes[f"features.{i}.weight"] = (K, C, KH, KH)
        shapes[f"features.{i}.bias"] = (K,)
    for i, (O, I) in fcs.items():
        shapes[f"classifier.{i}.weight"] = (O, I)
        shapes[f"classifier.{i}.bias"] = (O,)
    return shapes


class AlexNet(_StateDictModel):
    """AlexNet inference with BF16 weights (torchvision topology and names).

    Parameters
    ----------
    state_dict : dict of str to ndarray
        torchvision ``alexnet`` parameters (see :func:`alexnet_shapes`);
        ``num_classes`` is taken from ``classifier.6.weight``.

    Attributes
    ----------
    features : Sequential
        conv11/4 64 - relu - pool3/2 - conv5 192 - relu - pool - conv3 384 -
        relu - conv3 256 - relu - conv3 256 - relu - pool (indices 0..12).
    avgpool : AdaptiveAvgPool2d
        To 6x6.
    classifier : Sequential
        dropout - fc 9216->4096 - relu - dropout - fc 4096->4096 - relu -
        fc 4096->num_classes (indices 0..6; dropout is the identity).

    Raises
    ------
    ValueError
        If the state dict has missing, unexpected or misshapen entries.
    """

    def __init__(self, state_dict):
        sd = state_dict
        self.num_classes = _num_classes(sd, "classifier.6.weight")
        _check_state_dict(sd, alexnet_shapes(self.num_classes), "AlexNet")
        self.features = Sequential(
            _conv(sd, "features.0", 4, 2), ReLU(True), MaxPool2d(3, 2, layout=_NHWC),
            _conv(sd, "features.3", 1, 2), ReLU(True), MaxPool2d(3, 2, layout=_NHWC),
            _conv(sd, "features.6", 1, 1), ReLU(True),
            _conv(sd, "features.8", 1, 1), ReLU(True),
            _conv(sd, "features.10", 1, 1), ReLU(True), MaxPool2d(3, 2, layout=_NHWC),
        )
        self.avgpool = AdaptiveAvgPool2d((6, 6), layout=_NHWC)
        self.flatten = Flatten(1, layout=_NHWC)
        self.classifier = Sequential(
            Dropout(), _linear(sd, "classifier.1"), ReLU(True),
            Dropout(), _linear(sd, "classifier.4"), ReLU(True),
            _linear(sd, "classifier.6"),
        )
        self._workspace = _Workspace()

    def __call__(self, x):
        """Logits.

        The features run on BF16 NHWC activations, as ResNet50's: each
        convolution's bias and ReLU are fused into its GEMM
        (``Conv2d.bf16``), and the pools read the BF16 bits.

        Parameters
        ----------
        x : ndarray of float32, shape (N, 3, H, W)
            Normalised images; ``H, W >= 63`` (224 for ImageNet models).

        Returns
        -------
        ndarray of float32, shape (N, num_classes)
        """
        x = F.as_bf16(F.to_nhwc(np.asarray(x, np.float32)))  # (N, H, W, 3) BF16
        f, ws = self.features, self._workspace
        for conv, pool in ((f[0], f[2]), (f[3], f[5]), (f[6], None), (f[8], None),
                           (f[10], f[12])):
            x = conv.bf16(x, relu=True, workspace=ws(_cols_elems(conv, x.shape)))
            if pool is not None:
                # Non-negative BF16 bits pool exactly as int16 (their order is the values').
                x = pool(x.view(np.int16)).view(np.uint16)
        x = self.avgpool(F.as_float32(x))  # (N, 6, 6, 256)
        return self.classifier(self.flatten(x))  # (N, 9216) -> (N, num_classes)


# --------------------------------------------------------------------------
# ResNet-50

_RESNET50_LAYERS = (3, 4, 6, 3)
_RESNET50_WIDTHS = (64, 128, 256, 512)
_EXPANSION = 4


def resnet50_shapes(num_classes=1000):
    """Parameter names and shapes of torchvision's ``resnet50(num_classes)``.

    Returns
    -------
    dict of str to tuple of int
        ``conv1``, ``bn1``, ``layer{1..4}.{i}.{conv,bn}{1,2,3}``,
        ``layer{1..4}.0.downsample.{0,1}``, ``fc`` (batch norms with
        ``weight``, ``bias``, ``running_mean``, ``running_var``).
    """
    shapes = {"conv1.weight": (64, 3, 7, 7)}

    def bn(name, c):
        for p in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.{p}"] = (c,)

    bn("bn1", 64)
    inplanes = 64
    for li, (blocks, width) in enumerate(zip(_RESNET50_LAYERS, _RESNET50_WIDTHS), 1):
        for bi in range(blocks):
            p = f"layer{li}.{bi}"
            shapes[f"{p}.conv1.weight"] = (width, inplanes, 1, 1)
            bn(f"{p}.bn1", width)
            shapes[f"{p}.conv2.weight"] = (width, width, 3, 3)
            bn(f"{p}.bn2", width)
            shapes[f"{p}.conv3.weight"] = (width * _EXPANSION, width, 1, 1)
            bn(f"{p}.bn3", width * _EXPANSION)
            if bi == 0:
                shapes[f"{p}.downsample.0.weight"] = (width * _EXPANSION, inplanes, 1, 1)
                bn(f"{p}.downsample.1", width * _EXPANSION)
            inplanes = width * _EXPANSION
    shapes["fc.weight"] = (num_classes, 512 * _EXPANSION)
    shapes["fc.bias"] = (num_classes,)
    return shapes


class Bottleneck:
    """torchvision's ``Bottleneck`` (v1.5) with folded batch norms, NHWC.

    ``relu(conv3(relu(conv2(relu(conv1(x))))) + downsample(x))``; conv2
    carries the stride.  Attributes ``conv1``, ``conv2``, ``conv3`` (each
    with its ``bnX`` folded in) and ``downsample`` (a folded 1x1 conv or None).
    """

    def __init__(self, sd, prefix, stride):
        self.conv1 = _conv_bn(sd, f"{prefix}.conv1", f"{prefix}.bn1")
        self.conv2 = _conv_bn(sd, f"{prefix}.conv2", f"{prefix}.bn2", stride, 1)
        self.conv3 = _conv_bn(sd, f"{prefix}.conv3", f"{prefix}.bn3")
        self.downsample = None
        if f"{prefix}.downsample.0.weight" in sd:
            self.downsample = _conv_bn(sd, f"{prefix}.downsample.0", f"{prefix}.downsample.1", stride)

    def __call__(self, x, workspace=None):
        """x : (N, H, W, C) BF16 (uint16 bits) -> (N, H/S, W/S, 4*width) BF16.

        Activations stay BF16 between convolutions: each convolution rounds
        its fp32 result to BF16 with its bias, the shortcut and the ReLU
        fused into the GEMM (functional.conv2d_bf16), as PyTorch's bf16
        inference rounds every layer's output.  `x` must be C-contiguous;
        it is overwritten when it is the shortcut (no downsample).
        `workspace(n)` (optional) returns im2col scratch of at least n
        uint16 elements.
        """
        out = self.conv1.bf16(x, relu=True)  # (N, H, W, width)
        ws = None if workspace is None else workspace(_cols_elems(self.conv2, out.shape))
        out = self.conv2.bf16(out, relu=True, workspace=ws)  # (N, H/S, W/S, width)
        shortcut = x if self.downsample is None else self.downsample.bf16(x)  # (N, H/S, W/S, 4*width)
        return self.conv3.bf16(out, residual=shortcut, relu=True)  # written into shortcut


def _cols_elems(conv, x_shape):
    """Elements of conv's im2col matrix for an NHWC input of x_shape."""
    N, H, W, C = x_shape
    (KH, KW), (SH, SW), (PH, PW), (DH, DW) = conv.kernel_size, conv.stride, conv.padding, \
        conv.dilation
    return (N * F.conv_output_size(H, KH, SH, PH, DH) * F.conv_output_size(W, KW, SW, PW, DW)
            * KH * KW * C)


class _Workspace(threading.local):
    """Per-thread im2col scratch of a model, reused by every layer.

    Per-thread im2col scratch of a model (uint16), grown on demand and
    reused by every layer of every call: a fresh array per layer would pay
    its page faults each time (two thirds of im2col's time here)."""

    buf = None

    def __call__(self, n):
        if self.buf is None or self.buf.size < n:
            self.buf = np.empty(n, dtype=np.uint16)
        return self.buf


class ResNet50(_StateDictModel):
    """ResNet-50 inference with BF16 weights (torchvision topology and names).

    Parameters
    ----------
    state_dict : dict of str to ndarray
        torchvision ``resnet50`` parameters (see :func:`resnet50_shapes`);
        ``num_classes`` is taken from ``fc.weight``.

    Attributes
    ----------
    conv1 : Conv2d
        7x7/2, 64, with ``bn1`` folded.
    maxpool : MaxPool2d
        3x3/2, padding 1.
    layer1, layer2, layer3, layer4 : Sequential of Bottleneck
        3, 4, 6, 3 blocks of widths 64, 128, 256, 512 (outputs 4x).
    fc : Linear
        2048 -> num_classes.

    Raises
    ------
    ValueError
        If the state dict has missing, unexpected or misshapen entries.
    """

    def __init__(self, state_dict):
        sd = state_dict
        self.num_classes = _num_classes(sd, "fc.weight")
        _check_state_dict(sd, resnet50_shapes(self.num_classes), "ResNet50")
        self.conv1 = _conv_bn(sd, "conv1", "bn1", 2, 3)
        self.maxpool = MaxPool2d(3, 2, 1, layout=_NHWC)
        for li, blocks in enumerate(_RESNET50_LAYERS, 1):
            stride = 1 if li == 1 else 2
            layer = Sequential(*(Bottleneck(sd, f"layer{li}.{bi}", stride if bi == 0 else 1)
                                 for bi in range(blocks)))
            setattr(self, f"layer{li}", layer)
        self.fc = _linear(sd, "fc")
        self._workspace = _Workspace()

    def __call__(self, x):
        """Logits.

        Parameters
        ----------
        x : ndarray of float32, shape (N, 3, H, W)
            Normalised images (224x224 for ImageNet models; any ``H, W >= 1``).

        Returns
        -------
        ndarray of float32, shape (N, num_classes)
        """
        x = F.as_bf16(F.to_nhwc(np.asarray(x, np.float32)))  # (N, H, W, 3) BF16
        x = self.conv1.bf16(x, relu=True, workspace=self._workspace(
            _cols_elems(self.conv1, x.shape)))  # (N, H/2, W/2, 64) BF16, all >= +0
        # Non-negative BF16 bits pool exactly as int16 (their order is the values').
        x = self.maxpool(x.view(np.int16)).view(np.uint16)  # (N, H/4, W/4, 64)
        ws = self._workspace
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in layer:
                x = block(x, ws)  # ends (N, H/32, W/32, 2048) BF16
        x = F.as_float32(x).mean(axis=(1, 2), dtype=np.float32)  # (N, 2048): avgpool + flatten
        return self.fc(x)  # (N, num_classes)


# --------------------------------------------------------------------------
# LeNet-style digits CNN


def lenet_digits_shapes():
    """Parameter names and shapes of :class:`LeNetDigits`.

    Returns
    -------
    dict of str to tuple of int
        ``conv1`` (16, 1, 3, 3), ``conv2`` (32, 16, 3, 3), ``fc1`` (64, 128),
        ``fc2`` (10, 64), each with a bias.
    """
    return {
        "conv1.weight": (16, 1, 3, 3), "conv1.bias": (16,),
        "conv2.weight": (32, 16, 3, 3), "conv2.bias": (32,),
        "fc1.weight": (64, 128), "fc1.bias": (64,),
        "fc2.weight": (10, 64), "fc2.bias": (10,),
    }


class LeNetDigits(_StateDictModel):
    """LeNet-style CNN for 8x8 digit scans (LeCun et al. 1998, scaled down).

    ``conv1`` 3x3 pad 1, 1->16 - relu - maxpool 2 - ``conv2`` 3x3 pad 1,
    16->32 - relu - maxpool 2 - flatten (NCHW order, 128) - ``fc1`` 128->64 -
    relu - ``fc2`` 64->10.

    Parameters
    ----------
    state_dict : dict of str to ndarray
        See :func:`lenet_digits_shapes`.

    Raises
    ------
    ValueError
        If the state dict has missing, unexpected or misshapen entries.
    """

    def __init__(self, state_dict):
        sd = state_dict
        _check_state_dict(sd, lenet_digits_shapes(), "LeNetDigits")
        self.conv1 = _conv(sd, "conv1", 1, 1)
        self.conv2 = _conv(sd, "conv2", 1, 1)
        self.pool = MaxPool2d(2, layout=_NHWC)
        self.flatten = Flatten(1, layout=_NHWC)
        self.fc1 = _linear(sd, "fc1")
        self.fc2 = _linear(sd, "fc2")

    def __call__(self, x):
        """Logits.

        Parameters
        ----------
        x : ndarray of float32, shape (N, 1, 8, 8)
            Pixel intensities scaled to [0, 1] (scikit-learn's 0..16 / 16).

        Returns
        -------
        ndarray of float32, shape (N, 10)
        """
        x = F.to_nhwc(np.asarray(x, np.float32))  # (N, 8, 8, 1)
        x = self.pool(F.relu(self.conv1(x), inplace=True))  # (N, 4, 4, 16)
        x = self.pool(F.relu(self.conv2(x), inplace=True))  # (N, 2, 2, 32)
        x = F.relu(self.fc1(self.flatten(x)), inplace=True)  # (N, 64)
        return self.fc2(x)  # (N, 10)

    def predict(self, x):
        """Return the class indices: ``argmax`` of the logits.

        ndarray of int64, shape (N,)."""
        return self(x).argmax(axis=1)


# --------------------------------------------------------------------------
# shipped data


def random_state_dict(shapes, seed=0):
    """Synthetic weights for benchmarks and tests, fp32, with the given names.

    Convolution and linear weights are He-scaled normals (std ``sqrt(2 /
    fan_in)``); batch norms are near identity, with the last one of each
    ResNet block (``.bn3.``, ``downsample.1``) damped by 0.3 as in
    "zero-init residual" practice, so the residual stream stays O(1) through
    50 layers.  Deterministic for a given ``seed``.

    Parameters
    ----------
    shapes : dict of str to tuple of int
        As returned by :func:`resnet50_shapes`, :func:`alexnet_shapes`, ...
    seed : int

    Returns
    -------
    dict of str to ndarray of float32
    """
    rng = np.random.default_rng(seed)
    sd = {}
    for k, s in shapes.items():
        if k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 1.5, s).astype(np.float32)
        elif k.endswith("running_mean"):
            sd[k] = (0.1 * rng.standard_normal(s)).astype(np.float32)
        elif len(s) == 1 and k.endswith("weight"):
            damp = 0.3 if (".bn3." in k or "downsample.1" in k) else 1.0
            sd[k] = (damp * rng.uniform(0.5, 1.0, s)).astype(np.float32)
        elif len(s) == 1:
            sd[k] = (0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            sd[k] = rng.standard_normal(s, dtype=np.float32) * np.float32(np.sqrt(2 / np.prod(s[1:])))
    return sd


def _data_path(name):
    # Package data next to this module; via importlib.resources when the
    # module was loaded without a __file__ (e.g. from an archive).
    here = globals().get("__file__")
    if here:
        return os.path.join(os.path.dirname(here), "data", name)
    from importlib.resources import files

    return str(files(__package__).joinpath("data", name))


def load_lenet_digits(path=None):
    """The shipped trained digits model (BF16 weights).

    Parameters
    ----------
    path : str, optional
        Defaults to ``pycds/bf16/data/lenet_digits.safetensors``.

    Returns
    -------
    model : LeNetDigits
    record : dict of str to str
        The training record (JSON under the ``pycds.training`` metadata key
        of the file header): ``fp32_accuracy``, ``bf16_accuracy`` (percent,
        as text), ``seed``, ``split``, ``n_test``, ...; empty if absent.
    """
    import json

    from safetensors import safe_open

    path = path or _data_path(LENET_DIGITS_FILE)
    with safe_open(path, "np") as f:
        metadata = f.metadata() or {}
    record = json.loads(metadata[TRAINING_KEY]) if TRAINING_KEY in metadata else {}
    return LeNetDigits.from_file(path), record


def load_digits_test(path=None):
    """The held-out split of scikit-learn's digits the shipped model never saw.

    Parameters
    ----------
    path : str, optional
        Defaults to ``pycds/bf16/data/digits_test.npz``.

    Returns
    -------
    images : ndarray of float32, shape (N, 1, 8, 8)
        Intensities 0..16 scaled to [0, 1].
    labels : ndarray of int64, shape (N,)
        Digits 0..9.
    """
    with np.load(path or _data_path(DIGITS_TEST_FILE), allow_pickle=False) as z:
        images = z["images"].astype(np.float32) / np.float32(16.0)
        labels = z["labels"].astype(np.int64)
    return images.reshape(-1, 1, 8, 8), labels
