/* loader.c -- reserves an archive's heap and brings one module's chunk to life.
 *
 * pycds_archive_open() checks that the archive was made by this very
 * interpreter build, reads and checks its chunk table (one record per
 * module: where its chunk and relocation entries are, and their checksum)
 * and reserves address space for the heap: an anonymous MAP_PRIVATE |
 * MAP_NORESERVE mapping, so nothing of the heap is read or allocated yet.
 * It holds two arenas: one for the chunks' heads, one (from a page on) for
 * their tails (pycds_place in pycds_internal.h); a module's chunk is placed
 * at the end of each when it is first loaded, so loaded chunks are packed
 * in load order and the tails given back after module bodies ran
 * (release.c) fill whole pages.
 * pycds_archive_load() handles one module, once, in two stages
 * (archive.h); stage 1 may have run ahead on the read-ahead thread
 * (prefetch.c):
 *
 *   stage 1, no GIL:
 *   1. pread() the chunk's head and tail into their places and its relocation
 *      entries into a buffer.  The bytes that are checked are the bytes that
 *      are used, and they are this process's own: a concurrent overwrite or
 *      truncation of the file can make a later load fail, never tear one or
 *      fault code already loaded.  (A file mapping cannot promise that: on
 *      truncate, Linux unmaps even the private copy-on-write pages of a
 *      MAP_PRIVATE mapping -- truncate_pagecache() calls unmap_mapping_range()
 *      with even_cows=1 -- so `cp new.img app.img` would turn live code
 *      objects into SIGBUS or zero pages.  See docs/design-notes.md.)
 *   2. verify the XXH64 checksum of the chunk as the writer wrote it (head
 *      then tail; seeded with the archive's random id, so a chunk from
 *      another archive never passes);
 *   3. apply the relocations, bounds-checking each: INTERNAL/INTERN/FROZENSET
 *      (and DATA, into an object) turn a chunk offset into the address of
 *      its head or tail copy,
 *      EXTERNAL adds the image anchor's and must land inside the
 *      interpreter image;
 *   stage 2, holding the GIL, on the importing thread:
 *   4. re-intern the strings the dump run had interned, and swap SINGLETON
 *      copies for the interpreter's shared instances (layout hooks);
 *   5. build the frozensets from their item tuples (innermost first: entries
 *      are in the order the writer emitted them);
 *   6. check the root is a code object, let the layout do the per-process
 *      work unmarshal does for each code object (pycds_layout_after_load:
 *      3.12+ code versions and code watchers), and hand it out.
 * A module that fails half way is marked failed and never retried (fix-ups
 * are not idempotent).  The per-module state is guarded by the archive's
 * mutex (archive.h); imports themselves are serialised by the GIL, which
 * pycds_archive_load() holds throughout.
 */
#include "archive.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static int
read_full(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = (uint8_t *)buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return pycds_fail(PYCDS_E_IO, "read of archive failed: %s",
                              strerror(errno));
        }
        if (got == 0) {
            return pycds_fail(PYCDS_E_IO, "archive is shorter than its index says");
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return PYCDS_OK;
}

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

/* Check the chunk table: every chunk inside the heap, 8-aligned, after the
 * previous one (chunks never overlap, so a chunk's pread can never land on
 * another module's live objects), its root inside it, its relocation
 * entries inside the table. */
static int
check_chunk_table(const pycds_archive *a)
{
    uint64_t prev_end = 0;
    for (uint32_t k = 0; k < a->nmodules; k++) {
        const pycds_chunk_rec *c = &a->chunks[k];
        /* chunk_off + chunk_len <= heap_len, written so that it cannot wrap */
        if (c->chunk_len > a->heap_len || c->chunk_off > a->heap_len - c->chunk_len) {
            return pycds_fail(PYCDS_E_CORRUPT, "chunk table entry %u out of range", k);
        }
        uint64_t end = c->chunk_off + c->chunk_len;
        if (c->chunk_off % 8 != 0 || c->chunk_off < prev_end || c->zero != 0
            || c->root_off % 8 != 0
            || (uint64_t)c->root_off + sizeof(PyObject) > c->chunk_len
            || c->reloc_first > a->reloc_count
            || c->reloc_count > a->reloc_count - c->reloc_first) {
            return pycds_fail(PYCDS_E_CORRUPT, "chunk table entry %u out of range", k);
        }
        prev_end = end;
    }
    return PYCDS_OK;
}

