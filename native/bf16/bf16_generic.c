/* bf16_generic.c -- portable C sbgemm micro-kernel (no ISA extensions).
 *
 * Same panel format as the AVX512-BF16 kernel (k-units of KU = 2), MR x NR =
 * 4 x 16.  It is never picked automatically: the numpy/OpenBLAS fallback is
 * faster on CPUs without BF16 instructions.  It exists so the blocked,
 * threaded driver (packing, direct A, splits, K blocks, edges) is tested on
 * every machine, including CI runners without AVX512-BF16: select it with
 * bf16k_select_kernel("generic") or PYCDS_BF16_KERNEL=generic.
 *
 * Per k-unit and entry it adds the two exact products one at a time, in the
 * order VDPBF16PS documents (odd element first), so it has the same error
 * bound as the hardware kernels.
 */
#include <string.h>

#include "bf16_kernels.h"

#define MR 4
#define NR 16
#define KU 2

static void
generic_kern(int64_t ku, const uint16_t *ap, int64_t a_ps, int64_t a_rs,
             const uint16_t *bp, float *c, int64_t ldc, int mr, int nr,
             float alpha, float beta)
{
    float acc[MR][NR];
    int i, j;

    memset(acc, 0, sizeof(acc));
    for (int64_t p = 0; p < ku; p++) {
        const uint16_t *bq = bp + p * (NR * KU);
        /* The k-unit of each row, read one row at a time and only for the
         * mr rows that exist: A read in place ends at row mr - 1 of the
         * last tile.  (With the loads inside the multiply loop below, gcc
         * 12 at -O3 vectorized that loop over rows and read a row past the
         * end of A: a fault when A ended at an unmapped page.)  The rows
         * past mr multiply zeros and are never stored. */
        float a0[MR] = {0}, a1[MR] = {0};
        for (i = 0; i < mr; i++) {
            const uint16_t *aq = ap + p * a_ps + i * a_rs;
            a0[i] = bf16k_widen(aq[0]);
            a1[i] = bf16k_widen(aq[1]);
        }
        for (i = 0; i < MR; i++) {
            for (j = 0; j < NR; j++) {
                acc[i][j] += a1[i] * bf16k_widen(bq[KU * j + 1]);
                acc[i][j] += a0[i] * bf16k_widen(bq[KU * j]);
            }
        }
    }
    for (i = 0; i < mr; i++) {
        float *crow = c + i * ldc;
        for (j = 0; j < nr; j++) {
            float r = alpha * acc[i][j];
            crow[j] = beta == 0.0f ? r : r + beta * crow[j];
        }
    }
}

const bf16k_kernel_desc bf16k_generic_desc = {
    "generic", MR, NR, KU, 1, generic_kern, NULL, NULL
};
