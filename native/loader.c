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
 *   4. re-intern the strings the dump run had interned, and swap SINGLETON
 *      copies for the interpreter's shared instances (layout hooks);
 *   5. build the frozensets from their item tuples (innermost first: entries
 *      are in the order the writer emitted them);
 *   6. check the root is a code object, let the layout do the per-process
 *      work unmarshal does for each code object (pycds_layout_after_load:
 *      3.12+ code versions and code watchers), and hand it out.
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
    uint64_t (*spans)[2];     /* heap ranges [start, end) read so far */
    size_t nspans, spancap;
    PyObject **roots;         /* per module: its code object once loaded */
    int verify;               /* run verify_chunk() on every load */
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
    free(a->spans);
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
        case PYCDS_RELOC_SINGLETON:
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
    size_t i = (size_t)(((uintptr_t)from >> 3) * (uintptr_t)0x9E3779B97F4A7C15ULL >> 20) & mask;
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

static int
fixup_objects(uint8_t *chunk, const uint32_t *rel, uint64_t n)
{
    size_t ninterned = 0;
    for (uint64_t i = 0; i < n; i++) {
        ninterned += (rel[i] & 7u) == PYCDS_RELOC_INTERN;
    }
    size_t cap = 16;
    while (cap < 2 * ninterned) {
        cap *= 2;
    }
    /* Without memory for the memo, intern slot by slot: same result. */
    intern_memo *memo = ninterned > 1 ? calloc(cap, sizeof(intern_memo)) : NULL;
    int rc = PYCDS_OK;
    /* Strings and shared instances first: a frozenset must be built from
     * the very objects a fresh unmarshal would give it. */
    for (uint64_t i = 0; rc == PYCDS_OK && i < n; i++) {
        int kind = (int)(rel[i] & 7u);
        if (kind == PYCDS_RELOC_INTERN || kind == PYCDS_RELOC_SINGLETON) {
            PyObject **slot = (PyObject **)(chunk + (rel[i] & ~(uint32_t)7u));
            if (!pycds_image_contains(Py_TYPE(*slot), sizeof(PyTypeObject))) {
                rc = pycds_fail(PYCDS_E_CORRUPT, "slot target has no static type");
                break;
            }
            if (kind == PYCDS_RELOC_SINGLETON) {
                rc = pycds_layout_use_singleton(slot);
            }
            else if (!PyUnicode_CheckExact(*slot)) {
                rc = pycds_fail(PYCDS_E_CORRUPT, "INTERN slot is not a str");
            }
            else {
                rc = intern_cached(memo, cap - 1, slot);
            }
        }
    }
    free(memo);
    if (rc) {
        return rc;
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

/* ---- structural check ---------------------------------------------------
 *
 * The checksum proves the chunk is the one the dump wrote; this pass proves
 * that what CPython will touch is well formed even if it is not (a re-signed
 * or hostile archive): as marshal.c's r_object only ever builds well-formed
 * objects, every object reachable from the root (and from each INTERN,
 * FROZENSET and SINGLETON slot) must
 *   - have an allowed exact type, and lie wholly inside the chunk (its size
 *     computed from its own header: tuple/bytes/code ob_size, str length and
 *     kind, int digits), with a zeroed (untracked) GC header for tuples;
 *   - have each pointer field (tuple items, the code fields the layout lists)
 *     be a slot that a relocation entry fixed up, pointing at an object of
 *     an allowed type (the exact type the code field needs).
 * External targets (static objects of the image) must have an allowed type.
 * Runs after apply_relocations(), before any object is used.  What it does
 * not check is what CPython does not check in a .pyc either: the bytecode and
 * the code object's scalar fields (see docs/reliability.md).
 */

enum { SLOT_NONE = 0 };   /* else kind + 1 */

#if PY_VERSION_HEX >= 0x030C0000
#  define PYCDS_LONG_DIGITS long_value.ob_digit
#else
#  define PYCDS_LONG_DIGITS ob_digit
#endif

typedef struct {
    uint8_t *chunk;
    uint64_t len;
    uint8_t *slot_kind;       /* per 8-byte word: SLOT_NONE or kind + 1 */
    uint8_t *seen;            /* per 8-byte word: object visited */
    PyObject **stack;
    size_t depth, cap;
} verifier;

static int
is_value_type(PyTypeObject *t)
{
    return t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyLong_Type
           || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyTuple_Type
           || t == &PyCode_Type || t == &PyBool_Type || t == &PyFrozenSet_Type
           || t == Py_TYPE(Py_None) || t == Py_TYPE(Py_Ellipsis);
}

static int
inside(const verifier *v, const void *p)
{
    return (const uint8_t *)p >= v->chunk && (const uint8_t *)p < v->chunk + v->len;
}

/* Size in bytes of the chunk object op, or 0 if its header is not that of
 * a well-formed object of its type fitting in avail bytes. */
static size_t
object_size(PyObject *op, uint64_t avail)
{
    PyTypeObject *t = Py_TYPE(op);
    uint64_t size = 0;
    if (t == &PyFloat_Type) {
        size = sizeof(PyFloatObject);
    }
    else if (t == &PyComplex_Type) {
        size = sizeof(PyComplexObject);
    }
    else if (avail < sizeof(PyVarObject)) {
        return 0;
    }
    else if (t == &PyTuple_Type || t == &PyBytes_Type || t == &PyCode_Type) {
        Py_ssize_t n = t->tp_itemsize ? Py_SIZE(op) : 0;
        if (n < 0 || (uint64_t)n > avail) {
            return 0;
        }
        size = (uint64_t)t->tp_basicsize + (uint64_t)n * (uint64_t)t->tp_itemsize;
        if (t == &PyBytes_Type && size <= avail
            && ((PyBytesObject *)op)->ob_sval[n] != '\0') {
            return 0;
        }
    }
    else if (t == &PyLong_Type) {
#if PY_VERSION_HEX >= 0x030C0000
        uint64_t n = (uint64_t)(((PyLongObject *)op)->long_value.lv_tag >> 3);
#else
        Py_ssize_t s = Py_SIZE(op);
        uint64_t n = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
#endif
        if (n > avail) {
            return 0;
        }
        size = offsetof(PyLongObject, PYCDS_LONG_DIGITS) + sizeof(digit) * (n ? n : 1);
    }
    else if (t == &PyUnicode_Type) {
        if (avail < sizeof(PyASCIIObject)
            || (avail < sizeof(PyCompactUnicodeObject)
                && !PyUnicode_IS_COMPACT_ASCII(op))) {
            return 0;
        }
        if (!PyUnicode_IS_COMPACT(op)) {
            return 0;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (!PyUnicode_IS_READY(op)) {
            return 0;
        }
#endif
        Py_ssize_t n = PyUnicode_GET_LENGTH(op);
        unsigned int kind = PyUnicode_KIND(op);
        if (n < 0 || (uint64_t)n > avail
            || !(kind == 1 || kind == 2 || kind == 4)
            || (PyUnicode_IS_ASCII(op) && kind != 1)) {
            return 0;
        }
        size = (PyUnicode_IS_ASCII(op) ? sizeof(PyASCIIObject)
                                       : sizeof(PyCompactUnicodeObject))
               + ((uint64_t)n + 1) * kind;
    }
    return size <= avail ? (size_t)size : 0;
}

/* Check the object at p (a slot's target, already relocated); push it if
 * it is in the chunk and new.  want: the exact type needed, or NULL. */
static int
check_target(verifier *v, PyObject *p, PyTypeObject *want)
{
    if (!inside(v, p)) {
        /* apply_relocations() put it inside the interpreter image. */
        if (!pycds_image_contains(p, sizeof(PyObject))
            || !is_value_type(Py_TYPE(p))
            || (want != NULL && Py_TYPE(p) != want)) {
            return pycds_fail(PYCDS_E_CORRUPT,
                              "external reference to something not a constant");
        }
        return PYCDS_OK;
    }
    uint64_t off = (uint64_t)((uint8_t *)p - v->chunk);
    if (off % 8 != 0 || off + sizeof(PyObject) > v->len) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu is misplaced",
                          (unsigned long long)off);
    }
    PyTypeObject *t = Py_TYPE(p);
    if (want != NULL && t != want) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu has a wrong type",
                          (unsigned long long)off);
    }
    if (v->seen[off / 8]) {
        return PYCDS_OK;      /* checked when first reached */
    }
    /* The types a chunk holds (layout.c copies no others). */
    if (!(t == &PyUnicode_Type || t == &PyTuple_Type || t == &PyBytes_Type
          || t == &PyCode_Type || t == &PyLong_Type || t == &PyFloat_Type
          || t == &PyComplex_Type)) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu has a wrong type",
                          (unsigned long long)off);
    }
    size_t size = object_size(p, v->len - off);
    if (size == 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu is malformed or "
                          "does not fit in its chunk", (unsigned long long)off);
    }
    if (t == &PyTuple_Type) {
        /* GC header before the object: in the chunk and untracked. */
        uint64_t gc = 2 * sizeof(uintptr_t);
        uint64_t zero[2] = {0, 0};
        if (off < gc || memcmp(v->chunk + off - gc, zero, gc) != 0) {
            return pycds_fail(PYCDS_E_CORRUPT, "tuple at %llu has a bad GC header",
                              (unsigned long long)off);
        }
    }
    if (t == &PyUnicode_Type) {
        int rc = pycds_layout_check_object(p);
        if (rc) {
            return rc;
        }
    }
    v->seen[off / 8] = 1;
    if (t == &PyTuple_Type || t == &PyCode_Type) {
        if (v->depth == v->cap) {
            size_t ncap = v->cap ? 2 * v->cap : 256;
            PyObject **s = realloc(v->stack, ncap * sizeof(*s));
            if (s == NULL) {
                return pycds_fail(PYCDS_E_NOMEM, "cannot grow the check stack");
            }
            v->stack = s;
            v->cap = ncap;
        }
        v->stack[v->depth++] = p;
    }
    return PYCDS_OK;
}