/* Whether reserving len bytes of address space leaves the program what
 * RLIMIT_AS lets it have.  The reservation allocates nothing, but counts
 * against the limit as a whole from the first archive hit (the modules a
 * program never imports included), so under a tight limit a program that
 * runs plainly could hit MemoryError, or fail to load an extension, under
 * SHARE (a review showed both).  The archive is refused when its heap would
 * take more than half of what the limit leaves the process now (its
 * VmSize: /proc/self/statm); always used without a limit.  *left gets that
 * headroom in bytes. */
static int
address_space_allows(size_t len, uint64_t *left)
{
    struct rlimit rl;
    *left = UINT64_MAX;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
        return 1;
    }
    uint64_t used = 0;
    FILE *f = fopen("/proc/self/statm", "re");
    if (f != NULL) {
        unsigned long long pages;
        if (fscanf(f, "%llu", &pages) == 1) {
            long page = sysconf(_SC_PAGESIZE);
            used = (uint64_t)pages * (uint64_t)(page > 0 ? page : 4096);
        }
        fclose(f);
    }
    uint64_t limit = (uint64_t)rl.rlim_cur;
    *left = limit > used ? limit - used : 0;
    return (uint64_t)len <= *left / 2;
}

int
pycds_archive_open(int fd, uint64_t heap_off, uint64_t heap_len,
                   uint64_t reloc_off, uint64_t reloc_count,
                   uint64_t chunks_off, uint64_t chunks_sum,
                   uint32_t nmodules, uint64_t seed,
                   const char *layout_id, pycds_archive **out)
{
    if (out == NULL || layout_id == NULL || fd < 0) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_open arguments");
    }
    *out = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || heap_off % (uint64_t)page != 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "heap section is not page-aligned");
    }
    if (heap_len > (uint64_t)SIZE_MAX / 2 || reloc_count > (uint64_t)SIZE_MAX / 8) {
        return pycds_fail(PYCDS_E_CORRUPT, "section sizes out of range");
    }

    char here[512];
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = pycds_image_init();
    if (rc == PYCDS_OK) {
        rc = pycds_layout_describe(here, sizeof(here));
    }
    PyGILState_Release(g);
    if (rc) {
        return rc;
    }
    if (strcmp(here, layout_id) != 0) {
        return pycds_fail(PYCDS_E_FOREIGN,
                          "archive layout '%.200s' differs from this "
                          "interpreter's '%.200s'", layout_id, here);
    }

    pycds_archive *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate archive handle");
    }
    a->fd = -1;
    a->release_mode = PYCDS_RELEASE_ON;
    int have_sync = 0;
    size_t n = nmodules ? nmodules : 1;
    a->state = calloc(n, 1);
    a->roots = calloc(n, sizeof(PyObject *));
    a->fixups = calloc(n, sizeof(pycds_fixups *));
    a->keep_tail = calloc(n, 1);
    a->chunks = calloc(n, sizeof(pycds_chunk_rec));
    a->head_at = calloc(n, sizeof(uint64_t));
    a->tail_at = calloc(n, sizeof(uint64_t));
    if (a->state == NULL || a->roots == NULL || a->fixups == NULL || a->chunks == NULL
        || a->keep_tail == NULL || a->head_at == NULL || a->tail_at == NULL) {
        rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate module table");
        goto fail;
    }
    rc = pycds_archive_sync_init(a);
    if (rc) {
        goto fail;
    }
    have_sync = 1;
    g = PyGILState_Ensure();
    a->fd = pycds_fd_place(fd);
    PyGILState_Release(g);
    if (a->fd < 0) {
        rc = pycds_fail(PYCDS_E_IO, "dup of archive fd failed: %s",
                        strerror(errno));
        goto fail;
    }
    a->heap_off = heap_off;
    a->heap_len = heap_len;
    a->reloc_off = reloc_off;
    a->reloc_count = reloc_count;
    a->nmodules = nmodules;
    a->seed = seed;
    size_t tbytes = (size_t)nmodules * sizeof(pycds_chunk_rec);
    rc = read_full(a->fd, a->chunks, tbytes, chunks_off);
    if (rc) {
        goto fail;
    }
    if (pycds_hash64(a->chunks, tbytes, seed) != chunks_sum) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "chunk table checksum mismatch");
        goto fail;
    }
    rc = check_chunk_table(a);
    if (rc) {
        goto fail;
    }
    /* The arenas: every head, then every tail (8-aligned), each arena
     * rounded up to a page.  Both sums are at most heap_len plus 8 bytes a
     * chunk (the table keeps chunks apart), far from overflowing. */
    a->page = (size_t)page;
    uint64_t heads = 0, tails = 0;
    for (uint32_t k = 0; k < nmodules; k++) {
        heads += a->chunks[k].root_off;
        tails += (a->chunks[k].chunk_len - a->chunks[k].root_off + 7u) & ~(uint64_t)7u;
    }
    uint64_t pg = (uint64_t)page;
    heads = (heads + pg - 1) / pg * pg;
    tails = (tails + pg - 1) / pg * pg;
    if (heads + tails > 0) {
        a->map_len = (size_t)(heads + tails);
        uint64_t left;
        if (!address_space_allows(a->map_len, &left)) {
            rc = pycds_fail(PYCDS_E_IO, "its heap needs %zu MiB of address space, "
                            "more than half of the %llu MiB RLIMIT_AS leaves",
                            a->map_len >> 20, (unsigned long long)(left >> 20));
            goto fail;
        }
        void *m = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            rc = pycds_fail(PYCDS_E_IO, "cannot reserve %zu bytes for the heap: %s",
                            a->map_len, strerror(errno));
            goto fail;
        }
        a->base = (uint8_t *)m;
        a->tails = a->base + heads;
        a->tail_pages = (size_t)(tails / pg);
        a->tail_live = calloc(a->tail_pages ? a->tail_pages : 1, sizeof(uint32_t));
        if (a->tail_live == NULL) {
            munmap(a->base, a->map_len);
            a->base = NULL;
            rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate the tail page table");
            goto fail;
        }
    }
    *out = a;
    return PYCDS_OK;

