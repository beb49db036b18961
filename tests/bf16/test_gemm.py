"""sbgemm against a float64 reference, on the hardware kernel and the fallback.

Error bound used throughout (see ``bound()``): inputs are exact BF16 values
and a product of two BF16 values has at most 8 + 8 significand bits, so it
is exact in fp32.  The kernels therefore only add fp32 roundings: each entry
goes through at most K - 1 additions in the dot product, plus, per K block,
one multiply by alpha and one accumulation into C, plus beta*c and the final
add.  With KC >= 2 k values per block that is fewer than n = 2K + 4
roundings, so by the standard summation bound (Higham, Accuracy and
Stability, Lemma 3.1 / eq. 3.5)

    |C - C_exact| <= gamma_n * (|alpha| * sum_k |a_ik b_kj| + |beta c_ij|),
    gamma_n = n*u / (1 - n*u),  u = 2**-24.

The float64 reference adds its own error below K * 2**-53 * sum|a||b|, which
the bound absorbs via ``n + 1``.  Inputs are normal BF16 values with
exponents in [-20, 20], so no product or nonzero partial sum is subnormal
and the hardware's flush-to-zero of subnormals never applies.
"""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pycds.bf16 import _kernels  # noqa: F401  (must import: no silent skip)
from pycds.bf16 import gemm
from pycds.bf16.convert import to_bf16, to_float32

U = 2.0**-24
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bound(k, alpha, beta, a, b, c0):
    # Elementwise error bound for alpha*A@B + beta*C0 (see module docstring).
    n = 2 * k + 5
    gamma = n * U / (1 - n * U)
    s = abs(alpha) * (np.abs(a) @ np.abs(b))  # (M, N) float64
    if c0 is not None:
        s = s + abs(beta) * np.abs(c0)
    return gamma * s


def rand_bf16(rng, shape, emax=20):
    # Normal BF16 values: random sign and significand, exponent in [-emax, emax].
    mant = rng.uniform(1.0, 2.0, size=shape)
    exp = rng.integers(-emax, emax + 1, size=shape)
    sign = rng.choice([-1.0, 1.0], size=shape)
    return to_bf16((sign * np.ldexp(mant, exp)).astype(np.float32))


def reference(a, b, c0, alpha, beta):
    # a: (M, K) uint16, b: (K, N) uint16, c0: (M, N) float32 or None.
    af = to_float32(a).astype(np.float64)
    bf = to_float32(b).astype(np.float64)
    ref = alpha * (af @ bf)
    if c0 is not None and beta != 0.0:
        ref = ref + beta * c0.astype(np.float64)
    return ref, af, bf


# The fp32 FMA kernels for CPUs without BF16 instructions, run (forced)
# wherever the CPU has them, also when a better kernel is the default.
FMA_KERNELS = ["avx512fma", "avx2fma"]


def _kernel_selected(param):
    if param == "hw":
        if gemm.HW_KERNEL == "none":
            pytest.skip("this CPU has no BF16 or FMA kernel; the driver is "
                        "covered by 'generic' here and BFMMLA under qemu")
        name = gemm.HW_KERNEL
    elif param in FMA_KERNELS:
        if param not in gemm.NATIVE_KERNELS:
            pytest.skip(f"this CPU cannot run {param}")
        if param == gemm.HW_KERNEL:
            pytest.skip(f"{param} is the 'hw' kernel here")
        name = param
    else:
        name = param
    prev = gemm._select_kernel(name)
    yield name
    gemm._select_kernel(prev)


@pytest.fixture(params=["hw", "generic", "fallback"] + FMA_KERNELS)
def kernel(request):
    """Run the test on the hardware kernel, the portable C kernel (same
    native driver: packing, threads, blocking), the numpy fallback and the
    FMA kernels this CPU can run."""
    yield from _kernel_selected(request.param)


@pytest.fixture(params=["hw", "generic"] + FMA_KERNELS)
def native_kernel(request):
    """The kernels of the native driver (its worker pool)."""
    yield from _kernel_selected(request.param)


def check(got, a, b, c0, alpha, beta):
    ref, af, bf = reference(a, b, c0, alpha, beta)
    err = np.abs(got.astype(np.float64) - ref)
    lim = bound(a.shape[1], alpha, beta, af, bf, c0)
    worst = np.max(err - lim) if err.size else 0.0
    assert worst <= 0.0, f"error exceeds bound by {worst:g}"


