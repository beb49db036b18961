/* bf16_driver.c -- CPU dispatch, conversion, B packing and the blocked,
 * threaded sbgemm driver shared by every hardware micro-kernel.
 *
 * Compiled for the baseline ISA (x86-64 / armv8-a); ISA-specific code lives
 * in bf16_avx512.c and bf16_bfmmla.c behind target attributes and is only
 * called after the CPU check below.  No Python objects are touched here:
 * cffi calls these functions with the GIL released.
 *
 * Blocking follows the BLIS/GotoBLAS loop nest with B already packed:
 *   for pc (KC k values)          A block MC x KC packed per thread (L2)
 *     for ic (MC rows)
 *       for jp (B panels)         B micro-panel KC x NR stays in L1
 *         for ir (MR rows)        micro-kernel: MR x NR tile of C
 * C is scaled by beta in the first K block only; later blocks accumulate.
 * Threads split the B panels (or the rows when there are too few panels).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
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

#define KC 256              /* k values per K block (multiple of 4) */
#define MC_TILES 20         /* MR tiles per A block */
/* Work chunks per thread, for dynamic balance.  Panel chunks each re-read
 * all of A, so there are fewer of them. */
#define ROW_CHUNKS_PER_THREAD 4
#define PANEL_CHUNKS_PER_THREAD 2
#define DIRECT_MAX_PANELS 8  /* read A in place up to this many panels */
#define MIN_FLOPS_PER_THREAD (1LL << 24)  /* ~0.1 ms of work */

/* ---- dispatch ---------------------------------------------------------- */

static const bf16k_kernel_desc *hw_desc;     /* set once by detect() */
#if defined(__x86_64__)
static int have_avx512bw;   /* set by detect(): AVX512 conversion loops */
#endif
static _Atomic(const bf16k_kernel_desc *) selected;  /* NULL: use hw_desc */
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static int num_threads;     /* 0 = not yet set */

static void
detect(void)
{
    hw_desc = NULL;
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_avx512bw = __builtin_cpu_supports("avx512f")
        && __builtin_cpu_supports("avx512bw");
    if (__builtin_cpu_supports("avx512bf16")
            && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vl")) {
        hw_desc = &bf16k_avx512_desc;
    }
#elif defined(__aarch64__) && defined(__linux__)
    if (getauxval(AT_HWCAP2) & HWCAP2_BF16) {
        hw_desc = &bf16k_bfmmla_desc;
    }
#endif
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
    if (strcmp(name, "generic") == 0) {
        atomic_store(&selected, &bf16k_generic_desc);
        return BF16K_OK;
    }
    if (hw_desc != NULL && strcmp(name, hw_desc->name) == 0) {
        atomic_store(&selected, hw_desc);
        return BF16K_OK;
    }
    return BF16K_E_NOKERNEL;
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

/* Run fn(arg0) here and fn(arg1) on a new thread (or here, if the thread
 * cannot be started).  For memory-bound loops over large arrays. */
static void
run_pair(void *(*fn)(void *), void *arg0, void *arg1)
{
    pthread_t tid;
    int threaded = pthread_create(&tid, NULL, fn, arg1) == 0;
    fn(arg0);
    if (threaded) {
        pthread_join(tid, NULL);
    } else {
        fn(arg1);
    }
}

/* Arrays at least this long are converted / packed by two threads. */
#define PARALLEL_MIN_ELEMS (1 << 18)

/* ---- conversion -------------------------------------------------------- */

/* Scalar RNE/truncate, branch-free; NaN -> sign | 0x7FC0. */
static void
from_f32_scalar(const float *src, uint16_t *dst, int64_t n, uint32_t bias_on)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof(u));
        uint32_t mag = u & 0x7FFFFFFFu;
        uint32_t r = (u + bias_on * (0x7FFFu + ((u >> 16) & 1u))) >> 16;
        uint32_t nan = (u >> 16 & 0x8000u) | 0x7FC0u;
        dst[i] = (uint16_t)(mag > 0x7F800000u ? nan : r);
    }
}

static void
to_f32_scalar(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof(u));
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
    conv_job j0 = {src, dst, n, bias_on, widen};
    if (n < PARALLEL_MIN_ELEMS || get_num_threads() < 2) {
        conv_run(&j0);
        return;
    }
    int64_t h = n / 2;
    j0.n = h;
    conv_job j1 = {(const char *)src + (size_t)h * src_size,
                   (char *)dst + (size_t)h * dst_size, n - h, bias_on, widen};
    run_pair(conv_run, &j0, &j1);
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
typedef struct {
    const bf16k_kernel_desc *d;
    const uint16_t *b;
    int64_t k, n, rs, cs;
    uint16_t *dst;
    int64_t p0, p1;
} pack_job;

