/* bf16_kernels.h -- the C boundary of pycds.bf16._kernels.
 *
 * BF16 <-> fp32 conversion and sbgemm (BF16 x BF16 -> fp32, the semantics
 * of OpenBLAS cblas_sbgemm, row-major) with runtime CPU dispatch:
 *
 *   x86-64   AVX512-BF16  VDPBF16PS (_mm512_dpbf16_ps)  bf16_avx512.c
 *   x86-64   AVX-512F     VFMADD231PS zmm, BF16 widened  bf16_fma.c
 *   x86-64   AVX2 + FMA   VFMADD231PS ymm, BF16 widened  bf16_fma.c
 *   aarch64  FEAT_BF16    BFMMLA    (vbfmmlaq_f32)      bf16_bfmmla.c
 *   other    none: the Python wrapper uses its numpy/OpenBLAS fallback.
 *
 * Rules: no Python objects (cffi calls these with the GIL released); every
 * function returns 0 or a negative BF16K_E_* code (never aborts); all
 * arrays are caller-owned raw pointers; strides are in elements.
 *
 * Keep in sync with bf16_kernels.cdef (declarations only, no directives).
 */
#ifndef PYCDS_BF16_KERNELS_H
#define PYCDS_BF16_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The fp32 value of the BF16 bit pattern h (its 16 bits above 16 zero
 * bits): exact, NaN and infinities kept. */
static inline float
bf16k_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

#define BF16K_OK 0
#define BF16K_E_NOMEM (-1)      /* malloc failed */
#define BF16K_E_ARG (-2)        /* bad size, stride or buffer length */
#define BF16K_E_NOKERNEL (-3)   /* no hardware sbgemm kernel on this CPU */
#define BF16K_E_THREAD (-4)     /* pthread_create failed */
#define BF16K_E_LAYOUT (-5)     /* packed B made for another kernel */

#define BF16K_ACT_NONE 0        /* bf16k_sbgemm_fused activations */
#define BF16K_ACT_RELU 1        /* on the rounded bits */
#define BF16K_ACT_GELU 2        /* exact (erf) GELU in fp32, before rounding */

#define BF16K_ROUND_NEAREST 0   /* IEEE 754 roundTiesToEven */
#define BF16K_ROUND_TRUNCATE 1  /* toward zero */

/* Kernel description used by the blocked driver (bf16_driver.c).
 *
 * Panels: B is packed as [kunits][NR][KU] uint16, where a k-unit is KU
 * consecutive k values (2 for VDPBF16PS pairs, 4 for BFMMLA quads),
 * zero-padded past K and N.  A is read as k-units too: unit p of row i is at
 * ap[p * a_ps + i * a_rs] (KU contiguous values).  Packed A blocks use
 * a_ps = MR * KU, a_rs = KU (zero rows past M); kernels with direct_a != 0
 * also accept row-major op(A) in place (a_ps = KU, a_rs = lda) and then read
 * only rows < mr.
 *
 * kern(ku, ap, a_ps, a_rs, bp, c, ldc, mr, nr, alpha, beta):
 *   C[0:mr, 0:nr] = alpha * A @ Bp + beta * C   (ku k-units)
 *   beta == 0 means C is not read.  mr <= MR, nr <= NR.
 */
typedef void (*bf16k_microkernel)(int64_t ku, const uint16_t *ap,
                                  int64_t a_ps, int64_t a_rs,
                                  const uint16_t *bp, float *c, int64_t ldc,
                                  int mr, int nr, float alpha, float beta);

/* Micro-kernels on fp32 operands (kernels without BF16 instructions): the
 * driver widens BF16 to fp32 while packing.
 *
 * kern_f32(kc, a, b, c, ldc, mr, nr, alpha, beta):
 *   C[0:mr, 0:nr] = alpha * A @ B + beta * C   (kc k values)
 *   kc is a multiple of BF16K_F32_GROUP; a: [kc / GROUP][MR][GROUP] fp32
 *   (GROUP consecutive k values of each row, zero rows past mr); b: [kc][NR]
 *   fp32 (zero columns past nr).  beta == 0 means C is not read.
 * B is packed in k-units of KU = 1 (the BF16 panel [k][NR]). */
