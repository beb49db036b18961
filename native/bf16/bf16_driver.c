/* bf16_driver.c -- CPU dispatch, conversion, B packing and the blocked,
 * threaded sbgemm driver shared by every hardware micro-kernel.
 *
 * Compiled for the baseline ISA (x86-64 / armv8-a); ISA-specific code lives
 * in bf16_avx512.c, bf16_fma.c and bf16_bfmmla.c behind target attributes
 * and is only called after the CPU check below.  No Python objects are
 * touched here: cffi calls these functions with the GIL released.
 *
 * Blocking follows the BLIS/GotoBLAS loop nest with B already packed:
 *   for pc (KC k values)          A block MC x KC packed per thread (L2)
 *     for ic (MC rows)
 *       for jp (B panels)         B micro-panel KC x NR stays in L1
 *         for ir (MR rows)        micro-kernel: MR x NR tile of C
 * C is scaled by beta in the first K block only; later blocks accumulate.
 * For the fp32 FMA kernels (kern_f32) the A block is widened to fp32 while
 * it is packed, and each KC x NR B micro-panel is widened into a per-thread
 * fp32 buffer before the MR loop that reuses it.
 * Threads split the B panels (or the rows when there are too few panels).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1UL << 14)
#endif
#endif

#include "bf16_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KC 2048             /* k values per K block (multiple of 4) */
#define KC_F32 512          /* ... for the fp32 kernels, whose B micro-panel
                             * is widened into a buffer (multiple of 8) */
#define BUF_ALIGN 64        /* packing buffers: cache-line aligned */
#define MC_TILES 20         /* MR tiles per A block */
#define A_ALL_F32 (1 << 20)  /* fp32 kernels: floats of A kept across K
                                * blocks (run_block's a_all) */
#define WHOLE_B_F32 (1 << 18)  /* fp32 kernels: widen a B of at most this
                                * many floats (1 MiB) once per call */
/* Work chunks per thread, for dynamic balance.  Panel chunks each re-read
 * all of A, so there are fewer of them. */
#define ROW_CHUNKS_PER_THREAD 8
/* ... for the fp32 kernels, where each row chunk widens every B
 * micro-panel again (avx512fma, two threads: 4 beat 8 by 3 to 7 %). */
#define ROW_CHUNKS_PER_THREAD_F32 4
#define PANEL_CHUNKS_PER_THREAD 2
#define DIRECT_MAX_PANELS 8  /* read A in place up to this many panels */
#define MIN_FLOPS_PER_THREAD (1LL << 24)  /* work worth a thread's wake-up */

/* ---- dispatch ---------------------------------------------------------- */

static const bf16k_kernel_desc *hw_desc;     /* set once by detect() */
/* Every kernel this CPU can run, best first, then generic (detect()). */
static const bf16k_kernel_desc *avail[4];
static int navail;
static char avail_names[64];
#if defined(__x86_64__)
static int have_avx512bw;   /* set by detect(): AVX512 conversion loops */
static int have_avx512vl;   /* ... and with VL: the fused epilogue */
static int have_avx2;       /* the transformer row kernels' AVX2 clones */
#endif
static _Atomic(const bf16k_kernel_desc *) selected;  /* NULL: use hw_desc */
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static int num_threads;     /* 0 = not yet set */

static void
detect(void)
{
    navail = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_avx512bw = __builtin_cpu_supports("avx512f")
        && __builtin_cpu_supports("avx512bw");
    have_avx512vl = have_avx512bw && __builtin_cpu_supports("avx512vl");
    have_avx2 = __builtin_cpu_supports("avx2");
    if (__builtin_cpu_supports("avx512bf16")
            && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vl")) {
        avail[navail++] = &bf16k_avx512_desc;
    }
    if (__builtin_cpu_supports("avx512f")) {
        avail[navail++] = &bf16k_avx512fma_desc;
    }
    if (have_avx2 && __builtin_cpu_supports("fma")) {
        avail[navail++] = &bf16k_avx2fma_desc;
    }
#elif defined(__aarch64__) && defined(__linux__)
    if (getauxval(AT_HWCAP2) & HWCAP2_BF16) {
        avail[navail++] = &bf16k_bfmmla_desc;
    }
#endif
    hw_desc = navail > 0 ? avail[0] : NULL;
    avail[navail++] = &bf16k_generic_desc;
    avail_names[0] = '\0';
    for (int i = 0; i < navail; i++) {
        if (i > 0) {
            strcat(avail_names, " ");
        }
        strcat(avail_names, avail[i]->name);   /* < 64 chars in all */
    }
}

static const bf16k_kernel_desc *
get_desc(void)
{
    pthread_once(&detect_once, detect);
    const bf16k_kernel_desc *d = atomic_load(&selected);
    return d ? d : hw_desc;
}

const char *
bf16k_kernel_name(void)
{
    const bf16k_kernel_desc *d = get_desc();
    return d ? d->name : "none";
}

int
bf16k_select_kernel(const char *name)
{
    if (name == NULL) {
        return BF16K_E_ARG;
    }
    pthread_once(&detect_once, detect);
    if (strcmp(name, "auto") == 0) {
        atomic_store(&selected, NULL);
        return BF16K_OK;
    }
    for (int i = 0; i < navail; i++) {
        if (strcmp(name, avail[i]->name) == 0) {
            atomic_store(&selected, avail[i]);
            return BF16K_OK;
        }
    }
    return BF16K_E_NOKERNEL;
}

const char *
bf16k_available_kernels(void)
{
    pthread_once(&detect_once, detect);
    return avail_names;
}

int
bf16k_kernel_params(int *mr, int *nr, int *ku)
{
    const bf16k_kernel_desc *d = get_desc();
    if (d == NULL) {
        return BF16K_E_NOKERNEL;
    }
    if (mr == NULL || nr == NULL || ku == NULL) {
        return BF16K_E_ARG;
    }
    *mr = d->mr;
    *nr = d->nr;
    *ku = d->ku;
    return BF16K_OK;
}

const char *
bf16k_strerror(int rc)
{
    switch (rc) {
    case BF16K_OK:
        return "ok";
    case BF16K_E_NOMEM:
        return "out of memory";
    case BF16K_E_ARG:
        return "invalid argument (size, stride or buffer length)";
    case BF16K_E_NOKERNEL:
        return "no hardware BF16 kernel on this CPU";
    case BF16K_E_THREAD:
        return "could not start a worker thread";
    case BF16K_E_LAYOUT:
        return "packed B does not match the active kernel";
    default:
        return "unknown error";
    }
}

int
bf16k_set_num_threads(int n)
{
    if (n <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (int)cpus : 1;
    }
    if (n > BF16K_MAX_THREADS) {
        n = BF16K_MAX_THREADS;
    }
    num_threads = n;
    return n;
}

static int
get_num_threads(void)
{
    if (num_threads <= 0) {
        return bf16k_set_num_threads(0);
    }
    return num_threads;
}

/* ---- two-way parallel helper ------------------------------------------ */

/* Arrays at least this long are converted / packed / unfolded by two
 * threads. */
#define PARALLEL_MIN_ELEMS (1 << 18)

/* The two halves of a job over `elems` elements: fn(arg0) and fn(arg1),
 * on two of the sbgemm pool's threads when the job is large and two
 * threads are allowed, else one after the other here.  For memory-bound
 * loops over large arrays.  (Defined with the pool, below.) */
static void run_pair(void *(*fn)(void *), void *arg0, void *arg1,
                     int64_t elems);

/* ---- conversion -------------------------------------------------------- */

/* The BF16 bits of the fp32 bits u: RNE (bias_on 1) or truncation
 * (bias_on 0), branch-free; NaN -> sign | 0x7FC0. */
static inline uint16_t
round_bits(uint32_t u, uint32_t bias_on)
{
    uint32_t mag = u & 0x7FFFFFFFu;
    uint32_t r = (u + bias_on * (0x7FFFu + ((u >> 16) & 1u))) >> 16;
    uint32_t nan = (u >> 16 & 0x8000u) | 0x7FC0u;
    return (uint16_t)(mag > 0x7F800000u ? nan : r);
}

static void
from_f32_scalar(const float *src, uint16_t *dst, int64_t n, uint32_t bias_on)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof(u));
        dst[i] = round_bits(u, bias_on);
    }
}

static void
to_f32_scalar(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        dst[i] = bf16k_widen(src[i]);
    }
}

#if defined(__x86_64__)
/* The same integer arithmetic, 16 lanes at a time (AVX512F/BW integer ops
 * only: VCVTNEPS2BF16 would flush subnormals, so it is not used). */
__attribute__((target("avx512f,avx512bw")))
static void
from_f32_avx512(const float *src, uint16_t *dst, int64_t n, uint32_t bias_on)
{
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i bias = _mm512_set1_epi32((int)(0x7FFFu * bias_on));
    const __m512i lsb_on = _mm512_set1_epi32((int)bias_on);
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i inf = _mm512_set1_epi32(0x7F800000);
    const __m512i sign16 = _mm512_set1_epi32(0x8000);
    const __m512i qnan = _mm512_set1_epi32(0x7FC0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(src + i));
        __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i lsb = _mm512_and_si512(_mm512_and_si512(hi, one), lsb_on);
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(u, absmask), inf);
        __m512i nanv = _mm512_or_si512(_mm512_and_si512(hi, sign16), qnan);
        r = _mm512_mask_mov_epi32(r, nan, nanv);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                            _mm512_cvtepi32_epi16(r));
    }
    from_f32_scalar(src + i, dst + i, n - i, bias_on);
}

__attribute__((target("avx512f,avx512bw")))
static void
to_f32_avx512(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)
                                       (src + i));
        __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        _mm512_storeu_si512((void *)(dst + i), u);
    }
    to_f32_scalar(src + i, dst + i, n - i);
}
#endif

typedef struct {
    const void *src;
    void *dst;
    int64_t n;
    uint32_t bias_on;
    int widen;              /* 1: BF16 -> f32, 0: f32 -> BF16 */
} conv_job;

static void *
conv_run(void *arg)
{
    const conv_job *j = arg;
#if defined(__x86_64__)
    if (have_avx512bw) {
        if (j->widen) {
            to_f32_avx512(j->src, j->dst, j->n);
        } else {
            from_f32_avx512(j->src, j->dst, j->n, j->bias_on);
        }
        return NULL;
    }
#endif
    if (j->widen) {
        to_f32_scalar(j->src, j->dst, j->n);
    } else {
        from_f32_scalar(j->src, j->dst, j->n, j->bias_on);
    }
    return NULL;
}

/* Convert n elements, in two halves on two threads when n is large. */
static void
conv_dispatch(const void *src, size_t src_size, void *dst, size_t dst_size,
              int64_t n, uint32_t bias_on, int widen)
{
    pthread_once(&detect_once, detect);
    int64_t h = n / 2;
    conv_job j0 = {src, dst, h, bias_on, widen};
    conv_job j1 = {(const char *)src + (size_t)h * src_size,
                   (char *)dst + (size_t)h * dst_size, n - h, bias_on, widen};
    run_pair(conv_run, &j0, &j1, n);
}

int
bf16k_from_f32(const float *src, uint16_t *dst, int64_t n, int rounding)
{
    if (n < 0 || (n > 0 && (src == NULL || dst == NULL))
            || (rounding != BF16K_ROUND_NEAREST
                && rounding != BF16K_ROUND_TRUNCATE)) {
        return BF16K_E_ARG;
    }
    conv_dispatch(src, sizeof(float), dst, sizeof(uint16_t), n,
                  rounding == BF16K_ROUND_NEAREST ? 1u : 0u, 0);
    return BF16K_OK;
}

int
bf16k_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    if (n < 0 || (n > 0 && (src == NULL || dst == NULL))) {
        return BF16K_E_ARG;
    }
    conv_dispatch(src, sizeof(uint16_t), dst, sizeof(float), n, 0, 1);
    return BF16K_OK;
}