@st.composite
def cases(draw):
    m = draw(st.one_of(st.just(1), st.integers(1, 40)))
    n = draw(st.integers(1, 80))
    k = draw(st.one_of(st.integers(0, 3), st.integers(1, 300)))
    return dict(
        m=m, n=n, k=k,
        trans_a=draw(st.booleans()),
        trans_b=draw(st.booleans()),
        alpha=draw(st.sampled_from([1.0, -1.0, 0.5, 2.5, 0.1])),
        beta=draw(st.sampled_from([0.0, 1.0, -0.75, 3.0])),
        give_c=draw(st.booleans()),
        packed=draw(st.booleans()),
        ml=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


class TestSbgemmRandom:
    @settings(max_examples=80, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(case=cases())
    def test_against_float64(self, kernel, case):
        rng = np.random.default_rng(case["seed"])
        m, n, k = case["m"], case["n"], case["k"]
        a = rand_bf16(rng, (m, k))  # (M, K)
        b = rand_bf16(rng, (k, n))  # (K, N)
        a_in = np.ascontiguousarray(a.T) if case["trans_a"] else a
        b_in = np.ascontiguousarray(b.T) if case["trans_b"] else b
        if case["ml"]:
            a_in = a_in.view(ml_dtypes.bfloat16)
            b_in = b_in.view(ml_dtypes.bfloat16)
        if case["packed"]:
            b_in = gemm.pack(b_in, trans_b=case["trans_b"])
            tb = False
        else:
            tb = case["trans_b"]
        c0 = None
        if case["give_c"]:
            c0 = rng.standard_normal((m, n)).astype(np.float32)
            c = c0.copy()
            out = gemm.sbgemm(a_in, b_in, c, case["alpha"], case["beta"],
                              trans_a=case["trans_a"], trans_b=tb)
            assert out is c
        else:
            out = gemm.sbgemm(a_in, b_in, alpha=case["alpha"],
                              beta=case["beta"], trans_a=case["trans_a"],
                              trans_b=tb)
        assert out.dtype == np.float32 and out.shape == (m, n)
        check(out, a, b, c0, case["alpha"], case["beta"] if c0 is not None
              else 0.0)


class TestSbgemmShapes:
    @pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 5, 1), (7, 1, 3),
                                         (6, 16, 8), (12, 32, 8), (13, 33, 9),
                                         (7, 17, 1), (25, 47, 255), (11, 31, 257),
                                         (131, 70, 513), (5, 3, 2)])
    def test_tile_edges(self, kernel, m, n, k):
        # M, N, K on both sides of the tiles (6x16, 12x32, 4x16), of the
        # 8-value k groups of the fp32 kernels and of the K blocks; K = 1.
        rng = np.random.default_rng(m * 1000 + n * 10 + k)
        a, b = rand_bf16(rng, (m, k)), rand_bf16(rng, (k, n))
        check(gemm.sbgemm(a, gemm.pack(b)), a, b, None, 1.0, 0.0)
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        c = c0.copy()
        gemm.sbgemm(np.ascontiguousarray(a.T), b, c, alpha=1.5, beta=-1.0,
                    trans_a=True)
        check(c, a, b, c0, 1.5, -1.0)

    @pytest.mark.parametrize("m", [1, 8])
    def test_inference_rows_packed(self, kernel, m):
        # Small-batch inference: M in {1, 8} rows, packed (K, N) weights.
        rng = np.random.default_rng(m)
        K, N = 1000, 777
        a = rand_bf16(rng, (m, K))
        w = rand_bf16(rng, (N, K))  # Linear.weight layout (out, in)
        pw = gemm.pack(w, trans_b=True)
        assert pw.shape == (K, N)
        check(gemm.sbgemm(a, pw), a, np.ascontiguousarray(w.T), None, 1.0, 0)

    @pytest.mark.parametrize("m, n, k", [(300, 200, 700), (2000, 20, 500),
                                         (97, 33, 1025), (60, 300, 64),
                                         (30, 520, 34), (20, 1100, 1600),
                                         (50, 100, 2200), (128, 149, 1100),
                                         (240, 150, 300), (241, 150, 300),
                                         (480, 130, 200), (400, 100, 1100)])
    def test_blocking_and_threads(self, kernel, m, n, k):
        # Covers: 2 threads split over M rows (A read in place when a thread
        # feeds <= 8 B panels) or over N panels (few rows; for the FMA
        # kernels up to two A blocks of rows, 240 on avx2fma and 480 on
        # avx512fma, packed as one block), packed A (odd K, or > 8 panels
        # per thread), and several K blocks (KC is 512 for the FMA kernels,
        # 2048 for the others; a B of every K block widened once per
        # worker: 400 x 100 x 1100).
        rng = np.random.default_rng(m + n + k)
        a, b = rand_bf16(rng, (m, k)), rand_bf16(rng, (k, n))
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        c = c0.copy()
        gemm.sbgemm(a, b, c, alpha=-0.5, beta=2.0)
        check(c, a, b, c0, -0.5, 2.0)

    @pytest.mark.parametrize("threads", [1, 3])
    def test_thread_counts(self, kernel, threads):
        rng = np.random.default_rng(threads)
        a, b = rand_bf16(rng, (150, 400)), rand_bf16(rng, (400, 300))
        assert gemm._set_num_threads(threads) == threads
        try:
            check(gemm.sbgemm(a, b), a, b, None, 1.0, 0.0)
        finally:
            gemm._set_num_threads(0)  # back to the default: online CPUs

    @pytest.mark.parametrize("trans_b", [False, True])
    def test_pack_large_roundtrip(self, kernel, trans_b):
        # Large enough for the two-thread packing path; odd K and N.
        rng = np.random.default_rng(9)
        b = rng.integers(0, 1 << 16, (701, 999), dtype=np.uint32)
        b = b.astype(np.uint16)  # (K, N) arbitrary bit patterns
        stored = np.ascontiguousarray(b.T) if trans_b else b
        assert np.array_equal(gemm.pack(stored, trans_b).to_rowmajor(), b)

    def test_beta_zero_ignores_nan_in_c(self, kernel):
        rng = np.random.default_rng(5)
        a, b = rand_bf16(rng, (9, 40)), rand_bf16(rng, (40, 50))
        c = np.full((9, 50), np.nan, dtype=np.float32)
        gemm.sbgemm(a, b, c, beta=0.0)
        check(c, a, b, None, 1.0, 0.0)

    def test_noncontiguous_c_updated_in_place(self, kernel):
        rng = np.random.default_rng(6)
        a, b = rand_bf16(rng, (10, 64)), rand_bf16(rng, (64, 30))
        big = rng.standard_normal((10, 90)).astype(np.float32)
        view = big[:, ::3]  # (10, 30), strided
        c0 = view.copy()
        out = gemm.sbgemm(a, b, view, alpha=1.0, beta=1.0)
        assert out is view
        check(big[:, ::3], a, b, c0, 1.0, 1.0)

    def test_k_zero_scales_c(self, kernel):
        a = np.zeros((3, 0), np.uint16)
        b = np.zeros((0, 4), np.uint16)
        c = np.ones((3, 4), np.float32)
        gemm.sbgemm(a, b, c, beta=0.5)
        assert np.all(c == 0.5)
        assert np.all(gemm.sbgemm(a, b) == 0.0)

    def test_empty_m_n(self, kernel):
        assert gemm.sbgemm(np.zeros((0, 5), np.uint16),
                           np.zeros((5, 3), np.uint16)).shape == (0, 3)
        assert gemm.sbgemm(np.zeros((2, 5), np.uint16),
                           np.zeros((5, 0), np.uint16)).shape == (2, 0)

    def test_packed_b_from_other_kernel(self):
        # A PackedB made under one kernel still works under every other.
        rng = np.random.default_rng(7)
        a, b = rand_bf16(rng, (5, 70)), rand_bf16(rng, (70, 45))
        names = ("fallback",) + gemm.NATIVE_KERNELS
        prev = gemm.kernel_name()
        try:
            packed = {}
            for name in names:
                gemm._select_kernel(name)
                packed[name] = gemm.pack(b)
                assert packed[name].layout == name
                assert np.array_equal(packed[name].to_rowmajor(), b)
            for name in names:
                gemm._select_kernel(name)
                for p in packed.values():
                    check(gemm.sbgemm(a, p), a, b, None, 1.0, 0.0)
        finally:
            gemm._select_kernel(prev)


