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
 *      inside the interpreter image; the slots stage 2 must visit go to a
 *      fix-up record, an INTERN slot with its string number (its high 32
 *      bits);
 *   4. check those slots' targets, and hash the strings stage 2 will
 *      intern (those whose number the process has not met yet).
 * Runs on the importing thread (loader.c) or ahead on the read-ahead thread
 * (prefetch.c); touches no Python object outside the chunk.
 */
#include "archive.h"
#include "layout.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The checks of pycds_read_full on pycds_pread_all's or pycds_pread2_all's
 * answer rc. */
static int
read_result(int rc)
{
    if (rc < 0) {
        return pycds_fail(PYCDS_E_IO, "read of archive failed: %s", strerror(errno));
    }
    if (rc > 0) {
        return pycds_fail(PYCDS_E_IO, "archive is shorter than its index says");
    }
    return PYCDS_OK;
}

int
pycds_read_full(int fd, void *buf, size_t n, uint64_t off)
{
    return read_result(pycds_pread_all(fd, buf, n, off));
}

/* Stage 1, after the checksum: apply the relocations, bounds-checking each,
 * and list the slots stage 2 must visit (INTERN and SINGLETON ones in
 * f->fix[0, nstr) with their string numbers in f->num, then FROZENSET ones,
 * each in table order) so that it does not walk every entry again.
 * count_fixups sizes the list; apply_relocations writes it. */
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

/* nstrings bounds the string numbers. */
static int
apply_relocations(const pycds_place *p, const uint32_t *rel, uint64_t nstrings,
                  pycds_fixups *f)
{
    uintptr_t anchor = pycds_image_anchor();
    uintptr_t hot_lo, hot_hi;
    pycds_image_hot(&hot_lo, &hot_hi);
    /* An external target whose object lies in the hot segment: v - hot_lo
     * at most this (unsigned: below hot_lo wraps above it). */
    uintptr_t hot_room = hot_hi - hot_lo >= sizeof(PyObject)
                         ? hot_hi - hot_lo - sizeof(PyObject) : 0;
    uint64_t len = p->len, n = f->nrel;
    uint64_t si = 0, fi = f->nstr;
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
        case PYCDS_RELOC_INTERN:
            if (v >> 32 >= nstrings) {
                return pycds_fail(PYCDS_E_CORRUPT, "string number %llu out of range",
                                  (unsigned long long)(v >> 32));
            }
            f->num[si] = (uint32_t)(v >> 32);
            f->fix[si++] = e;
            v &= UINT32_MAX;
            goto object;
        case PYCDS_RELOC_SINGLETON:
            f->num[si] = 0;
            f->fix[si++] = e;
            goto object;
        case PYCDS_RELOC_FROZENSET:
            f->fix[fi++] = e;
            goto object;
        case PYCDS_RELOC_INTERNAL:
        object:
            /* len >= sizeof(PyObject): the chunk table guarantees it.  An
             * object header lies wholly in the head or in the tail (they
             * are apart in memory). */
            if (v % 8 != 0 || v > len - sizeof(PyObject)
                || (v < p->root_off && p->root_off - v < sizeof(PyObject))) {
                return pycds_fail(PYCDS_E_CORRUPT,
                                  "relocation target %llu outside chunk",
                                  (unsigned long long)v);
            }
            /* The writer's tail (release.c) is reached from before it only
             * through INTERN slots; a chunk that says otherwise keeps it. */
            f->tail_shared |= kind == PYCDS_RELOC_INTERNAL && slot < p->root_off
                              && v >= p->root_off;
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
            if (v % _Alignof(PyObject) != 0
                || ((uintptr_t)v - hot_lo > hot_room
                    && !pycds_image_contains((const void *)(uintptr_t)v,
                                             sizeof(PyObject)))) {
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

/* Stage 1, once every slot is relocated: check the targets of the listed
 * slots' types (plain pointer comparisons: no GIL needed), and compute the
 * hash of each string stage 2 will look up in the interned dict (as
 * unicode_hash() would on first use), so that stage 2 spends its time in
 * the dict only.  A string whose number the process has met is not looked
 * up (loader.c), nor are its code units read: neither hashed nor measured. */
static int
check_fixups(pycds_archive *a, const pycds_place *p, pycds_fixups *f)
{
    for (uint64_t i = 0; i < f->nstr + f->nset; i++) {
        uint32_t e = f->fix[i];
        int kind = (int)(e & 7u);
        PyObject *target = *(PyObject **)pycds_place_at(p, e & ~(uint32_t)7u);
        PyTypeObject *t = Py_TYPE(target);
        if (kind == PYCDS_RELOC_INTERN) {
            if (t != &PyUnicode_Type) {
                return pycds_fail(PYCDS_E_CORRUPT, "INTERN slot is not a str");
            }
            f->nintern++;
            /* (hash: -1 as written, set here by an earlier slot.) */
            if (pycds_strtab_met(a, f->num[i])
                || ((PyASCIIObject *)target)->hash != -1) {
                continue;
            }
            /* The string must fit in its part before its code units are
             * hashed. */
            if (pycds_object_size(target, pycds_place_room(p, target)) == 0) {
                return pycds_fail(PYCDS_E_CORRUPT, "INTERN slot is not a str");
            }
            pycds_layout_str_prehash(target);
        }
        else if (kind == PYCDS_RELOC_SINGLETON) {
            if (!pycds_image_contains(t, sizeof(PyTypeObject))) {
                return pycds_fail(PYCDS_E_CORRUPT, "slot target has no static type");
            }
        }
        else if (t != &PyTuple_Type) {
            return pycds_fail(PYCDS_E_CORRUPT, "FROZENSET slot is not a tuple");
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
    /* (Head and tail lie together in the file, apart in the heap.) */
    int rc = read_result(pycds_pread2_all(a->fd, p.head, c->root_off, p.tail,
                                          c->chunk_len - c->root_off, at));
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
        rc = apply_relocations(&p, rel, a->reloc_count, f);
    }
    if (rc == PYCDS_OK) {
        rc = check_fixups(a, &p, f);
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

