/* loader.c -- opens an archive and brings one module's chunk to life.
 *
 * pycds_archive_open() checks that the archive was made by this very
 * interpreter build, reads and checks its chunk table (one record per
 * module: where its chunk and relocation entries are, and their checksum)
 * and reserves address space for the heap: an anonymous MAP_PRIVATE |
 * MAP_NORESERVE mapping, so nothing of the heap is read or allocated yet.
 * It holds two arenas: one for the chunks' heads, one (from a page on) for
 * their tails (pycds_place in pycds_internal.h); a module's chunk is placed
 * at the end of each when it is first loaded (archive.c), so loaded chunks
 * are packed in load order and the tails given back after module bodies
 * ran (release.c) fill whole pages.
 * pycds_archive_load() handles one module, once, in two stages
 * (archive.h): stage 1 (relocate.c) runs here or ahead on the read-ahead
 * thread (prefetch.c); stage 2, holding the GIL, on the importing thread:
 *   1. re-intern the strings the dump run had interned (once per string
 *      number and process: the archive's string table), and swap SINGLETON
 *      copies for the interpreter's shared instances (layout hooks);
 *   2. build the frozensets from their item tuples (innermost first: entries
 *      are in the order the writer emitted them);
 *   3. check the root is a code object, let the layout do the per-process
 *      work unmarshal does for each code object (pycds_layout_after_load:
 *      3.12+ code versions and code watchers), and hand it out.
 * A module that fails half way is marked failed and never retried (fix-ups
 * are not idempotent).  The per-module state is guarded by the archive's
 * mutex (archive.h); imports themselves are serialised by the GIL, which
 * pycds_archive_load() holds throughout.
 */
#include "archive.h"
#include "layout.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

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
 * SHARE.  The archive is refused when its heap would
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

/* The checks of h that need no file access: a heap section aligned as
 * the format says and section sizes this machine can address.  The
 * alignment is the format's, not this machine's page size: the loader
 * only ever preads the heap into its own arenas, whose pages are this
 * machine's, so an archive written under 4 KiB pages is served under 16
 * or 64 KiB ones and the other way round (docs/archive-format.md). */
static int
check_header(const pycds_archive_header *h)
{
    if (h->heap_off % PYCDS_HEAP_ALIGN != 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "heap section at %llu is not "
                          "%d-byte aligned",
                          (unsigned long long)h->heap_off, PYCDS_HEAP_ALIGN);
    }
    if (h->heap_len > (uint64_t)SIZE_MAX / 2
        || h->reloc_count > (uint64_t)SIZE_MAX / 8) {
        return pycds_fail(PYCDS_E_CORRUPT, "section sizes out of range");
    }
    return PYCDS_OK;
}

/* PYCDS_E_FOREIGN unless layout_id is this interpreter's. */
static int
check_layout(const char *layout_id)
{
    char here[512];
    int rc = pycds_layout_id(here, sizeof(here));
    if (rc) {
        return rc;
    }
    if (strcmp(here, layout_id) != 0) {
        return pycds_fail(PYCDS_E_FOREIGN,
                          "archive layout '%.200s' differs from this "
                          "interpreter's '%.200s'", layout_id, here);
    }
    return PYCDS_OK;
}

/* Give back everything a holds: at a failed open and at close, when none
 * of its reservation's objects are alive. */
static void
archive_free(pycds_archive *a)
{
    if (a->base != NULL) {
        munmap(a->base, a->map_len);
    }
    if (a->fd >= 0) {
        close(a->fd);
    }
    if (a->sync_made) {
        for (uint32_t i = 0; a->fixups != NULL && i < a->nmodules; i++) {
            pycds_fixups_free(a, a->fixups[i]);
        }
        pycds_fixpool_destroy(a);
        pycds_archive_sync_destroy(a);
    }
    free(a->state);
    free(a->roots);
    free(a->fixups);
    free(a->keep_tail);
    free(a->chunks);
    free(a->head_at);
    free(a->tail_at);
    free(a->tail_live);
    free(a->gb_q);
    /* Entries hold references only once a module reached stage 2, and an
     * archive that did is never freed (pycds_archive_close). */
    for (size_t i = 0; a->strtab != NULL && i < a->strtab_leaves; i++) {
        free(a->strtab[i]);
    }
    free(a->strtab);
    free(a);
}

