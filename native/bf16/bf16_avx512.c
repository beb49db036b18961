/* bf16_avx512.c -- x86-64 AVX512-BF16 sbgemm micro-kernel.
 *
 * VDPBF16PS (Intel intrinsics guide: _mm512_dpbf16_ps) multiplies pairs of
 * BF16 and adds both products into one fp32 lane:
 *     dst.fp32[i] += a.bf16[2i+1]*b.bf16[2i+1] + a.bf16[2i]*b.bf16[2i]
 * (denormal inputs and outputs are flushed to zero, RNE, no exceptions).
 * So a k-unit is a pair of k values (KU = 2): B panels hold, for each pair,
 * NR = 32 columns x 2 BF16 = two zmm registers; A panels hold MR = 12 rows x
 * 2 BF16, each row's pair broadcast as one 32-bit value (A may also be
 * read in place from a row-major matrix: see bf16k_kernel_desc).  The micro-tile is
 * MR x NR = 12 x 32 fp32 in 24 zmm accumulators.
 *
 * Only the functions below carry the AVX512 target attribute; the rest of
 * the library is baseline x86-64 and calls in only after the CPU check in
 * bf16_driver.c.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "bf16_kernels.h"

#define MR 12
#define NR 32
#define KU 2
#define PF_UNITS 48     /* prefetch B this many k-units (6 KiB) ahead */

#define AVX512BF16_TARGET \
    __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/* Prefetch hint PF_UNITS k-units ahead.  The address may lie past the end
 * of the panel (prefetches never fault), so it is formed as an integer: no
 * out-of-bounds pointer arithmetic.  It must be inlined: as a call (GCC 12
 * does not inline a function of the baseline target early into an AVX512
 * one), GCC finds it free of side effects and deletes every call. */
AVX512BF16_TARGET __attribute__((always_inline))
static inline void
prefetch_ahead(const uint16_t *bq)
{
    uintptr_t ahead = (uintptr_t)bq + PF_UNITS * NR * KU * sizeof(uint16_t);
    _mm_prefetch((const char *)ahead, _MM_HINT_T0);
    _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0);
}

/* Few-row tile (mr <= 4), the inference case where B streams from memory:
 * the first and second halves of K go to separate accumulators, so each
 * step reads two independent sequential streams of the panel (more misses
 * in flight) and the VDPBF16PS dependency chains overlap. */
AVX512BF16_TARGET __attribute__((always_inline))
static inline void
tile_few(int64_t ku, const uint16_t *ap, int64_t a_ps, int64_t a_rs,
         const uint16_t *bp, float *c, int64_t ldc, const int mr, int nr,
         float alpha, float beta)
{
    __m512 e0[4], e1[4], o0[4], o1[4];
    const int64_t half = ku / 2;
    const uint16_t *bh = bp + half * (NR * KU);
    const uint16_t *ah = ap + half * a_ps;
    int i;
    int64_t p;

    for (i = 0; i < mr; i++) {
        e0[i] = e1[i] = o0[i] = o1[i] = _mm512_setzero_ps();
    }
    for (p = 0; p < half; p++) {
        const uint16_t *bq = bp + p * (NR * KU);
        const uint16_t *br = bh + p * (NR * KU);
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)bq);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bq + 32));
        __m512bh b2 = (__m512bh)_mm512_loadu_si512((const void *)br);
        __m512bh b3 = (__m512bh)_mm512_loadu_si512((const void *)(br + 32));
        prefetch_ahead(bq);
        prefetch_ahead(br);
        for (i = 0; i < mr; i++) {
            uint32_t pe, po;
            memcpy(&pe, ap + p * a_ps + a_rs * i, sizeof(pe));
            memcpy(&po, ah + p * a_ps + a_rs * i, sizeof(po));
            __m512bh ae = (__m512bh)_mm512_set1_epi32((int)pe);
            __m512bh ao = (__m512bh)_mm512_set1_epi32((int)po);
            e0[i] = _mm512_dpbf16_ps(e0[i], ae, b0);
            e1[i] = _mm512_dpbf16_ps(e1[i], ae, b1);
            o0[i] = _mm512_dpbf16_ps(o0[i], ao, b2);
            o1[i] = _mm512_dpbf16_ps(o1[i], ao, b3);
        }
    }
    if (2 * half < ku) {
        /* Odd unit count: the last unit goes to the second-half chain. */
        const uint16_t *bq = bp + (ku - 1) * (NR * KU);
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)bq);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bq + 32));
        for (i = 0; i < mr; i++) {
            uint32_t po;
            memcpy(&po, ap + (ku - 1) * a_ps + a_rs * i, sizeof(po));
            __m512bh ao = (__m512bh)_mm512_set1_epi32((int)po);
            o0[i] = _mm512_dpbf16_ps(o0[i], ao, b0);
            o1[i] = _mm512_dpbf16_ps(o1[i], ao, b1);
        }
    }
    __mmask16 m0 = bf16k_lane_mask(nr);
    __mmask16 m1 = bf16k_lane_mask(nr - 16);
    for (i = 0; i < mr; i++) {
        bf16k_store_zmm(c + i * ldc, _mm512_add_ps(e0[i], o0[i]), m0, alpha, beta);
        if (m1) {
            bf16k_store_zmm(c + i * ldc + 16, _mm512_add_ps(e1[i], o1[i]), m1,
                      alpha, beta);
        }
    }
}