#define BF16K_F32_GROUP 8

typedef void (*bf16k_microkernel_f32)(int64_t kc, const float *a,
                                      const float *b, float *c, int64_t ldc,
                                      int mr, int nr, float alpha,
                                      float beta);

/* kern_f32_few(kc, a, b, c, ldc, mr, nr, alpha, beta): as kern_f32, for
 * few rows (inference batches), with B the BF16 panel [kc][NR] itself
 * (widened in registers: it is read once) and any kc; a as for kern_f32
 * (kc rounded up to GROUP). */
typedef void (*bf16k_microkernel_f32_few)(int64_t kc, const float *a,
                                          const uint16_t *b, float *c,
                                          int64_t ldc, int mr, int nr,
                                          float alpha, float beta);

typedef struct {
    const char *name;   /* "avx512bf16", "avx512fma", "avx2fma", "bfmmla" */
    int mr;             /* rows per micro-tile */
    int nr;             /* columns per micro-tile (= B panel width) */
    int ku;             /* k values per k-unit */
    int direct_a;       /* 1: may read row-major A without packing */
    bf16k_microkernel kern;          /* BF16 operands, or NULL */
    bf16k_microkernel_f32 kern_f32;  /* fp32 operands, or NULL */
    bf16k_microkernel_f32_few kern_f32_few;  /* with kern_f32 */
} bf16k_kernel_desc;

/* Kernel descriptors (bf16_generic.c is portable C, for testing the driver
 * anywhere; the others exist only on their architecture). */
extern const bf16k_kernel_desc bf16k_generic_desc;
#if defined(__x86_64__)
extern const bf16k_kernel_desc bf16k_avx512_desc;
extern const bf16k_kernel_desc bf16k_avx512fma_desc;
extern const bf16k_kernel_desc bf16k_avx2fma_desc;
#endif
#if defined(__aarch64__)
extern const bf16k_kernel_desc bf16k_bfmmla_desc;
#endif

#if defined(__x86_64__)
#include <immintrin.h>

/* The mask of the first n lanes of 16 (none for n <= 0, all from 16 on). */
static inline __mmask16
bf16k_lane_mask(int n)
{
    if (n >= 16) {
        return (__mmask16)0xFFFF;
    }
    if (n <= 0) {
        return (__mmask16)0;
    }
    return (__mmask16)((1u << n) - 1u);
}

/* The lanes m of a tile row: c = alpha * acc + beta * c, c not read where
 * beta == 0 (AVX-512F; the AVX512-BF16 and AVX-512F FMA kernels). */
__attribute__((target("avx512f"), always_inline))
static inline void
bf16k_store_zmm(float *c, __m512 acc, __mmask16 m, float alpha, float beta)
{
    __m512 r = acc;
    if (alpha != 1.0f) {
        r = _mm512_mul_ps(r, _mm512_set1_ps(alpha));
    }
    if (beta != 0.0f) {
        r = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, c), r);
    }
    _mm512_mask_storeu_ps(c, m, r);
}
#endif

/* ---- exported API (mirrored in bf16_kernels.cdef) ---------------------- */

/* Name of the selected kernel: by default the hardware kernel found on this
 * CPU, or "none".  Static string. */
const char *bf16k_kernel_name(void);

/* Select the kernel: "auto" (hardware detection), "generic" (portable C,
 * for tests), or the name of any kernel this CPU can run (so that the
 * AVX2 and AVX-512F FMA kernels can be tested on a CPU with AVX512-BF16).
 * Returns 0 or BF16K_E_NOKERNEL / BF16K_E_ARG.  Takes effect for later
 * calls; packed B from another kernel must be re-packed (BF16K_E_LAYOUT). */
int bf16k_select_kernel(const char *name);

