"""float32 <-> BF16 conversion, bit for bit against ml_dtypes.

Proof structure of the exhaustive test (TestExhaustiveClasses): for a
float32 bit pattern ``u = (h << 16) | l``, round-to-nearest-even returns
``h``, ``h + 1`` or NaN, and which one depends on ``l`` only through its
class {0}, (0, 0x8000), {0x8000}, (0x8000, 0xffff] (below, at, or above the
halfway point, or exact) plus whether ``u`` is NaN (decided by ``h`` and
``l != 0``).  So all 65536 high halves times representatives of every class,
including both ends of each open interval, cover every behaviour of the
function.  The full 2**32 sweep is ``scripts/bf16_exhaustive.py``.
"""

import ml_dtypes
import numpy as np
import pytest

from pycds.bf16 import _kernels  # noqa: F401  (must import: no silent skip)
from pycds.bf16 import convert
from pycds.bf16.convert import to_bf16, to_float32

# Lows: both ends of each class, plus one interior value.
LOWS = np.array(
    [0x0000, 0x0001, 0x4321, 0x7FFF, 0x8000, 0x8001, 0xC0DE, 0xFFFF],
    dtype=np.uint32,
)


def _ml_bits(f32):
    # Reference: ml_dtypes RNE, as uint16 bit patterns.
    with np.errstate(invalid="ignore", over="ignore"):
        return f32.astype(ml_dtypes.bfloat16).view(np.uint16)


def _all_patterns():
    # (65536 * len(LOWS),) uint32: every high half with every low class.
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    return (hi[:, None] | LOWS[None, :]).ravel()


def _native(f32, rounding):
    return convert._native_from_f32(np.ascontiguousarray(f32), rounding)


def _numpy(f32, rounding):
    return convert._round_bits(np.ascontiguousarray(f32).view(np.uint32),
                               rounding)


PATHS = {"numpy": _numpy, "native": _native}


class TestExhaustiveClasses:
    @pytest.mark.parametrize("path", sorted(PATHS))
    def test_nearest_matches_ml_dtypes(self, path):
        u = _all_patterns()
        f = u.view(np.float32)
        got = PATHS[path](f, "nearest")
        want = _ml_bits(f)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (
            f"{bad.size} mismatches, first u={u[bad[0]]:#010x}: "
            f"got {got[bad[0]]:#06x}, want {want[bad[0]]:#06x}"
        )

    @pytest.mark.parametrize("path", sorted(PATHS))
    def test_truncate(self, path):
        u = _all_patterns()
        got = PATHS[path](u.view(np.float32), "truncate")
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        want = (u >> 16).astype(np.uint16)
        want[nan] = ((u[nan] >> 16) & 0x8000 | 0x7FC0).astype(np.uint16)
        assert np.array_equal(got, want)

    def test_public_function_uses_both_paths(self):
        u = _all_patterns()
        f = u.view(np.float32)
        small = f[: convert._NATIVE_MIN - 1]  # numpy path
        assert np.array_equal(to_bf16(small), _ml_bits(small))
        assert np.array_equal(to_bf16(f), _ml_bits(f))  # native path

    def test_to_float32_all_patterns(self):
        b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        want = b.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
        for arr in (b, b[:100], b.view(ml_dtypes.bfloat16)):
            got = to_float32(arr).view(np.uint32)
            assert np.array_equal(got, want[: got.size])


    def test_large_arrays_two_threads(self):
        # Above the native two-thread threshold (2**18 elements), with a tail
        # that is not a multiple of the 16-lane vector width.
        n = (1 << 19) + 7
        u = np.random.default_rng(3).integers(0, 1 << 32, n, dtype=np.uint64)
        f = u.astype(np.uint32).view(np.float32)
        for rounding in ("nearest", "truncate"):
            assert np.array_equal(_native(f, rounding), _numpy(f, rounding))
        b = _ml_bits(f)
        want = (b.astype(np.uint32) << 16).view(np.uint32)
        assert np.array_equal(to_float32(b).view(np.uint32), want)


class TestSpecialValues:
    @pytest.mark.parametrize(
        "u32, want",
        [
            (0x00000000, 0x0000),  # +0
            (0x80000000, 0x8000),  # -0
            (0x7F800000, 0x7F80),  # +inf
            (0xFF800000, 0xFF80),  # -inf
            (0x7F7FFFFF, 0x7F80),  # max float rounds up: overflow -> inf
            (0x7F7F7FFF, 0x7F7F),  # just below the halfway point: stays
            (0x7F7F8000, 0x7F80),  # tie, odd lsb -> even, overflows to inf
            (0x3F808000, 0x3F80),  # tie, even lsb stays
            (0x3F818000, 0x3F82),  # tie, odd lsb rounds up
            (0x00008000, 0x0000),  # subnormal tie to even zero
            (0x00018000, 0x0002),  # subnormal tie, odd lsb rounds up
            (0x007FFFFF, 0x0080),  # largest subnormal rounds to min normal
            (0x7F800001, 0x7FC0),  # signalling NaN -> quiet NaN
            (0xFFC12345, 0xFFC0),  # negative NaN keeps its sign
            (0x7FA00000, 0x7FC0),  # NaN with payload -> canonical
        ],
    )
    def test_value(self, u32, want):
        f = np.array([u32], dtype=np.uint32).view(np.float32)
        for path in PATHS.values():
            assert int(path(f, "nearest")[0]) == want
        assert int(to_bf16(f)[0]) == want

    def test_nan_is_quiet_nan_both_modes(self):
        u = np.array([0x7F800001, 0xFF800001, 0x7FFFFFFF], dtype=np.uint32)
        for rounding in ("nearest", "truncate"):
            b = to_bf16(u.view(np.float32), rounding=rounding)
            assert np.all(np.isnan(to_float32(b)))
            assert np.all(b & 0x0040)  # quiet bit

    def test_roundtrip_exact(self):
        b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        finite = (b & 0x7FFF) <= 0x7F80
        assert np.array_equal(to_bf16(to_float32(b))[finite], b[finite])