fail:
    if (a->fd >= 0) {
        close(a->fd);
    }
    if (have_sync) {
        pthread_cond_destroy(&a->work_cv);
        pthread_cond_destroy(&a->done_cv);
        pthread_mutex_destroy(&a->mu);
    }
    free(a->state);
    free(a->roots);
    free(a->fixups);
    free(a->keep_tail);
    free(a->chunks);
    free(a->head_at);
    free(a->tail_at);
    free(a);
    return rc;
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

static int
apply_relocations(const pycds_place *p, const uint32_t *rel, uint64_t n)
{
    uintptr_t anchor = pycds_image_anchor();
    uint64_t len = p->len;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t e = rel[i];
        uint64_t slot = e & ~(uint32_t)7u;
        int kind = (int)(e & 7u);
        if (slot + sizeof(uint64_t) > len) {
            return pycds_fail(PYCDS_E_CORRUPT, "relocation slot %llu outside chunk",
                              (unsigned long long)slot);
        }
        /* 8-aligned, as root_off is: a slot is wholly in the head or the
         * tail. */
        uint8_t *at = pycds_place_at(p, slot);
        uint64_t v;
        memcpy(&v, at, sizeof(v));
        switch (kind) {
        case PYCDS_RELOC_INTERNAL:
        case PYCDS_RELOC_INTERN:
        case PYCDS_RELOC_FROZENSET:
        case PYCDS_RELOC_SINGLETON:
            /* len >= sizeof(PyObject): the chunk table guarantees it.  An
             * object header lies wholly in the head or in the tail (they
             * are apart in memory). */
            if (v % 8 != 0 || v > len - sizeof(PyObject)
                || (v < p->root_off && p->root_off - v < sizeof(PyObject))) {
                return pycds_fail(PYCDS_E_CORRUPT,
                                  "relocation target %llu outside chunk",
                                  (unsigned long long)v);
            }
            v = (uint64_t)(uintptr_t)pycds_place_at(p, v);
            break;
        case PYCDS_RELOC_DATA:
            /* Into an object (a str's code units): a word of the chunk. */
            if (v % 8 != 0 || v >= len) {
                return pycds_fail(PYCDS_E_CORRUPT,
                                  "relocation target %llu outside chunk",
                                  (unsigned long long)v);
            }
            v = (uint64_t)(uintptr_t)pycds_place_at(p, v);
            break;
        case PYCDS_RELOC_EXTERNAL:
            v = (uint64_t)(anchor + (uintptr_t)(int64_t)v);
            if (!pycds_image_contains((const void *)(uintptr_t)v, sizeof(PyObject))) {
                return pycds_fail(PYCDS_E_CORRUPT,
                                  "external relocation outside the interpreter");
            }
            break;
        default:
            return pycds_fail(PYCDS_E_CORRUPT, "unknown relocation kind %d", kind);
        }
        memcpy(at, &v, sizeof(v));
    }
    return PYCDS_OK;
}

