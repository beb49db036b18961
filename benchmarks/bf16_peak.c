/* bf16_peak.c -- the arithmetic limit an sbgemm kernel is measured against.
 *
 * Runs, on each of N threads (pinned one a CPU), a loop of independent
 * multiply-accumulate instructions with no memory traffic, and prints the
 * throughput in GFLOP/s (a multiply-add counts 2):
 *
 *   avx512bf16  VDPBF16PS zmm: 16 lanes x 2 BF16 products = 64 FLOP
 *   avx512f     VFMADD231PS zmm (fp32): 32 FLOP
 *   avx2        VFMADD231PS ymm (fp32): 16 FLOP
 *
 * 16 accumulators (12 for ymm), kept in registers (the loops unrolled): more than
 * latency x throughput (4-6 cycles x 2 a cycle on the CPUs here), so the
 * loop runs at the issue rate.  Only the kinds the
 * CPU has are run.  Build: cc -O2 -pthread bf16_peak.c -o bf16_peak
 * Usage: bf16_peak [THREADS] [SECONDS]   (defaults: 0, all CPUs; 0.5)
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ACCS 16         /* zmm kernels: 32 registers */
#define ACCS256 12      /* ymm kernel: 16 registers, 2 hold the operands */
#define UNROLL_ITERS 1000

typedef double (*kernel_fn)(long iters);

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One kernel: N accumulators of vector type VEC (set with SET1, summed with
 * ADD), each updated by STEP(acc) per pass; it returns a value derived from
 * them, so that the compiler keeps the loop.  Each accumulator starts at
 * another value: identical chains would be computed once.  (A macro: the
 * kernels differ only in their types and intrinsics, and each needs its
 * own target attribute.) */
#define PEAK_KERNEL(NAME, TARGET, VEC, N, LANES, SET1, ADD, STORE, OPERANDS, STEP) \
    __attribute__((target(TARGET))) static double                              \
    NAME(long iters)                                                          \
    {                                                                         \
        VEC acc[N];                                                           \
        OPERANDS;                                                             \
        _Pragma("GCC unroll 16")                                              \
        for (int i = 0; i < N; i++) {                                         \
            acc[i] = SET1((float)i);                                          \
        }                                                                     \
        for (long n = 0; n < iters; n++) {                                    \
            _Pragma("GCC unroll 16")                                          \
            for (int i = 0; i < N; i++) {                                     \
                acc[i] = STEP(acc[i]);                                        \
            }                                                                 \
        }                                                                     \
        float out[LANES];                                                     \
        VEC s = acc[0];                                                       \
        for (int i = 1; i < N; i++) {                                         \
            s = ADD(s, acc[i]);                                               \
        }                                                                     \
        STORE(out, s);                                                        \
        return out[0];                                                        \
    }

/* 1.0 times a tiny value: the sums never overflow nor become denormal. */
#define DP_STEP(acc) _mm512_dpbf16_ps((acc), a, b)
#define FMA512_STEP(acc) _mm512_fmadd_ps(a, b, (acc))
#define FMA256_STEP(acc) _mm256_fmadd_ps(a, b, (acc))

PEAK_KERNEL(run_bf16, "avx512f,avx512bf16", __m512, ACCS, 16, _mm512_set1_ps,
            _mm512_add_ps, _mm512_storeu_ps,
            __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);
            __m512bh b = (__m512bh)_mm512_set1_epi16(0x0001), DP_STEP)
PEAK_KERNEL(run_fma512, "avx512f", __m512, ACCS, 16, _mm512_set1_ps, _mm512_add_ps,
            _mm512_storeu_ps,
            __m512 a = _mm512_set1_ps(1.0f);
            __m512 b = _mm512_set1_ps(1e-30f), FMA512_STEP)
PEAK_KERNEL(run_fma256, "avx2,fma", __m256, ACCS256, 8, _mm256_set1_ps, _mm256_add_ps,
            _mm256_storeu_ps,
            __m256 a = _mm256_set1_ps(1.0f);
            __m256 b = _mm256_set1_ps(1e-30f), FMA256_STEP)

typedef struct {
    kernel_fn fn;
    int cpu;
    double seconds;
    double flops;      /* out: FLOP done */
    double elapsed;    /* out: seconds */
    double sink;
} job;

static void *
worker(void *arg)
{
    job *j = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(j->cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);   /* best effort */
    long iters = UNROLL_ITERS;
    double t0 = now_s(), t;
    j->sink = 0;
    j->flops = 0;
    do {
        j->sink += j->fn(iters);
        j->flops += (double)iters;
        t = now_s();
    } while (t - t0 < j->seconds);
    j->elapsed = t - t0;
    return NULL;
}

/* GFLOP/s of fn on nthreads threads; flop_per_iter: FLOP of one pass over
 * the accumulators.  -1 when a thread cannot be started. */
static double
measure(kernel_fn fn, double flop_per_iter, int nthreads, double seconds, const int *cpus)
{
    pthread_t tid[256];
    job jobs[256];
    double total = 0;

    fn(UNROLL_ITERS);       /* warm up: wake the vector unit, raise the clock */
    for (int i = 0; i < nthreads; i++) {
        jobs[i] = (job){fn, cpus[i], seconds, 0, 0, 0};
        if (pthread_create(&tid[i], NULL, worker, &jobs[i]) != 0) {
            for (int k = 0; k < i; k++) {
                pthread_join(tid[k], NULL);
            }
            return -1;
        }
    }
    for (int i = 0; i < nthreads; i++) {
        pthread_join(tid[i], NULL);
        total += jobs[i].flops * flop_per_iter / jobs[i].elapsed;
    }
    return total / 1e9;
}

int
main(int argc, char **argv)
{
    cpu_set_t set;
    int cpus[256], ncpus = 0;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        perror("sched_getaffinity");
        return 2;
    }
    for (int c = 0; c < CPU_SETSIZE && ncpus < 256; c++) {
        if (CPU_ISSET(c, &set)) {
            cpus[ncpus++] = c;
        }
    }
    int nthreads = argc > 1 ? atoi(argv[1]) : 0;
    if (nthreads == 0) {
        nthreads = ncpus;
    }
    double seconds = argc > 2 ? atof(argv[2]) : 0.5;
    if (nthreads < 1 || nthreads > ncpus || !(seconds > 0)) {
        fprintf(stderr, "usage: %s [THREADS (0: all, up to %d)] [SECONDS > 0]\n", argv[0],
                ncpus);
        return 2;
    }
    __builtin_cpu_init();
    struct {
        const char *name;
        int have;
        kernel_fn fn;
        double flop;
    } kinds[] = {
        {"avx512bf16", __builtin_cpu_supports("avx512bf16"), run_bf16, ACCS * 64.0},
        {"avx512f", __builtin_cpu_supports("avx512f"), run_fma512, ACCS * 32.0},
        {"avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
         run_fma256, ACCS256 * 16.0},
    };
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        if (!kinds[k].have) {
            continue;
        }
        double one = measure(kinds[k].fn, kinds[k].flop, 1, seconds, cpus);
        double all = measure(kinds[k].fn, kinds[k].flop, nthreads, seconds, cpus);
        if (one < 0 || all < 0) {
            fprintf(stderr, "cannot start threads\n");
            return 1;
        }
        printf("%s 1 %.1f %d %.1f\n", kinds[k].name, one, nthreads, all);
    }
    return 0;
}