/* ---- im2col -------------------------------------------------------------- */

/* Rows [r0, r1) of the NHWC im2col matrix: row (n, oy, ox) holds, for each
 * tap (ky, kx), the C channels of input pixel (oy*SH - PH + ky*DH,
 * ox*SW - PW + kx*DW), or zeros where that pixel is padding. */
typedef struct {
    const uint16_t *x;
    int64_t h, w, c;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t oh, ow, r0, r1;
    uint16_t *cols;
} im2col_job;

static void *
im2col_run(void *arg)
{
    const im2col_job *j = arg;
    const int64_t pix = j->oh * j->ow, c = j->c;
    const size_t bytes = (size_t)c * sizeof(uint16_t);
    uint16_t *dst = j->cols + j->r0 * (int64_t)j->kh * j->kw * c;
    for (int64_t r = j->r0; r < j->r1; r++) {
        const int64_t n = r / pix, rem = r % pix;
        const int64_t y0 = rem / j->ow * j->sh - j->ph;
        const int64_t x0 = rem % j->ow * j->sw - j->pw;
        const uint16_t *img = j->x + n * j->h * j->w * c;
        const int64_t x1 = x0 + (int64_t)(j->kw - 1) * j->dw;   /* last tap's column */
        for (int ky = 0; ky < j->kh; ky++) {
            const int64_t y = y0 + (int64_t)ky * j->dh;
            if (j->dw == 1 && y >= 0 && y < j->h && x0 >= 0 && x1 < j->w) {
                /* the kernel row's KW pixels are adjacent: one copy */
                memcpy(dst, img + (y * j->w + x0) * c, (size_t)j->kw * bytes);
                dst += (int64_t)j->kw * c;
                continue;
            }
            for (int kx = 0; kx < j->kw; kx++, dst += c) {
                const int64_t xx = x0 + (int64_t)kx * j->dw;
                if (y < 0 || y >= j->h || xx < 0 || xx >= j->w) {
                    memset(dst, 0, bytes);
                } else {
                    memcpy(dst, img + (y * j->w + xx) * c, bytes);
                }
            }
        }
    }
    return NULL;
}

int
bf16k_im2col_nhwc(const uint16_t *x, int64_t n, int64_t h, int64_t w, int64_t c,
                  int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
                  uint16_t *cols, int64_t cols_len)
{
    if (cols == NULL || n < 0 || h < 0 || w < 0 || c <= 0
            || (x == NULL && n > 0 && h > 0 && w > 0)
            || kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0 || ph < 0 || pw < 0
            || dh <= 0 || dw <= 0) {
        return BF16K_E_ARG;
    }
    int64_t eh = h + 2 * (int64_t)ph - (int64_t)dh * (kh - 1) - 1;
    int64_t ew = w + 2 * (int64_t)pw - (int64_t)dw * (kw - 1) - 1;
    if (eh < 0 || ew < 0) {
        return BF16K_E_ARG;   /* the kernel does not fit the padded image */
    }
    int64_t oh = eh / sh + 1, ow = ew / sw + 1, m = n * oh * ow;
    if (cols_len / ((int64_t)kh * kw * c) < m) {
        return BF16K_E_ARG;   /* cols too short */
    }
    if (h == 0 || w == 0) {
        /* An empty image: every tap is padding. */
        memset(cols, 0, (size_t)(m * kh * kw * c) * sizeof(uint16_t));
        return BF16K_OK;
    }
    im2col_job j0 = {x, h, w, c, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, 0, m, cols};
    im2col_job j1 = j0;
    j0.r1 = j1.r0 = m / 2;
    run_pair(im2col_run, &j0, &j1, m * (int64_t)kh * kw * c);
    return BF16K_OK;
}

/* ---- packing ----------------------------------------------------------- */

static int64_t
ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Element count of packed op(B) (k x n) for descriptor d; -1 on overflow. */
static int64_t
packed_len(const bf16k_kernel_desc *d, int64_t k, int64_t n)
{
    int64_t kunits = ceil_div(k, d->ku);
    int64_t panels = ceil_div(n, d->nr);
    int64_t per_panel = kunits * d->nr * d->ku;
    if (kunits > 0 && panels > INT64_MAX / 2 / per_panel) {
        return -1;
    }
    return panels * per_panel;
}

int64_t
bf16k_packed_b_len(int64_t k, int64_t n)
{
    const bf16k_kernel_desc *d = get_desc();
    if (d == NULL) {
        return BF16K_E_NOKERNEL;
    }
    if (k < 0 || n < 0) {
        return BF16K_E_ARG;
    }
    int64_t len = packed_len(d, k, n);
    return len < 0 ? BF16K_E_ARG : len;
}

/* Copy one k-unit (ku = 2 or 4 uint16, else element-wise) with a constant
 * size, so the compiler emits one load/store instead of a memcpy call. */
static inline void
copy_unit(uint16_t *dst, const uint16_t *src, int ku)
{
    if (ku == 2) {
        memcpy(dst, src, 2 * sizeof(uint16_t));
    } else if (ku == 4) {
        memcpy(dst, src, 4 * sizeof(uint16_t));
    } else {
        for (int u = 0; u < ku; u++) {
            dst[u] = src[u];
        }
    }
}

/* Interleave ku rows of op(B) (unit column stride) into one k-unit of a
 * full panel: q[jj*ku + u] = row_u[jj]. */
static void
pack_b_unit_rows(const uint16_t *b0, int64_t rs, int nr, int ku, uint16_t *q)
{
    if (ku == 1) {
        /* The fp32 kernels' panels: a unit is one row (element by
         * element, packing took 27 us of a 256^3 avx2fma call's 190). */
        memcpy(q, b0, (size_t)nr * sizeof(uint16_t));
        return;
    }
#if defined(__SSE2__)
    if (ku == 2 && nr % 8 == 0) {
        const uint16_t *b1 = b0 + rs;
        for (int jj = 0; jj < nr; jj += 8) {
            __m128i r0 = _mm_loadu_si128((const __m128i *)(b0 + jj));
            __m128i r1 = _mm_loadu_si128((const __m128i *)(b1 + jj));
            _mm_storeu_si128((__m128i *)(q + 2 * jj),
                             _mm_unpacklo_epi16(r0, r1));
            _mm_storeu_si128((__m128i *)(q + 2 * jj + 8),
                             _mm_unpackhi_epi16(r0, r1));
        }
        return;
    }
#endif
    for (int u = 0; u < ku; u++) {
        const uint16_t *row = b0 + u * rs;
        for (int jj = 0; jj < nr; jj++) {
            q[jj * ku + u] = row[jj];
        }
    }
}

/* One call's B packing, k-units [p0, p1) (one per thread). */
#define PACK_B_ROWS 8       /* rows of B per visit of a panel */
typedef struct {
    const bf16k_kernel_desc *d;
    const uint16_t *b;
    int64_t k, n, rs, cs;
    uint16_t *dst;
    int64_t p0, p1;
} pack_job;

/* Unit p of panel jp of the packed op(B), from j's B. */
static void
pack_b_unit(const pack_job *j, int64_t p, int64_t jp, int64_t kunits)
{
    const int nr = j->d->nr, ku = j->d->ku;
    const int64_t k = j->k, n = j->n, rs = j->rs, cs = j->cs;
    const int64_t k0 = p * ku;
    const int full_k = k0 + ku <= k;
    uint16_t *q = j->dst + (jp * kunits + p) * nr * ku;
    const int64_t j0 = jp * nr;
    const int ncols = (int)(n - j0 < nr ? n - j0 : nr);
    if (full_k && ncols == nr && cs == 1) {
        pack_b_unit_rows(j->b + k0 * rs + j0, rs, nr, ku, q);
    } else if (full_k && ncols == nr && rs == 1) {
        for (int jj = 0; jj < nr; jj++) {
            copy_unit(q + jj * ku, j->b + (j0 + jj) * cs + k0, ku);
        }
    } else {
        for (int jj = 0; jj < nr; jj++) {
            for (int u = 0; u < ku; u++) {
                int64_t kk = k0 + u;
                q[jj * ku + u] = (jj < ncols && kk < k)
                    ? j->b[kk * rs + (j0 + jj) * cs] : 0;
            }
        }
    }
}

static void *
pack_b_range(void *arg)
{
    const pack_job *j = arg;
    const int ku = j->d->ku;
    const int64_t kunits = ceil_div(j->k, ku);
    const int64_t panels = ceil_div(j->n, j->d->nr);
    /* k-units outer so that the rows of a row-major B are read in order,
     * PACK_B_ROWS rows of B at a time, so that each panel gets a run of
     * nr * PACK_B_ROWS values (with one k value a unit and a unit at a
     * time, every 32-byte write went to another panel: 2048^2 packed in
     * 0.84 ms against 0.17 with VDPBF16PS pairs); panel jp, unit p lives
     * at dst[((jp * kunits) + p) * nr * ku]. */
    const int64_t step = PACK_B_ROWS / ku > 0 ? PACK_B_ROWS / ku : 1;
    for (int64_t pb = j->p0; pb < j->p1; pb += step) {
        const int64_t pe = pb + step < j->p1 ? pb + step : j->p1;
        for (int64_t jp = 0; jp < panels; jp++) {
            for (int64_t p = pb; p < pe; p++) {
                pack_b_unit(j, p, jp, kunits);
            }
        }
    }
    return NULL;
}

int
bf16k_pack_b(const uint16_t *b, int64_t k, int64_t n, int64_t rs, int64_t cs,
             uint16_t *dst, int64_t len)
{
    const bf16k_kernel_desc *d = get_desc();
    if (d == NULL) {
        return BF16K_E_NOKERNEL;
    }
    if (k < 0 || n < 0 || (k > 0 && n > 0 && b == NULL)) {
        return BF16K_E_ARG;
    }
    int64_t need = packed_len(d, k, n);
    if (need < 0 || len < need || (need > 0 && dst == NULL)) {
        return BF16K_E_ARG;
    }
    const int64_t kunits = ceil_div(k, d->ku);
    pack_job j0 = {d, b, k, n, rs, cs, dst, 0, kunits};
    pack_job j1 = j0;
    j0.p1 = j1.p0 = kunits / 2;
    run_pair(pack_b_range, &j0, &j1, need);
    return BF16K_OK;
}

/* The first units of one full tile of row-major A (ku = 2, mr a multiple
 * of 4) packed by 4 x 4 transposes of 32-bit pairs: 4 rows x 4 units in, 4
 * units x 4 rows out (a unit of every row at a time made pack_a 8 % of a
 * 1024^3 product, one thread).  Returns how many units it packed. */
static int64_t
pack_a_pairs(const uint16_t *src, int64_t rs, int mr, int ku, int64_t units,
             uint16_t *td)
{
#if defined(__SSE2__)
    if (ku != 2 || mr % 4 != 0) {
        return 0;
    }
    int64_t p = 0;
    for (; p + 4 <= units; p += 4) {
        uint16_t *q = td + p * mr * 2;
        for (int g = 0; g < mr; g += 4) {
            const uint16_t *r = src + g * rs + p * 2;
            if ((p & 15) == 0) {
                /* 12 row streams are more than the hardware prefetcher
                 * follows well: fetch each row 512 bytes ahead, once a
                 * cache line (an integer address: no pointer past A). */
                for (int i = 0; i < 4; i++) {
                    _mm_prefetch((const char *)((uintptr_t)(r + i * rs) + 512),
                                 _MM_HINT_T0);
                }
            }
            __m128i x0 = _mm_loadu_si128((const __m128i *)r);
            __m128i x1 = _mm_loadu_si128((const __m128i *)(r + rs));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(r + 2 * rs));
            __m128i x3 = _mm_loadu_si128((const __m128i *)(r + 3 * rs));
            __m128i t0 = _mm_unpacklo_epi32(x0, x1);
            __m128i t1 = _mm_unpacklo_epi32(x2, x3);
            __m128i t2 = _mm_unpackhi_epi32(x0, x1);
            __m128i t3 = _mm_unpackhi_epi32(x2, x3);
            uint16_t *o = q + g * 2;
            _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi64(t0, t1));
            _mm_storeu_si128((__m128i *)(o + mr * 2),
                             _mm_unpackhi_epi64(t0, t1));
            _mm_storeu_si128((__m128i *)(o + mr * 4),
                             _mm_unpacklo_epi64(t2, t3));
            _mm_storeu_si128((__m128i *)(o + mr * 6),
                             _mm_unpackhi_epi64(t2, t3));
        }
    }
    return p;
