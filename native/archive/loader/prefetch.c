/* prefetch.c -- the read-ahead thread: stage 1 of the modules a program is
 * about to import, on another core.
 *
 * A dump run writes the chunks in the order the program imported its
 * modules, and the next run of the same program imports them in about that
 * order.  So when the importing thread loads module k, the modules right
 * after k in the heap are the likely next ones: this thread runs stage 1
 * (pread, checksum, pointer relocations; archive.h) for those whose chunks
 * start less than `pf_cur` bytes after k's end, and the importing thread
 * finds them READY; what stays on the importing thread is stage 2, the part
 * that needs the GIL (re-interning, frozensets).  As the kernel's file
 * read-ahead does, the window starts small (RAMP_MIN) and doubles on every
 * import that finds its module read ahead, up to `pf_window`, and falls
 * back to RAMP_MIN on an import that does not: it bounds the work and
 * memory spent on modules that are never imported (a program that imports
 * one module and stops reads RAMP_MIN ahead, not the whole window).
 *
 * The thread touches no Python object and never takes the GIL; it blocks
 * every signal but the synchronous ones (the others stay the
 * interpreter's); it exits after IDLE_MS without work, so a long-running
 * program has no extra thread once its imports are done, and is started
 * again when needed.  Before fork() it is stopped and joined
 * (pthread_atfork), so the child is never left with a module AHEAD
 * forever, and a process that forks has no thread of ours (nothing for
 * CPython 3.12+'s multi-threaded fork warning, or a look at
 * /proc/self/task, to see).
 */
#include "archive.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define IDLE_MS 200
#define RAMP_MIN (256u << 10)
/* Stack of the read-ahead thread, bytes. */
#define PREFETCH_STACK ((size_t)256 << 10)

/* Archives with read-ahead, for the fork handlers. */
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static pycds_archive *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_ok;

/* With a->mu held: the next module to read ahead, or nmodules. */
static uint32_t
next_candidate(pycds_archive *a)
{
    while (a->pf_next < a->nmodules
           && a->chunks[a->pf_next].chunk_off < a->pf_limit) {
        if (a->state[a->pf_next] == MOD_NEW) {
            return a->pf_next;
        }
        a->pf_next++;
    }
    return a->nmodules;
}

/* With a->mu held: give back the page ranges queued by release.c (the lock
 * is let go meanwhile; only a thread holding the GIL adds to the queue).
 * The queue's buffer goes back to the queue for reuse rather than to
 * free(): on the read-ahead thread, free() would set up a glibc arena of
 * that thread's own (its per-thread cache) for good. */
static void
drain_locked(pycds_archive *a)
{
    while (a->gb_n > 0) {
        uintptr_t *q = a->gb_q;
        size_t n = a->gb_n, cap = a->gb_cap;
        a->gb_q = NULL;
        a->gb_n = a->gb_cap = 0;
        pthread_mutex_unlock(&a->mu);
        for (size_t i = 0; i < n; i++) {
            (void)pycds_release_pages(a, q[2 * i], (size_t)q[2 * i + 1]);
        }
        pthread_mutex_lock(&a->mu);
        if (a->gb_q == NULL) {
            a->gb_q = q;
            a->gb_cap = cap;
        }
        else {
            free(q);      /* a new queue was started meanwhile (rare) */
        }
    }
}

static void *
prefetch_main(void *arg)
{
    pycds_archive *a = arg;
    pycds_scratch scratch = {NULL, 0};
    pthread_mutex_lock(&a->mu);
    a->pf_tid = gettid();
    while (!a->pf_stop) {
        uint32_t k = next_candidate(a);
        if (k == a->nmodules) {
            struct timespec until;
            if (clock_gettime(CLOCK_MONOTONIC, &until) != 0) {
                break;        /* no clock for the idle timeout: just exit */
            }
            until.tv_nsec += (long)IDLE_MS * 1000000L;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            a->pf_waiting = 1;
            int w = pthread_cond_timedwait(&a->work_cv, &a->mu, &until);
            a->pf_waiting = 0;
            if (w == ETIMEDOUT && !a->pf_stop && next_candidate(a) == a->nmodules) {
                if (a->gb_n == 0) {
                    break;
                }
                /* The program stopped importing: now give back the pages
                 * of released tails (release.c).  Not earlier: each
                 * madvise() flushes the TLB of the importing thread's CPU
                 * too (an IPI), which costs the imports more than the call
                 * costs this thread; as jemalloc's background purging
                 * does, wait for a quiet moment. */
                drain_locked(a);
            }
            continue;
        }
        a->state[k] = MOD_AHEAD;
        a->pf_next = k + 1;
        pthread_mutex_unlock(&a->mu);

        pycds_fixups *fix = NULL;
        int rc = pycds_chunk_stage1(a, k, &scratch, &fix);

        pthread_mutex_lock(&a->mu);
        if (rc == PYCDS_OK) {
            a->fixups[k] = fix;
            a->state[k] = MOD_READY;
            a->pf_ahead++;
        }
        else {
            /* The importing thread redoes it and reports the failure. */
            a->state[k] = MOD_NOPREFETCH;
        }
        pthread_cond_broadcast(&a->done_cv);
    }
    if (!a->pf_stop) {
        drain_locked(a);      /* leaving for lack of a clock */
    }
    a->pf_running = 0;
    pycds_fixpool_trim_locked(a);
    pthread_mutex_unlock(&a->mu);
    pycds_scratch_free(&scratch);
    return NULL;
}

