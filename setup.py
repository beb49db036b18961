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
    install_requires=["cffi>=1.16", "numpy>=1.24", "ml_dtypes>=0.3", "safetensors>=0.4"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "flask>=2", "boto3>=1.26",
                 "xxhash>=3"],   # the reference XXH64 for native/archive/common/hash.c
        "demo": ["flask>=2"],   # examples/service.py (numpy, safetensors: required above)
        "examples": ["flask>=2", "boto3>=1.26"],
    },
    cmdclass={"build_py": BuildWithPTH},
    zip_safe=False,
)