class TestFloat32A:
    """float32 A is rounded to BF16 inside sbgemm (the FMA kernels while
    packing it): bit for bit ``sbgemm(to_bf16(a), ...)``."""

    @staticmethod
    def special_f32(rng, shape):
        # Rounding ties both ways, values just off a tie, NaN (quiet and
        # signalling, either sign), +-inf, overflow to inf, subnormals, -0.
        u = rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(np.uint32)
        # Magnitudes below 2**-95, and half of them raised to [2**-63, 1).
        u &= np.uint32(0x8FFFFFFF)
        u |= np.uint32(0x30000000) * rng.integers(0, 2, shape, dtype=np.uint32)
        pick = rng.integers(0, 12, shape)
        tie = (u & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
        u = np.where(pick == 0, tie, u)
        u = np.where(pick == 1, tie + np.uint32(1), u)
        u = np.where(pick == 2, tie - np.uint32(1), u)
        specials = np.array([0x7FC00001, 0xFF800001, 0x7F800000, 0xFF800000,
                             0x7F7FFFFF, 0x00000001, 0x807FFFFF, 0x80000000],
                            dtype=np.uint32)
        u = np.where(pick == 3, specials[rng.integers(0, 8, shape)], u)
        return u.view(np.float32)

    @pytest.mark.parametrize("m, n, k", [(1, 40, 300), (7, 17, 9), (13, 33, 1),
                                         (25, 47, 255), (128, 149, 1100),
                                         (300, 70, 520), (9, 1100, 64)])
    @pytest.mark.parametrize("trans_a", [False, True])
    @pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NaN, fallback
    def test_bitwise_to_bf16_then_sbgemm(self, kernel, m, n, k, trans_a):
        rng = np.random.default_rng(m * 7 + n * 3 + k)
        a = self.special_f32(rng, (m, k))
        b = rand_bf16(rng, (k, n), emax=4)
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        stored = np.ascontiguousarray(a.T) if trans_a else a
        for bb in (b, gemm.pack(b)):
            want = gemm.sbgemm(to_bf16(stored), bb, c0.copy(), alpha=0.75,
                               beta=-1.0, trans_a=trans_a)
            got = gemm.sbgemm(stored, bb, c0.copy(), alpha=0.75, beta=-1.0,
                              trans_a=trans_a)
            np.testing.assert_array_equal(got.view(np.uint32),
                                          want.view(np.uint32))

    def test_against_float64_and_strided_a(self, kernel):
        # Normal values: the rounded A times B within the sbgemm bound; A a
        # strided view (every other column of a wider array).
        rng = np.random.default_rng(3)
        wide = rng.standard_normal((70, 2 * 333)).astype(np.float32)
        a = wide[:, ::2]                                # (70, 333) strided
        b = rand_bf16(rng, (333, 90), emax=4)
        check(gemm.sbgemm(a, gemm.pack(b)), to_bf16(a), b, None, 1.0, 0.0)

    def test_alpha_zero_and_empty(self, kernel):
        a = np.full((4, 6), np.nan, np.float32)
        b = rand_bf16(np.random.default_rng(4), (6, 5))
        c = np.ones((4, 5), np.float32)
        gemm.sbgemm(a, b, c, alpha=0.0, beta=2.0)       # A not read
        assert np.all(c == 2.0)
        assert gemm.sbgemm(np.zeros((0, 6), np.float32), b).shape == (0, 5)
        assert np.all(gemm.sbgemm(np.zeros((4, 0), np.float32),
                                  np.zeros((0, 5), np.uint16)) == 0.0)

    def test_native_entry_point_errors(self, native_kernel):
        # The C entry point checks its arguments as bf16k_sbgemm_packed does.
        ffi, lib = gemm._ffi, gemm._lib
        a = np.ones((3, 4), np.float32)
        pb = gemm.pack(np.zeros((4, 5), np.uint16))
        c = np.zeros((3, 5), np.float32)
        ap = ffi.cast("const float *", ffi.from_buffer(a))
        bp = ffi.cast("const uint16_t *", ffi.from_buffer(pb.data))
        cp = ffi.cast("float *", ffi.from_buffer(c))
        assert lib.bf16k_sbgemm_f32a(3, 5, 4, 1.0, ap, 4, 1, bp, pb.data.size,
                                     pb._layout_id, 0.0, cp, 5) == 0
        assert lib.bf16k_sbgemm_f32a(3, 5, 4, 1.0, ap, 4, 1, bp, 3,
                                     pb._layout_id, 0.0, cp, 5) == -2
        assert lib.bf16k_sbgemm_f32a(3, 5, 4, 1.0, ffi.NULL, 4, 1, bp,
                                     pb.data.size, pb._layout_id, 0.0, cp,
                                     5) == -2
        assert lib.bf16k_sbgemm_f32a(3, 5, 4, 1.0, ap, 4, 1, bp, pb.data.size,
                                     pb._layout_id + 1, 0.0, cp, 5) == -5


class TestErrors:
    def test_shape_mismatch(self):
        with pytest.raises(ValueError, match="inner dimensions"):
            gemm.sbgemm(np.zeros((2, 3), np.uint16), np.zeros((4, 5), np.uint16))

    def test_dtype(self):
        # float32 A is rounded (TestFloat32A); other floats are refused, and
        # B must be BF16 whatever A is.
        with pytest.raises(ValueError, match="or float32, got dtype float64"):
            gemm.sbgemm(np.zeros((2, 3), np.float64), np.zeros((3, 5), np.uint16))
        with pytest.raises(ValueError, match="got dtype float32"):
            gemm.sbgemm(np.zeros((2, 3), np.float32), np.zeros((3, 5), np.float32))
        with pytest.raises(ValueError, match="2-D"):
            gemm.sbgemm(np.zeros(3, np.float32), np.zeros((3, 5), np.uint16))

    def test_rank(self):
        with pytest.raises(ValueError, match="2-D"):
            gemm.pack(np.zeros((2, 3, 4), np.uint16))

    def test_bad_c(self):
        a, b = np.zeros((2, 3), np.uint16), np.zeros((3, 5), np.uint16)
        with pytest.raises(ValueError, match=r"shape \(2, 5\)"):
            gemm.sbgemm(a, b, np.zeros((5, 2), np.float32))
        with pytest.raises(ValueError, match="float32"):
            gemm.sbgemm(a, b, np.zeros((2, 5), np.float64))

    def test_trans_b_with_packed(self):
        p = gemm.pack(np.zeros((3, 5), np.uint16))
        with pytest.raises(ValueError, match="trans_b"):
            gemm.sbgemm(np.zeros((2, 3), np.uint16), p, trans_b=True)

    def test_native_error_codes_raise(self):
        ffi, lib = _kernels.ffi, _kernels.lib
        layout = lib.bf16k_packed_layout()
        rc = lib.bf16k_sbgemm_packed(2, 2, 2, 1.0, ffi.NULL, 2, 1, ffi.NULL,
                                     0, layout, 0.0, ffi.NULL, 2)
        assert rc == -2
        with pytest.raises(gemm.Bf16KernelError, match="invalid argument"):
            gemm._check(rc)
        rc = lib.bf16k_sbgemm_packed(2, 2, 2, 1.0, ffi.NULL, 2, 1, ffi.NULL,
                                     0, layout + 1, 0.0, ffi.NULL, 2)
        assert rc == -5  # packed B made for another kernel
        with pytest.raises(MemoryError):
            gemm._check(-1)
        assert lib.bf16k_select_kernel(b"no-such-kernel") == -3

    def test_native_bad_lengths(self):
        ffi, lib = _kernels.ffi, _kernels.lib
        b = np.zeros((4, 40), np.uint16)
        short = np.zeros(3, np.uint16)
        rc = lib.bf16k_pack_b(ffi.cast("const uint16_t *", ffi.from_buffer(b)),
                              4, 40, 40, 1,
                              ffi.cast("uint16_t *", ffi.from_buffer(short)),
                              short.size)
        assert rc == -2

    @pytest.mark.parametrize("alpha", [1.0, 0.0])
    def test_native_short_packed_b_refused_whatever_alpha(self, native_kernel, alpha):
        # alpha == 0 reads neither operand (BLAS quick return), but a wrong
        # length is still the caller's error.
        ffi, lib = _kernels.ffi, _kernels.lib
        a = np.zeros((3, 4), np.uint16)
        short = np.zeros(8, np.uint16)
        c = np.ones((3, 40), np.float32)
        rc = lib.bf16k_sbgemm_packed(
            3, 40, 4, alpha, ffi.cast("const uint16_t *", ffi.from_buffer(a)), 4, 1,
            ffi.cast("const uint16_t *", ffi.from_buffer(short)), short.size,
            lib.bf16k_packed_layout(), 0.0,
            ffi.cast("float *", ffi.from_buffer(c, require_writable=True)), 40)
        assert rc == -2 and np.all(c == 1.0)


class TestDispatch:
    def test_kernel_name(self):
        hw = ("avx512bf16", "avx512fma", "avx2fma", "bfmmla")
        assert gemm.kernel_name() in hw + ("fallback", "generic")
        assert gemm.HW_KERNEL in hw + ("none",)
        assert gemm.NATIVE_KERNELS[-1] == "generic"
        if gemm.HW_KERNEL != "none":
            assert gemm.NATIVE_KERNELS[0] == gemm.HW_KERNEL

    def test_cpu_flags_pick_the_kernel(self):
        # The C detection (cpuid) agrees with the flags Linux reports.
        with open("/proc/cpuinfo") as f:
            flags = set(next(ln for ln in f if ln.startswith("flags")).split())
        want = []
        if {"avx512_bf16", "avx512bw", "avx512vl"} <= flags:
            want.append("avx512bf16")
        if "avx512f" in flags:
            want.append("avx512fma")
        if {"avx2", "fma"} <= flags:
            want.append("avx2fma")
        if os.uname().machine == "x86_64":
            assert list(gemm.NATIVE_KERNELS[:-1]) == want
            assert gemm.HW_KERNEL == (want[0] if want else "none")

    @pytest.mark.parametrize("value, want", [("fallback", "fallback"),
                                             ("generic", "generic"),
                                             ("auto", None),
                                             ("avx2fma", "avx2fma"),
                                             ("avx512fma", "avx512fma")])
    def test_env_override(self, value, want):
        if want in FMA_KERNELS and want not in gemm.NATIVE_KERNELS:
            pytest.skip(f"this CPU cannot run {want}")
        env = dict(os.environ, PYCDS_BF16_KERNEL=value)
        # The installed package, not the checkout (-c puts the cwd first on
        # sys.path; the checkout has no compiled kernels of its own).
        out = subprocess.run(
            [sys.executable, "-c",
             "from pycds.bf16 import gemm; print(gemm.kernel_name())"],
            env=env, capture_output=True, text=True, check=True,
            cwd=os.path.dirname(ROOT),
        ).stdout.strip()
        want = want or (gemm.HW_KERNEL if gemm.HW_KERNEL != "none"
                        else "fallback")
        assert out == want


# ---- sbgemm_fused: the post-ops (bias, BF16 residual, round, ReLU) ----------

def fused_reference(a, b, bias, res, relu, alpha=1.0):
    """float64 value of alpha*A@B + bias + residual, its error bound before the
    final BF16 rounding (the sbgemm bound with two more fp32 additions), and
    the expected ReLU."""
    af = to_float32(a).astype(np.float64)
    bf = to_float32(b).astype(np.float64)
    ref = alpha * (af @ bf)
    mag = abs(alpha) * (np.abs(af) @ np.abs(bf))
    if bias is not None:
        ref = ref + bias.astype(np.float64)
        mag = mag + np.abs(bias)
    if res is not None:
        r = to_float32(res).astype(np.float64)
        ref, mag = ref + r, mag + np.abs(r)
    n = 2 * a.shape[1] + 7
    return ref, n * U / (1 - n * U) * mag


def check_fused(got, a, b, bias, res, relu, alpha=1.0):
    ref, err_v = fused_reference(a, b, bias, res, relu, alpha)
    g = to_float32(got).astype(np.float64)
    # one BF16 rounding (unit roundoff 2**-8) of a value already err_v off
    lim = err_v + 2.0**-8 * (np.abs(ref) + err_v)
    if relu:
        ref = np.maximum(ref, 0.0)       # ReLU is 1-Lipschitz: same bound
        assert not np.signbit(g).any(), "ReLU output has a sign bit set"
    worst = np.max(np.abs(g - ref) - lim) if g.size else 0.0
    assert worst <= 0.0, f"fused error exceeds bound by {worst:g}"


@st.composite
def fused_cases(draw):
    return dict(
        m=draw(st.one_of(st.integers(1, 40), st.integers(200, 700))),
        n=draw(st.integers(1, 100)),
        k=draw(st.one_of(st.integers(0, 3), st.integers(1, 600))),
        bias=draw(st.booleans()), res=draw(st.booleans()), relu=draw(st.booleans()),
        alpha=draw(st.sampled_from([1.0, -0.5, 2.0])), trans_a=draw(st.booleans()),
        wide_out=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)),
    )


class TestSbgemmFused:
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(case=fused_cases())
    def test_against_float64(self, kernel, case):
        rng = np.random.default_rng(case["seed"])
        m, n, k = case["m"], case["n"], case["k"]
        a = rand_bf16(rng, (m, k), emax=6)
        b = rand_bf16(rng, (k, n), emax=6)
        bias = rng.standard_normal(n).astype(np.float32) if case["bias"] else None
        res = rand_bf16(rng, (m, n), emax=6) if case["res"] else None
        a_in = np.ascontiguousarray(a.T) if case["trans_a"] else a
        # the result into a column slice of a wider array: row stride > n
        full = np.full((m, n + 5), 0xABCD, np.uint16) if case["wide_out"] else None
        out = full[:, 2:2 + n] if full is not None else None
        got = gemm.sbgemm_fused(a_in, gemm.pack(b), bias=bias, residual=res, relu=case["relu"],
                                out=out, alpha=case["alpha"], trans_a=case["trans_a"])
        assert got.dtype == np.uint16 and got.shape == (m, n)
        if full is not None:
            assert got is out
            assert (full[:, :2] == 0xABCD).all() and (full[:, 2 + n:] == 0xABCD).all()
        check_fused(got, a, b, bias, res, case["relu"], case["alpha"])

    def test_equals_sbgemm_then_post_ops(self, kernel):
        """Where the blocking is the same (one K block, one thread's rows), the
        fused result is bit for bit the unfused one rounded by to_bf16."""
        rng = np.random.default_rng(11)
        a, b = rand_bf16(rng, (20, 200), emax=4), rand_bf16(rng, (200, 70), emax=4)
        bias = rng.standard_normal(70).astype(np.float32)
        res = rand_bf16(rng, (20, 70), emax=4)
        acc = gemm.sbgemm(a, gemm.pack(b))
        acc += bias
        acc += to_float32(res)
        want = to_bf16(acc)
        np.maximum(want.view(np.int16), 0, out=want.view(np.int16))
        got = gemm.sbgemm_fused(a, gemm.pack(b), bias=bias, residual=res, relu=True)
        np.testing.assert_array_equal(got, want)

    def test_residual_may_be_out(self, kernel):
        rng = np.random.default_rng(12)
        a, b = rand_bf16(rng, (300, 64), emax=4), rand_bf16(rng, (64, 48), emax=4)
        res = rand_bf16(rng, (300, 48), emax=4)
        want = gemm.sbgemm_fused(a, gemm.pack(b), residual=res.copy(), relu=True)
        got = gemm.sbgemm_fused(a, gemm.pack(b), residual=res, relu=True, out=res)
        assert got is res
        np.testing.assert_array_equal(got, want)

    def test_nan_inf_and_signed_zero(self, kernel):
        # zero products: the post-ops alone decide; RNE keeps NaN quiet and signed
        a = np.zeros((2, 4), np.uint16)
        b = np.zeros((4, 4), np.uint16)
        bias = np.array([np.nan, -np.nan, -np.inf, -0.0], np.float32)
        plain = gemm.sbgemm_fused(a, b, bias=bias)
        assert plain[0, 0] == 0x7FC0 and plain[0, 1] == 0xFFC0
        assert plain[0, 2] == 0xFF80 and plain[0, 3] in (0x0000, 0x8000)
        relu = gemm.sbgemm_fused(a, b, bias=bias, relu=True)
        assert list(relu[1]) == [0x7FC0, 0, 0, 0]

    def test_errors(self):
        a, b = np.zeros((3, 4), np.uint16), np.zeros((4, 5), np.uint16)
        with pytest.raises(ValueError, match="bias"):
            gemm.sbgemm_fused(a, b, bias=np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="bias must be real"):
            gemm.sbgemm_fused(a, b, bias=np.zeros(3, np.complex64))
        with pytest.raises(ValueError, match="residual"):
            gemm.sbgemm_fused(a, b, residual=np.zeros((3, 4), np.uint16))
        with pytest.raises(ValueError, match="out"):
            gemm.sbgemm_fused(a, b, out=np.zeros((3, 5), np.float32))
        with pytest.raises(ValueError, match="out"):
            gemm.sbgemm_fused(a, b, out=np.zeros((5, 3), np.uint16).T)


class TestWorkerPool:
    def test_consecutive_calls_do_not_reuse_packed_a(self, native_kernel):
        """Pool workers keep their packing buffers between calls; a buffer's
        packed A is only reused within the call that packed it.  Inference
        shapes (few rows, many panels split over threads) take that path."""
        gemm._set_num_threads(2)
        try:
            rng = np.random.default_rng(21)
            b = gemm.pack(rand_bf16(rng, (2048, 2048), emax=3))
            for _ in range(3):
                a = rand_bf16(rng, (8, 2048), emax=3)
                check(gemm.sbgemm(a, b), a, b.to_rowmajor(), None, 1.0, 0.0)
                check_fused(gemm.sbgemm_fused(a, b), a, b.to_rowmajor(), None, None, False)
        finally:
            gemm._set_num_threads(0)

    def test_fork_child_gets_its_own_workers(self, native_kernel, tmp_path):
        kernel = native_kernel
        code = (
            "import os, numpy as np\n"
            "from pycds.bf16 import gemm\n"
            f"gemm._select_kernel({kernel!r}); gemm._set_num_threads(2)\n"
            "a = np.full((64, 1024), 0x3F80, np.uint16); b = gemm.pack(np.full((1024, 512), 0x3F80, np.uint16))\n"
            "assert (gemm.sbgemm(a, b) == 1024).all()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(0 if (gemm.sbgemm(a, b) == 1024).all() else 1)\n"
            "_, st = os.waitpid(pid, 0)\n"
            "assert os.waitstatus_to_exitcode(st) == 0 and (gemm.sbgemm(a, b) == 1024).all()\n"
            "print('ok')\n")
        # outside the source tree: -c code imports from the working directory first
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout == "ok\n", r.stderr


# ---- BLAS quick return: alpha == 0 or K == 0 --------------------------------

class TestAlphaZero:
    """alpha == 0 or K == 0: C := beta*C and A, B are not read, as the
    reference BLAS sgemm does (so inf/NaN in A or B, or a NaN alpha with
    K == 0, do not reach C); beta == 0 still writes zeros over NaN."""

    def test_alpha_zero_ignores_inf_and_nan_in_a_b(self, kernel):
        rng = np.random.default_rng(31)
        a, b = rand_bf16(rng, (30, 6)), rand_bf16(rng, (6, 20))
        a[0, 0] = to_bf16(np.float32(np.inf))
        b[1, 3] = 0x7FC0  # NaN
        assert (gemm.sbgemm(a, b, alpha=0.0) == 0.0).all()
        assert (gemm.sbgemm(a, b, alpha=-0.0) == 0.0).all()
        c0 = rng.standard_normal((30, 20)).astype(np.float32)
        c = c0.copy()
        gemm.sbgemm(a, gemm.pack(b), c, alpha=0.0, beta=-2.0)
        np.testing.assert_array_equal(c, c0 * np.float32(-2.0))
        c = np.full((30, 20), np.nan, np.float32)
        gemm.sbgemm(a.T.copy(), b, c, alpha=0.0, beta=0.0, trans_a=True)
        assert (c == 0.0).all() and not np.signbit(c).any()
        # fused: the post-ops of a zero product
        bias = rng.standard_normal(20).astype(np.float32)
        got = gemm.sbgemm_fused(a, b, bias=bias, alpha=0.0)
        np.testing.assert_array_equal(got, np.broadcast_to(to_bf16(bias), (30, 20)))

    def test_alpha_underflowing_fp32_is_zero(self, kernel):
        # alpha is converted to fp32 first (1e-50 -> 0) on every kernel.
        a = np.full((3, 4), to_bf16(np.float32(np.inf)), np.uint16)
        b = np.full((4, 5), 0x3F80, np.uint16)
        assert (gemm.sbgemm(a, b, alpha=1e-50) == 0.0).all()

    def test_k_zero_ignores_nan_alpha(self, kernel):
        a, b = np.zeros((3, 0), np.uint16), np.zeros((0, 5), np.uint16)
        c = np.ones((3, 5), np.float32)
        gemm.sbgemm(a, b, c, alpha=np.nan, beta=2.0)
        assert (c == 2.0).all()
        assert (gemm.sbgemm(a, b, alpha=np.nan) == 0.0).all()
        got = gemm.sbgemm_fused(a, b, bias=np.ones(5, np.float32), alpha=np.nan)
        assert (got == 0x3F80).all()


