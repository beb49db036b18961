/* loader.c -- reserves an archive's heap and brings one module's chunk to life.
 *
 * pycds_archive_open() checks that the archive was made by this very
 * interpreter build and reserves address space for the heap: an anonymous
 * MAP_PRIVATE | MAP_NORESERVE mapping, so nothing is read or allocated yet.
 * pycds_archive_load() handles one module, once:
 *
 *   1. pread() the chunk into its place in the reservation and its relocation
 *      entries into a buffer.  The bytes that are checked are the bytes that
 *      are used, and they are this process's own: a concurrent overwrite or
 *      truncation of the file can make a later load fail, never tear one or
 *      fault code already loaded.  (A file mapping cannot promise that: on
 *      truncate, Linux unmaps even the private copy-on-write pages of a
 *      MAP_PRIVATE mapping -- truncate_pagecache() calls unmap_mapping_range()
 *      with even_cows=1 -- so `cp new.img app.img` would turn live code
 *      objects into SIGBUS or zero pages.  See docs/design-notes.md.)
 *   2. verify the XXH64 checksum (seeded with the archive's random id, so a
 *      chunk from another archive never passes);
 *   3. apply the relocations, bounds-checking each: INTERNAL/INTERN/FROZENSET
 *      add the chunk's address, EXTERNAL adds the image anchor's and must
 *      land inside the interpreter image;
 *   4. re-intern the strings the dump run had interned;
 *   5. build the frozensets from their item tuples (innermost first: entries
 *      are in the order the writer emitted them);
 *   6. check the root is a code object and hand it out.
 * A module that fails half way is marked failed and never retried (fix-ups
 * are not idempotent).  All of it runs holding the GIL, which also makes the
 * once-only state safe across threads.
 */
#include "pycds_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

enum { MOD_NEW = 0, MOD_LOADED = 1, MOD_FAILED = 2 };

struct pycds_archive {
    int fd;
    uint8_t *base;            /* mapping of the heap section, or NULL */
    size_t map_len;
    uint64_t heap_off, heap_len;
    uint64_t reloc_off, reloc_count;
    uint32_t nmodules;
    uint64_t seed;
    uint8_t *state;           /* per module: MOD_* */
    PyObject **roots;         /* per module: its code object once loaded */
};

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
pycds_archive_open(int fd, uint64_t heap_off, uint64_t heap_len,
                   uint64_t reloc_off, uint64_t reloc_count,
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
    a->state = calloc(nmodules ? nmodules : 1, 1);
    a->roots = calloc(nmodules ? nmodules : 1, sizeof(PyObject *));
    if (a->state == NULL || a->roots == NULL) {
        rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate module table");
        goto fail;
    }
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (a->fd < 0) {
        rc = pycds_fail(PYCDS_E_IO, "dup of archive fd failed: %s",
                        strerror(errno));
        goto fail;
    }
    if (heap_len > 0) {
        a->map_len = (size_t)heap_len;
        void *m = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            rc = pycds_fail(PYCDS_E_IO, "cannot reserve %zu bytes for the heap: %s",
                            a->map_len, strerror(errno));
            goto fail;
        }
        a->base = (uint8_t *)m;
    }
    a->heap_off = heap_off;
    a->heap_len = heap_len;
    a->reloc_off = reloc_off;
    a->reloc_count = reloc_count;
    a->nmodules = nmodules;
    a->seed = seed;
    *out = a;
    return PYCDS_OK;

fail:
    if (a->fd >= 0) {
        close(a->fd);
    }
    free(a->state);
    free(a->roots);
    free(a);
    return rc;
}