/* One MR x NR tile; mr is a compile-time constant after inlining. */
AVX512BF16_TARGET __attribute__((always_inline))
static inline void
tile(int64_t ku, const uint16_t *ap, int64_t a_ps, int64_t a_rs,
     const uint16_t *bp, float *c, int64_t ldc, const int mr, int nr,
     float alpha, float beta)
{
    __m512 acc0[MR];
    __m512 acc1[MR];
    int i;

    /* C's rows are far apart and leave the cache between K blocks: fetch
     * them 64 k-units before the end, so that the stores do not wait (at
     * the start of a long tile, the B micro-panel streaming through the
     * L1 evicted them again). */
    const int64_t c_fetch_at = ku > 96 ? ku - 64 : 0;
    /* Every loop over the rows is unrolled, so that the accumulators stay
     * in registers (a rolled loop indexes them: the arrays go to the stack,
     * zeroed with rep stos and re-read by the stores). */
#pragma GCC unroll 12
    for (i = 0; i < mr; i++) {
        acc0[i] = _mm512_setzero_ps();
        acc1[i] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < ku; p++) {
        const uint16_t *bq = bp + p * (NR * KU);
        const uint16_t *aq = ap + p * a_ps;
        if (p == c_fetch_at) {
            for (i = 0; i < mr; i++) {
                _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(c + i * ldc + nr / 2),
                             _MM_HINT_T0);
                _mm_prefetch((const char *)(c + i * ldc + nr - 1),
                             _MM_HINT_T0);
            }
        }
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)bq);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bq + 32));
        prefetch_ahead(bq);
#pragma GCC unroll 12
        for (i = 0; i < mr; i++) {
            uint32_t pair;
            memcpy(&pair, aq + a_rs * i, sizeof(pair));
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
            acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
            acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
        }
    }
    __mmask16 m0 = bf16k_lane_mask(nr);
    __mmask16 m1 = bf16k_lane_mask(nr - 16);
#pragma GCC unroll 12
    for (i = 0; i < mr; i++) {
        bf16k_store_zmm(c + i * ldc, acc0[i], m0, alpha, beta);
        if (m1) {
            bf16k_store_zmm(c + i * ldc + 16, acc1[i], m1, alpha, beta);
        }
    }
}

AVX512BF16_TARGET
static void
avx512_kern(int64_t ku, const uint16_t *ap, int64_t a_ps, int64_t a_rs,
            const uint16_t *bp, float *c, int64_t ldc, int mr, int nr,
            float alpha, float beta)
{
    /* A packed by the driver: a unit's MR rows are adjacent, and with the
     * strides as constants every A address is a fixed offset of one
     * pointer (with a_rs a variable, GCC needs a register per row offset
     * and spills two of them inside the loop). */
#define TILE_CASE(R) \
    case R: \
        if (a_rs == KU && a_ps == MR * KU) { \
            tile(ku, ap, MR * KU, KU, bp, c, ldc, R, nr, alpha, beta); \
        } else { \
            tile(ku, ap, a_ps, a_rs, bp, c, ldc, R, nr, alpha, beta); \
        } \
        break
#define FEW_CASE(R) \
    case R: \
        tile_few(ku, ap, a_ps, a_rs, bp, c, ldc, R, nr, alpha, beta); \
        break
    switch (mr) {
        FEW_CASE(1);
        FEW_CASE(2);
        FEW_CASE(3);
        FEW_CASE(4);
        TILE_CASE(5);
        TILE_CASE(6);
        TILE_CASE(7);
        TILE_CASE(8);
        TILE_CASE(9);
        TILE_CASE(10);
        TILE_CASE(11);
        TILE_CASE(12);
    default:
        break;
    }
#undef TILE_CASE
#undef FEW_CASE
}

const bf16k_kernel_desc bf16k_avx512_desc = {
    "avx512bf16", MR, NR, KU, 1, avx512_kern, NULL, NULL
};

#else
/* ISO C forbids an empty translation unit. */
typedef int bf16k_avx512_unused;
#endif /* __x86_64__ */
