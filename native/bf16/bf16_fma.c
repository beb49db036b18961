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
        /* C's rows are far apart and leave the cache between K blocks:     \
         * fetch them 64 k values before the end, so that the stores do not \
         * wait (fetched at the start, the B micro-panel streaming through  \
         * the L1 evicted them again). */                                   \
        const int64_t c_fetch_at = kc > 96 ? (kc - 64) / G * G : 0;         \
        for (i = 0; i < mr; i++) {                                            \
            acc0[i] = ZERO();                                                 \
            acc1[i] = ZERO();                                                 \
        }                                                                     \
        for (int64_t pg = 0; pg < kc; pg += G) {                              \
            const float *ag = a + pg * MRX;     /* [MRX][G] */                \
            const float *bg = b + pg * NRX;     /* [G][NRX] */                \
            if (pg == c_fetch_at) {                                           \
                for (i = 0; i < rows; i++) {                                  \
                    const float *ci = c + i * ldc;                            \
                    _mm_prefetch((const char *)ci, _MM_HINT_T0);              \
                    _mm_prefetch((const char *)(ci + nr / 2), _MM_HINT_T0);   \
                    _mm_prefetch((const char *)(ci + nr - 1), _MM_HINT_T0);   \
                }                                                             \
            }                                                                 \
            _Pragma("GCC unroll 2")                                           \
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
        case MRX:                                                             \
            PFX##_tile(kc, a, b, c, ldc, MRX, MRX, nr, alpha, beta);          \
            break;                                                            \
        default:                                                              \
            PFX##_tile(kc, a, b, c, ldc, MRX, mr, nr, alpha, beta);           \
            break;                                                            \
        }                                                                     \
    }

/* PFX##_few_kern, for inference batches (few rows): B is read once from
 * memory, as BF16, and widened in registers (no widened copy: a second
 * pass over it cost as much as the arithmetic), FEWX rows at a time.  The
 * k values of each call are split into two halves with separate
 * accumulators: two independent read streams (more misses in flight) and
 * twice the FMA chains (one or two rows have too few to hide the FMA
 * latency).  a: as for PFX##_kern ([kc8 / G][MRX][G], tile-padded); b: the
 * BF16 panel [kc][NRX]; kc need not be a multiple of G. */
#define FMA_FEW_KERNEL(PFX, TARGET, VEC, MRX, NRX, LANES, FEWX, ZERO, SET1,   \
                       FMADD, ADD, WIDEN, STORE)                              \
    TARGET __attribute__((always_inline)) static inline void                  \
    PFX##_few_tile(int64_t kc, const float *a, const uint16_t *b, float *c,   \
                   int64_t ldc, const int mr, int nr, float alpha,            \
                   float beta)                                                \
    {                                                                         \
        VEC e0[FEWX], e1[FEWX], o0[FEWX], o1[FEWX];                           \
        const int64_t half = kc / (2 * G) * G;                                \
        int i;                                                                \
        for (i = 0; i < mr; i++) {                                            \
            e0[i] = e1[i] = o0[i] = o1[i] = ZERO();                           \
        }                                                                     \
        for (int64_t p = 0; p < kc - half; p++) {                             \
            /* p < half: both halves; then the tail (kc odd groups) */        \
            const int64_t p2 = p + half;                                      \
            const float *ao = a + p2 / G * (MRX * G) + p2 % G;                \
            const uint16_t *bo = b + p2 * NRX;                                \
            _mm_prefetch((const char *)((uintptr_t)bo + FEW_PF_BYTES),        \
                         _MM_HINT_T0);                                        \
            const VEC b2 = WIDEN(bo), b3 = WIDEN(bo + LANES);                 \
            if (p < half) {                                                   \
                const float *ae = a + p / G * (MRX * G) + p % G;              \
                const uint16_t *be = b + p * NRX;                             \
                _mm_prefetch((const char *)((uintptr_t)be + FEW_PF_BYTES),    \
                             _MM_HINT_T0);                                    \
                const VEC b0 = WIDEN(be), b1 = WIDEN(be + LANES);             \
                for (i = 0; i < mr; i++) {                                    \
                    const VEC av = SET1(ae[i * G]);                           \
                    e0[i] = FMADD(av, b0, e0[i]);                             \
                    e1[i] = FMADD(av, b1, e1[i]);                             \
                }                                                             \
            }                                                                 \
            for (i = 0; i < mr; i++) {                                        \
                const VEC av = SET1(ao[i * G]);                               \
                o0[i] = FMADD(av, b2, o0[i]);                                 \
                o1[i] = FMADD(av, b3, o1[i]);                                 \
            }                                                                 \
        }                                                                     \
        for (i = 0; i < mr; i++) {                                            \
            STORE(c + i * ldc, ADD(e0[i], o0[i]), nr, alpha, beta);           \
            STORE(c + i * ldc + LANES, ADD(e1[i], o1[i]), nr - LANES, alpha,  \
                  beta);                                                      \
        }                                                                     \
    }                                                                         \
                                                                              \
    /* mr <= MRX rows of one tile, FEWX at a time */                          \
    TARGET static void                                                        \
    PFX##_few_kern(int64_t kc, const float *a, const uint16_t *b, float *c,   \
                   int64_t ldc, int mr, int nr, float alpha, float beta)      \
    {                                                                         \
        for (int r = 0; r < mr; r += FEWX) {                                  \
            const float *ar = a + r * G;                                      \
            float *cr = c + r * ldc;                                          \
            switch (mr - r) {                                                 \
            case 1:                                                           \
                PFX##_few_tile(kc, ar, b, cr, ldc, 1, nr, alpha, beta);       \
                break;                                                        \
            FEW_CASES_##FEWX(PFX, kc, ar, b, cr, ldc, nr, alpha, beta)        \
            }                                                                 \
        }                                                                     \
    }