#else
    (void)src; (void)rs; (void)mr; (void)ku; (void)units; (void)td;
    return 0;
#endif
}

/* Pack rows [i0, i0+mc) x k values [k0, k0+kcu*ku) of op(A) into
 * [tile][kcu][mr][ku], zero-padded to whole tiles and past K. */
static void
pack_a(const bf16k_kernel_desc *d, const uint16_t *a, int64_t rs, int64_t cs,
       int64_t m_end, int64_t k, int64_t i0, int64_t mc, int64_t k0,
       int64_t kcu, uint16_t *dst)
{
    const int mr = d->mr, ku = d->ku;
    int64_t tiles = ceil_div(mc, mr);
    for (int64_t t = 0; t < tiles; t++) {
        uint16_t *td = dst + t * kcu * mr * ku;
        int64_t r0 = i0 + t * mr;
        int rows = (int)(m_end - r0 < mr ? m_end - r0 : mr);
        int64_t full_units = (k - k0) / ku;   /* units with no K padding */
        if (full_units > kcu) {
            full_units = kcu;
        }
        if (rows == mr && cs == 1) {
            /* Row-major op(A): mr sequential read streams, one sequential
             * write stream. */
            const uint16_t *src = a + r0 * rs + k0;
            int64_t p = pack_a_pairs(src, rs, mr, ku, full_units, td);
            for (; p < full_units; p++) {
                uint16_t *q = td + p * mr * ku;
                for (int ii = 0; ii < mr; ii++) {
                    copy_unit(q + ii * ku, src + ii * rs + p * ku, ku);
                }
            }
        } else if (rows == mr && rs == 1) {
            /* Transposed storage: a k value's mr rows are contiguous. */
            for (int64_t p = 0; p < full_units; p++) {
                uint16_t *q = td + p * mr * ku;
                for (int u = 0; u < ku; u++) {
                    const uint16_t *src = a + (k0 + p * ku + u) * cs + r0;
                    for (int ii = 0; ii < mr; ii++) {
                        q[ii * ku + u] = src[ii];
                    }
                }
            }
        } else {
            full_units = 0;
        }
        for (int64_t p = full_units; p < kcu; p++) {
            uint16_t *q = td + p * mr * ku;
            int64_t kk0 = k0 + p * ku;
            for (int ii = 0; ii < mr; ii++) {
                for (int u = 0; u < ku; u++) {
                    int64_t kk = kk0 + u;
                    q[ii * ku + u] = (ii < rows && kk < k)
                        ? a[(r0 + ii) * rs + kk * cs] : 0;
                }
            }
        }
    }
}

/* dst[0:8] = the fp32 values of the BF16 src[0:8] (exact). */
static inline void
widen8(const uint16_t *src, float *dst)
{
#if defined(__SSE2__)
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)src);
    const __m128i zero = _mm_setzero_si128();
    _mm_storeu_si128((__m128i *)(void *)dst, _mm_unpacklo_epi16(zero, h));
    _mm_storeu_si128((__m128i *)(void *)(dst + 4),
                     _mm_unpackhi_epi16(zero, h));
#else
    for (int q = 0; q < 8; q++) {
        dst[q] = bf16k_widen(src[q]);
    }
#endif
}

/* The fp32 kernels' B micro-panel: kc rows of nr BF16 (src, [kc][nr]) to
 * fp32 in dst, then zero rows up to kc8. */
static void
widen_panel(const uint16_t *src, int64_t kc, int nr, int64_t kc8, float *dst)
{
    const int64_t n = kc * nr;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
#if defined(__SSE2__)
        if (i % 32 == 0) {
            /* 2 KiB ahead (a prefetch never faults: an integer address) */
            _mm_prefetch((const char *)((uintptr_t)(src + i) + 2048),
                         _MM_HINT_T0);
        }
#endif
        widen8(src + i, dst + i);
    }
    for (; i < n; i++) {
        dst[i] = bf16k_widen(src[i]);
    }
    memset(dst + n, 0, (size_t)((kc8 - kc) * nr) * sizeof(float));
}

/* x rounded to BF16 (nearest even, NaN made quiet: bf16k_from_f32) and
 * widened back: the fp32 value of to_bf16(x). */
static inline float
round_widen(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return bf16k_widen(round_bits(u, 1u));
}

/* dst[0:8] = round_widen(src[0:8]). */
static inline void
round8(const float *src, float *dst)
{
    for (int q = 0; q < 8; q++) {
        dst[q] = round_widen(src[q]);
    }
}

/* pack_a for the fp32 kernels: rows [i0, i0+mc) x k values [k0, k0+kc) of
 * op(A) into [tile][kc8 / G][mr][G] (G = BF16K_F32_GROUP consecutive k
 * values of a row), zero-padded to whole tiles and up to kc8 (a multiple
 * of G).  A holds BF16 (a, widened by w8, 8 values at a time) or, with af
 * not NULL, fp32 (af, rounded to BF16 and widened back by r8): the same
 * packed values as bf16k_from_f32 then widening, in one pass. */
static inline __attribute__((always_inline)) void
pack_a_f32_body(const bf16k_kernel_desc *d, const uint16_t *a,
                const float *af, int64_t rs, int64_t cs, int64_t m_end,
                int64_t i0, int64_t mc, int64_t k0, int64_t kc, int64_t kc8,
                float *dst, void (*w8)(const uint16_t *, float *),
                void (*r8)(const float *, float *))
{
    enum { G = BF16K_F32_GROUP };
    const int mr = d->mr;
    const int64_t tiles = ceil_div(mc, mr);
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t r0 = i0 + t * mr;
        const int rows = (int)(m_end - r0 < mr ? m_end - r0 : mr);
        for (int64_t pg = 0; pg < kc8; pg += G) {
            float *gd = dst + (t * kc8 + pg) * mr;     /* [mr][G] */
            const int64_t kn = kc - pg;   /* valid k values of this group */
            for (int ii = 0; ii < mr; ii++) {
                float *q = gd + ii * G;
                const int64_t at = (r0 + ii) * rs + (k0 + pg) * cs;
                if (ii < rows && cs == 1 && kn >= G) {
                    if (af != NULL) {
                        r8(af + at, q);
                    } else {
                        w8(a + at, q);
                    }
                    continue;
                }
                for (int u = 0; u < G; u++) {
                    q[u] = ii >= rows || u >= kn ? 0.0f
                        : af != NULL ? round_widen(af[at + u * cs])
                        : bf16k_widen(a[at + u * cs]);
                }
            }
        }
    }
}

#define PACK_A_F32_PARAMS                                                   \
    const bf16k_kernel_desc *d, const uint16_t *a, const float *af,         \
    int64_t rs, int64_t cs, int64_t m_end, int64_t i0, int64_t mc,          \
    int64_t k0, int64_t kc, int64_t kc8, float *dst
#define PACK_A_F32_ARGS d, a, af, rs, cs, m_end, i0, mc, k0, kc, kc8, dst
/* The body instantiated once per A type (the NULL pointer a constant), so
 * that packing BF16 A tests no pointer per 8 values (attention's products,
 * A packed per head: 4 % slower with the test). */
#define PACK_A_F32_BY_TYPE(w8, r8)                                          \
    do {                                                                    \
        if (af != NULL) {                                                   \
            pack_a_f32_body(d, NULL, af, rs, cs, m_end, i0, mc, k0, kc,     \
                            kc8, dst, w8, r8);                              \
        } else {                                                            \
            pack_a_f32_body(d, a, NULL, rs, cs, m_end, i0, mc, k0, kc,      \
                            kc8, dst, w8, r8);                              \
        }                                                                   \
    } while (0)

static void
pack_a_f32_base(PACK_A_F32_PARAMS)
{
    PACK_A_F32_BY_TYPE(widen8, round8);
}

#if defined(__x86_64__)
/* With few B panels the packing of A is a good part of the product: with
 * AVX2, 8 values are widened by one vpmovzxwd and one shift. */
__attribute__((target("avx2"))) static inline void
widen8_avx2(const uint16_t *src, float *dst)
{
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)src);
    _mm256_storeu_si256((__m256i *)(void *)dst,
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* round8 on ymm: round_bits' integer steps, then the low half cleared. */
__attribute__((target("avx2"))) static inline void
round8_avx2(const float *src, float *dst)
{
    const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)src);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                         _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(
        lsb, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
    /* NaN (|u| > inf, as signed: both are non-negative): sign | 0x7FC0. */
    const __m256i nan = _mm256_cmpgt_epi32(
        _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
        _mm256_set1_epi32(0x7F800000));
    const __m256i qnan = _mm256_or_si256(
        _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)),
        _mm256_set1_epi32(0x7FC00000));
    _mm256_storeu_si256((__m256i *)(void *)dst,
                        _mm256_blendv_epi8(r, qnan, nan));
}

__attribute__((target("avx2"))) static void
pack_a_f32_avx2(PACK_A_F32_PARAMS)
{
    PACK_A_F32_BY_TYPE(widen8_avx2, round8_avx2);
}
#endif

static void
pack_a_f32(PACK_A_F32_PARAMS)
{
#if defined(__x86_64__)
    if (have_avx2) {
        pack_a_f32_avx2(PACK_A_F32_ARGS);
        return;
    }
#endif
    pack_a_f32_base(PACK_A_F32_ARGS);
}

/* ---- threaded driver --------------------------------------------------- */

/* One sbgemm call, shared by its worker threads.  The work is cut into
 * chunks (row blocks, or groups of B panels) that workers claim from an
 * atomic counter, so a thread slowed down by another process (or by
 * OpenBLAS workers spinning after a numpy call) just claims fewer chunks. */
/* Post-ops of bf16k_sbgemm_fused, applied to each tile of C once its last
 * K block is done (while it is in L1): + bias[j], + residual, GELU (fp32),
 * round to BF16, ReLU on the rounded bits. */
typedef struct {
    const float *bias;      /* n, or NULL */
    const uint16_t *res;    /* res[i*ldr + j] BF16, or NULL */
    int64_t ldr;
    int act;                /* BF16K_ACT_NONE / _RELU / _GELU */
    uint16_t *out;          /* out[i*ldo + j] BF16 */
    int64_t ldo;
} epilogue_t;

/* A chunk of a non-GEMM job run on the same threads (attention, LayerNorm):
 * chunk idx of ctx, with the worker's buffers (apack_t, below). */
typedef struct apack apack_t;
typedef int (*task_fn)(const void *ctx, int64_t idx, apack_t *ap);

typedef struct {
    const bf16k_kernel_desc *d;
    const epilogue_t *ep;   /* fused call: C is per-worker scratch */
    task_fn task;           /* not NULL: a task job (d, ep, ... unused) */
    const void *task_ctx;
    int64_t m, n, k;
    float alpha, beta;
    const uint16_t *a;
    const float *af;        /* fp32 op(A) (a unused), fp32 kernels only */
    int64_t a_rs, a_cs;
    const uint16_t *bp;
    float *c;
    int64_t ldc;
    int split_n;            /* chunks are panel groups (else row blocks) */
    int64_t chunk;          /* panels, or rows (multiple of MR), per chunk */
    int64_t nchunks;
    atomic_llong next;      /* next unclaimed chunk */
    atomic_int rc;          /* first error, BF16K_OK if none */
} gemm_t;