/* The kernels this CPU can run, space-separated, the one "auto" picks
 * first and "generic" last.  Static string. */
const char *bf16k_available_kernels(void);

/* MR, NR, KU of the active hardware kernel (see bf16k_kernel_desc); returns
 * BF16K_E_NOKERNEL (outputs untouched) when there is none. */
int bf16k_kernel_params(int *mr, int *nr, int *ku);

/* Human-readable message for a BF16K_E_* code.  Static string. */
const char *bf16k_strerror(int rc);

/* Number of worker threads sbgemm uses (1..BF16K_MAX_THREADS); n <= 0 picks
 * the number of online CPUs.  Returns the value in effect. */
int bf16k_set_num_threads(int n);

/* src: n float32 (caller-owned, read)  ->  dst: n uint16 BF16 (written). */
int bf16k_from_f32(const float *src, uint16_t *dst, int64_t n, int rounding);

/* src: n uint16 BF16 (read)  ->  dst: n float32 (written), exact. */
int bf16k_to_f32(const uint16_t *src, float *dst, int64_t n);

/* Number of uint16 elements pack_b writes for op(B) of shape (k, n), for
 * the active hardware kernel; -BF16K_E_NOKERNEL... as a negative code. */
int64_t bf16k_packed_b_len(int64_t k, int64_t n);

/* B element (kk, j) of op(B) (K x N) is b[kk*rs + j*cs].  dst (len uint16,
 * caller-owned) receives the panel layout of the active kernel. */
int bf16k_pack_b(const uint16_t *b, int64_t k, int64_t n, int64_t rs,
                 int64_t cs, uint16_t *dst, int64_t len);

/* Identifier of the selected kernel's packed-B layout, (NR << 8) | KU, or
 * BF16K_E_NOKERNEL.  Store it with packed data; sbgemm checks it. */
int bf16k_packed_layout(void);

/* C = alpha * op(A) @ op(B) + beta * C.
 * op(A) (m x k): element (i, kk) at a[i*a_rs + kk*a_cs].
 * bp: B packed by bf16k_pack_b for (k, n), bp_len uint16, made for layout
 * `layout` (BF16K_E_LAYOUT if that is not the selected kernel's).
 * c: m x n float32, element (i, j) at c[i*ldc + j].  beta == 0: not read.
 * k == 0 or alpha == 0: C := beta * C and a, bp are not read (BLAS). */
int bf16k_sbgemm_packed(int64_t m, int64_t n, int64_t k, float alpha,
                        const uint16_t *a, int64_t a_rs, int64_t a_cs,
                        const uint16_t *bp, int64_t bp_len, int layout,
                        float beta, float *c, int64_t ldc);

/* bf16k_sbgemm_packed with op(A) given in fp32 (element (i, kk) at
 * a[i*a_rs + kk*a_cs], a_rs, a_cs >= 0) and rounded to BF16 first (nearest
 * even, as bf16k_from_f32): the result is bit for bit that of converting A
 * and calling bf16k_sbgemm_packed.  The fp32 kernels (avx2fma, avx512fma)
 * round A while they pack it, in the same pass as the widening; the others
 * convert A's stored span to a temporary BF16 copy (BF16K_E_NOMEM if it
 * cannot be allocated). */
int bf16k_sbgemm_f32a(int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t a_rs, int64_t a_cs,
                      const uint16_t *bp, int64_t bp_len, int layout,
                      float beta, float *c, int64_t ldc);

/* out = BF16(act(alpha * op(A) @ op(B) + bias + res)), the post-ops
 * applied to each tile of the fp32 product while it is in cache (as
 * oneDNN's post-ops): bias (n floats) and res (m x n BF16 at
 * res[i*ldr + j]) are optional (NULL); act BF16K_ACT_GELU applies
 * 0.5 v (1 + erf(v / sqrt 2)) to the fp32 sum (erf: a rational
 * approximation, |error| <= 5e-7); the sum is rounded to nearest even
 * (NaN stays NaN); with BF16K_ACT_RELU, negative results, -0 and NaNs with
 * the sign bit become +0 (ReLU on the rounded bits).  Another act value:
 * BF16K_E_ARG.  out: m x n uint16 at
 * out[i*ldo + j]; it may be res itself (ldo == ldr), as each element of res
 * is read before that element of out is written.  No fp32 C is exposed.
 * k == 0 or alpha == 0: the post-ops of a zero product (a, bp not read). */
