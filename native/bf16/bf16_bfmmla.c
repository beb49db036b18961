/* bf16_bfmmla.c -- aarch64 BFMMLA sbgemm micro-kernel.
 *
 * BFMMLA (Arm ACLE: vbfmmlaq_f32, FEAT_BF16) multiplies a 2x4 BF16 matrix
 * by the transpose of another 2x4 and accumulates into 2x2 fp32:
 *     r[i][j] += sum_{q<4} a[i][q] * b[j][q]      (i, j in {0, 1})
 * so a k-unit is a quad of k values (KU = 4).  A panels hold MR = 8 rows x
 * 4 BF16 per quad: rows 2i, 2i+1 form one 128-bit A operand; B panels hold
 * NR = 8 columns x 4 BF16: columns 2j, 2j+1 form one B operand.  The
 * micro-tile is 8 x 8 fp32 in 16 accumulators of 2x2.
 *
 * Built only on aarch64; the target attribute enables +bf16 for these
 * functions alone, and bf16_driver.c calls them only when
 * getauxval(AT_HWCAP2) & HWCAP2_BF16.  Also linked by the standalone qemu
 * test (scripts/test_bfmmla_qemu.sh).
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "bf16_kernels.h"

#define MR 8
#define NR 8
#define KU 4

#define BFMMLA_TARGET __attribute__((target("arch=armv8.6-a+bf16")))

BFMMLA_TARGET
static void
bfmmla_kern(int64_t ku, const uint16_t *ap, int64_t a_ps, int64_t a_rs,
            const uint16_t *bp, float *c, int64_t ldc, int mr, int nr,
            float alpha, float beta)
{
    float32x4_t acc[MR / 2][NR / 2];
    float tile[MR][NR];
    int i, j;

    (void)a_rs;   /* packed A only (direct_a = 0): rows are KU apart */

    for (i = 0; i < MR / 2; i++) {
        for (j = 0; j < NR / 2; j++) {
            acc[i][j] = vdupq_n_f32(0.0f);
        }
    }
    for (int64_t p = 0; p < ku; p++) {
        const uint16_t *aq = ap + p * a_ps;
        const uint16_t *bq = bp + p * (NR * KU);
        bfloat16x8_t av[MR / 2];
        bfloat16x8_t bv[NR / 2];
        for (i = 0; i < MR / 2; i++) {
            av[i] = vreinterpretq_bf16_u16(vld1q_u16(aq + 8 * i));
        }
        for (j = 0; j < NR / 2; j++) {
            bv[j] = vreinterpretq_bf16_u16(vld1q_u16(bq + 8 * j));
        }
        for (i = 0; i < MR / 2; i++) {
            for (j = 0; j < NR / 2; j++) {
                acc[i][j] = vbfmmlaq_f32(acc[i][j], av[i], bv[j]);
            }
        }
    }
    /* acc[i][j] = [c(2i,2j), c(2i,2j+1), c(2i+1,2j), c(2i+1,2j+1)] */
    for (i = 0; i < MR / 2; i++) {
        for (j = 0; j < NR / 2; j++) {
            float v[4];
            vst1q_f32(v, acc[i][j]);
            tile[2 * i][2 * j] = v[0];
            tile[2 * i][2 * j + 1] = v[1];
            tile[2 * i + 1][2 * j] = v[2];
            tile[2 * i + 1][2 * j + 1] = v[3];
        }
    }
    for (i = 0; i < mr; i++) {
        float *crow = c + i * ldc;
        for (j = 0; j < nr; j++) {
            float r = alpha * tile[i][j];
            crow[j] = beta == 0.0f ? r : r + beta * crow[j];
        }
    }
}

const bf16k_kernel_desc bf16k_bfmmla_desc = {
    "bfmmla", MR, NR, KU, 0, bfmmla_kern, NULL, NULL
};

#else
/* ISO C forbids an empty translation unit. */
typedef int bf16k_bfmmla_unused;
#endif /* __aarch64__ */