class TestAPI:
    def test_ml_dtypes_out(self):
        x = np.linspace(-3, 3, 10, dtype=np.float32).reshape(2, 5)
        y = to_bf16(x, out="ml_dtypes")
        assert y.dtype == ml_dtypes.bfloat16 and y.shape == (2, 5)
        assert np.array_equal(y.view(np.uint16), to_bf16(x))
        assert np.array_equal(to_bf16(y), y.view(np.uint16))

    def test_shape_and_noncontiguous(self):
        x = np.random.default_rng(1).standard_normal((64, 130))
        x = x.astype(np.float32)[:, ::3]
        assert to_bf16(x).shape == x.shape
        assert np.array_equal(to_bf16(x), _ml_bits(x))

    def test_zero_dim(self):
        b = to_bf16(np.float32(1.5))
        assert b.shape == () and int(b) == 0x3FC0
        assert to_float32(b).shape == () and float(to_float32(b)) == 1.5

    @pytest.mark.parametrize("x, want", [
        (np.float32("nan"), 0x7FC0), (float("nan"), 0x7FC0), (np.array(np.nan), 0x7FC0),
        (-np.float32("nan"), 0xFFC0), (np.float64(-np.nan), 0xFFC0),
        (np.float32(np.inf), 0x7F80), (1.5, 0x3FC0),
    ])
    def test_zero_dim_nan_and_others(self, x, want):
        # 0-d NaN is the canonical quiet NaN with its sign, and every 0-d
        # input gives the same type: a 0-d uint16 array.
        b = to_bf16(x)
        assert isinstance(b, np.ndarray) and b.dtype == np.uint16 and b.shape == ()
        assert int(b) == want
        m = to_bf16(x, rounding="truncate", out="ml_dtypes")
        assert isinstance(m, np.ndarray) and m.shape == () and int(m.view(np.uint16)) == want
        # and back: a 0-d float32 array, as the docstring says
        f = to_float32(b)
        assert isinstance(f, np.ndarray) and f.dtype == np.float32 and f.shape == ()
        assert f.view(np.uint32) == want << 16

    @pytest.mark.parametrize("x", [
        None, "1.5", np.array(["1.5"]), np.array([True, False]), True,
        np.array(["2024-01-01"], dtype="datetime64[D]"), np.array([1], dtype="timedelta64[s]"),
        np.array([1.0, None], dtype=object), b"12",
    ])
    def test_non_numbers_rejected(self, x):
        with pytest.raises(ValueError, match="must be real"):
            to_bf16(x)

    def test_ml_dtypes_input_is_copied(self):
        y = to_bf16(np.array([1.5, -2.0], np.float32), out="ml_dtypes")
        b = to_bf16(y)
        assert b.dtype == np.uint16 and list(b) == [0x3FC0, 0xC000]
        assert not np.shares_memory(b, y)
        b[0] = 0
        assert float(y[0]) == 1.5

    def test_integers_are_cast(self):
        assert list(to_bf16(np.array([3, -7], np.int64))) == [0x4040, 0xC0E0]

    def test_float64_input_cast_first(self):
        x = np.array([1.0 + 2.0**-9, -2.5], dtype=np.float64)
        assert np.array_equal(to_bf16(x), _ml_bits(x.astype(np.float32)))

    @pytest.mark.parametrize(
        "kwargs",
        [{"rounding": "up"}, {"out": "float32"}],
    )
    def test_bad_options(self, kwargs):
        with pytest.raises(ValueError):
            to_bf16(np.zeros(3, np.float32), **kwargs)

    def test_bad_dtypes(self):
        with pytest.raises(ValueError, match="uint16"):
            to_bf16(np.zeros(3, np.uint16))
        with pytest.raises(ValueError, match="real"):
            to_bf16(np.zeros(3, np.complex64))
        with pytest.raises(ValueError, match="float32"):
            to_float32(np.zeros(3, np.float32))

    def test_native_rejects_bad_args(self):
        lib = _kernels.lib
        assert lib.bf16k_from_f32(_kernels.ffi.NULL, _kernels.ffi.NULL,
                                  -1, 0) < 0
        assert lib.bf16k_from_f32(_kernels.ffi.NULL, _kernels.ffi.NULL,
                                  0, 7) < 0
