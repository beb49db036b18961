/* relocate.c -- stage 1 of a load (archive.h): a module's chunk read into
 * its place, checked and relocated, without the GIL.
 *
 *   1. pread() the chunk's head and tail into their places and its
 *      relocation entries into a buffer.  The bytes that are checked are the
 *      bytes that are used, and they are this process's own: a concurrent
 *      overwrite or truncation of the file can make a later load fail, never
 *      tear one or fault code already loaded (a file mapping cannot promise
 *      that: on truncate, Linux unmaps even the private copy-on-write pages
 *      of a MAP_PRIVATE mapping; docs/design-notes.md);
 *   2. verify the XXH64 checksum of the chunk as the writer wrote it (head
 *      then tail; seeded with the archive's id, a hash of its content,
 *      so a chunk from another archive never passes);
 *   3. apply the relocations, bounds-checking each: INTERNAL/INTERN/FROZENSET
 *      (and DATA, into an object) turn a chunk offset into the address of
 *      its head or tail copy, EXTERNAL adds the image anchor's and must land
 *      inside the interpreter image; an INTERN slot's string number (its
 *      high 32 bits) goes to the fix-up record;
 *   4. list the slots stage 2 must visit, in a fix-up record.
 * Runs on the importing thread (loader.c) or ahead on the read-ahead thread
 * (prefetch.c); touches no Python object outside the chunk.
 */
#include "archive.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int
pycds_read_full(int fd, void *buf, size_t n, uint64_t off)
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

/* nstrings bounds the string numbers; num gets one per INTERN and
 * SINGLETON entry, in table order (fill_fixups lists them so). */
static int
apply_relocations(const pycds_place *p, const uint32_t *rel, uint64_t n,
                  uint64_t nstrings, uint32_t *num)
{
    uintptr_t anchor = pycds_image_anchor();
    uint64_t len = p->len;
    uint64_t si = 0;
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
        if (kind == PYCDS_RELOC_INTERN) {
            if (v >> 32 >= nstrings) {
                return pycds_fail(PYCDS_E_CORRUPT, "string number %llu out of range",
                                  (unsigned long long)(v >> 32));
            }
            num[si++] = (uint32_t)(v >> 32);
            v &= UINT32_MAX;
        }
        else if (kind == PYCDS_RELOC_SINGLETON) {
            num[si++] = 0;
        }
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
            /* (Static objects are aligned as any object.) */
            if (!pycds_image_contains((const void *)(uintptr_t)v, sizeof(PyObject))
                || v % _Alignof(PyObject) != 0) {
                return pycds_fail(PYCDS_E_CORRUPT,
                                  "external relocation outside the interpreter "
                                  "or misaligned");
            }
            break;
        default:
            return pycds_fail(PYCDS_E_CORRUPT, "unknown relocation kind %d", kind);
        }
        memcpy(at, &v, sizeof(v));
    }
    return PYCDS_OK;
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

/* A fix-up record with room for its list (nstr + nset entries) and the
 * nstr string numbers: from the read-ahead thread's pool when pooled
 * (prefetch.c), else malloc'd. */
static pycds_fixups *
fixups_new(pycds_archive *a, int pooled, uint64_t nstr, uint64_t nset)
{
    size_t bytes = sizeof(pycds_fixups)
                   + (size_t)(2 * nstr + nset) * sizeof(uint32_t);
    void *block = NULL;
    pycds_fixups *f = pooled ? pycds_fixpool_alloc(a, bytes, &block) : malloc(bytes);
    if (f != NULL) {
        memset(f, 0, sizeof(*f));
        f->fix = (uint32_t *)(f + 1);
        f->num = f->fix + nstr + nset;
        f->nstr = nstr;
        f->nset = nset;
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
    int rc = pycds_read_full(a->fd, p.head, c->root_off, at);
    if (rc == PYCDS_OK) {
        rc = pycds_read_full(a->fd, p.tail, c->chunk_len - c->root_off, at + c->root_off);
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
    rc = pycds_read_full(a->fd, rel, rbytes,
                   a->reloc_off + c->reloc_first * sizeof(uint32_t));
    if (rc == PYCDS_OK) {
        uint64_t h = pycds_hash64_2(p.head, c->root_off, p.tail,
                                    c->chunk_len - c->root_off, a->seed);
        h = pycds_hash64(rel, rbytes, h);
        if (h != c->checksum) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "module checksum mismatch");
        }
    }
    pycds_fixups *f = NULL;
    if (rc == PYCDS_OK) {
        uint64_t nstr, nset;
        count_fixups(rel, c->reloc_count, &nstr, &nset);
        f = fixups_new(a, scratch != NULL, nstr, nset);
        if (f == NULL) {
            rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate the fix-up list");
        }
        else {
            f->nrel = c->reloc_count;
        }
    }
    if (rc == PYCDS_OK) {
        rc = apply_relocations(&p, rel, c->reloc_count, a->reloc_count, f->num);
    }
    if (rc == PYCDS_OK) {
        rc = fill_fixups(&p, rel, f);
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