/* Results of re-interning, by the chunk's string: a name referenced from many
 * slots (co_names of every function, say) is looked up in the interpreter's
 * interned set once per load, not once per slot. */
typedef struct {
    PyObject *from, *to;
} intern_memo;

static int
intern_cached(intern_memo *memo, size_t mask, PyObject **slot)
{
    if (memo == NULL) {
        return pycds_layout_intern(slot);
    }
    PyObject *from = *slot;
    size_t i = pycds_addr_hash(from, mask);
    while (memo[i].from != NULL) {
        if (memo[i].from == from) {
            /* Each slot owns a reference, as after pycds_layout_intern(). */
            Py_INCREF(memo[i].to);
            *slot = memo[i].to;
            return PYCDS_OK;
        }
        i = (i + 1) & mask;
    }
    int rc = pycds_layout_intern(slot);
    if (rc == PYCDS_OK) {
        memo[i].from = from;
        memo[i].to = *slot;
    }
    return rc;
}

/* Stage 1, after the relocations: list the slots stage 2 must visit
 * (INTERN and SINGLETON ones, then FROZENSET ones, each in table order) so
 * that it does not walk every entry again, check their targets' types
 * (plain pointer comparisons: no GIL needed), and compute the hash of each
 * string to be interned (as unicode_hash() would on first use), so that
 * stage 2 spends its time in the interned dict only.  count_fixups sizes
 * the list, fill_fixups writes it into f->fix (f->nstr + f->nset entries). */
static void
count_fixups(const uint32_t *rel, uint64_t n, uint64_t *nstr, uint64_t *nset)
{
    *nstr = *nset = 0;
    for (uint64_t i = 0; i < n; i++) {
        int kind = (int)(rel[i] & 7u);
        *nstr += kind == PYCDS_RELOC_INTERN || kind == PYCDS_RELOC_SINGLETON;
        *nset += kind == PYCDS_RELOC_FROZENSET;
    }
}

static int
fill_fixups(const pycds_place *p, const uint32_t *rel, pycds_fixups *f)
{
    uint64_t n = f->nrel, si = 0, fi = f->nstr;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t e = rel[i];
        int kind = (int)(e & 7u);
        if (kind == PYCDS_RELOC_INTERNAL) {
            /* The writer's tail (release.c) is reached from before it only
             * through INTERN slots; a chunk that says otherwise keeps it. */
            uint8_t *t = *(uint8_t **)pycds_place_at(p, e & ~(uint32_t)7u);
            f->tail_shared |= (e & ~(uint32_t)7u) < p->root_off
                              && (uintptr_t)t >= (uintptr_t)p->tail
                              && (uintptr_t)t - (uintptr_t)p->tail < p->len - p->root_off;
            continue;
        }
        if (kind == PYCDS_RELOC_EXTERNAL || kind == PYCDS_RELOC_DATA) {
            continue;
        }
        PyObject *target = *(PyObject **)pycds_place_at(p, e & ~(uint32_t)7u);
        PyTypeObject *t = Py_TYPE(target);
        if (kind == PYCDS_RELOC_INTERN) {
            /* apply_relocations() put the target in the chunk; the string
             * must fit in its part too before its code units are hashed. */
            if (t != &PyUnicode_Type
                || pycds_object_size(target, pycds_place_room(p, target)) == 0) {
                return pycds_fail(PYCDS_E_CORRUPT, "INTERN slot is not a str");
            }
            f->nintern++;
            pycds_layout_str_prehash(target);
            f->fix[si++] = e;
        }
        else if (kind == PYCDS_RELOC_SINGLETON) {
            if (!pycds_image_contains(t, sizeof(PyTypeObject))) {
                return pycds_fail(PYCDS_E_CORRUPT, "slot target has no static type");
            }
            f->fix[si++] = e;
        }
        else {
            if (t != &PyTuple_Type) {
                return pycds_fail(PYCDS_E_CORRUPT, "FROZENSET slot is not a tuple");
            }
            f->fix[fi++] = e;
        }
    }
    return PYCDS_OK;
}

