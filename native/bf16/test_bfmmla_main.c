/* test_bfmmla_main.c -- standalone check of the sbgemm driver + BFMMLA
 * micro-kernel, for aarch64 under qemu (scripts/test_bfmmla_qemu.sh).
 *
 * Links bf16_driver.c and bf16_bfmmla.c unchanged; compares
 * bf16k_sbgemm_packed against a double-precision reference with the fp32
 * summation bound gamma_n * (|alpha| sum|a||b| + |beta c|), n = 2K + 5,
 * u = 2^-24 (products of BF16 values are exact in fp32).
 * With beta == 0 the case also runs bf16k_sbgemm_fused (bias = row 0 of
 * C0, a BF16 residual when m + n + k is odd, ReLU when ta) against the same reference
 * plus the post-ops, allowing the fp32 bound and one BF16 rounding.
 * Exit status 0 on success; prints one line per case with the largest
 * ratio |error| / bound (must be <= 1).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_kernels.h"

/* The kernel this build must find; override with
 * -DBF16K_TEST_EXPECT='"avx512bf16"' to run the same checks natively on
 * x86-64 (e.g. under -fsanitize=address,undefined). */
#ifndef BF16K_TEST_EXPECT
#define BF16K_TEST_EXPECT "bfmmla"
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t
next_u32(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Random normal BF16: sign, 7-bit significand, exponent in [-20, 20]. */
static uint16_t
rand_bf16(void)
{
    uint32_t r = next_u32();
    uint32_t sign = (r >> 31) << 15;
    uint32_t exp = (uint32_t)(127 - 20 + (int)((r >> 8) % 41));
    uint32_t mant = r & 0x7F;
    return (uint16_t)(sign | exp << 7 | mant);
}

static double
bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return (double)f;
}

/* The operands and results of one case: op(A) m x k (A stored m x k, or
 * k x m if ta), op(B) k x n (B stored k x n, or n x k if tb), row-major. */
typedef struct {
    int64_t m, n, k;
    int64_t a_rs, a_cs, b_rs, b_cs;
    float alpha, beta;
    int fused, relu, use_res;   /* fused run: ReLU, BF16 residual */
    uint16_t *a, *b, *res, *fo, *bp;
    float *c, *c0;
    int64_t plen;
} gemm_case;

/* |error| / bound of the fused output at (i, j), whose plain product has
 * reference ref and fp32 error bound lim: + bias c0[j] + residual, two more
 * fp32 additions, then one BF16 rounding (unit roundoff 2^-8) and the
 * ReLU.  2.0 when the ReLU left a sign bit. */
static double
fused_ratio(const gemm_case *t, int64_t i, int64_t j, double ref, double lim)
{
    int64_t n = t->n;
    double r = t->use_res ? bf16_to_double(t->res[i * n + j]) : 0.0;
    double fref = ref + (double)t->c0[j] + r;
    double flim = lim + fabs((double)t->c0[j]) + fabs(r);
    double fnu = (double)(2 * t->k + 7) * ldexp(1.0, -24);
    double ev = fnu / (1.0 - fnu) * flim;
    double bound = ev + ldexp(1.0, -8) * (fabs(fref) + ev);
    if (t->relu) {
        fref = fref > 0.0 ? fref : 0.0;
    }
    double ferr = fabs(bf16_to_double(t->fo[i * n + j]) - fref);
    if (t->relu && (t->fo[i * n + j] & 0x8000u)) {
        return 2.0;
    }
    return ferr == 0.0 ? 0.0 : ferr / bound;
}

