"""Build script: what cffi and the .pth hook need; the metadata is in pyproject.toml.

- ``native/archive/build.py:ffibuilder`` builds ``pycds._native`` (the archive writer and loader).
- ``native/bf16/build.py:ffibuilder`` builds ``pycds.bf16._kernels`` (bf16 conversion and sbgemm).
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
    cffi_modules=[
        "native/archive/build.py:ffibuilder",
        "native/bf16/build.py:ffibuilder",
    ],
    cmdclass={"build_py": BuildWithPTH},
)