/* The cases 2..FEWX of PFX##_few_kern's switch (FEWX or more rows left:
 * FEWX). */
#define FEW_CASES_2(PFX, kc, ar, b, cr, ldc, nr, alpha, beta)                 \
    default:                                                                  \
        PFX##_few_tile(kc, ar, b, cr, ldc, 2, nr, alpha, beta);               \
        break;
#define FEW_CASES_4(PFX, kc, ar, b, cr, ldc, nr, alpha, beta)                 \
    case 2:                                                                   \
        PFX##_few_tile(kc, ar, b, cr, ldc, 2, nr, alpha, beta);               \
        break;                                                                \
    case 3:                                                                   \
        PFX##_few_tile(kc, ar, b, cr, ldc, 3, nr, alpha, beta);               \
        break;                                                                \
    default:                                                                  \
        PFX##_few_tile(kc, ar, b, cr, ldc, 4, nr, alpha, beta);               \
        break;

#define FEW_PF_BYTES 4096   /* prefetch distance of the B streams */

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

/* 8 BF16 at p widened to fp32. */
#define WIDEN_YMM(p)                                                          \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(              \
        _mm_loadu_si128((const __m128i *)(const void *)(p))), 16))

FMA_MICROKERNEL(avx2, AVX2_TARGET, __m256, MR2, NR2, 8, _mm256_setzero_ps,
                _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, store_ymm)
FMA_FEW_KERNEL(avx2, AVX2_TARGET, __m256, MR2, NR2, 8, 2, _mm256_setzero_ps,
               _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, WIDEN_YMM,
               store_ymm)

const bf16k_kernel_desc bf16k_avx2fma_desc = {
    "avx2fma", MR2, NR2, 1, 0, NULL, avx2_kern, avx2_few_kern
};

/* ---- AVX-512F: 12 x 32 ------------------------------------------------- */

#define MR5 12
#define NR5 32

/* c[0:n] = alpha * acc + beta * c (n <= 16); beta == 0: c is not read. */
AVX512F_TARGET __attribute__((always_inline))
static inline void
store_zmm(float *c, __m512 acc, int n, float alpha, float beta)
{
    if (n > 0) {
        bf16k_store_zmm(c, acc, bf16k_lane_mask(n), alpha, beta);
    }
}

/* 16 BF16 at p widened to fp32. */
#define WIDEN_ZMM(p)                                                          \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(              \
        _mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))

FMA_MICROKERNEL(avx512, AVX512F_TARGET, __m512, MR5, NR5, 16,
                _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps,
                _mm512_fmadd_ps, store_zmm)
FMA_FEW_KERNEL(avx512, AVX512F_TARGET, __m512, MR5, NR5, 16, 4,
               _mm512_setzero_ps, _mm512_set1_ps, _mm512_fmadd_ps,
               _mm512_add_ps, WIDEN_ZMM, store_zmm)

const bf16k_kernel_desc bf16k_avx512fma_desc = {
    "avx512fma", MR5, NR5, 1, 0, NULL, avx512_kern, avx512_few_kern
};

#else
/* ISO C forbids an empty translation unit. */
typedef int bf16k_fma_unused;
#endif /* __x86_64__ */