static int
apply_relocations(pycds_archive *a, uint8_t *chunk, uint64_t len,
                  const uint32_t *rel, uint64_t n)
{
    uintptr_t anchor = pycds_image_anchor();
    for (uint64_t i = 0; i < n; i++) {
        uint32_t e = rel[i];
        uint64_t slot = e & ~(uint32_t)7u;
        int kind = (int)(e & 7u);
        if (slot + sizeof(uint64_t) > len) {
            return pycds_fail(PYCDS_E_CORRUPT, "relocation slot %llu outside chunk",
                              (unsigned long long)slot);
        }
        uint64_t v;
        memcpy(&v, chunk + slot, sizeof(v));
        switch (kind) {
        case PYCDS_RELOC_INTERNAL:
        case PYCDS_RELOC_INTERN:
        case PYCDS_RELOC_FROZENSET:
            if (v % 8 != 0 || v + sizeof(PyObject) > len) {
                return pycds_fail(PYCDS_E_CORRUPT,
                                  "relocation target %llu outside chunk",
                                  (unsigned long long)v);
            }
            v += (uint64_t)(uintptr_t)chunk;
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
        memcpy(chunk + slot, &v, sizeof(v));
    }
    (void)a;
    return PYCDS_OK;
}

static int
fixup_objects(uint8_t *chunk, const uint32_t *rel, uint64_t n)
{
    /* Strings first: frozenset items must hash as interned strings do. */
    for (uint64_t i = 0; i < n; i++) {
        if ((rel[i] & 7u) == PYCDS_RELOC_INTERN) {
            PyObject **slot = (PyObject **)(chunk + (rel[i] & ~(uint32_t)7u));
            if (!PyUnicode_CheckExact(*slot)) {
                return pycds_fail(PYCDS_E_CORRUPT, "INTERN slot is not a str");
            }
            int rc = pycds_layout_intern(slot);
            if (rc) {
                return rc;
            }
        }
    }
    for (uint64_t i = 0; i < n; i++) {
        if ((rel[i] & 7u) == PYCDS_RELOC_FROZENSET) {
            PyObject **slot = (PyObject **)(chunk + (rel[i] & ~(uint32_t)7u));
            if (!PyTuple_CheckExact(*slot)) {
                return pycds_fail(PYCDS_E_CORRUPT, "FROZENSET slot is not a tuple");
            }
            /* New reference, owned by the archive for good. */
            PyObject *fs = PyFrozenSet_New(*slot);
            if (fs == NULL) {
                return pycds_fail_python("rebuilding a frozenset");
            }
            *slot = fs;
        }
    }
    return PYCDS_OK;
}

static int
load_chunk(pycds_archive *a, const pycds_chunk_info *c, PyObject **root)
{
    uint64_t end = c->chunk_off + c->chunk_len;
    if (end < c->chunk_off || end > a->heap_len || c->chunk_off % 8 != 0
        || c->root_off % 8 != 0 || c->root_off + sizeof(PyObject) > c->chunk_len
        || c->reloc_first + c->reloc_count < c->reloc_first
        || c->reloc_first + c->reloc_count > a->reloc_count) {
        return pycds_fail(PYCDS_E_CORRUPT, "module index entry out of range");
    }
    uint8_t *chunk = a->base + c->chunk_off;
    int rc = read_full(a->fd, chunk, (size_t)c->chunk_len,
                       a->heap_off + c->chunk_off);
    if (rc) {
        return rc;
    }
    size_t rbytes = (size_t)c->reloc_count * sizeof(uint32_t);
    uint32_t *rel = malloc(rbytes ? rbytes : 1);
    if (rel == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate relocation buffer");
    }
    rc = read_full(a->fd, rel, rbytes,
                   a->reloc_off + c->reloc_first * sizeof(uint32_t));
    if (rc == PYCDS_OK) {
        uint64_t h = pycds_hash64(chunk, (size_t)c->chunk_len, a->seed);
        h = pycds_hash64(rel, rbytes, h);
        if (h != c->checksum) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "module checksum mismatch");
        }
    }
    if (rc == PYCDS_OK) {
        rc = apply_relocations(a, chunk, c->chunk_len, rel, c->reloc_count);
    }
    if (rc == PYCDS_OK) {
        rc = fixup_objects(chunk, rel, c->reloc_count);
    }
    free(rel);
    if (rc) {
        return rc;
    }
    PyObject *co = (PyObject *)(chunk + c->root_off);
    if (!pycds_image_contains(Py_TYPE(co), sizeof(PyTypeObject))
        || !PyCode_Check(co)) {
        return pycds_fail(PYCDS_E_CORRUPT, "module root is not a code object");
    }
    *root = co;
    return PYCDS_OK;
}

int
pycds_archive_load(pycds_archive *a, uint32_t module_no,
                   const pycds_chunk_info *chunk, uintptr_t out_list)
{
    if (a == NULL || chunk == NULL || out_list == 0) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_load arguments");
    }
    if (module_no >= a->nmodules) {
        return pycds_fail(PYCDS_E_ARG, "module number %u out of range", module_no);
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PYCDS_OK;
    PyObject *list = (PyObject *)out_list;
    if (!PyList_Check(list)) {
        rc = pycds_fail(PYCDS_E_ARG, "out_list is not a list");
        goto done;
    }
    switch (a->state[module_no]) {
    case MOD_FAILED:
        rc = pycds_fail(PYCDS_E_STATE, "module %u failed to load before", module_no);
        goto done;
    case MOD_NEW:
        rc = load_chunk(a, chunk, &a->roots[module_no]);
        if (rc) {
            a->state[module_no] = MOD_FAILED;
            goto done;
        }
        a->state[module_no] = MOD_LOADED;
        break;
    default:
        break;
    }
    if (PyList_Append(list, a->roots[module_no]) < 0) {
        rc = pycds_fail_python("handing out the code object");
    }
done:
    PyGILState_Release(g);
    return rc;
}

int
pycds_archive_close(pycds_archive *a)
{
    if (a == NULL) {
        return PYCDS_OK;
    }
    for (uint32_t i = 0; i < a->nmodules; i++) {
        if (a->state[i] == MOD_LOADED) {
            /* Objects from this mapping are alive: keep it for good. */
            return pycds_fail(PYCDS_E_STATE,
                              "archive has loaded modules; it stays mapped");
        }
    }
    if (a->base != NULL) {
        munmap(a->base, a->map_len);
    }
    close(a->fd);
    free(a->state);
    free(a->roots);
    free(a);
    return PYCDS_OK;
}