/* A new handle for nmodules modules: its per-module tables and its locks. */
static int
archive_new(uint32_t nmodules, pycds_archive **out)
{
    pycds_archive *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate archive handle");
    }
    a->fd = -1;
    a->release_mode = PYCDS_RELEASE_ON;
    a->nmodules = nmodules;
    size_t n = nmodules ? nmodules : 1;
    a->state = calloc(n, 1);
    a->roots = calloc(n, sizeof(PyObject *));
    a->fixups = calloc(n, sizeof(pycds_fixups *));
    a->keep_tail = calloc(n, 1);
    a->chunks = calloc(n, sizeof(pycds_chunk_rec));
    a->head_at = calloc(n, sizeof(uint64_t));
    a->tail_at = calloc(n, sizeof(uint64_t));
    int rc = PYCDS_OK;
    if (a->state == NULL || a->roots == NULL || a->fixups == NULL || a->chunks == NULL
        || a->keep_tail == NULL || a->head_at == NULL || a->tail_at == NULL) {
        rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate module table");
    }
    if (rc == PYCDS_OK) {
        rc = pycds_archive_sync_init(a);
        a->sync_made = rc == PYCDS_OK;
    }
    if (rc) {
        archive_free(a);
        return rc;
    }
    *out = a;
    return PYCDS_OK;
}

/* Read a's chunk table (h->chunks_off) and check it. */
static int
read_chunk_table(pycds_archive *a, const pycds_archive_header *h)
{
    size_t tbytes = (size_t)a->nmodules * sizeof(pycds_chunk_rec);
    int rc = pycds_read_full(a->fd, a->chunks, tbytes, h->chunks_off);
    if (rc) {
        return rc;
    }
    if (pycds_hash64(a->chunks, tbytes, h->seed) != h->chunks_sum) {
        return pycds_fail(PYCDS_E_CORRUPT, "chunk table checksum mismatch");
    }
    return check_chunk_table(a);
}

/* Reserve the two arenas: every head, then every tail (8-aligned), each
 * arena rounded up to a page.  Both sums are at most heap_len plus 8 bytes
 * a chunk (the table keeps chunks apart), far from overflowing. */
static int
reserve_heap(pycds_archive *a)
{
    uint64_t heads = 0, tails = 0, pg = (uint64_t)a->page;
    for (uint32_t k = 0; k < a->nmodules; k++) {
        heads += a->chunks[k].root_off;
        tails += (a->chunks[k].chunk_len - a->chunks[k].root_off + 7u) & ~(uint64_t)7u;
    }
    heads = (heads + pg - 1) / pg * pg;
    tails = (tails + pg - 1) / pg * pg;
    if (heads + tails == 0) {
        return PYCDS_OK;
    }
    size_t len = (size_t)(heads + tails);
    uint64_t left;
    if (!address_space_allows(len, &left)) {
        return pycds_fail(PYCDS_E_IO, "its heap needs %zu MiB of address space, "
                          "more than half of the %llu MiB RLIMIT_AS leaves",
                          len >> 20, (unsigned long long)(left >> 20));
    }
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        return pycds_fail(PYCDS_E_IO, "cannot reserve %zu bytes for the heap: %s",
                          len, strerror(errno));
    }
    a->base = (uint8_t *)m;
    a->map_len = len;
    a->tails = a->base + heads;
    a->tail_pages = (size_t)(tails / pg);
    a->tail_live = calloc(a->tail_pages ? a->tail_pages : 1, sizeof(uint32_t));
    if (a->tail_live == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate the tail page table");
    }
    return PYCDS_OK;
}

int
pycds_archive_open(int fd, const pycds_archive_header *h, pycds_archive **out)
{
    if (out == NULL || h == NULL || h->layout_id == NULL || fd < 0) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_open arguments");
    }
    *out = NULL;
    long page = sysconf(_SC_PAGESIZE);
    int rc = page > 0 ? check_header(h)
        : pycds_fail(PYCDS_E_IO, "cannot read the page size: %s",
                     strerror(errno));
    if (rc == PYCDS_OK) {
        rc = check_layout(h->layout_id);
    }
    pycds_archive *a = NULL;
    if (rc == PYCDS_OK) {
        rc = archive_new(h->nmodules, &a);
    }
    if (rc) {
        return rc;
    }
    a->page = (size_t)page;
    a->heap_off = h->heap_off;
    a->heap_len = h->heap_len;
    a->reloc_off = h->reloc_off;
    a->reloc_count = h->reloc_count;
    a->seed = h->seed;
    PyGILState_STATE g = PyGILState_Ensure();
    a->fd = pycds_fd_place(fd);
    int err = errno;
    PyGILState_Release(g);
    if (a->fd < 0) {
        rc = pycds_fail(PYCDS_E_IO, "dup of archive fd failed: %s", strerror(err));
    }
    if (rc == PYCDS_OK) {
        rc = read_chunk_table(a, h);
    }
    if (rc == PYCDS_OK) {
        a->strtab_leaves = (size_t)(a->reloc_count / PYCDS_STRTAB_LEAF) + 1;
        a->strtab = calloc(a->strtab_leaves, sizeof(PyObject **));
        if (a->strtab == NULL) {
            rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate the string table");
        }
    }
    if (rc == PYCDS_OK) {
        rc = reserve_heap(a);
    }
    if (rc) {
        archive_free(a);
        return rc;
    }
    *out = a;
    return PYCDS_OK;
}

