/* fixpool.c -- the pool of fix-up records the read-ahead thread makes.
 *
 * Records are bump-allocated in mmap'd blocks rather than malloc'd: a block
 * malloc'd by the read-ahead thread and freed by the importing thread would
 * stay in the read-ahead thread's own malloc arena for good.  A block goes
 * back when its last record is freed (one empty block is kept for reuse
 * while the thread runs) and, at the latest, when the thread exits.
 */
#include "archive.h"

#include <sys/mman.h>

#define FIXBLOCK (64u << 10)

struct pycds_fixblock {
    size_t cap;               /* bytes of the mapping */
    size_t used;              /* bytes handed out, this header included */
    uint64_t live;            /* records handed out and not yet freed */
};

#define FIXBLOCK_HDR ((sizeof(struct pycds_fixblock) + 15u) & ~(size_t)15u)

/* With a->mu held: b has no record left and is not the one being filled.
 * Kept as the spare only while the thread runs (it exits when idle). */
static void
fixblock_retire(pycds_archive *a, struct pycds_fixblock *b)
{
    if (a->fb_spare == NULL && b->cap == FIXBLOCK && a->pf_running) {
        a->fb_spare = b;
    }
    else {
        (void)munmap(b, b->cap);
    }
}

void *
pycds_fixpool_alloc(pycds_archive *a, size_t bytes, void **block)
{
    size_t need = (bytes + 15u) & ~(size_t)15u;
    void *out = NULL;
    pthread_mutex_lock(&a->mu);
    struct pycds_fixblock *b = a->fb_cur;
    if (b != NULL && b->live == 0) {
        b->used = FIXBLOCK_HDR;               /* empty: fill it again */
    }
    if (b == NULL || b->cap - b->used < need) {
        struct pycds_fixblock *nb = NULL;
        if (need <= FIXBLOCK - FIXBLOCK_HDR && a->fb_spare != NULL) {
            nb = a->fb_spare;
            a->fb_spare = NULL;
        }
        else {
            size_t cap = need + FIXBLOCK_HDR <= FIXBLOCK ? FIXBLOCK
                         : (need + FIXBLOCK_HDR + a->page - 1) & ~(a->page - 1);
            void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m != MAP_FAILED) {
                nb = m;
                nb->cap = cap;
            }
        }
        if (nb != NULL) {
            nb->used = FIXBLOCK_HDR;
            nb->live = 0;
            if (b != NULL && b->live == 0) {
                fixblock_retire(a, b);
            }
            /* else b goes when its last record is freed */
            a->fb_cur = b = nb;
        }
        else {
            b = NULL;
        }
    }
    if (b != NULL) {
        out = (uint8_t *)b + b->used;
        b->used += need;
        b->live++;
        *block = b;
    }
    pthread_mutex_unlock(&a->mu);
    return out;
}

void
pycds_fixpool_free(pycds_archive *a, void *block)
{
    struct pycds_fixblock *b = block;
    pthread_mutex_lock(&a->mu);
    if (--b->live == 0 && (b != a->fb_cur || !a->pf_running)) {
        if (b == a->fb_cur) {
            a->fb_cur = NULL;         /* the thread has exited: nobody fills it */
        }
        fixblock_retire(a, b);
    }
    pthread_mutex_unlock(&a->mu);
}

void
pycds_fixpool_trim_locked(pycds_archive *a)
{
    if (a->fb_cur != NULL && a->fb_cur->live == 0) {
        (void)munmap(a->fb_cur, a->fb_cur->cap);
        a->fb_cur = NULL;
    }
    if (a->fb_spare != NULL) {
        (void)munmap(a->fb_spare, a->fb_spare->cap);
        a->fb_spare = NULL;
    }
}

void
pycds_fixpool_destroy(pycds_archive *a)
{
    pthread_mutex_lock(&a->mu);
    pycds_fixpool_trim_locked(a);
    pthread_mutex_unlock(&a->mu);
}
