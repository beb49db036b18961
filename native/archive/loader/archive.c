/* archive.c -- the services of an open archive that every loader unit uses:
 * its locks, where a module's chunk is placed in the heap reservation, and
 * giving pages of the reservation back.  It calls no other loader unit, so
 * the loader (loader.c), the read-ahead thread (prefetch.c) and the release
 * of tails (release.c) all build on it without depending on one another.
 */
#include "archive.h"

#include <sys/mman.h>
#include <time.h>

int
pycds_archive_sync_init(pycds_archive *a)
{
    pthread_condattr_t ca;
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot create the archive's mutex");
    }
    int rc = pthread_condattr_init(&ca);
    if (rc == 0) {
        /* The read-ahead thread's idle timeout is measured on this clock. */
        rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (rc == 0) {
            rc = pthread_cond_init(&a->done_cv, &ca);
            if (rc == 0) {
                rc = pthread_cond_init(&a->work_cv, &ca);
                if (rc != 0) {
                    pthread_cond_destroy(&a->done_cv);
                }
            }
        }
        pthread_condattr_destroy(&ca);
    }
    if (rc != 0) {
        pthread_mutex_destroy(&a->mu);
        return pycds_fail(PYCDS_E_NOMEM, "cannot create a condition variable");
    }
    return PYCDS_OK;
}

void
pycds_archive_sync_destroy(pycds_archive *a)
{
    pthread_cond_destroy(&a->work_cv);
    pthread_cond_destroy(&a->done_cv);
    pthread_mutex_destroy(&a->mu);
}

void
pycds_archive_place(pycds_archive *a, uint32_t k, pycds_place *out)
{
    const pycds_chunk_rec *c = &a->chunks[k];
    pthread_mutex_lock(&a->mu);
    if (a->tail_at[k] == 0) {
        uint64_t tail_len = c->chunk_len - c->root_off;
        a->head_at[k] = a->heads_used + 1;
        a->tail_at[k] = a->tails_used + 1;
        a->heads_used += c->root_off;
        /* Count the tail's bytes on each page it spans (release.c). */
        uint64_t lo = a->tails_used, hi = lo + tail_len, pg = a->page;
        for (uint64_t p = lo / pg; p * pg < hi; p++) {
            a->tail_live[p] += (uint32_t)pycds_page_share(p, pg, lo, hi);
        }
        a->tails_used += (tail_len + 7u) & ~(uint64_t)7u;
    }
    out->head = a->base + (a->head_at[k] - 1);
    out->tail = a->tails + (a->tail_at[k] - 1);
    pthread_mutex_unlock(&a->mu);
    out->root_off = c->root_off;
    out->len = c->chunk_len;
}

int
pycds_release_pages(pycds_archive *a, uintptr_t lo, size_t len)
{
    return a->release_mode == PYCDS_RELEASE_PROTECT
        ? mprotect((void *)lo, len, PROT_NONE)
        : madvise((void *)lo, len, MADV_DONTNEED);
}