/* With a->mu held. */
static void
join_locked(pycds_archive *a)
{
    if (a->pf_joinable) {
        pthread_t t = a->pf_thread;
        a->pf_joinable = 0;
        pthread_mutex_unlock(&a->mu);
        (void)pthread_join(t, NULL);   /* fails only for a bad handle */
        pthread_mutex_lock(&a->mu);
    }
}

static void
start_locked(pycds_archive *a)
{
    join_locked(a);           /* an idle thread that has exited */
    if (a->pf_running || a->pf_window == 0 || a->pf_stop) {
        return;
    }
    /* The thread inherits this mask: every signal blocked but the
     * synchronous ones, so that a fault in it still reaches faulthandler
     * (a blocked SIGSEGV would kill the process silently). */
    sigset_t mask, old;
    sigfillset(&mask);
    sigdelset(&mask, SIGSEGV);
    sigdelset(&mask, SIGBUS);
    sigdelset(&mask, SIGFPE);
    sigdelset(&mask, SIGILL);
    if (pthread_sigmask(SIG_SETMASK, &mask, &old) != 0) {
        a->pf_window = 0;
        return;
    }
    /* A small stack: the thread's work is loops over buffers (no
     * recursion), and its address space counts against RLIMIT_AS, which a
     * program near its limit needs for itself. */
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        (void)pthread_attr_setstacksize(&attr, PREFETCH_STACK);  /* else the default */
        a->pf_tid = 0;
        rc = pthread_create(&a->pf_thread, &attr, prefetch_main, a);
        (void)pthread_attr_destroy(&attr);
    }
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        a->pf_window = 0;     /* no thread to be had: load everything inline */
        return;
    }
    a->pf_joinable = 1;
    a->pf_running = 1;
}

void
pycds_prefetch_schedule(pycds_archive *a, uint32_t k, int hit)
{
    if (a->pf_window == 0) {
        return;
    }
    uint64_t lo = a->pf_window < RAMP_MIN ? a->pf_window : RAMP_MIN;
    if (!hit || a->pf_cur < lo) {
        a->pf_cur = lo;
    }
    else if (a->pf_cur < a->pf_window) {
        a->pf_cur = 2 * a->pf_cur < a->pf_window ? 2 * a->pf_cur : a->pf_window;
    }
    const pycds_chunk_rec *c = &a->chunks[k];
    a->pf_next = k + 1;
    a->pf_limit = c->chunk_off + c->chunk_len + a->pf_cur;
    if (next_candidate(a) == a->nmodules) {
        return;
    }
    if (!a->pf_running) {
        a->pf_woken_limit = a->pf_limit;
        start_locked(a);
    }
    else if (a->pf_waiting
             && (a->pf_limit < a->pf_woken_limit
                 || a->pf_limit - a->pf_woken_limit >= a->pf_cur / 4)) {
        /* Waking the thread costs this one a futex call: wake it for a
         * quarter window of new work at a time, or when the program moved
         * back in the heap. */
        a->pf_woken_limit = a->pf_limit;
        pthread_cond_signal(&a->work_cv);
    }
}

int
pycds_prefetch_give_back(pycds_archive *a, uintptr_t lo, size_t len)
{
    int taken = 0;
    pthread_mutex_lock(&a->mu);
    if (a->pf_window == 0 || a->pf_stop) {
        goto out;
    }
    if (a->gb_n == a->gb_cap) {
        size_t ncap = a->gb_cap ? 2 * a->gb_cap : 64;
        uintptr_t *nq = realloc(a->gb_q, ncap * 2 * sizeof(uintptr_t));
        if (nq == NULL) {
            goto out;
        }
        a->gb_q = nq;
        a->gb_cap = ncap;
    }
    a->gb_q[2 * a->gb_n] = lo;
    a->gb_q[2 * a->gb_n + 1] = (uintptr_t)len;
    a->gb_n++;
    /* Not woken for this: the thread gives the queue back when it has
     * had nothing to do for IDLE_MS (prefetch_main). */
    if (!a->pf_running) {
        start_locked(a);
        if (!a->pf_running) {
            a->gb_n--;        /* no thread: the caller does it */
            goto out;
        }
    }
    taken = 1;
out:
    pthread_mutex_unlock(&a->mu);
    return taken;
}