/* Per-worker packed-A buffer.  When a block's packing is the same for
 * every chunk (panel chunks with one K block and one row block), it is
 * packed once and reused: rows [m0, m1) are valid. */
struct apack {
    uint16_t *buf;
    size_t cap;             /* uint16 elements */
    int64_t m0, m1;         /* rows held when `valid` */
    int valid;
    int bvalid;             /* fp32 kernels: this call's B is widened at
                             * the start of buf (whole_b) for K blocks
                             * [0, bvalid) */
    float *cbuf;            /* fused calls: fp32 C of the current chunk;
                             * task jobs: their scratch */
    size_t ccap;            /* floats */
};

static int
apack_reserve(apack_t *ap, size_t need)
{
    if (need <= ap->cap) {
        return BF16K_OK;
    }
    void *nb;
    if (posix_memalign(&nb, BUF_ALIGN, need * sizeof(uint16_t)) != 0) {
        return BF16K_E_NOMEM;
    }
    free(ap->buf);
    ap->buf = nb;
    ap->cap = need;
    ap->valid = 0;
    ap->bvalid = 0;
    return BF16K_OK;
}

/* Grow ap's fp32 scratch (cbuf: a fused call's C chunk, a task's work
 * area) to `need` floats. */
static int
scratch_reserve(apack_t *ap, size_t need)
{
    if (need <= ap->ccap) {
        return BF16K_OK;
    }
    float *nb = malloc(need * sizeof(float));
    if (nb == NULL) {
        return BF16K_E_NOMEM;
    }
    free(ap->cbuf);
    ap->cbuf = nb;
    ap->ccap = need;
    return BF16K_OK;
}

/* One BF16 result from an fp32 value: round to nearest even (NaN -> sign
 * | quiet NaN), then ReLU on the bits: negative values, -0 and NaNs with
 * the sign bit become +0 (as pycds.bf16.functional.relu_bf16). */
static inline uint16_t
epi_round(float v, int relu)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        r = (u >> 16 & 0x8000u) | 0x7FC0u;
    }
    if (relu && (r & 0x8000u)) {
        r = 0;
    }
    return (uint16_t)r;
}

/* erf(x) in fp32: the rational approximation of Eigen's
 * generic_fast_erf_float (XLA's EmitErfF32): x clamped to [-4, 4] (erf is
 * +-1 in fp32 beyond), then x * P(x^2) / Q(x^2).  Absolute error <= 5e-7
 * against math.erf on [-6, 6] (tests/bf16/test_encoder.py). */
#define ERF_A13 (-2.72614225801306e-10f)
#define ERF_A11 2.77068142495902e-08f
#define ERF_A9 (-2.10102402082508e-06f)
#define ERF_A7 (-5.69250639462346e-05f)
#define ERF_A5 (-7.34990630326855e-04f)
#define ERF_A3 (-2.95459980854025e-03f)
#define ERF_A1 (-1.60960333262415e-02f)
#define ERF_B8 (-1.45660718464996e-05f)
#define ERF_B6 (-2.13374055278905e-04f)
#define ERF_B4 (-1.68282697438203e-03f)
#define ERF_B2 (-7.37332916720468e-03f)
#define ERF_B0 (-1.42647390514189e-02f)
#define GELU_NEG_LIMIT (-16.0f)  /* below: GELU is -0 in fp32 (-inf too) */

static inline float
erf_f32(float x)
{
    x = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
    const float x2 = x * x;
    float p = ERF_A13 * x2 + ERF_A11;
    p = p * x2 + ERF_A9;
    p = p * x2 + ERF_A7;
    p = p * x2 + ERF_A5;
    p = p * x2 + ERF_A3;
    p = p * x2 + ERF_A1;
    float q = ERF_B8 * x2 + ERF_B6;
    q = q * x2 + ERF_B4;
    q = q * x2 + ERF_B2;
    q = q * x2 + ERF_B0;
    return x * p / q;
}

/* GELU(v) = v * Phi(v) = 0.5 v (1 + erf(v / sqrt 2)), the exact ("erf")
 * form of Hendrycks & Gimpel 2016 that BERT uses (hidden_act "gelu").
 * NaN stays NaN; -inf gives -0, +inf gives +inf. */
static inline float
gelu_f32(float v)
{
    if (v < GELU_NEG_LIMIT) {
        return -0.0f;
    }
    return 0.5f * v * (1.0f + erf_f32(v * 0.70710678118654752f));
}

/* Post-ops for rows [i0, i0+rows) x columns [j0, j0+ncols) of the result;
 * s is the fp32 tile (s[r*lds + c] is element (i0+r, j0+c)). */
static void
epilogue_scalar(const epilogue_t *e, const float *s, int64_t lds, int64_t i0,
                int rows, int64_t j0, int ncols)
{
    for (int r = 0; r < rows; r++) {
        const int64_t i = i0 + r;
        for (int c = 0; c < ncols; c++) {
            const int64_t j = j0 + c;
            float v = s[r * lds + c];
            if (e->bias != NULL) {
                v += e->bias[j];
            }
            if (e->res != NULL) {
                v += bf16k_widen(e->res[i * e->ldr + j]);
            }
            if (e->act == BF16K_ACT_GELU) {
                v = gelu_f32(v);
            }
            e->out[i * e->ldo + j] = epi_round(v, e->act == BF16K_ACT_RELU);
        }
    }
}

#if defined(__x86_64__)
/* gelu_f32 on 16 lanes; the same operations in the same order (mul, add:
 * no FMA contraction), so bit-identical to the scalar code. */
__attribute__((target("avx512f")))
static inline __m512
gelu_avx512(__m512 v)
{
    const __m512 x = _mm512_max_ps(_mm512_min_ps(
        _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)),
        _mm512_set1_ps(4.0f)), _mm512_set1_ps(-4.0f));
    const __m512 x2 = _mm512_mul_ps(x, x);
#define MA(acc, c) _mm512_add_ps(_mm512_mul_ps(acc, x2), _mm512_set1_ps(c))
    __m512 p = MA(_mm512_set1_ps(ERF_A13), ERF_A11);
    p = MA(p, ERF_A9);
    p = MA(p, ERF_A7);
    p = MA(p, ERF_A5);
    p = MA(p, ERF_A3);
    p = MA(p, ERF_A1);
    __m512 q = MA(_mm512_set1_ps(ERF_B8), ERF_B6);
    q = MA(q, ERF_B4);
    q = MA(q, ERF_B2);
    q = MA(q, ERF_B0);
#undef MA
    const __m512 erf = _mm512_div_ps(_mm512_mul_ps(x, p), q);
    __m512 g = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v),
                             _mm512_add_ps(_mm512_set1_ps(1.0f), erf));
    /* NaN compares false, so it keeps g (NaN); below the limit: -0. */
    __mmask16 low = _mm512_cmp_ps_mask(v, _mm512_set1_ps(GELU_NEG_LIMIT),
                                       _CMP_LT_OQ);
    return _mm512_mask_mov_ps(g, low, _mm512_set1_ps(-0.0f));
}

/* epi_round(v, 0) on 16 lanes: BF16 bits, round to nearest even, NaN ->
 * sign | quiet NaN. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline __m256i
round_bf16_avx512(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i rr = _mm512_srli_epi32(_mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
        _mm512_set1_epi32(0x7F800000));
    const __m512i qnan = _mm512_or_si512(
        _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)),
        _mm512_set1_epi32(0x7FC0));
    rr = _mm512_mask_mov_epi32(rr, nan, qnan);
    return _mm512_cvtepi32_epi16(rr);
}

/* The same, 16 columns at a time (masked tail); bit-identical results. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void
epilogue_avx512(const epilogue_t *e, const float *s, int64_t lds, int64_t i0,
                int rows, int64_t j0, int ncols)
{
    const __m256i zero16 = _mm256_setzero_si256();
    for (int r = 0; r < rows; r++) {
        const int64_t i = i0 + r;
        for (int c = 0; c < ncols; c += 16) {
            const int64_t j = j0 + c;
            __mmask16 m = ncols - c >= 16 ? (__mmask16)0xFFFF
                                          : (__mmask16)((1u << (ncols - c)) - 1u);
            __m512 v = _mm512_maskz_loadu_ps(m, s + r * lds + c);
            if (e->bias != NULL) {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, e->bias + j));
            }
            if (e->res != NULL) {
                __m256i h = _mm256_maskz_loadu_epi16(m, e->res + i * e->ldr + j);
                v = _mm512_add_ps(v, _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
            }
            if (e->act == BF16K_ACT_GELU) {
                v = gelu_avx512(v);
            }
            __m256i o = round_bf16_avx512(v);
            if (e->act == BF16K_ACT_RELU) {
                o = _mm256_max_epi16(o, zero16);   /* signed: clears negatives */
            }
            _mm256_mask_storeu_epi16(e->out + i * e->ldo + j, m, o);
        }
    }
}
#endif

/* The generic kernel keeps the portable epilogue too, so that selecting it
 * tests the scalar code on any machine. */
static void
epilogue(const bf16k_kernel_desc *d, const epilogue_t *e, const float *s,
         int64_t lds, int64_t i0, int rows, int64_t j0, int ncols)
{
#if defined(__x86_64__)
    if (have_avx512vl && d != &bf16k_generic_desc) {
        epilogue_avx512(e, s, lds, i0, rows, j0, ncols);
        return;
    }
#else
    (void)d;
#endif
    epilogue_scalar(e, s, lds, i0, rows, j0, ncols);
}

