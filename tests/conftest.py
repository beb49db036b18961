"""Fixtures and set-up shared by every test; the helpers the tests import
are in tests/support/ (``from support import run_python``).

pytest (rootdir conftest, the default "prepend" import mode, no
tests/__init__.py) puts this directory first on sys.path before it imports
this file, wherever it is run from: that is what makes ``support``
importable from every test module, and from this file.
"""

import importlib.machinery
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `python -m pytest` from the checkout puts the checkout first on sys.path;
# unless the native module was built in place there (a development setup),
# its pycds/ cannot run: test the installed package instead.  Only a module
# built for this interpreter counts (a checkout may hold one per version).
if not any(os.path.exists(os.path.join(ROOT, "pycds", "_native" + suffix))
           for suffix in importlib.machinery.EXTENSION_SUFFIXES):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]

# The helpers' asserts report as the tests' own do.
pytest.register_assert_rewrite("support")

from support import WORKSPACE, pycds_installed_pth  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _pycds_is_installed():
    """End-to-end tests need pycds installed (its .pth in site-packages)."""
    if pycds_installed_pth() is None:
        pytest.fail("pycds is not installed in this interpreter "
                    "(pip install . first): pycds.pth not in site-packages")


@pytest.fixture
def workspace(tmp_path):
    """A private copy of tests/workspace (small importable packages)."""
    import shutil
    dst = tmp_path / "ws"
    shutil.copytree(WORKSPACE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst
