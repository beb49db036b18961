/* bf16_fma.c -- x86-64 fp32 FMA sbgemm micro-kernels for CPUs without BF16
 * instructions (AVX2+FMA on ymm, AVX-512F on zmm).
 *
 * The driver widens BF16 to fp32 while packing (exact: a BF16 value is the
 * top half of an fp32 one), so these kernels are plain sgemm micro-kernels:
 *
 *   A block   [kc / G][MR][G] fp32: G = 8 consecutive k values of each row
 *             (widened from row-major A without a transpose), zero rows
 *             past M and zero k values past K;
 *   B panel   [kc][NR] fp32, widened from the packed BF16 panel (k-units of
 *             KU = 1, so half the bytes of fp32 weights stay in memory)
 *             into a per-thread buffer that stays in L1.
 *
 * Per k value the kernel loads the NR B values (NR / lanes registers),
 * broadcasts each row's A value and issues MR x NR / lanes VFMADD231PS into
 * the accumulators: 6 x 16 in 12 ymm, 12 x 32 in 24 zmm.  Products of two
 * BF16 values are exact in fp32, so the result differs from exact
 * arithmetic only by the fp32 sums (each FMA rounds once), as with
 * VDPBF16PS; subnormals are kept (no flush to zero).
 *
 * Only the functions below carry the AVX2/FMA or AVX-512F target
 * attribute; bf16_driver.c calls them after its CPU check.
 */
#if defined(__x86_64__)

#include <immintrin.h>

#include "bf16_kernels.h"

#define G BF16K_F32_GROUP

#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define AVX512F_TARGET __attribute__((target("avx512f")))

/* The micro-kernel PFX##_kern of one vector width: MRX x NRX tiles of
 * VEC registers of LANES floats (2 per row: NRX = 2 * LANES), with the
 * intrinsics ZERO, LOADU, SET1, FMADD and the row store STORE(c, acc, n,
 * alpha, beta).  PFX##_tile computes `mr` rows (a compile-time constant
 * after inlining: the accumulators stay in registers) and stores `rows`
 * of them; the kernel specialises mr = 1..4 (inference batches) and
 * computes any other partial tile as a full one (A is zero-padded to whole
 * tiles).  A macro, since the widths differ only in types and intrinsics
 * and each needs its own target attribute. */
#define FMA_MICROKERNEL(PFX, TARGET, VEC, MRX, NRX, LANES, ZERO, LOADU, SET1, \
                        FMADD, STORE)                                         \
    TARGET __attribute__((always_inline)) static inline void                  \
    PFX##_tile(int64_t kc, const float *a, const float *b, float *c,          \
               int64_t ldc, const int mr, int rows, int nr, float alpha,      \
               float beta)                                                    \
    {                                                                         \
        VEC acc0[MRX], acc1[MRX];                                             \
        int i;                                                                \
        for (i = 0; i < mr; i++) {                                            \
            acc0[i] = ZERO();                                                 \
            acc1[i] = ZERO();                                                 \
        }                                                                     \
        for (int64_t pg = 0; pg < kc; pg += G) {                              \
            const float *ag = a + pg * MRX;     /* [MRX][G] */                \
            const float *bg = b + pg * NRX;     /* [G][NRX] */                \
            _Pragma("GCC unroll 8")                                           \
            for (int q = 0; q < G; q++) {                                     \
                const VEC b0 = LOADU(bg + q * NRX);                           \
                const VEC b1 = LOADU(bg + q * NRX + LANES);                   \
                _Pragma("GCC unroll 12")                                      \
                for (i = 0; i < mr; i++) {                                    \
                    const VEC av = SET1(ag[i * G + q]);                       \
                    acc0[i] = FMADD(av, b0, acc0[i]);                         \
                    acc1[i] = FMADD(av, b1, acc1[i]);                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
        for (i = 0; i < rows; i++) {                                          \
            STORE(c + i * ldc, acc0[i], nr, alpha, beta);                     \
            STORE(c + i * ldc + LANES, acc1[i], nr - LANES, alpha, beta);     \
        }                                                                     \
    }                                                                         \
                                                                              \
    TARGET static void                                                        \
    PFX##_kern(int64_t kc, const float *a, const float *b, float *c,          \
               int64_t ldc, int mr, int nr, float alpha, float beta)          \
    {                                                                         \
        switch (mr) {                                                         \
        case 1:                                                               \
            PFX##_tile(kc, a, b, c, ldc, 1, 1, nr, alpha, beta);              \
            break;                                                            \
        case 2:                                                               \
            PFX##_tile(kc, a, b, c, ldc, 2, 2, nr, alpha, beta);              \
            break;                                                            \
        case 3:                                                               \
            PFX##_tile(kc, a, b, c, ldc, 3, 3, nr, alpha, beta);              \
            break;                                                            \
        case 4:                                                               \
            PFX##_tile(kc, a, b, c, ldc, 4, 4, nr, alpha, beta);              \
            break;                                                            \
        default:                                                              \
            PFX##_tile(kc, a, b, c, ldc, MRX, mr, nr, alpha, beta);           \
            break;                                                            \
        }                                                                     \
    }

/* ---- AVX2 + FMA: 6 x 16 ------------------------------------------------ */

#define MR2 6
#define NR2 16

/* The lane mask of the first n (<= 8) of 8 floats, for maskload/store. */
AVX2_TARGET __attribute__((always_inline))
static inline __m256i
ymm_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* c[0:n] = alpha * acc + beta * c (n <= 8); beta == 0: c is not read. */
AVX2_TARGET __attribute__((always_inline))
static inline void
store_ymm(float *c, __m256 acc, int n, float alpha, float beta)
{
    __m256 r = acc;
    if (alpha != 1.0f) {
        r = _mm256_mul_ps(r, _mm256_set1_ps(alpha));
    }
    if (n >= 8) {
        if (beta != 0.0f) {
            r = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(c), r);
        }
        _mm256_storeu_ps(c, r);
    } else if (n > 0) {
        const __m256i m = ymm_mask(n);
        if (beta != 0.0f) {
            r = _mm256_fmadd_ps(_mm256_set1_ps(beta),
                                _mm256_maskload_ps(c, m), r);
        }
        _mm256_maskstore_ps(c, m, r);
    }
}

FMA_MICROKERNEL(avx2, AVX2_TARGET, __m256, MR2, NR2, 8, _mm256_setzero_ps,
                _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, store_ymm)

const bf16k_kernel_desc bf16k_avx2fma_desc = {
    "avx2fma", MR2, NR2, 1, 0, NULL, avx2_kern
};

/* ---- AVX-512F: 12 x 32 ------------------------------------------------- */

#define MR5 12
#define NR5 32

/* c[0:n] = alpha * acc + beta * c (n <= 16, masked); beta == 0: c is not
 * read. */
AVX512F_TARGET __attribute__((always_inline))
static inline void
store_zmm(float *c, __m512 acc, int n, float alpha, float beta)
{
    if (n <= 0) {
        return;
    }
    const __mmask16 m = n >= 16 ? (__mmask16)0xFFFF
                                : (__mmask16)((1u << n) - 1u);
    __m512 r = acc;
    if (alpha != 1.0f) {
        r = _mm512_mul_ps(r, _mm512_set1_ps(alpha));
    }
    if (beta != 0.0f) {
        r = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, c),
                            r);
    }
    _mm512_mask_storeu_ps(c, m, r);
}

FMA_MICROKERNEL(avx512, AVX512F_TARGET, __m512, MR5, NR5, 16,
                _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps,
                _mm512_fmadd_ps, store_zmm)

const bf16k_kernel_desc bf16k_avx512fma_desc = {
    "avx512fma", MR5, NR5, 1, 0, NULL, avx512_kern
};

#else
/* ISO C forbids an empty translation unit. */
typedef int bf16k_fma_unused;
#endif /* __x86_64__ */