/* C[m0:m1, panels p0:p1] of the call g. */
static int
run_block(const gemm_t *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
          apack_t *ap)
{
    const bf16k_kernel_desc *d = g->d;
    const int mr = d->mr, nr = d->nr, ku = d->ku;
    const int64_t kunits = ceil_div(g->k, ku);
    /* fp32 kernels: A and each B micro-panel widened (see the top); for
     * few rows, B read as BF16 by kern_f32_few. */
    const int f32 = d->kern_f32 != NULL;
    int64_t mc_max = (int64_t)MC_TILES * mr;
    if (f32 && m1 - m0 <= 2 * mc_max) {
        /* Up to twice MC rows in one A block: each A block widens every B
         * micro-panel again (M = 128 on avx2fma was 2 blocks). */
        mc_max = ceil_div(m1 - m0, mr) * mr;
    }
    /* Few rows (inference batches): B is streamed once from memory, so read
     * each panel front to back in one pass instead of in KC blocks. */
    const int few = m1 - m0 <= 2 * mr;
    int64_t kcu_max = few ? kunits : (f32 ? KC_F32 : KC) / ku;
    if (f32 && kunits <= KC_F32 + KC_F32 / 2) {
        /* One block rather than two halves: each block widens every B
         * micro-panel and adds into C again (3136 x 576 x 64: -5 %). */
        kcu_max = kunits;
    }
    /* Equal K blocks (no short tail block, which would pay a full C
     * read-modify-write for little work). */
    kcu_max = ceil_div(kunits, ceil_div(kunits, kcu_max));
    /* Row-major op(A) with whole k-units is read in place when it feeds few
     * B panels: packing costs about as much as one panel's arithmetic.
     * With many panels the packed copy wins (rows lda apart alias in L1),
     * and inference-sized A (<= 2 tiles) is cheap to pack once per thread. */
    const int direct = d->direct_a && g->a_cs == 1 && g->k % ku == 0
        && p1 - p0 <= DIRECT_MAX_PANELS && m1 - m0 > 2 * mr;
    /* fp32 kernels, panel chunks of one A block in several K blocks: the
     * A of every K block is kept (A_ALL_F32 floats at most), so that each
     * worker packs A once per call, not once per chunk (196 x 2304 x 256:
     * 16 % of the time in pack_a_f32 with 4 chunks). */
    const int64_t nblk = ceil_div(kunits, kcu_max);
    const int a_all = f32 && g->split_n && nblk > 1 && m1 - m0 <= mc_max
        && ceil_div(m1 - m0, mr) * mr * kunits <= A_ALL_F32;
    /* Packing identical for every chunk of this call: pack once. */
    const int reusable = (kcu_max == kunits || a_all) && m1 - m0 <= mc_max;

    /* fp32 kernels: the widened A block (arows x kc8max floats), then, at
     * a cache-line boundary, the widened B micro-panel (kc8max x nr; not
     * used for few rows, whose K block is all of K).  With a B of at most
     * WHOLE_B_F32 floats (every K block), row chunks instead widen all of
     * B once per call and worker, at the start of the buffer ([K block]
     * [panel][kc8max][nr]), and the A block follows: each chunk widening
     * every micro-panel again took 16 % of a 256^3 product on two threads
     * (avx2fma, 15 chunks), 3 % of 784 x 1152 x 128 (3 K blocks). */
    const int64_t kc8max = ceil_div(kcu_max, BF16K_F32_GROUP)
        * BF16K_F32_GROUP;
    const int64_t panels = ceil_div(g->n, nr);
    const int64_t bsize = nblk * panels * kc8max * nr;   /* floats */
    const int whole_b = f32 && !few && !direct && !g->split_n
        && bsize <= WHOLE_B_F32;
    int64_t aoff = 0, boff = 0;     /* floats */
    int64_t astride = 0;    /* a_all: floats from one K block's A to the next */
    if (!direct) {
        int64_t arows = m1 - m0 < mc_max ? ceil_div(m1 - m0, mr) * mr
                                         : mc_max;
        size_t need = (size_t)(arows * kcu_max * ku);
        if (f32) {
            const int64_t line = BUF_ALIGN / sizeof(float);
            const int64_t asize = ceil_div(arows * kc8max, line) * line;
            if (whole_b) {
                aoff = ceil_div(bsize, line) * line;
                need = (size_t)(aoff + asize) * 2;   /* floats as uint16 */
            } else {
                boff = asize * (a_all ? nblk : 1);
                need = (size_t)(boff + (few ? 0 : kc8max) * nr) * 2;
            }
            astride = a_all ? asize : 0;
        }
        int rc = apack_reserve(ap, need);
        if (rc != BF16K_OK) {
            return rc;
        }
    }
    /* Where the micro-kernel writes C: the caller's matrix, or for a fused
     * call this chunk's fp32 scratch (row m0, column p0*nr at its origin). */
    float *cbase = g->c;
    int64_t ldc = g->ldc;
    if (g->ep != NULL) {
        ldc = (p1 - p0) * nr;
        int rc = scratch_reserve(ap, (size_t)((m1 - m0) * ldc));
        if (rc != BF16K_OK) {
            return rc;
        }
        cbase = ap->cbuf - m0 * ldc - p0 * nr;
    }
    for (int64_t pc = 0; pc < kunits; pc += kcu_max) {
        int64_t kcu = kunits - pc < kcu_max ? kunits - pc : kcu_max;
        float beta = pc == 0 ? g->beta : 1.0f;
        const int last = pc + kcu >= kunits;
        const int64_t kc8 = ceil_div(kcu, BF16K_F32_GROUP) * BF16K_F32_GROUP;
        const int64_t ablk_off = aoff + pc / kcu_max * astride;    /* floats */
        for (int64_t ic = m0; ic < m1; ic += mc_max) {
            int64_t mc = m1 - ic < mc_max ? m1 - ic : mc_max;
            const uint16_t *ablk;
            int64_t a_ps, a_rs;
            if (direct) {
                ablk = g->a + ic * g->a_rs + pc * ku;
                a_ps = ku;
                a_rs = g->a_rs;
            } else {
                if (!(reusable && ap->valid && ap->m0 == m0
                      && ap->m1 == m1)) {
                    if (f32) {
                        pack_a_f32(d, g->a, g->af, g->a_rs, g->a_cs, m1,
                                   ic, mc, pc * ku, kcu, kc8,
                                   (float *)(void *)ap->buf + ablk_off);
                    } else {
                        pack_a(d, g->a, g->a_rs, g->a_cs, m1, g->k, ic, mc,
                               pc * ku, kcu, ap->buf);
                    }
                    ap->valid = reusable && last;   /* a_all: every block */
                    ap->m0 = m0;
                    ap->m1 = m1;
                }
                ablk = ap->buf;
                a_ps = (int64_t)mr * ku;
                a_rs = ku;
            }
            for (int64_t jp = p0; jp < p1; jp++) {
                const uint16_t *bpan = g->bp + (jp * kunits + pc) * nr * ku;
                int64_t col = jp * nr;
                int ncols = (int)(g->n - col < nr ? g->n - col : nr);
                if (f32 && few) {
                    const float *afl = (const float *)(const void *)ap->buf
                        + ablk_off;
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        int rows = (int)(mc - ir < mr ? mc - ir : mr);
                        d->kern_f32_few(kcu, afl + (ir / mr) * kc8 * mr, bpan,
                                        cbase + (ic + ir) * ldc + col, ldc,
                                        rows, ncols, g->alpha, beta);
                    }
                } else if (f32) {
                    /* The micro-panel widened once for every MR tile (or,
                     * whole_b, once for the call). */
                    const float *afl = (const float *)(const void *)ap->buf
                        + ablk_off;
                    float *bfl = (float *)(void *)ap->buf
                        + (whole_b ? (pc / kcu_max * panels + jp) * kc8max
                           * nr : boff);
                    if (!(whole_b && ap->bvalid > pc / kcu_max)) {
                        widen_panel(bpan, kcu, nr, kc8, bfl);
                    }
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        int rows = (int)(mc - ir < mr ? mc - ir : mr);
                        d->kern_f32(kc8, afl + (ir / mr) * kc8 * mr, bfl,
                                    cbase + (ic + ir) * ldc + col, ldc, rows,
                                    ncols, g->alpha, beta);
                    }
                } else {
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        int rows = (int)(mc - ir < mr ? mc - ir : mr);
                        const uint16_t *at = direct
                            ? ablk + ir * a_rs
                            : ablk + (ir / mr) * kcu * mr * ku;
                        d->kern(kcu, at, a_ps, a_rs, bpan,
                                cbase + (ic + ir) * ldc + col, ldc, rows,
                                ncols, g->alpha, beta);
                    }
                }
                if (g->ep != NULL && last) {
                    epilogue(d, g->ep, cbase + ic * ldc + col, ldc, ic, (int)mc,
                             col, ncols);
                }
            }
            /* whole_b: this row chunk has widened every panel (p0 = 0,
             * p1 = all: row chunks span all of them). */
            if (!whole_b) {
                ap->bvalid = 0;     /* buf's start now holds other data */
            } else if (ap->bvalid <= pc / kcu_max) {
                ap->bvalid = (int)(pc / kcu_max) + 1;
            }
        }
    }
    return BF16K_OK;
}

/* Claim and run chunks of g until none is left. */
static void
work_on(gemm_t *g, apack_t *ap)
{
    ap->valid = 0;        /* a pool worker's buffer holds another call's A */
    ap->bvalid = 0;       /* ... and B */
    for (;;) {
        long long idx = atomic_fetch_add(&g->next, 1);
        if (idx >= g->nchunks) {
            break;
        }
        if (g->task != NULL) {
            int rc = g->task(g->task_ctx, idx, ap);
            if (rc != BF16K_OK) {
                int ok = BF16K_OK;
                atomic_compare_exchange_strong(&g->rc, &ok, rc);
                break;
            }
            continue;
        }
        int64_t m0 = 0, m1 = g->m, p0 = 0, p1 = ceil_div(g->n, g->d->nr);
        if (g->split_n) {
            p0 = idx * g->chunk;
            p1 = p0 + g->chunk < p1 ? p0 + g->chunk : p1;
        } else {
            m0 = idx * g->chunk;
            m1 = m0 + g->chunk < m1 ? m0 + g->chunk : m1;
        }
        int rc = run_block(g, m0, m1, p0, p1, ap);
        if (rc != BF16K_OK) {
            int ok = BF16K_OK;
            atomic_compare_exchange_strong(&g->rc, &ok, rc);
            break;
        }
    }
}

static void
apack_free(apack_t *ap)
{
    free(ap->buf);
    free(ap->cbuf);
}

/* The calling thread's packing buffers, kept between calls as a pool
 * worker keeps its own (made anew per call, blocks this large came from
 * mmap and cost page faults on every call), and freed when the thread
 * exits. */
static pthread_key_t caller_key;
static int caller_key_ok;
static pthread_once_t caller_once = PTHREAD_ONCE_INIT;

static void
caller_free(void *p)
{
    apack_free(p);
    free(p);
}

static void
caller_init(void)
{
    caller_key_ok = pthread_key_create(&caller_key, caller_free) == 0;
}

/* Run g's chunks on this thread, with its kept buffers (or, if they cannot
 * be set up, fresh ones). */
static void
work_here(gemm_t *g)
{
    pthread_once(&caller_once, caller_init);
    apack_t *kept = caller_key_ok ? pthread_getspecific(caller_key) : NULL;
    if (kept == NULL && caller_key_ok) {
        kept = calloc(1, sizeof(*kept));
        if (kept != NULL && pthread_setspecific(caller_key, kept) != 0) {
            free(kept);
            kept = NULL;
        }
    }
    if (kept != NULL) {
        work_on(g, kept);
        return;
    }
    apack_t ap = {NULL, 0, 0, 0, 0, 0, NULL, 0};
    work_on(g, &ap);
    apack_free(&ap);
}

/* Thread entry of a one-off worker (when the pool is taken). */
static void *
worker(void *arg)
{
    apack_t ap = {NULL, 0, 0, 0, 0, 0, NULL, 0};
    work_on(arg, &ap);
    apack_free(&ap);
    return NULL;
}

/* ---- worker pool ----------------------------------------------------------
 *
 * Starting a thread per call would be paid by every layer of a network,
 * once per image; so, like OpenBLAS and OpenMP runtimes, sbgemm keeps its
 * workers.  They sleep on a condition variable
 * between calls (no spinning), keep their packing buffers, block every
 * signal, and are never joined (they end with the process).  One call owns
 * the pool at a time; a concurrent call (another Python thread: cffi
 * releases the GIL) starts one-off threads as before.  After fork() the
 * child has no workers: the atfork handlers reset the pool, and the child
 * starts its own on first use. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work;      /* a job was posted (seq changed) */
    pthread_cond_t done;      /* busy reached 0 */
    int nthreads;             /* workers started */
    int in_use;               /* a call owns the pool */
    atomic_ullong seq;        /* job number (written under mu; polled) */
    gemm_t *job;
    atomic_int busy;          /* workers still on the job (likewise) */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 0, 0, NULL, 0};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static int pool_ok;

/* Poll ready(arg) for at most POOL_SPIN_NS; returns whether it became
 * true (workers: a new job; the caller: every worker done).  Waking a thread asleep on a condition variable took about 30 us
 * here (a 2-thread 256^3 product ran no faster than a 1-thread one), paid
 * at each end of every call; back-to-back calls (a network's layers) find
 * the other side still polling.  Unlike OpenBLAS's 0.1 s of sched_yield,
 * the 100 us cost a later numpy call next to nothing. */
#define POOL_SPIN_NS 100000
static int
pool_spin(int (*ready)(unsigned long long), unsigned long long arg)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int i = 0; i < 8; i++) {
            if (ready(arg)) {
                return 1;
            }
            /* Yield rather than pause: another process's thread waiting
             * for this CPU gets it (a chunk-holding thread of this call
             * included). */
            sched_yield();
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec)
            > POOL_SPIN_NS) {
            return 0;
        }
    }
}

static int
job_posted(unsigned long long seen)
{
    return atomic_load_explicit(&pool.seq, memory_order_relaxed) != seen;
}

static int
job_done(unsigned long long unused)
{
    (void)unused;
    return atomic_load_explicit(&pool.busy, memory_order_relaxed) == 0;
}