/* The pointer field at field (inside the chunk): must be a relocated slot
 * (not FROZENSET unless any type is allowed), then its target checked. */
static int
check_field(verifier *v, PyObject **field, PyTypeObject *want)
{
    uint64_t off = (uint64_t)((uint8_t *)field - v->chunk);
    uint8_t k = v->slot_kind[off / 8];
    if (off % 8 != 0 || k == SLOT_NONE
        || (want != NULL && k == PYCDS_RELOC_FROZENSET + 1)) {
        return pycds_fail(PYCDS_E_CORRUPT, "pointer at %llu was not relocated",
                          (unsigned long long)off);
    }
    return check_target(v, *field, want);
}

/* Every item of tuple t (checked already) must be of exact type want. */
static int
check_items(verifier *v, PyObject *t, PyTypeObject *want)
{
    for (Py_ssize_t i = 0; i < Py_SIZE(t); i++) {
        PyObject **item = &((PyTupleObject *)t)->ob_item[i];
        int rc = inside(v, t) ? check_field(v, item, want)
                              : (Py_TYPE(*item) == want ? PYCDS_OK
                                 : pycds_fail(PYCDS_E_CORRUPT, "bad static tuple"));
        if (rc) {
            return rc;
        }
    }
    return PYCDS_OK;
}