static void *
pack_b_range(void *arg)
{
    const pack_job *j = arg;
    const int nr = j->d->nr, ku = j->d->ku;
    const int64_t k = j->k, n = j->n, rs = j->rs, cs = j->cs;
    const int64_t kunits = ceil_div(k, ku);
    const int64_t panels = ceil_div(n, nr);
    /* k-units outer so that the rows of a row-major B are read in order;
     * panel jp, unit p lives at dst[((jp * kunits) + p) * nr * ku]. */
    for (int64_t p = j->p0; p < j->p1; p++) {
        const int64_t k0 = p * ku;
        const int full_k = k0 + ku <= k;
        for (int64_t jp = 0; jp < panels; jp++) {
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
    if (need < PARALLEL_MIN_ELEMS || get_num_threads() < 2) {
        pack_b_range(&j0);
        return BF16K_OK;
    }
    pack_job j1 = j0;
    j0.p1 = j1.p0 = kunits / 2;
    run_pair(pack_b_range, &j0, &j1);
    return BF16K_OK;
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
            for (int64_t p = 0; p < full_units; p++) {
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

/* ---- threaded driver --------------------------------------------------- */

/* One sbgemm call, shared by its worker threads.  The work is cut into
 * chunks (row blocks, or groups of B panels) that workers claim from an
 * atomic counter, so a thread slowed down by another process (or by
 * OpenBLAS workers spinning after a numpy call) just claims fewer chunks. */
typedef struct {
    const bf16k_kernel_desc *d;
    int64_t m, n, k;
    float alpha, beta;
    const uint16_t *a;
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
typedef struct {
    uint16_t *buf;
    size_t cap;             /* uint16 elements */
    int64_t m0, m1;         /* rows held when `valid` */
    int valid;
} apack_t;

static int
apack_reserve(apack_t *ap, size_t need)
{
    if (need <= ap->cap) {
        return BF16K_OK;
    }
    uint16_t *nb = malloc(need * sizeof(uint16_t));
    if (nb == NULL) {
        return BF16K_E_NOMEM;
    }
    free(ap->buf);
    ap->buf = nb;
    ap->cap = need;
    ap->valid = 0;
    return BF16K_OK;
}

/* C[m0:m1, panels p0:p1] of the call g. */
static int
run_block(const gemm_t *g, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
          apack_t *ap)
{
    const bf16k_kernel_desc *d = g->d;
    const int mr = d->mr, nr = d->nr, ku = d->ku;
    const int64_t kunits = ceil_div(g->k, ku);
    const int64_t mc_max = (int64_t)MC_TILES * mr;
    /* Few rows (inference batches): B is streamed once from memory, so read
     * each panel front to back in one pass instead of in KC blocks. */
    int64_t kcu_max = m1 - m0 <= 2 * mr ? kunits : KC / ku;
    /* Equal K blocks (no short tail block, which would pay a full C
     * read-modify-write for little work). */
    kcu_max = ceil_div(kunits, ceil_div(kunits, kcu_max));
    /* Row-major op(A) with whole k-units is read in place when it feeds few
     * B panels: packing costs about as much as one panel's arithmetic.
     * With many panels the packed copy wins (rows lda apart alias in L1),
     * and inference-sized A (<= 2 tiles) is cheap to pack once per thread. */
    const int direct = d->direct_a && g->a_cs == 1 && g->k % ku == 0
        && p1 - p0 <= DIRECT_MAX_PANELS && m1 - m0 > 2 * mr;
    /* Packing identical for every chunk of this call: pack once. */
    const int reusable = kcu_max == kunits && m1 - m0 <= mc_max;

    if (!direct) {
        int64_t arows = m1 - m0 < mc_max ? ceil_div(m1 - m0, mr) * mr
                                         : mc_max;
        int rc = apack_reserve(ap, (size_t)(arows * kcu_max * ku));
        if (rc != BF16K_OK) {
            return rc;
        }
    }
    for (int64_t pc = 0; pc < kunits; pc += kcu_max) {
        int64_t kcu = kunits - pc < kcu_max ? kunits - pc : kcu_max;
        float beta = pc == 0 ? g->beta : 1.0f;
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
                    pack_a(d, g->a, g->a_rs, g->a_cs, m1, g->k, ic, mc,
                           pc * ku, kcu, ap->buf);
                    ap->valid = reusable;
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
                for (int64_t ir = 0; ir < mc; ir += mr) {
                    int rows = (int)(mc - ir < mr ? mc - ir : mr);
                    const uint16_t *at = direct
                        ? ablk + ir * a_rs
                        : ablk + (ir / mr) * kcu * mr * ku;
                    d->kern(kcu, at, a_ps, a_rs, bpan,
                            g->c + (ic + ir) * g->ldc + col, g->ldc, rows,
                            ncols, g->alpha, beta);
                }
            }
        }
    }
    return BF16K_OK;
}

static void *
worker(void *arg)
{
    gemm_t *g = arg;
    apack_t ap = {NULL, 0, 0, 0, 0};
    for (;;) {
        long long idx = atomic_fetch_add(&g->next, 1);
        if (idx >= g->nchunks) {
            break;
        }
        int64_t m0 = 0, m1 = g->m, p0 = 0, p1 = ceil_div(g->n, g->d->nr);
        if (g->split_n) {
            p0 = idx * g->chunk;
            p1 = p0 + g->chunk < p1 ? p0 + g->chunk : p1;
        } else {
            m0 = idx * g->chunk;
            m1 = m0 + g->chunk < m1 ? m0 + g->chunk : m1;
        }
        int rc = run_block(g, m0, m1, p0, p1, &ap);
        if (rc != BF16K_OK) {
            int ok = BF16K_OK;
            atomic_compare_exchange_strong(&g->rc, &ok, rc);
            break;
        }
    }
    free(ap.buf);
    return NULL;
}

/* C = beta * C when K == 0 (no products). */
static void
scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        for (int64_t jj = 0; jj < n; jj++) {
            c[i * ldc + jj] = beta == 0.0f ? 0.0f : beta * c[i * ldc + jj];
        }
    }
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

int
bf16k_sbgemm_packed(int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t *a, int64_t a_rs, int64_t a_cs,
                    const uint16_t *bp, int64_t bp_len, int layout,
                    float beta, float *c, int64_t ldc)
{
    const bf16k_kernel_desc *d = get_desc();
    if (d == NULL) {
        return BF16K_E_NOKERNEL;
    }
    if (layout != layout_id(d)) {
        return BF16K_E_LAYOUT;
    }
    if (m < 0 || n < 0 || k < 0 || ldc < n) {
        return BF16K_E_ARG;
    }
    if (m == 0 || n == 0) {
        return BF16K_OK;
    }
    if (c == NULL) {
        return BF16K_E_ARG;
    }
    if (k == 0) {
        scale_c(m, n, beta, c, ldc);
        return BF16K_OK;
    }
    if (a == NULL || bp == NULL || bp_len < packed_len(d, k, n)
            || packed_len(d, k, n) < 0) {
        return BF16K_E_ARG;
    }

    const int64_t panels = ceil_div(n, d->nr);
    const int64_t tiles = ceil_div(m, d->mr);
    double flops = 2.0 * (double)m * (double)n * (double)k;
    int nt = get_num_threads();
    if (flops < (double)MIN_FLOPS_PER_THREAD * 2) {
        nt = 1;
    }
    /* Split rows when there are enough of them: each thread then packs
     * only its own rows of A and shares the packed B.  Few rows (inference
     * batches, or < 4 tiles per thread with many panels): split the B
     * panels instead, so B crosses the memory bus once. */
    gemm_t g;
    g.d = d;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.a_rs = a_rs;
    g.a_cs = a_cs;
    g.bp = bp;
    g.c = c;
    g.ldc = ldc;
    g.split_n = tiles < 2 * (int64_t)nt
        || (tiles < 4 * (int64_t)nt && panels >= 4 * (int64_t)nt);
    if (nt == 1) {
        g.split_n = 0;
        g.chunk = m;        /* one chunk: the whole product */
    } else if (g.split_n) {
        g.chunk = ceil_div(panels, (int64_t)nt * PANEL_CHUNKS_PER_THREAD);
    } else {
        int64_t t = ceil_div(tiles, (int64_t)nt * ROW_CHUNKS_PER_THREAD);
        g.chunk = (t < MC_TILES ? t : MC_TILES) * d->mr;
    }
    g.nchunks = ceil_div(g.split_n ? panels : m, g.chunk);
    if (nt > g.nchunks) {
        nt = (int)g.nchunks;
    }
    atomic_init(&g.next, 0);
    atomic_init(&g.rc, BF16K_OK);

    pthread_t tids[BF16K_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        /* On failure the threads already running (and this one) simply
         * claim the remaining chunks. */
        if (pthread_create(&tids[t], NULL, worker, &g) != 0) {
            break;
        }
        started = t;
    }
    worker(&g);
    for (int t = 1; t <= started; t++) {
        pthread_join(tids[t], NULL);
    }
    return atomic_load(&g.rc);
}