# ---- sbgemm_fused: any row stride for out / residual -------------------------

class TestFusedRowStrides:
    @pytest.mark.parametrize("which", ["out", "residual", "both", "same"])
    def test_negative_row_stride(self, kernel, which):
        rng = np.random.default_rng(41)
        m, k, n = 20, 30, 30
        a, b = rand_bf16(rng, (m, k), emax=4), rand_bf16(rng, (k, n), emax=4)
        res0 = rand_bf16(rng, (m, n), emax=4)
        want = gemm.sbgemm_fused(a, b, residual=res0.copy(), relu=True)
        full = np.zeros((m, n), np.uint16)
        out = full[::-1] if which in ("out", "both") else None
        res = res0[::-1].copy()[::-1] if which in ("residual", "both") else res0.copy()
        if which == "same":      # the residual is out itself, rows reversed
            full[::-1] = res0
            out = res = full[::-1]
        got = gemm.sbgemm_fused(a, b, residual=res, relu=True, out=out)
        if out is not None:
            assert got is out
        np.testing.assert_array_equal(got, want)

    def test_overlapping_and_zero_row_stride_residual(self, kernel):
        rng = np.random.default_rng(42)
        a, b = rand_bf16(rng, (12, 8), emax=4), rand_bf16(rng, (8, 10), emax=4)
        row = rand_bf16(rng, (10,), emax=4)
        res = np.broadcast_to(row, (12, 10))            # row stride 0
        want = gemm.sbgemm_fused(a, b, residual=np.ascontiguousarray(res))
        np.testing.assert_array_equal(gemm.sbgemm_fused(a, b, residual=res), want)


# ---- operands that end (or start) at an inaccessible page -------------------