/* ---- fork ---------------------------------------------------------------- */

/* pthread_join() returns once the kernel has cleared the thread's id, a
 * moment before it drops the thread from the process: until then
 * /proc/self/stat still counts it, and CPython 3.12+ reads that count
 * after fork() to warn that the process forked with threads.  Wait for the
 * thread to be gone, a bounded time (about 50 ms at most). */
static void
wait_gone(pid_t tid)
{
    char path[64];
    if (tid <= 0 || snprintf(path, sizeof path, "/proc/self/task/%d", (int)tid)
                    >= (int)sizeof path) {
        return;
    }
    struct timespec pause = {0, 50000};
    for (int i = 0; i < 1000 && access(path, F_OK) == 0; i++) {
        (void)nanosleep(&pause, NULL);
    }
}

static void
before_fork(void)
{
    pthread_mutex_lock(&registry_mu);
    for (pycds_archive *a = registry; a != NULL; a = a->pf_next_archive) {
        pthread_mutex_lock(&a->mu);
        a->pf_stop = 1;
        pthread_cond_broadcast(&a->work_cv);
        int joined = a->pf_joinable;
        join_locked(a);
        if (joined) {
            wait_gone(a->pf_tid);     /* set by the thread before it exited */
        }
        /* Pages waiting to be given back go now, so that neither process
         * keeps them (the thread is not restarted after the fork). */
        drain_locked(a);
        /* Held across fork(): no module changes state meanwhile. */
    }
}

static void
after_fork_parent(void)
{
    for (pycds_archive *a = registry; a != NULL; a = a->pf_next_archive) {
        a->pf_stop = 0;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_mutex_unlock(&registry_mu);
}

/* The child has one thread.  Its locks and condition variables are made
 * anew rather than unlocked: a condition variable may still count waiters
 * of the parent (an importer waiting for the read-ahead thread), whom
 * glibc would wait for.  A module some other thread of the parent was
 * importing stays IMPORTING, so the child imports it plainly. */
static void
after_fork_child(void)
{
    for (pycds_archive *a = registry; a != NULL; a = a->pf_next_archive) {
        a->pf_stop = 0;
        a->pf_running = 0;
        a->pf_waiting = 0;
        /* glibc's init with default attributes cannot fail; if it did,
         * the child must not start a thread on broken locks. */
        if (pycds_archive_sync_init(a) != PYCDS_OK) {
            a->pf_window = 0;
        }
    }
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    registry_mu = fresh;
}

static void
register_atfork(void)
{
    atfork_ok = pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
}

int
pycds_prefetch_enable(pycds_archive *a, uint64_t window)
{
    if (window > 0) {
        /* On one CPU the thread could only take turns with the program. */
        cpu_set_t cpus;
        long ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
            ? CPU_COUNT(&cpus)
            : sysconf(_SC_NPROCESSORS_ONLN);   /* > 1024 CPUs: EINVAL */
        if (ncpu < 2) {
            window = 0;
        }
    }
    if (window > 0) {
        pthread_once(&atfork_once, register_atfork);
        if (!atfork_ok) {
            window = 0;       /* never risk a fork with the thread running */
        }
    }
    pthread_mutex_lock(&registry_mu);
    int listed = 0;
    for (pycds_archive *p = registry; p != NULL; p = p->pf_next_archive) {
        listed |= p == a;
    }
    if (window > 0 && !listed) {
        a->pf_next_archive = registry;
        registry = a;
    }
    pthread_mutex_lock(&a->mu);
    a->pf_window = window;
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_unlock(&registry_mu);
    return PYCDS_OK;
}

void
pycds_prefetch_shutdown(pycds_archive *a)
{
    pthread_mutex_lock(&registry_mu);
    for (pycds_archive **p = &registry; *p != NULL; p = &(*p)->pf_next_archive) {
        if (*p == a) {
            *p = a->pf_next_archive;
            break;
        }
    }
    pthread_mutex_lock(&a->mu);
    a->pf_stop = 1;
    a->pf_window = 0;
    pthread_cond_broadcast(&a->work_cv);
    join_locked(a);
    drain_locked(a);
    a->pf_stop = 0;
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_unlock(&registry_mu);
}

int
pycds_archive_set_prefetch(pycds_archive *a, uint64_t window)
{
    if (a == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no archive");
    }
    if (window == 0) {
        pycds_prefetch_shutdown(a);
        return PYCDS_OK;
    }
    return pycds_prefetch_enable(a, window);
}

int
pycds_archive_prefetched(pycds_archive *a, uint64_t *count)
{
    if (a == NULL || count == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_prefetched arguments");
    }
    pthread_mutex_lock(&a->mu);
    *count = a->pf_ahead;
    pthread_mutex_unlock(&a->mu);
    return PYCDS_OK;
}