/* Where the interned string of string number n goes in a's table (its
 * leaf made now if need be), or NULL when out of memory: the string is
 * then interned without it, which gives the same object.  n is below
 * a->reloc_count (relocate.c). */
static PyObject **
strtab_entry(pycds_archive *a, uint32_t n)
{
    PyObject **leaf = a->strtab[n / PYCDS_STRTAB_LEAF];
    if (leaf == NULL) {
        leaf = calloc(PYCDS_STRTAB_LEAF, sizeof(PyObject *));
        if (leaf == NULL) {
            return NULL;
        }
        __atomic_store_n(&a->strtab[n / PYCDS_STRTAB_LEAF], leaf, __ATOMIC_RELEASE);
    }
    return &leaf[n % PYCDS_STRTAB_LEAF];
}

/* Whether strs a and b have the same value (both ready: a chunk's str, an
 * interned one). */
static int
same_str(PyObject *a, PyObject *b)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b)
           && memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

/* Re-intern the str in *slot, string number n: the first time the process
 * meets n, as unmarshal interns (pycds_layout_intern, which probes the
 * interpreter's interned dict); after that, the result for n, which is
 * still the interned string of that value (interned strings the archive
 * holds references to never leave the interned dict).  The deep check
 * also checks that the chunk's copy has that value: a writer gives a
 * number to one value only. */
static int
intern_numbered(pycds_archive *a, uint32_t n, PyObject **slot)
{
    PyObject **t = strtab_entry(a, n);
    if (t != NULL && *t != NULL) {
        if (a->verify && !same_str(*slot, *t)) {
            return pycds_fail(PYCDS_E_CORRUPT, "string number %u differs between chunks", n);
        }
        /* Each slot owns a reference, as after pycds_layout_intern(). */
        *slot = Py_NewRef(*t);
        return PYCDS_OK;
    }
    int rc = pycds_layout_intern(slot);
    if (rc == PYCDS_OK && t != NULL && *t == NULL) {
        /* The table's own, for good. */
        __atomic_store_n(t, Py_NewRef(*slot), __ATOMIC_RELAXED);
    }
    return rc;
}

/* Stage 2: re-intern, shared instances, frozensets (GIL held). */
static int
fixup_objects(pycds_archive *a, const pycds_place *p, const pycds_fixups *f)
{
    int rc = PYCDS_OK;
    uint64_t left = f->nintern, room = 0;
    /* Strings and shared instances first: a frozenset must be built from
     * the very objects a fresh unmarshal would give it. */
    for (uint64_t i = 0; rc == PYCDS_OK && i < f->nstr; i++) {
        uint32_t e = f->fix[i];
        PyObject **slot = (PyObject **)pycds_place_at(p, e & ~(uint32_t)7u);
        if ((e & 7u) == PYCDS_RELOC_SINGLETON) {
            rc = pycds_layout_use_singleton(slot);
            continue;
        }
        if (room == 0) {
            rc = pycds_layout_intern_reserve(left > 0 ? left : 1, &room);
            if (rc) {
                break;
            }
        }
        rc = intern_numbered(a, f->num[i], slot);
        room--;
        left--;
    }
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
        rc = fixup_objects(a, &p, f);
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
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *list = (PyObject *)out_list, *root = NULL;
    int rc;
    if (!PyList_Check(list)) {
        rc = pycds_fail(PYCDS_E_ARG, "out_list is not a list");
    } else if ((rc = pycds_archive_load_root(a, module_no, &root)) == PYCDS_OK) {
        if (PyList_Append(list, root) < 0) {
            rc = pycds_fail_python("handing out the code object");
        }
        Py_DECREF(root);
    }
    PyGILState_Release(g);
    return rc;
}

int
pycds_archive_load_root(pycds_archive *a, uint32_t module_no, PyObject **root)
{
    if (a == NULL || root == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_load arguments");
    }
    if (module_no >= a->nmodules) {
        /* The number comes from the archive's index. */
        return pycds_fail(PYCDS_E_CORRUPT, "module number %u out of range",
                          module_no);
    }
    int rc = PYCDS_OK;
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
    *root = Py_NewRef(a->roots[module_no]);
done:
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
    archive_free(a);
    return PYCDS_OK;
}