/* arg: the job number before the job it was started for (its creator
 * read it holding the lock, then posted that job). */
static void *
pool_worker(void *arg)
{
    apack_t ap = {NULL, 0, 0, 0, 0, 0, NULL, 0};
    unsigned long long seen = (unsigned long long)(uintptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.seq == seen) {
            pthread_cond_wait(&pool.work, &pool.mu);
        }
        seen = pool.seq;
        gemm_t *g = pool.job;
        pthread_mutex_unlock(&pool.mu);
        work_on(g, &ap);
        pthread_mutex_lock(&pool.mu);
        if (--pool.busy == 0) {
            pthread_cond_signal(&pool.done);
        }
        pthread_mutex_unlock(&pool.mu);
        pool_spin(job_posted, seen);
        pthread_mutex_lock(&pool.mu);
    }
    return NULL;
}

static void
pool_before_fork(void)
{
    pthread_mutex_lock(&pool.mu);
}

static void
pool_after_fork_parent(void)
{
    pthread_mutex_unlock(&pool.mu);
}

static void
pool_after_fork_child(void)
{
    /* Only the forking thread exists here: no workers, no job.  The lock
     * and condition variables are made anew, not unlocked: pool.work still
     * counts the parent's sleeping workers as waiters, and glibc would
     * wait for them to leave. */
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pool.mu = mu;
    pool.work = cv;
    pool.done = cv;
    pool.nthreads = 0;
    pool.in_use = 0;
    pool.job = NULL;
    pool.busy = 0;
}

static void
pool_init(void)
{
    pool_ok = pthread_atfork(pool_before_fork, pool_after_fork_parent,
                             pool_after_fork_child) == 0;
}

/* Run g on this thread and nt - 1 others; returns g's status. */
static int
run_threads(gemm_t *g, int nt)
{
    pthread_once(&pool_once, pool_init);
    int pooled = 0;
    if (pool_ok) {
        pthread_mutex_lock(&pool.mu);
        if (!pool.in_use) {
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old);
            while (pool.nthreads < nt - 1) {
                pthread_t tid;
                if (pthread_create(&tid, NULL, pool_worker,
                                   (void *)(uintptr_t)pool.seq) != 0) {
                    break;
                }
                pthread_detach(tid);
                pool.nthreads++;
            }
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            if (pool.nthreads > 0) {
                pooled = 1;
                pool.in_use = 1;
                pool.job = g;
                pool.busy = pool.nthreads;
                pool.seq++;
                pthread_cond_broadcast(&pool.work);
            }
        }
        pthread_mutex_unlock(&pool.mu);
    }
    if (pooled) {
        work_here(g);
        pool_spin(job_done, 0);
        pthread_mutex_lock(&pool.mu);
        while (pool.busy > 0) {
            pthread_cond_wait(&pool.done, &pool.mu);
        }
        pool.job = NULL;
        pool.in_use = 0;
        pthread_mutex_unlock(&pool.mu);
        return atomic_load(&g->rc);
    }
    pthread_t tids[BF16K_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        /* On failure the threads already running (and this one) simply
         * claim the remaining chunks. */
        if (pthread_create(&tids[t], NULL, worker, g) != 0) {
            break;
        }
        started = t;
    }
    work_here(g);
    for (int t = 1; t <= started; t++) {
        pthread_join(tids[t], NULL);
    }
    return atomic_load(&g->rc);
}

/* C = beta * C when there are no products to add (K == 0 or alpha == 0);
 * beta == 0 writes zeros without reading C. */
static void
scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        for (int64_t jj = 0; jj < n; jj++) {
            c[i * ldc + jj] = beta == 0.0f ? 0.0f : beta * c[i * ldc + jj];
        }
    }
}

/* C := beta*C (plus the fused post-ops) when there are no products to add
 * (K == 0 or alpha == 0): the BLAS quick return (reference sgemm;
 * OpenBLAS's level-3 driver), A and B not read, so inf or NaN in them (or
 * a NaN alpha with K == 0) does not reach C.  Fused: the post-ops of zero. */
static void
no_products(int64_t m, int64_t n, float beta, float *c, int64_t ldc,
            const epilogue_t *ep)
{
    if (ep == NULL) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    float zero[64] = {0};
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j += 64) {
            epilogue_scalar(ep, zero, 0, i, 1, j, (int)(n - j < 64 ? n - j : 64));
        }
    }
}

/* Tiles per row chunk: c0, or a smaller size (down to c0 / 2) whose chunks,
 * claimed in turn by nt equally fast threads, leave the busiest thread at
 * least 2 % less to do.  With 22 tiles (M = 256) on two threads, 11 chunks
 * of 2 gave one thread 12 tiles and the other 10; 22 chunks of 1 give 11
 * each.  For large M the extra chunks, each streaming all of B again, cost
 * more than the balance gains, hence the 2 %. */
static int64_t
balanced_chunk(int64_t tiles, int64_t c0, int nt)
{
    int64_t best = c0, best_span = -1;      /* -1: c0's not yet known */
    for (int64_t c = c0; c >= 1 && 2 * c >= c0; c--) {
        const int64_t n = ceil_div(tiles, c);
        const int64_t short_by = n * c - tiles;    /* the last chunk's */
        int64_t span = 0;
        for (int t = 0; t < nt && t < n; t++) {
            int64_t load = (n - t + nt - 1) / nt * c;
            if (t == (n - 1) % nt) {
                load -= short_by;
            }
            span = load > span ? load : span;
        }
        if (best_span < 0 || span * 50 < best_span * 49) {
            best = c;
            best_span = span;
        }
    }
    return best;
}

/* Split g (its d, ep, m, n and k set) into chunks for the threads: sets
 * g->split_n, g->chunk and g->nchunks, returns how many threads to run.
 * Rows are split when there are enough of them: each thread then packs
 * only its own rows of A and shares the packed B.  Few rows (inference
 * batches, or < 4 tiles per thread with many panels): the B panels are
 * split instead, so B crosses the memory bus once.  The fp32 kernels split
 * the panels whenever all rows make one A block (run_block): each row chunk
 * would widen every B micro-panel again. */
static int
plan_chunks(gemm_t *g)
{
    const bf16k_kernel_desc *d = g->d;
    const int64_t panels = ceil_div(g->n, d->nr);
    const int64_t tiles = ceil_div(g->m, d->mr);
    double flops = 2.0 * (double)g->m * (double)g->n * (double)g->k;
    int nt = get_num_threads();
    if (flops < (double)MIN_FLOPS_PER_THREAD * 2) {
        nt = 1;
    }
    g->split_n = tiles < 2 * (int64_t)nt
        || (tiles < 4 * (int64_t)nt && panels >= 4 * (int64_t)nt)
        || (d->kern_f32 != NULL && tiles <= 2 * MC_TILES
            && panels >= 4 * (int64_t)nt);
    if (nt == 1) {
        g->split_n = 0;
        g->chunk = g->m;        /* one chunk: the whole product */
    } else if (g->split_n) {
        g->chunk = ceil_div(panels, (int64_t)nt * PANEL_CHUNKS_PER_THREAD);
    } else {
        /* A whole number of chunks per thread, each at most one A block:
         * an odd chunk left for one thread to do alone cost a tenth of
         * the time at 2048^3. */
        int64_t per = d->kern_f32 != NULL ? ROW_CHUNKS_PER_THREAD_F32
                                          : ROW_CHUNKS_PER_THREAD;
        if (ceil_div(tiles, (int64_t)nt * per) > MC_TILES) {
            per = ceil_div(tiles, (int64_t)nt * MC_TILES);
        }
        g->chunk = balanced_chunk(tiles, ceil_div(tiles, (int64_t)nt * per),
                                  nt) * d->mr;
    }
    if (g->ep != NULL && !g->split_n && g->chunk > (int64_t)MC_TILES * d->mr) {
        /* Fused: a chunk's fp32 C lives in per-worker scratch; keep it to
         * one A block of rows so that it stays in cache. */
        g->chunk = (int64_t)MC_TILES * d->mr;
    }
    g->nchunks = ceil_div(g->split_n ? panels : g->m, g->chunk);
    return nt > g->nchunks ? (int)g->nchunks : nt;
}

static int
layout_id(const bf16k_kernel_desc *d)
{
    return d->nr << 8 | d->ku;
}

int
bf16k_packed_layout(void)
{
    const bf16k_kernel_desc *d = get_desc();
    return d ? layout_id(d) : BF16K_E_NOKERNEL;
}

/* The checks and the threaded run shared by the entry points: op(A) is
 * BF16 (a) or, for the fp32 kernels only, fp32 (af; a is NULL). */
static int
sbgemm_run(int64_t m, int64_t n, int64_t k, float alpha,
           const uint16_t *a, const float *af, int64_t a_rs, int64_t a_cs,
           const uint16_t *bp, int64_t bp_len, int layout,
           float beta, float *c, int64_t ldc, const epilogue_t *ep)
{
    const bf16k_kernel_desc *d = get_desc();
    if (d == NULL) {
        return BF16K_E_NOKERNEL;
    }
    if (layout != layout_id(d)) {
        return BF16K_E_LAYOUT;
    }
    if (m < 0 || n < 0 || k < 0 || (ep == NULL && ldc < n)) {
        return BF16K_E_ARG;
    }
    if (m == 0 || n == 0) {
        return BF16K_OK;
    }
    if (ep == NULL && c == NULL) {
        return BF16K_E_ARG;
    }
    /* The operands are checked also where they are not read (below): a
     * caller's wrong length is an error whatever alpha is. */
    if (packed_len(d, k, n) < 0 || bp_len < packed_len(d, k, n)
            || (k > 0 && ((a == NULL && af == NULL) || bp == NULL))) {
        return BF16K_E_ARG;
    }
    if (k == 0 || alpha == 0.0f) {
        no_products(m, n, beta, c, ldc, ep);
        return BF16K_OK;
    }
    gemm_t g;
    g.d = d;
    g.ep = ep;
    g.task = NULL;
    g.task_ctx = NULL;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.af = af;
    g.a_rs = a_rs;
    g.a_cs = a_cs;
    g.bp = bp;
    g.c = c;
    g.ldc = ldc;
    int nt = plan_chunks(&g);
    atomic_init(&g.next, 0);
    atomic_init(&g.rc, BF16K_OK);

    if (nt <= 1) {
        work_here(&g);
        return atomic_load(&g.rc);
    }
    return run_threads(&g, nt);
}

int
bf16k_sbgemm_packed(int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t *a, int64_t a_rs, int64_t a_cs,
                    const uint16_t *bp, int64_t bp_len, int layout,
                    float beta, float *c, int64_t ldc)
{
    return sbgemm_run(m, n, k, alpha, a, NULL, a_rs, a_cs, bp, bp_len,
                      layout, beta, c, ldc, NULL);
}

int
bf16k_sbgemm_f32a(int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t a_rs, int64_t a_cs,
                  const uint16_t *bp, int64_t bp_len, int layout,
                  float beta, float *c, int64_t ldc)
{
    const bf16k_kernel_desc *d = get_desc();
    if (d == NULL || d->kern_f32 != NULL || m <= 0 || n <= 0 || k <= 0
            || alpha == 0.0f) {
        /* fp32 kernels: A rounded while it is packed (or not read). */
        return sbgemm_run(m, n, k, alpha, NULL, a, a_rs, a_cs, bp, bp_len,
                          layout, beta, c, ldc, NULL);
    }
    /* BF16 kernels: A's stored span rounded first, with its strides. */
    if (m < 0 || k < 0 || a_rs < 0 || a_cs < 0 || a == NULL) {
        return BF16K_E_ARG;
    }
    const int64_t span = (m - 1) * a_rs + (k - 1) * a_cs + 1;
    uint16_t *ab = malloc((size_t)span * sizeof(uint16_t));
    if (ab == NULL) {
        return BF16K_E_NOMEM;
    }
    int rc = bf16k_from_f32(a, ab, span, BF16K_ROUND_NEAREST);
    if (rc == BF16K_OK) {
        rc = sbgemm_run(m, n, k, alpha, ab, NULL, a_rs, a_cs, bp, bp_len,
                        layout, beta, c, ldc, NULL);
    }
    free(ab);
    return rc;
}