/* A fix-up record with room for n list entries: from the read-ahead
 * thread's pool when pooled (prefetch.c), else malloc'd. */
static pycds_fixups *
fixups_new(pycds_archive *a, int pooled, uint64_t n)
{
    size_t bytes = sizeof(pycds_fixups) + (size_t)n * sizeof(uint32_t);
    void *block = NULL;
    pycds_fixups *f = pooled ? pycds_fixpool_alloc(a, bytes, &block) : malloc(bytes);
    if (f != NULL) {
        memset(f, 0, sizeof(*f));
        f->fix = (uint32_t *)(f + 1);
        f->block = block;
    }
    return f;
}

void
pycds_fixups_free(pycds_archive *a, pycds_fixups *f)
{
    if (f != NULL) {
        free(f->rel);
        if (f->block != NULL) {
            pycds_fixpool_free(a, f->block);
        }
        else {
            free(f);
        }
    }
}

/* Stage 2: re-intern, shared instances, frozensets (GIL held). */
static int
fixup_objects(const pycds_place *p, const pycds_fixups *f)
{
    size_t cap = 16;
    while (cap < 2 * f->nintern) {
        cap *= 2;
    }
    /* Without memory for the memo, intern slot by slot: same result. */
    intern_memo *memo = f->nintern > 1 ? calloc(cap, sizeof(intern_memo)) : NULL;
    int rc = pycds_layout_intern_reserve(f->nintern);
    /* Strings and shared instances first: a frozenset must be built from
     * the very objects a fresh unmarshal would give it. */
    for (uint64_t i = 0; rc == PYCDS_OK && i < f->nstr; i++) {
        uint32_t e = f->fix[i];
        PyObject **slot = (PyObject **)pycds_place_at(p, e & ~(uint32_t)7u);
        if ((e & 7u) == PYCDS_RELOC_SINGLETON) {
            rc = pycds_layout_use_singleton(slot);
        }
        else {
            rc = intern_cached(memo, cap - 1, slot);
        }
    }
    free(memo);
    /* One frozenset per item tuple: the compiler shares an equal constant
     * between code objects, and marshal gives every reference to it the
     * same object. */
    pycds_table built = {NULL, 0, 0};
    for (uint64_t i = f->nstr; rc == PYCDS_OK && i < f->nstr + f->nset; i++) {
        PyObject **slot = (PyObject **)pycds_place_at(p, f->fix[i] & ~(uint32_t)7u);
        uint64_t made;
        if (pycds_table_get(&built, *slot, &made)) {
            *slot = Py_NewRef((PyObject *)(uintptr_t)made);
            continue;
        }
        /* New reference, owned by the archive for good. */
        PyObject *fs = PyFrozenSet_New(*slot);
        if (fs == NULL) {
            rc = pycds_fail_python("rebuilding a frozenset");
            break;
        }
        rc = pycds_table_put(&built, *slot, (uint64_t)(uintptr_t)fs);
        *slot = fs;
    }
    free(built.slots);
    return rc;
}

/* The relocation entries of a chunk of rbytes bytes: in the caller's
 * scratch buffer (grown by mmap) when given and the deep check is off,
 * else in a malloc'd buffer that *own gets. */
static uint32_t *
relocation_buffer(pycds_scratch *scratch, size_t rbytes, uint32_t **own)
{
    *own = NULL;
    if (scratch == NULL) {
        return *own = malloc(rbytes ? rbytes : 1);
    }
    if (scratch->cap < rbytes || scratch->p == NULL) {
        size_t cap = ((rbytes >> 16) + 1) << 16;       /* 64 KiB steps */
        void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            return NULL;
        }
        pycds_scratch_free(scratch);
        scratch->p = m;
        scratch->cap = cap;
    }
    return scratch->p;
}

void
pycds_scratch_free(pycds_scratch *scratch)
{
    if (scratch->p != NULL) {
        (void)munmap(scratch->p, scratch->cap);
        scratch->p = NULL;
        scratch->cap = 0;
    }
}