/* The largest |error| / bound over C (and the fused output) of case t. */
static double
worst_ratio(const gemm_case *t)
{
    double worst = 0.0;
    double nu = (double)(2 * t->k + 5) * ldexp(1.0, -24);
    double gamma = nu / (1.0 - nu);
    int64_t n = t->n;
    for (int64_t i = 0; i < t->m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0, sabs = 0.0;
            for (int64_t kk = 0; kk < t->k; kk++) {
                double x = bf16_to_double(t->a[i * t->a_rs + kk * t->a_cs]);
                double y = bf16_to_double(t->b[kk * t->b_rs + j * t->b_cs]);
                s += x * y;
                sabs += fabs(x * y);
            }
            double ref = (double)t->alpha * s;
            double lim = fabs((double)t->alpha) * sabs;
            if (t->beta != 0.0f) {
                ref += (double)t->beta * (double)t->c0[i * n + j];
                lim += fabs((double)t->beta * (double)t->c0[i * n + j]);
            }
            double err = fabs((double)t->c[i * n + j] - ref);
            double ratio = err == 0.0 ? 0.0 : err / (gamma * lim);
            if (!(ratio <= worst)) {   /* also catches NaN */
                worst = ratio;
            }
            double fr = t->fused ? fused_ratio(t, i, j, ref, lim) : 0.0;
            if (!(fr <= worst)) {
                worst = fr;
            }
        }
    }
    return worst;
}

/* Allocate t's buffers and fill the operands at random; 0 on success. */
static int
case_alloc(gemm_case *t)
{
    int64_t m = t->m, n = t->n, k = t->k;
    t->a = malloc((size_t)(m * k + 1) * sizeof(*t->a));
    t->b = malloc((size_t)(k * n + 1) * sizeof(*t->b));
    t->c = malloc((size_t)(m * n + 1) * sizeof(*t->c));
    t->c0 = malloc((size_t)(m * n + 1) * sizeof(*t->c0));
    t->fo = malloc((size_t)(m * n + 1) * sizeof(*t->fo));
    t->res = malloc((size_t)(m * n + 1) * sizeof(*t->res));
    t->plen = bf16k_packed_b_len(k, n);
    t->bp = t->plen >= 0 ? malloc((size_t)(t->plen + 1) * sizeof(*t->bp)) : NULL;
    if (t->a == NULL || t->b == NULL || t->c == NULL || t->c0 == NULL
            || t->bp == NULL || t->fo == NULL || t->res == NULL) {
        printf("FAIL alloc (packed len %lld)\n", (long long)t->plen);
        return -1;
    }
    for (int64_t i = 0; i < m * k; i++) {
        t->a[i] = rand_bf16();
    }
    for (int64_t i = 0; i < k * n; i++) {
        t->b[i] = rand_bf16();
    }
    for (int64_t i = 0; i < m * n; i++) {
        t->c0[i] = t->c[i] = (float)((int)(next_u32() % 2001) - 1000) / 256.0f;
        t->res[i] = rand_bf16();
    }
    return 0;
}

static void
case_free(gemm_case *t)
{
    free(t->a);
    free(t->b);
    free(t->c);
    free(t->c0);
    free(t->bp);
    free(t->fo);
    free(t->res);
}

/* Pack B, run the plain product and (beta == 0) the fused one. */
static int
case_run(gemm_case *t)
{
    int rc = bf16k_pack_b(t->b, t->k, t->n, t->b_rs, t->b_cs, t->bp, t->plen);
    if (rc == 0) {
        rc = bf16k_sbgemm_packed(t->m, t->n, t->k, t->alpha, t->a, t->a_rs,
                                 t->a_cs, t->bp, t->plen,
                                 bf16k_packed_layout(), t->beta, t->c, t->n);
    }
    if (rc == 0 && t->fused) {
        rc = bf16k_sbgemm_fused(t->m, t->n, t->k, t->alpha, t->a, t->a_rs,
                                t->a_cs, t->bp, t->plen, bf16k_packed_layout(),
                                t->c0, t->use_res ? t->res : NULL, t->n,
                                t->relu, t->fo, t->n);
    }
    return rc;
}

