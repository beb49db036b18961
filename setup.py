"""Build script: the pure-Python package, two cffi API-mode extensions, and the .pth hook.

- ``native/build_native.py:ffibuilder`` builds ``pycds._native`` (the archiver and loader).
- ``native/build_bf16.py:ffibuilder`` builds ``pycds.bf16._kernels`` (bf16 conversion and sbgemm).
- ``pycds.pth`` is copied to the root of the build tree so that it lands in site-packages
  (the technique pytest-cov uses); it is inert unless ``PYCDSMODE`` is set.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


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
    version="0.1.0",
    description="Start-up accelerator for CPython: archive code objects, mmap them, import in place",
    python_requires=">=3.10",
    packages=["pycds", "pycds.bf16"],
    package_data={"pycds.bf16": ["data/*"]},
    cffi_modules=[
        "native/build_native.py:ffibuilder",
        "native/build_bf16.py:ffibuilder",
    ],
    install_requires=["cffi>=1.16", "numpy>=1.24", "ml_dtypes>=0.3", "safetensors>=0.4"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "flask>=2", "boto3>=1.26",
                 "xxhash>=3"],   # the reference XXH64 for native/hash.c
        "examples": ["flask>=2", "boto3>=1.26"],
    },
    cmdclass={"build_py": BuildWithPTH},
    zip_safe=False,
)