static int
verify_chunk(uint8_t *chunk, uint64_t len, const uint32_t *rel, uint64_t n,
             uint64_t root_off)
{
    uint8_t *maps = calloc(2 * (len / 8 + 1), 1);
    verifier v = {chunk, len, maps, maps ? maps + len / 8 + 1 : NULL,
                  NULL, 0, 0};
    int rc = PYCDS_OK;
    if (maps == NULL) {
        rc = pycds_fail(PYCDS_E_NOMEM, "cannot allocate the check maps");
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w = (rel[i] & ~(uint32_t)7u) / 8;
        if (v.slot_kind[w] != SLOT_NONE) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "two relocations of one slot");
            goto done;
        }
        v.slot_kind[w] = (uint8_t)((rel[i] & 7u) + 1);
    }
    rc = check_target(&v, (PyObject *)(chunk + root_off), &PyCode_Type);
    for (uint64_t i = 0; rc == PYCDS_OK && i < n; i++) {
        int kind = (int)(rel[i] & 7u);
        PyObject **slot = (PyObject **)(chunk + (rel[i] & ~(uint32_t)7u));
        if (kind == PYCDS_RELOC_INTERN) {
            rc = check_target(&v, *slot, &PyUnicode_Type);
        }
        else if (kind == PYCDS_RELOC_FROZENSET) {
            rc = check_target(&v, *slot, &PyTuple_Type);
        }
        else if (kind == PYCDS_RELOC_SINGLETON) {
            rc = check_target(&v, *slot, NULL);
        }
    }
    const pycds_code_field *fields;
    size_t nfields = pycds_layout_code_fields(&fields);
    while (rc == PYCDS_OK && v.depth > 0) {
        PyObject *op = v.stack[--v.depth];
        if (Py_TYPE(op) == &PyTuple_Type) {
            for (Py_ssize_t i = 0; rc == PYCDS_OK && i < Py_SIZE(op); i++) {
                rc = check_field(&v, &((PyTupleObject *)op)->ob_item[i], NULL);
            }
        }
        else {
            for (size_t i = 0; rc == PYCDS_OK && i < nfields; i++) {
                PyObject **f = (PyObject **)((uint8_t *)op + fields[i].offset);
                rc = check_field(&v, f, fields[i].type);
                if (rc == PYCDS_OK && fields[i].item_type != NULL) {
                    rc = check_items(&v, *f, fields[i].item_type);
                }
            }
            if (rc == PYCDS_OK) {
                rc = pycds_layout_check_object(op);
            }
        }
    }