/* One case: op(A) m x k (transposed storage if ta), op(B) k x n. */
static int
run_case(int64_t m, int64_t n, int64_t k, int ta, int tb, float alpha,
         float beta)
{
    gemm_case t = {
        .m = m, .n = n, .k = k,
        .a_rs = ta ? 1 : k, .a_cs = ta ? m : 1,
        .b_rs = tb ? 1 : n, .b_cs = tb ? k : 1,
        .alpha = alpha, .beta = beta,
        .fused = beta == 0.0f, .relu = ta, .use_res = (int)((m + n + k) & 1),
    };
    int ok = 0;
    if (case_alloc(&t) == 0) {
        int rc = case_run(&t);
        if (rc != 0) {
            printf("FAIL rc=%d (%s)\n", rc, bf16k_strerror(rc));
        }
        else {
            double worst = worst_ratio(&t);
            ok = worst <= 1.0;
            printf("%s m=%lld n=%lld k=%lld ta=%d tb=%d alpha=%g beta=%g "
                   "(max |err|/bound %.3g)\n", ok ? "ok  " : "FAIL",
                   (long long)m, (long long)n, (long long)k, ta, tb,
                   (double)alpha, (double)beta, worst);
        }
    }
    case_free(&t);
    return ok;
}

/* Every shape with each of the four (ta, tb, alpha, beta) combinations;
 * adds to *cases, returns the failures. */
static int
gemm_cases(int *cases)
{
    static const int64_t shapes[][3] = {
        {1, 1, 1}, {1, 9, 5}, {8, 8, 4}, {7, 13, 11}, {16, 16, 16},
        {1, 300, 257}, {8, 64, 1000}, {33, 70, 129}, {100, 90, 300},
        {250, 40, 600}, {64, 300, 130}, {30, 520, 34},
        /* K blocks of the BF16 kernels (KC = 2048): two of 1050 */
        {40, 70, 2100},
        /* over 2 * MIN_FLOPS_PER_THREAD: two threads (the worker pool) */
        {160, 130, 900},
        /* ... with one K block and a small B: the fp32 kernels widen all
         * of B once per worker and call (several row chunks reuse it) */
        {300, 250, 240},
    };
    int failures = 0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (int t = 0; t < 4; t++) {
            float alpha = (t & 1) ? -0.5f : 1.0f;
            float beta = (t & 2) ? 1.5f : 0.0f;
            (*cases)++;
            failures += !run_case(shapes[s][0], shapes[s][1], shapes[s][2],
                                  t & 1, (t >> 1) & 1, alpha, beta);
        }
    }
    return failures;
}

/* Conversion sanity on the same build: a few values, then a large array
 * (two threads, vector loop + tail) against the scalar formula, and the
 * exact widening back.  Adds to *cases, returns the failures. */
static int
conversion_cases(int *cases)
{
    int failures = 0;
    float f[3] = {1.0f, -2.5f, 3.0e38f};
    uint16_t h[3];
    float back[3];
    (*cases)++;
    if (bf16k_from_f32(f, h, 3, BF16K_ROUND_NEAREST) != 0
            || bf16k_to_f32(h, back, 3) != 0 || h[0] != 0x3F80
            || h[1] != 0xC020 || back[1] != -2.5f) {
        printf("FAIL conversion\n");
        failures++;
    }
    (*cases)++;
    const int64_t big = (1 << 19) + 7;
    float *fs = malloc((size_t)big * sizeof(*fs));
    float *fb = malloc((size_t)big * sizeof(*fb));
    uint16_t *hs = malloc((size_t)big * sizeof(*hs));
    int bad = fs == NULL || fb == NULL || hs == NULL;
    for (int64_t i = 0; !bad && i < big; i++) {
        uint32_t u = next_u32();
        memcpy(&fs[i], &u, sizeof(u));
    }
    bad = bad || bf16k_from_f32(fs, hs, big, BF16K_ROUND_NEAREST) != 0
        || bf16k_to_f32(hs, fb, big) != 0;
    for (int64_t i = 0; !bad && i < big; i++) {
        uint32_t u, w;
        memcpy(&u, &fs[i], sizeof(u));
        memcpy(&w, &fb[i], sizeof(w));
        uint32_t want = (u & 0x7FFFFFFFu) > 0x7F800000u
            ? ((u >> 16 & 0x8000u) | 0x7FC0u)
            : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        bad = hs[i] != want || w != (uint32_t)hs[i] << 16;
    }
    if (bad) {
        printf("FAIL large conversion\n");
        failures++;
    }
    free(fs);
    free(fb);
    free(hs);
    return failures;
}