int bf16k_sbgemm_fused(int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t *a, int64_t a_rs, int64_t a_cs,
                       const uint16_t *bp, int64_t bp_len, int layout,
                       const float *bias, const uint16_t *res, int64_t ldr,
                       int act, uint16_t *out, int64_t ldo);

/* The post-ops of bf16k_sbgemm_fused applied to an fp32 m x n matrix acc
 * (acc[i*lda + j], read): out = BF16(act(acc + bias + res)) with bias, res,
 * act, out as there.  For products computed elsewhere (the numpy fallback).
 * m or n == 0: nothing. */
int bf16k_postops(int64_t m, int64_t n, const float *acc, int64_t lda,
                  const float *bias, const uint16_t *res, int64_t ldr, int act,
                  uint16_t *out, int64_t ldo);

/* LayerNorm over each of m rows of n floats (x[i*ldx + j], read), after
 * adding bias (n floats, or NULL): y = (v - mean) / sqrt(var + eps) *
 * gamma + beta with the biased variance, as torch.nn.LayerNorm, in fp32.
 * Writes y (fp32, y[i*ldy + j], may be x itself with ldy == ldx) and/or yb
 * (its BF16 rounding to nearest even, yb[i*ldb + j]); either may be NULL,
 * not both.  gamma, beta: n floats.  Rows split over the sbgemm threads. */
int bf16k_layernorm(const float *x, int64_t m, int64_t n, int64_t ldx,
                    const float *bias, const float *gamma, const float *beta,
                    float eps, float *y, int64_t ldy, uint16_t *yb,
                    int64_t ldb);

/* Multi-head scaled dot-product attention of nb sequences of t tokens, in
 * fp32 from BF16 Q, K, V: row (b*t + i) of qkv holds Q, K and V side by side
 * (nh heads of d values each, so 3*nh*d <= ldq uint16); key_bias (nb x t
 * floats) is added to every score of key j (0, or -1e30 for padding);
 * ctx row (b*t + i), columns [h*d, (h+1)*d), receives softmax(q K^T *
 * scale + key_bias) V of head h rounded to BF16 (ldc >= nh*d).  Softmax in
 * fp32 with max subtraction.  use_kernel != 0 and a kernel selected: the
 * two products by the sbgemm micro-kernel (BF16 products, fp32 sums; the
 * probabilities rounded to BF16 before P V, as PyTorch's BF16 attention);
 * otherwise portable C in fp32 throughout.  (sequence, head) pairs split
 * over the sbgemm threads.  nb or t == 0: nothing. */
int bf16k_attention(const uint16_t *qkv, int64_t ldq, int64_t nb, int64_t t,
                    int64_t nh, int64_t d, const float *key_bias, float scale,
                    int use_kernel, uint16_t *ctx, int64_t ldc);

/* im2col of an NHWC BF16 image (x: n x h x w x c, C-contiguous) into
 * cols ((n*oh*ow) x (kh*kw*c), C-contiguous, cols_len uint16 at least):
 * row (n, oy, ox), columns (ky, kx, ci), zeros in the padding; the layout
 * of pycds.bf16.im2col.im2col(..., "NHWC").  Two threads for large images.
 * h or w may be 0 (all padding: cols is zeroed, x is not read). */
int bf16k_im2col_nhwc(const uint16_t *x, int64_t n, int64_t h, int64_t w, int64_t c,
                      int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
                      uint16_t *cols, int64_t cols_len);

#define BF16K_MAX_THREADS 64

#endif /* PYCDS_BF16_KERNELS_H */