int
bf16k_sbgemm_fused(int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t *a, int64_t a_rs, int64_t a_cs,
                   const uint16_t *bp, int64_t bp_len, int layout,
                   const float *bias, const uint16_t *res, int64_t ldr,
                   int act, uint16_t *out, int64_t ldo)
{
    if (out == NULL || ldo < n || (res != NULL && ldr < n)
            || act < BF16K_ACT_NONE || act > BF16K_ACT_GELU) {
        return BF16K_E_ARG;
    }
    epilogue_t ep = {bias, res, ldr, act, out, ldo};
    return sbgemm_run(m, n, k, alpha, a, NULL, a_rs, a_cs, bp, bp_len,
                      layout, 0.0f, NULL, 0, &ep);
}

/* ---- transformer row kernels: LayerNorm, attention ---------------------- */

/* name(params): the always-inline `body` compiled twice, for the baseline
 * ISA and for AVX2 (GCC vectorises each; 8 lanes), called through name(),
 * which takes the AVX2 copy when detect() found AVX2. */
#if defined(__x86_64__)
#define ROW_KERNEL(name, body, params, args)                            \
    static void name##_generic params { body args; }                    \
    __attribute__((target("avx2"))) static void name##_avx2 params      \
    { body args; }                                                      \
    static void name params                                             \
    {                                                                   \
        if (have_avx2) {                                                \
            name##_avx2 args;                                           \
        } else {                                                        \
            name##_generic args;                                        \
        }                                                               \
    }
#else
#define ROW_KERNEL(name, body, params, args)                            \
    static void name params { body args; }
#endif

/* Run chunks 0..ntasks-1 of task on the sbgemm threads (the pool), or on
 * this thread alone below MIN_FLOPS_PER_THREAD of work per thread. */
static int
run_tasks(int64_t ntasks, task_fn task, const void *ctx, double flops)
{
    gemm_t g;
    memset(&g, 0, sizeof(g));
    g.task = task;
    g.task_ctx = ctx;
    g.nchunks = ntasks;
    int nt = get_num_threads();
    if (flops < (double)MIN_FLOPS_PER_THREAD * 2) {
        nt = 1;
    }
    if (nt > ntasks) {
        nt = (int)ntasks;
    }
    atomic_init(&g.next, 0);
    atomic_init(&g.rc, BF16K_OK);
    if (nt <= 1) {
        work_here(&g);
        return atomic_load(&g.rc);
    }
    return run_threads(&g, nt);
}

/* run_pair's job: fn on arg[idx]. */
typedef struct {
    void *(*fn)(void *);
    void *arg[2];
} pair_job;

static int
pair_task(const void *ctx, int64_t idx, apack_t *ap)
{
    const pair_job *p = ctx;
    (void)ap;
    p->fn(p->arg[idx]);
    return BF16K_OK;
}

/* On the pool, not on a thread started per call: starting one cost about
 * 40 us, paid by every im2col, conversion and B packing of a network's
 * forward (ResNet-50: 17 a forward). */
static void
run_pair(void *(*fn)(void *), void *arg0, void *arg1, int64_t elems)
{
    pair_job p = {fn, {arg0, arg1}};
    if (elems >= PARALLEL_MIN_ELEMS) {
        /* As much work as two threads' worth (run_tasks' threshold). */
        (void)run_tasks(2, pair_task, &p, 2.0 * MIN_FLOPS_PER_THREAD * 2);
        return;
    }
    fn(arg0);
    fn(arg1);
}

/* Sum of the n values x[j] + b[j] (b may be NULL), and of (x[j] + b[j] - mu)^2
 * when sq: 16 partial sums, which GCC vectorises for the baseline ISA. */
static inline __attribute__((always_inline)) float
row_sum(const float *x, const float *b, int64_t n, float mu, int sq)
{
    float s[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        for (int l = 0; l < 16; l++) {
            float v = x[j + l] + (b != NULL ? b[j + l] : 0.0f);
            s[l] += sq ? (v - mu) * (v - mu) : v;
        }
    }
    float t = 0.0f;
    for (; j < n; j++) {
        float v = x[j] + (b != NULL ? b[j] : 0.0f);
        t += sq ? (v - mu) * (v - mu) : v;
    }
    for (int l = 0; l < 16; l++) {
        t += s[l];
    }
    return t;
}

typedef struct {
    const float *x;
    int64_t m, n, ldx;
    const float *bias, *gamma, *beta;
    float eps;
    float *y;
    int64_t ldy;
    uint16_t *yb;
    int64_t ldb;
} layernorm_t;

#define LN_ROWS 32          /* rows per LayerNorm task */

/* Rows [i0, i1) of t; v: n floats of scratch.  Unit-stride loops without
 * calls or branches, for the vectoriser. */
static inline __attribute__((always_inline)) void
layernorm_rows(const layernorm_t *t, int64_t i0, int64_t i1, float *restrict v)
{
    const int64_t n = t->n;
    for (int64_t i = i0; i < i1; i++) {
        const float *restrict xr = t->x + i * t->ldx;
        if (t->bias != NULL) {
            for (int64_t j = 0; j < n; j++) {
                v[j] = xr[j] + t->bias[j];
            }
        } else {
            memcpy(v, xr, (size_t)n * sizeof(float));
        }
        /* Two passes (mean, then the centred sum of squares): no
         * cancellation, as torch.nn.LayerNorm; biased variance. */
        const float mu = row_sum(v, NULL, n, 0.0f, 0) / (float)n;
        const float var = row_sum(v, NULL, n, mu, 1) / (float)n;
        const float rstd = 1.0f / sqrtf(var + t->eps);
        for (int64_t j = 0; j < n; j++) {
            v[j] = (v[j] - mu) * rstd * t->gamma[j] + t->beta[j];
        }
        if (t->yb != NULL) {
            uint16_t *restrict br = t->yb + i * t->ldb;
            for (int64_t j = 0; j < n; j++) {
                br[j] = epi_round(v[j], 0);
            }
        }
        if (t->y != NULL) {
            memcpy(t->y + i * t->ldy, v, (size_t)n * sizeof(float));
        }
    }
}


ROW_KERNEL(layernorm_run, layernorm_rows,
           (const layernorm_t *t, int64_t i0, int64_t i1, float *v),
           (t, i0, i1, v))

static int
layernorm_task(const void *ctx, int64_t idx, apack_t *ap)
{
    const layernorm_t *t = ctx;
    int rc = scratch_reserve(ap, (size_t)t->n);
    if (rc != BF16K_OK) {
        return rc;
    }
    const int64_t i0 = idx * LN_ROWS;
    const int64_t i1 = i0 + LN_ROWS < t->m ? i0 + LN_ROWS : t->m;
    layernorm_run(t, i0, i1, ap->cbuf);
    return BF16K_OK;
}

int
bf16k_layernorm(const float *x, int64_t m, int64_t n, int64_t ldx,
                const float *bias, const float *gamma, const float *beta,
                float eps, float *y, int64_t ldy, uint16_t *yb, int64_t ldb)
{
    if (m < 0 || n <= 0 || ldx < n || x == NULL || gamma == NULL
            || beta == NULL || (y == NULL && yb == NULL)
            || (y != NULL && ldy < n)
            || (yb != NULL && ldb < n)) {
        return BF16K_E_ARG;
    }
    layernorm_t t = {x, m, n, ldx, bias, gamma, beta, eps, y, ldy, yb, ldb};
    (void)get_desc();   /* runs detect() once: have_avx2 */
    /* About 10 flops per element; the threshold counts GEMM flops, which
     * cost less each than these memory-bound passes. */
    return run_tasks((m + LN_ROWS - 1) / LN_ROWS, layernorm_task, &t,
                     40.0 * (double)m * (double)n);
}

/* The sbgemm_fused post-ops on an fp32 matrix the caller computed (the
 * Python fallback's numpy product): the kernels' own epilogue, rows split
 * over the pool, so every path rounds, and applies GELU, alike. */
typedef struct {
    const float *acc;
    int64_t m, n, lda;
    const epilogue_t *ep;
} postops_t;

#define POSTOPS_ROWS 64     /* rows per post-ops task */

static int
postops_task(const void *ctx, int64_t idx, apack_t *ap)
{
    const postops_t *t = ctx;
    (void)ap;
    const int64_t i0 = idx * POSTOPS_ROWS;
    const int64_t i1 = i0 + POSTOPS_ROWS < t->m ? i0 + POSTOPS_ROWS : t->m;
    for (int64_t j = 0; j < t->n; j += 1024) {   /* ncols is an int */
        const int nc = (int)(t->n - j < 1024 ? t->n - j : 1024);
        epilogue(get_desc(), t->ep, t->acc + i0 * t->lda + j, t->lda, i0,
                 (int)(i1 - i0), j, nc);
    }
    return BF16K_OK;
}

int
bf16k_postops(int64_t m, int64_t n, const float *acc, int64_t lda,
              const float *bias, const uint16_t *res, int64_t ldr, int act,
              uint16_t *out, int64_t ldo)
{
    if (m < 0 || n < 0 || lda < n || ldo < n || (res != NULL && ldr < n)
            || act < BF16K_ACT_NONE || act > BF16K_ACT_GELU
            || (m > 0 && n > 0 && (acc == NULL || out == NULL))) {
        return BF16K_E_ARG;
    }
    if (m == 0 || n == 0) {
        return BF16K_OK;
    }
    (void)get_desc();   /* detect(): the AVX512 epilogue */
    epilogue_t ep = {bias, res, ldr, act, out, ldo};
    postops_t t = {acc, m, n, lda, &ep};
    /* About as costly per element as a GEMM flop's worth of 16 (GELU). */
    return run_tasks((m + POSTOPS_ROWS - 1) / POSTOPS_ROWS, postops_task, &t,
                     16.0 * (double)m * (double)n);
}

/* exp(x) for x <= 0 in fp32 (Cephes expf: n = round(x log2 e), a degree-5
 * polynomial in the remainder, times 2^n); 0 below -87 (where 2^n would be
 * subnormal).  Relative error about 2 ulp; written so that GCC vectorises
 * a loop of it (no calls; the selects become blends under
 * -fno-trapping-math, native/bf16/build.py). */
static inline float
exp_neg_f32(float x)
{
    const float xc = x < -87.0f ? -87.0f : x;
    /* n = nearest integer to xc log2 e: adding and subtracting 1.5 * 2^23
     * rounds (|.| < 2^22), with no call for the vectoriser to trip on. */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const union { int32_t i; float f; } two_n = {
        .i = ((int32_t)n + 127) * (1 << 23)
    };
    return x < -87.0f ? 0.0f : p * two_n.f;
}

/* Largest of x[0..n-1] (n >= 1): 16 partial maxima, for the vectoriser. */
static inline __attribute__((always_inline)) float
row_max(const float *x, int64_t n)
{
    float m[16];
    for (int l = 0; l < 16; l++) {
        m[l] = x[0];
    }
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        for (int l = 0; l < 16; l++) {
            m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
        }
    }
    float t = x[0];
    for (; j < n; j++) {
        t = x[j] > t ? x[j] : t;
    }
    for (int l = 0; l < 16; l++) {
        t = m[l] > t ? m[l] : t;
    }
    return t;
}

typedef struct {
    const bf16k_kernel_desc *d;  /* sbgemm kernel, or NULL: plain C */
    const uint16_t *qkv;    /* row b*T + t: Q, K and V side by side (3H) */
    int64_t ldq;
    int64_t T, nh, d_head;
    const float *key_bias;  /* B x T, added to the scores (0, or -1e30) */
    float scale;
    uint16_t *ctx;          /* row b*T + t, head h at [h*d, (h+1)*d) */
    int64_t ldc;
} attn_t;