/* im2col of one geometry q (h w c kh kw s p d n) against the definition;
 * 0 when it matches. */
static int
im2col_bad(const int *q)
{
    int64_t h = q[0], w = q[1], c = q[2], n = q[8];
    int kh = q[3], kw = q[4], st = q[5], pd = q[6], dl = q[7];
    int64_t oh = (h + 2 * pd - dl * (kh - 1) - 1) / st + 1;
    int64_t ow = (w + 2 * pd - dl * (kw - 1) - 1) / st + 1;
    int64_t len = n * oh * ow * kh * kw * c;
    uint16_t *img = malloc((size_t)(n * h * w * c) * sizeof(*img));
    uint16_t *cols = malloc((size_t)len * sizeof(*cols));
    int bad = img == NULL || cols == NULL;
    for (int64_t i = 0; !bad && i < n * h * w * c; i++) {
        img[i] = (uint16_t)(1 + i % 65000);
    }
    bad = bad || bf16k_im2col_nhwc(img, n, h, w, c, kh, kw, st, st, pd, pd,
                                   dl, dl, cols, len) != 0;
    for (int64_t r = 0; !bad && r < n * oh * ow; r++) {
        int64_t b = r / (oh * ow), oy = r % (oh * ow) / ow, ox = r % ow;
        for (int64_t kk = 0; !bad && kk < (int64_t)kh * kw * c; kk++) {
            int64_t ky = kk / (kw * c), kx = kk / c % kw, ci = kk % c;
            int64_t y = oy * st - pd + ky * dl, x = ox * st - pd + kx * dl;
            uint16_t want = (y < 0 || y >= h || x < 0 || x >= w) ? 0
                : img[((b * h + y) * w + x) * c + ci];
            bad = cols[r * kh * kw * c + kk] != want;
        }
    }
    free(img);
    free(cols);
    return bad;
}

/* im2col of NHWC images, padding and dilation included (whole-row copies
 * and per-tap copies both).  Adds to *cases, returns the failures. */
static int
im2col_cases(int *cases)
{
    static const int geo[][9] = {   /* h w c kh kw s p d n */
        {7, 6, 3, 3, 3, 1, 1, 1, 2}, {9, 9, 4, 7, 7, 2, 3, 1, 1},
        {5, 8, 2, 3, 2, 2, 0, 2, 2}, {4, 4, 8, 1, 3, 1, 2, 1, 1},
    };
    int failures = 0;
    for (size_t gi = 0; gi < sizeof(geo) / sizeof(geo[0]); gi++) {
        (*cases)++;
        if (im2col_bad(geo[gi])) {
            printf("FAIL im2col geometry %zu\n", gi);
            failures++;
        }
    }
    return failures;
}

int
main(int argc, char **argv)
{
    int failures = 0, cases = 0;
    /* argv[1]: a kernel to select first (e.g. "generic"). */
    const char *expect = argc > 1 ? argv[1] : BF16K_TEST_EXPECT;
    if (argc > 1 && bf16k_select_kernel(argv[1]) != 0) {
        printf("FAIL cannot select kernel %s\n", argv[1]);
        return 1;
    }
    const char *name = bf16k_kernel_name();
    printf("kernel: %s\n", name);
    if (strcmp(name, expect) != 0) {
        printf("FAIL expected the %s kernel (bfmmla: run under qemu -cpu "
               "max)\n", expect);
        return 1;
    }
    /* A packed B made for another layout is refused. */
    cases++;
    if (bf16k_sbgemm_packed(1, 1, 1, 1.0f, NULL, 1, 1, NULL, 0,
                            bf16k_packed_layout() + 1, 0.0f, NULL, 1)
            != BF16K_E_LAYOUT) {
        printf("FAIL layout mismatch not detected\n");
        failures++;
    }
    bf16k_set_num_threads(2);
    failures += gemm_cases(&cases);
    failures += conversion_cases(&cases);
    failures += im2col_cases(&cases);
    printf("%d/%d cases passed\n", cases - failures, cases);
    return failures != 0;
}