int
pycds_chunk_stage1(pycds_archive *a, uint32_t k, pycds_scratch *scratch,
                   pycds_fixups **out)
{
    const pycds_chunk_rec *c = &a->chunks[k];
    pycds_place p;
    pycds_archive_place(a, k, &p);
    *out = NULL;
    uint64_t at = a->heap_off + c->chunk_off;
    int rc = read_full(a->fd, p.head, c->root_off, at);
    if (rc == PYCDS_OK) {
        rc = read_full(a->fd, p.tail, c->chunk_len - c->root_off, at + c->root_off);
    }
    if (rc) {
        return rc;
    }
    size_t rbytes = (size_t)c->reloc_count * sizeof(uint32_t);
    /* Only the deep check reads the entries after this stage: in `own`
     * then, handed to the fix-up record. */
    uint32_t *own = NULL;
    uint32_t *rel = relocation_buffer(a->verify ? NULL : scratch, rbytes, &own);
    if (rel == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate relocation buffer");
    }
    rc = read_full(a->fd, rel, rbytes,
                   a->reloc_off + c->reloc_first * sizeof(uint32_t));
    if (rc == PYCDS_OK) {
        uint64_t h = pycds_hash64_2(p.head, c->root_off, p.tail,
                                    c->chunk_len - c->root_off, a->seed);
        h = pycds_hash64(rel, rbytes, h);
        if (h != c->checksum) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "module checksum mismatch");
        }
    }
    if (rc == PYCDS_OK) {
        rc = apply_relocations(&p, rel, c->reloc_count);
    }
    pycds_fixups *f = NULL;
    if (rc == PYCDS_OK) {
        uint64_t nstr, nset;
        count_fixups(rel, c->reloc_count, &nstr, &nset);
        f = fixups_new(a, scratch != NULL, nstr + nset);
        if (f == NULL) {
            rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate the fix-up list");
        }
        else {
            f->nrel = c->reloc_count;
            f->nstr = nstr;
            f->nset = nset;
            rc = fill_fixups(&p, rel, f);
        }
    }
    if (rc == PYCDS_OK && a->verify) {
        f->rel = own;
        own = NULL;
    }
    /* Freed by the thread that allocated it (see pycds_scratch). */
    free(own);
    if (rc) {
        pycds_fixups_free(a, f);
        return rc;
    }
    *out = f;
    return PYCDS_OK;
}

/* Stage 2 of module k (GIL held); consumes f. */
static int
chunk_stage2(pycds_archive *a, uint32_t k, pycds_fixups *f, PyObject **root)
{
    pycds_place p;
    pycds_archive_place(a, k, &p);
    int rc = PYCDS_OK;
    if (a->verify) {
        rc = pycds_verify_chunk(&p, f->rel, f->nrel);
    }
    if (rc == PYCDS_OK) {
        rc = fixup_objects(&p, f);
    }
    a->keep_tail[k] = (uint8_t)f->tail_shared;
    pycds_fixups_free(a, f);
    if (rc) {
        return rc;
    }
    PyObject *co = (PyObject *)pycds_place_at(&p, p.root_off);
    if (!pycds_image_contains(Py_TYPE(co), sizeof(PyTypeObject))
        || !PyCode_Check(co)) {
        return pycds_fail(PYCDS_E_CORRUPT, "module root is not a code object");
    }
    rc = pycds_layout_after_load(co);
    if (rc) {
        return rc;
    }
    *root = co;
    return PYCDS_OK;
}