/* Softmax of the scores s[0..T) + kb in place (fp32, max subtracted);
 * returns 1 / their sum, by which the caller scales. */
static inline __attribute__((always_inline)) float
softmax_row(float *restrict s, const float *restrict kb, int64_t T)
{
    for (int64_t j = 0; j < T; j++) {
        s[j] += kb[j];
    }
    const float mx = row_max(s, T);
    for (int64_t j = 0; j < T; j++) {
        s[j] = exp_neg_f32(s[j] - mx);
    }
    return 1.0f / row_sum(s, NULL, T, 0.0f, 0);
}

/* One (sequence, head) of scaled dot-product attention (Vaswani et al.
 * 2017) without an sbgemm kernel, all in fp32: K (transposed, times the
 * scale) and V widened into the scratch w, then per query row: scores =
 * q K^T * scale + key_bias, softmax, p V, rounded to BF16.  Loops over j
 * (keys) and k (head dims) are unit-stride, for the vectoriser. */
static inline __attribute__((always_inline)) void
attn_head_body(const attn_t *a, int64_t b, int64_t h, float *restrict w)
{
    const int64_t T = a->T, d = a->d_head, H = a->nh * d;
    float *restrict kt = w;            /* d x T */
    float *restrict v = kt + d * T;    /* T x d */
    float *restrict s = v + T * d;     /* T */
    float *restrict q = s + T;         /* d */
    float *restrict o = q + d;         /* d */
    const uint16_t *base = a->qkv + b * T * a->ldq;
    for (int64_t j = 0; j < T; j++) {
        const uint16_t *row = base + j * a->ldq + h * d;
        for (int64_t k = 0; k < d; k++) {
            kt[k * T + j] = bf16k_widen(row[H + k]) * a->scale;
            v[j * d + k] = bf16k_widen(row[2 * H + k]);
        }
    }
    for (int64_t i = 0; i < T; i++) {
        const uint16_t *qr = base + i * a->ldq + h * d;
        for (int64_t k = 0; k < d; k++) {
            q[k] = bf16k_widen(qr[k]);
        }
        for (int64_t j = 0; j < T; j++) {
            s[j] = 0.0f;
        }
        for (int64_t k = 0; k < d; k++) {
            const float qk = q[k];
            const float *kr = kt + k * T;
            for (int64_t j = 0; j < T; j++) {
                s[j] += qk * kr[j];
            }
        }
        const float inv = softmax_row(s, a->key_bias + b * T, T);
        for (int64_t k = 0; k < d; k++) {
            o[k] = 0.0f;
        }
        for (int64_t j = 0; j < T; j++) {
            const float p = s[j];
            const float *vr = v + j * d;
            for (int64_t k = 0; k < d; k++) {
                o[k] += p * vr[k];
            }
        }
        uint16_t *cr = a->ctx + (b * T + i) * a->ldc + h * d;
        for (int64_t k = 0; k < d; k++) {
            cr[k] = epi_round(o[k] * inv, 0);
        }
    }
}


ROW_KERNEL(attn_head_c, attn_head_body,
           (const attn_t *a, int64_t b, int64_t h, float *w), (a, b, h, w))

/* C (m x n fp32, ldc) = alpha * A (m x k BF16, rows a_rs apart) @ packed B,
 * on this thread (inside a task). */
static int
gemm_here(const bf16k_kernel_desc *d, int64_t m, int64_t n, int64_t k,
          float alpha, const uint16_t *a, int64_t a_rs, const uint16_t *bp,
          float *c, int64_t ldc, apack_t *ap)
{
    gemm_t g;
    memset(&g, 0, sizeof(g));
    g.d = d;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.a = a;
    g.a_rs = a_rs;
    g.a_cs = 1;
    g.bp = bp;
    g.c = c;
    g.ldc = ldc;
    ap->valid = 0;          /* the packed A of the previous product is stale */
    ap->bvalid = 0;         /* ... and so is its widened B */
    return run_block(&g, 0, m, 0, ceil_div(n, d->nr), ap);
}

/* Softmax rows of s (T x T fp32) to BF16 probabilities p (T rows ldp
 * apart, zeros in columns T .. ldp-1). */
static inline __attribute__((always_inline)) void
softmax_rows_bf16(float *restrict s, const float *restrict kb, int64_t T,
                  uint16_t *restrict p, int64_t ldp)
{
    for (int64_t i = 0; i < T; i++) {
        float *sr = s + i * T;
        const float inv = softmax_row(sr, kb, T);
        for (int64_t j = 0; j < T; j++) {
            p[i * ldp + j] = epi_round(sr[j] * inv, 0);
        }
        for (int64_t j = T; j < ldp; j++) {
            p[i * ldp + j] = 0;
        }
    }
}


ROW_KERNEL(softmax_rows, softmax_rows_bf16,
           (float *s, const float *kb, int64_t T, uint16_t *p, int64_t ldp),
           (s, kb, T, p, ldp))

#if defined(__x86_64__)
/* exp_neg_f32 on 16 lanes (the same steps; roundscale for the rounding). */
__attribute__((target("avx512f")))
static inline __m512
exp_neg_avx512(__m512 x)
{
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(
        _mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(n,
                                                _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
#define PA(acc, c) _mm512_add_ps(_mm512_mul_ps(acc, r), _mm512_set1_ps(c))
    __m512 p = PA(_mm512_set1_ps(1.9875691500e-4f), 1.3981999507e-3f);
    p = PA(p, 8.3334519073e-3f);
    p = PA(p, 4.1665795894e-2f);
    p = PA(p, 1.6666665459e-1f);
    p = PA(p, 5.0000001201e-1f);
#undef PA
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
                      _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f),
                                              _CMP_GE_OQ);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

/* The lanes of the next 16 of `left` values (all when left >= 16). */
static inline __mmask16
tail16(int64_t left)
{
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* softmax_rows_bf16 with AVX512: 16 keys at a time, masked tail. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void
softmax_rows_avx512(float *s, const float *kb, int64_t T, uint16_t *p,
                    int64_t ldp)
{
    for (int64_t i = 0; i < T; i++) {
        float *sr = s + i * T;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < T; j += 16) {
            const __mmask16 m = tail16(T - j);
            __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, sr + j),
                                     _mm512_maskz_loadu_ps(m, kb + j));
            _mm512_mask_storeu_ps(sr + j, m, v);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
        }
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t j = 0; j < T; j += 16) {
            const __mmask16 m = tail16(T - j);
            __m512 e = exp_neg_avx512(
                _mm512_sub_ps(_mm512_maskz_loadu_ps(m, sr + j), mx));
            e = _mm512_maskz_mov_ps(m, e);
            _mm512_mask_storeu_ps(sr + j, m, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
        for (int64_t j = 0; j < T; j += 16) {
            const __mmask16 m = tail16(T - j);
            __m256i b = round_bf16_avx512(
                _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + j), inv));
            _mm256_mask_storeu_epi16(p + i * ldp + j, m, b);
        }
        for (int64_t j = T; j < ldp; j++) {
            p[i * ldp + j] = 0;
        }
    }
}
#endif

/* One (sequence, head) with the sbgemm micro-kernel, as PyTorch's BF16
 * attention does it: S = Q K^T * scale (BF16 products, fp32 sums), softmax
 * in fp32, P rounded to BF16, O = P V, rounded to BF16.  K^T and V are
 * packed into the kernel's panels in the worker's scratch. */
static int
attn_head_kernel(const attn_t *a, int64_t b, int64_t h, apack_t *ap)
{
    const bf16k_kernel_desc *d = a->d;
    const int64_t T = a->T, dh = a->d_head, H = a->nh * dh;
    /* P's rows padded with zeros to whole k-units: the P V product then
     * reads P in place (packing a T x T A cost as much as the product). */
    const int64_t tp = ceil_div(T, d->ku) * d->ku;
    const int64_t kp_len = packed_len(d, dh, T), vp_len = packed_len(d, T, dh);
    /* floats: S (T x T), O (T x dh); uint16 as floats: P, packed K, V. */
    const size_t need =
        (size_t)(T * T + T * dh + (T * tp + kp_len + vp_len) / 2 + 8);
    int rc = scratch_reserve(ap, need);
    if (rc != BF16K_OK) {
        return rc;
    }
    float *S = ap->cbuf;
    float *O = S + T * T;
    uint16_t *P = (uint16_t *)(O + T * dh);
    uint16_t *kp = P + T * tp;
    uint16_t *vp = kp + kp_len;
    const uint16_t *base = a->qkv + b * T * a->ldq + h * dh;
    /* op(B) = K^T (dh x T): element (kk, j) at base[H + j*ldq + kk]. */
    pack_job jk = {d, base + H, dh, T, 1, a->ldq, kp, 0,
                   ceil_div(dh, d->ku)};
    pack_b_range(&jk);
    /* op(B) = V (T x dh): element (j, kk) at base[2H + j*ldq + kk]. */
    pack_job jv = {d, base + 2 * H, T, dh, a->ldq, 1, vp, 0,
                   ceil_div(T, d->ku)};
    pack_b_range(&jv);
    rc = gemm_here(d, T, T, dh, a->scale, base, a->ldq, kp, S, T, ap);
    if (rc != BF16K_OK) {
        return rc;
    }
    const float *kb = a->key_bias + b * T;
#if defined(__x86_64__)
    if (have_avx512vl) {
        softmax_rows_avx512(S, kb, T, P, tp);
    } else {
        softmax_rows(S, kb, T, P, tp);
    }
#else
    softmax_rows(S, kb, T, P, tp);
#endif
    /* V packed for K = T holds zero k values up to tp. */
    rc = gemm_here(d, T, dh, tp, 1.0f, P, tp, vp, O, dh, ap);
    if (rc != BF16K_OK) {
        return rc;
    }
    for (int64_t i = 0; i < T; i++) {
        uint16_t *cr = a->ctx + (b * T + i) * a->ldc + h * dh;
        for (int64_t k = 0; k < dh; k++) {
            cr[k] = epi_round(O[i * dh + k], 0);
        }
    }
    return BF16K_OK;
}

static int
attn_task(const void *ctx, int64_t idx, apack_t *ap)
{
    const attn_t *a = ctx;
    const int64_t b = idx / a->nh, h = idx % a->nh;
    if (a->d != NULL) {
        return attn_head_kernel(a, b, h, ap);
    }
    const int64_t T = a->T, dh = a->d_head;
    int rc = scratch_reserve(ap, (size_t)(2 * T * dh + T + 2 * dh));
    if (rc != BF16K_OK) {
        return rc;
    }
    attn_head_c(a, b, h, ap->cbuf);
    return BF16K_OK;
}

int
bf16k_attention(const uint16_t *qkv, int64_t ldq, int64_t nb, int64_t t,
                int64_t nh, int64_t d, const float *key_bias, float scale,
                int use_kernel, uint16_t *ctx, int64_t ldc)
{
    if (nb < 0 || t < 0 || nh <= 0 || d <= 0 || ldq < 3 * nh * d
            || ldc < nh * d
            || (nb * t > 0
                && (qkv == NULL || key_bias == NULL || ctx == NULL))) {
        return BF16K_E_ARG;
    }
    if (nb == 0 || t == 0) {
        return BF16K_OK;
    }
    (void)get_desc();   /* runs detect() once: have_avx2 */
    attn_t a = {use_kernel ? get_desc() : NULL, qkv, ldq, t, nh, d, key_bias,
                scale, ctx, ldc};
    /* Work in GEMM-flop equivalents: the two products (4 t^2 d flops) run
     * at about half the GEMM rate (short K, packing, the softmax), so one
     * sequence of 128 tokens already pays for waking a second thread. */
    return run_tasks(nb * nh, attn_task, &a,
                     8.0 * (double)(nb * nh) * (double)(t * t * d));
}
