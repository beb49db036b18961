"""Import the native module pycds.bf16._kernels; raise ImportError if unbuilt.

The one importer of ``pycds.bf16._kernels`` (cffi, built from
``native/bf16/``): every other module of pycds.bf16 takes ``ffi`` and
``lib`` from here.  The native module is part of the product, so there is
no fallback when it is missing: importing this module (and so pycds.bf16)
fails with an ImportError that says how to build it.
"""

try:
    from pycds.bf16._kernels import ffi, lib
except ImportError as exc:  # the native module is part of the product
    raise ImportError(
        f"pycds.bf16._kernels is not built ({exc}); build it with "
        f"'python native/bf16/build.py' (in-place) or 'pip install .'",
        name="pycds.bf16._kernels",
    ) from exc

__all__ = ["ffi", "lib"]