int
pycds_archive_load(pycds_archive *a, uint32_t module_no, uintptr_t out_list)
{
    if (a == NULL || out_list == 0) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_load arguments");
    }
    if (module_no >= a->nmodules) {
        /* The number comes from the archive's index. */
        return pycds_fail(PYCDS_E_CORRUPT, "module number %u out of range",
                          module_no);
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PYCDS_OK;
    PyObject *list = (PyObject *)out_list;
    if (!PyList_Check(list)) {
        rc = pycds_fail(PYCDS_E_ARG, "out_list is not a list");
        goto done;
    }
    /* Claim the module.  The read-ahead thread holds a module AHEAD for the
     * length of one stage 1 and needs nothing of ours: wait for it.  A
     * module IMPORTING is being loaded by a stage 2 that ran Python code
     * (archive.h): refuse, the caller imports it plainly. */
    pthread_mutex_lock(&a->mu);
    while (a->state[module_no] == MOD_AHEAD) {
        pthread_cond_wait(&a->done_cv, &a->mu);
    }
    int s = a->state[module_no];
    pycds_fixups *fix = NULL;
    if (s == MOD_NEW || s == MOD_NOPREFETCH || s == MOD_READY) {
        fix = a->fixups[module_no];
        a->fixups[module_no] = NULL;
        a->state[module_no] = MOD_IMPORTING;
        pycds_prefetch_schedule(a, module_no, s == MOD_READY);
    }
    pthread_mutex_unlock(&a->mu);

    if (s == MOD_FAILED) {
        rc = pycds_fail(PYCDS_E_STATE, "failed to load before");
        goto done;
    }
    if (s == MOD_IMPORTING) {
        rc = pycds_fail(PYCDS_E_STATE, "being loaded by another import");
        goto done;
    }
    if (s == MOD_RELEASED) {
        rc = pycds_fail(PYCDS_E_STATE, "ran before and was released");
        goto done;
    }
    if (s != MOD_LOADED) {
        if (s != MOD_READY) {
            rc = pycds_chunk_stage1(a, module_no, NULL, &fix);
        }
        if (rc == PYCDS_OK) {
            rc = chunk_stage2(a, module_no, fix, &a->roots[module_no]);
        }
        pthread_mutex_lock(&a->mu);
        a->state[module_no] = rc ? MOD_FAILED : MOD_LOADED;
        pthread_mutex_unlock(&a->mu);
        if (rc) {
            goto done;
        }
    }
    if (PyList_Append(list, a->roots[module_no]) < 0) {
        rc = pycds_fail_python("handing out the code object");
    }
done:
    PyGILState_Release(g);
    return rc;
}

int
pycds_archive_fd(pycds_archive *a, int *fd)
{
    if (a == NULL || fd == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no archive");
    }
    *fd = a->fd;
    return PYCDS_OK;
}

int
pycds_archive_set_verify(pycds_archive *a, int on)
{
    if (a == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no archive");
    }
    pthread_mutex_lock(&a->mu);
    int started = 0;
    for (uint32_t i = 0; i < a->nmodules && !started; i++) {
        started = a->state[i] != MOD_NEW;
    }
    if (!started) {
        a->verify = on != 0;
    }
    pthread_mutex_unlock(&a->mu);
    /* Stage 1 keeps the relocation entries only for the deep check. */
    return started ? pycds_fail(PYCDS_E_STATE, "verify is set before the first load")
                   : PYCDS_OK;
}

int
pycds_archive_close(pycds_archive *a)
{
    if (a == NULL) {
        return PYCDS_OK;
    }
    pthread_mutex_lock(&a->mu);
    int live = 0;
    for (uint32_t i = 0; i < a->nmodules; i++) {
        /* FAILED too: a stage 2 that failed half way may have made
         * strings of the reservation the interpreter's interned ones. */
        live |= a->state[i] == MOD_LOADED || a->state[i] == MOD_IMPORTING
                || a->state[i] == MOD_RELEASED || a->state[i] == MOD_FAILED;
    }
    pthread_mutex_unlock(&a->mu);
    if (live) {
        /* Objects from this reservation are alive: keep it for good (and
         * its read-ahead on). */
        return pycds_fail(PYCDS_E_STATE,
                          "archive has loaded modules; it stays mapped");
    }
    pycds_prefetch_shutdown(a);
    if (a->base != NULL) {
        munmap(a->base, a->map_len);
    }
    close(a->fd);
    for (uint32_t i = 0; i < a->nmodules; i++) {
        pycds_fixups_free(a, a->fixups[i]);
    }
    pycds_fixpool_destroy(a);
    pthread_cond_destroy(&a->work_cv);
    pthread_cond_destroy(&a->done_cv);
    pthread_mutex_destroy(&a->mu);
    free(a->state);
    free(a->roots);
    free(a->fixups);
    free(a->keep_tail);
    free(a->chunks);
    free(a->head_at);
    free(a->tail_at);
    free(a->tail_live);
    free(a->gb_q);
    free(a);
    return PYCDS_OK;
}