_GUARD_SCRIPT = r'''
import ctypes, itertools, mmap, sys
import numpy as np
from pycds.bf16 import gemm, im2col, to_bf16, to_float32

gemm._select_kernel(sys.argv[1])
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PROT_RW, PROT_NONE, MAP_ANON_PRIVATE = 3, 0, 0x22

def guarded(shape, dtype, where):
    """A new array whose bytes end right before (or start right after) a
    PROT_NONE page, filled with ones."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pages = -(-n // PAGE) + 1
    base = libc.mmap(None, (pages + 1) * PAGE, PROT_RW, MAP_ANON_PRIVATE, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    if where == "end":
        assert libc.mprotect(base + pages * PAGE, PAGE, PROT_NONE) == 0
        start = base + pages * PAGE - n
    else:
        assert libc.mprotect(base, PAGE, PROT_NONE) == 0
        start = base + PAGE
    buf = (ctypes.c_char * max(n, 1)).from_address(start)
    x = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
    x[...] = 0x3F80 if dtype == np.uint16 else 1.0   # BF16 1.0 / fp32 1.0
    return x

def place(x, where):
    g = guarded(x.shape, x.dtype, where)
    g[...] = x
    return g

rng = np.random.default_rng(0)
def rb(shape):
    return to_bf16(rng.uniform(-2, 2, shape).astype(np.float32))

def close(got, want, what):
    if not np.allclose(got, want, rtol=2e-2, atol=2e-2):
        sys.exit(f"wrong result: {what}")

for where, (m, n, k), ta, tb in itertools.product(
        ["end", "start"],
        [(1, 1, 1), (5, 17, 7), (9, 3, 2), (13, 33, 6), (30, 20, 6), (49, 40, 66),
         (26, 300, 4)],
        [False, True], [False, True]):
    case = f"where={where} m={m} n={n} k={k} trans_a={ta} trans_b={tb}"
    print(case, flush=True)
    a0, b0 = rb((m, k)), rb((k, n))
    ref = to_float32(a0).astype(np.float64) @ to_float32(b0).astype(np.float64)
    a = place(a0.T if ta else a0, where)
    b = place(b0.T if tb else b0, where)
    close(gemm.sbgemm(a, b, trans_a=ta, trans_b=tb), ref, case + " sbgemm")
    c = guarded((m, n), np.float32, where)
    gemm.sbgemm(a, b, c, beta=1.0, trans_a=ta, trans_b=tb)
    close(c, ref + 1, case + " sbgemm into c")
    # packed B whose panels end at the page too
    p = gemm.pack(b, trans_b=tb)
    p.data = place(p.data, where)
    close(gemm.sbgemm(a, p, trans_a=ta), ref, case + " sbgemm packed")
    af = place(to_float32(a0.T if ta else a0), where)     # fp32 A, rounded
    close(gemm.sbgemm(af, p, trans_a=ta), ref, case + " sbgemm fp32 A")
    bias = guarded((n,), np.float32, where)
    res = guarded((m, n), np.uint16, where)
    out = guarded((m, n), np.uint16, where)
    got = gemm.sbgemm_fused(a, p, bias=bias, residual=res, out=out, trans_a=ta)
    close(to_float32(got), ref + 2, case + " fused")
    got = gemm.sbgemm_fused(a, p, bias=bias, residual=res, out=res, relu=True, trans_a=ta)
    close(to_float32(got), np.maximum(ref + 2, 0), case + " fused in place")
    # out / residual: the columns of a wider array, last row at the page
    wide = guarded((m, n + 3), np.uint16, where)
    got = gemm.sbgemm_fused(a, p, residual=wide[:, 3:], out=wide[:, 3:], trans_a=ta)
    close(to_float32(got), ref + 1, case + " fused strided")

print("conversions", flush=True)
for count in [1, 4095, 4096, 4097, 4111, (1 << 18) + 3]:
    for where in ["end", "start"]:
        f = guarded((count,), np.float32, where)
        assert (to_bf16(f) == 0x3F80).all() and (to_float32(to_bf16(f)) == 1).all()
        assert (to_float32(guarded((count,), np.uint16, where)) == 1).all()

print("im2col", flush=True)
for (N, H, W, C, kk, s, pad, d) in [(1, 5, 5, 3, 3, 1, 1, 1), (2, 7, 5, 1, 3, 2, 0, 2),
                                    (1, 1, 1, 5, 1, 1, 0, 1), (1, 3, 3, 2, 3, 1, 2, 1)]:
    for where in ["end", "start"]:
        x = guarded((N, H, W, C), np.uint16, where)
        got = im2col(x, kk, s, pad, d, "NHWC")
        want = im2col(to_float32(x), kk, s, pad, d, "NHWC")   # the numpy path
        assert np.array_equal(to_float32(got), want)
print("ok")
'''


class TestGuardPages:
    def test_operands_at_inaccessible_pages(self, native_kernel, tmp_path):
        """Every operand (A, B, packed B, C, bias, residual, out; transposed or
        not; M > 8 with K even, where A is read in place) ends exactly at a
        PROT_NONE page, or starts right after one: a read or write past
        either end faults.  In a child process, so that a fault is a failure
        naming the case, not a crashed pytest."""
        r = subprocess.run([sys.executable, "-c", _GUARD_SCRIPT, native_kernel],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
        last = r.stdout.strip().splitlines()[-1:] or ["(nothing)"]
        assert r.returncode == 0 and r.stdout.endswith("ok\n"), (
            f"child exited with {r.returncode} (negative: killed by that signal) "
            f"during: {last[0]}\n{r.stderr[-2000:]}")