done:
    free(maps);
    free(v.stack);
    return rc;
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
    /* A chunk is read over its place in the reservation: one overlapping a
     * chunk read before (index entries of a damaged archive) would
     * overwrite live objects of another module.  Refuse it first. */
    for (size_t i = 0; i < a->nspans; i++) {
        if (c->chunk_off < a->spans[i][1] && a->spans[i][0] < end) {
            return pycds_fail(PYCDS_E_CORRUPT,
                              "module chunk overlaps another module's");
        }
    }
    if (a->nspans == a->spancap) {
        size_t ncap = a->spancap ? 2 * a->spancap : 64;
        void *p = realloc(a->spans, ncap * sizeof(*a->spans));
        if (p == NULL) {
            return pycds_fail(PYCDS_E_NOMEM, "cannot grow the chunk table");
        }
        a->spans = p;
        a->spancap = ncap;
    }
    a->spans[a->nspans][0] = c->chunk_off;
    a->spans[a->nspans][1] = end;
    a->nspans++;
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
    if (rc == PYCDS_OK && a->verify) {
        rc = verify_chunk(chunk, c->chunk_len, rel, c->reloc_count, c->root_off);
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
    rc = pycds_layout_after_load(co);
    if (rc) {
        return rc;
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
pycds_archive_set_verify(pycds_archive *a, int on)
{
    if (a == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no archive");
    }
    a->verify = on != 0;
    return PYCDS_OK;
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
    free(a->spans);
    free(a);
    return PYCDS_OK;
}
