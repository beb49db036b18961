/* writer.c -- deep copy of code objects into an archive heap (the dump side).
 *
 * Each module becomes one chunk: its code object and every object reachable
 * from it, laid out back to back (8-byte aligned) exactly as the running
 * CPython lays them out, with the per-process parts reset (layout.c).  Every
 * pointer slot written into the heap gets a relocation entry:
 *   - to an object copied into the same chunk: INTERNAL (value = chunk offset),
 *     or INTERN for strings the interpreter had interned, or SINGLETON for
 *     values of which the interpreter shares one heap instance (layout.c
 *     says which: 3.10's small ints, 1-char strs, empty singletons);
 *   - to a static object of the interpreter image: EXTERNAL (value = offset
 *     from the image anchor);
 *   - to a frozenset: FROZENSET; the heap holds a tuple of its items and the
 *     load pass builds a fresh frozenset (its table depends on str hashes,
 *     which PYTHONHASHSEED changes per process).
 * Objects shared within one module are copied once (a memo by address).
 * Chunks never point into each other, so each loads on its own.
 *
 * The caller holds the objects alive; the writer holds the GIL while it
 * walks them.  Structure after marshal.c's WFILE / w_object.
 */
#include "pycds_internal.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_LIMIT ((uint64_t)1 << 32)   /* relocation entries are 32-bit */

typedef struct {
    PyObject *key;
    uint64_t off;
} memo_slot;

struct pycds_writer {
    uint8_t *heap;
    size_t len, cap;
    uint32_t *relocs;
    size_t nrelocs, rcap;
    uint64_t seed;
    uint64_t chunk_start;     /* heap offset of the chunk being written */
    uint64_t nobjects;
    memo_slot *memo;          /* open addressing, capacity a power of 2 */
    size_t memo_used, memo_cap;
    PyObject *keepalive;      /* proxies whose addresses must not be reused */
};

/* ---- buffers ---------------------------------------------------------- */

static int
grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) {
        return PYCDS_OK;
    }
    size_t ncap = *cap ? *cap : 4096;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem) {
            return pycds_fail(PYCDS_E_NOMEM, "heap buffer too large");
        }
        ncap *= 2;
    }
    void *p = realloc(*buf, ncap * elem);
    if (p == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot grow buffer to %zu bytes",
                          ncap * elem);
    }
    *buf = p;
    *cap = ncap;
    return PYCDS_OK;
}

int
pycds_w_alloc(pycds_writer *w, size_t size, uint64_t *off)
{
    size_t start = (w->len + 7u) & ~(size_t)7u;
    size_t end = start + ((size + 7u) & ~(size_t)7u);
    if (end < start || end - w->chunk_start >= CHUNK_LIMIT) {
        return pycds_fail(PYCDS_E_TOOBIG, "module chunk exceeds 4 GiB");
    }
    int rc = grow((void **)&w->heap, &w->cap, end, 1);
    if (rc) {
        return rc;
    }
    memset(w->heap + w->len, 0, end - w->len);
    w->len = end;
    *off = start;
    w->nobjects++;
    return PYCDS_OK;
}

void *
pycds_w_at(pycds_writer *w, uint64_t off)
{
    return w->heap + off;
}

static int
add_reloc(pycds_writer *w, uint64_t slot_off, int kind)
{
    uint64_t rel = slot_off - w->chunk_start;
    if (rel & 7u) {
        return pycds_fail(PYCDS_E_ARG, "unaligned pointer slot at %llu",
                          (unsigned long long)rel);
    }
    int rc = grow((void **)&w->relocs, &w->rcap, w->nrelocs + 1,
                  sizeof(uint32_t));
    if (rc) {
        return rc;
    }
    w->relocs[w->nrelocs++] = (uint32_t)rel | (uint32_t)kind;
    return PYCDS_OK;
}

static void
store_slot(pycds_writer *w, uint64_t slot_off, uint64_t value)
{
    memcpy(w->heap + slot_off, &value, sizeof(value));
}

/* ---- memo ------------------------------------------------------------- */

static size_t
memo_hash(PyObject *key, size_t mask)
{
    uintptr_t k = (uintptr_t)key >> 3;
    k *= (uintptr_t)0x9E3779B97F4A7C15ULL;
    return (size_t)(k >> 16) & mask;
}

static int
memo_get(pycds_writer *w, PyObject *key, uint64_t *off)
{
    if (w->memo_cap == 0) {
        return 0;
    }
    size_t mask = w->memo_cap - 1;
    for (size_t i = memo_hash(key, mask);; i = (i + 1) & mask) {
        if (w->memo[i].key == NULL) {
            return 0;
        }
        if (w->memo[i].key == key) {
            *off = w->memo[i].off;
            return 1;
        }
    }
}

static int
memo_put(pycds_writer *w, PyObject *key, uint64_t off)
{
    if ((w->memo_used + 1) * 2 > w->memo_cap) {
        size_t ncap = w->memo_cap ? w->memo_cap * 2 : 1024;
        memo_slot *nm = calloc(ncap, sizeof(memo_slot));
        if (nm == NULL) {
            return pycds_fail(PYCDS_E_NOMEM, "cannot grow the copy memo");
        }
        for (size_t j = 0; j < w->memo_cap; j++) {
            if (w->memo[j].key != NULL) {
                size_t i = memo_hash(w->memo[j].key, ncap - 1);
                while (nm[i].key != NULL) {
                    i = (i + 1) & (ncap - 1);
                }
                nm[i] = w->memo[j];
            }
        }
        free(w->memo);
        w->memo = nm;
        w->memo_cap = ncap;
    }
    size_t mask = w->memo_cap - 1;
    size_t i = memo_hash(key, mask);
    while (w->memo[i].key != NULL) {
        i = (i + 1) & mask;
    }
    w->memo[i].key = key;
    w->memo[i].off = off;
    w->memo_used++;
    return PYCDS_OK;
}

static void
memo_clear(pycds_writer *w)
{
    if (w->memo) {
        memset(w->memo, 0, w->memo_cap * sizeof(memo_slot));
    }
    w->memo_used = 0;
}

/* ---- the copy --------------------------------------------------------- */

/* Copy op into the chunk once; *off is its heap offset. */
static int
copy_object(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    if (memo_get(w, op, off)) {
        return PYCDS_OK;
    }
    if (depth > PYCDS_MAX_DEPTH) {
        return pycds_fail(PYCDS_E_TOODEEP, "constants nested deeper than %d",
                          PYCDS_MAX_DEPTH);
    }
    int rc;
    if (PyFrozenSet_CheckExact(op)) {
        /* The heap holds a tuple of the items; FROZENSET rebuilds it. */
        PyObject *items = PySequence_Tuple(op);
        if (items == NULL) {
            return pycds_fail_python("frozenset items");
        }
        if (PyList_Append(w->keepalive, items) < 0) {
            Py_DECREF(items);
            return pycds_fail_python("keepalive");
        }
        Py_DECREF(items);
        rc = pycds_layout_copy(w, items, depth, off);
    }
    else {
        rc = pycds_layout_copy(w, op, depth, off);
    }
    if (rc) {
        return rc;
    }
    return memo_put(w, op, *off);
}

int
pycds_w_slot(pycds_writer *w, uint64_t slot_off, PyObject *child, int depth)
{
    if (child == NULL) {
        store_slot(w, slot_off, 0);
        return PYCDS_OK;
    }
    if (pycds_image_contains(child, sizeof(PyObject))) {
        int64_t delta = (int64_t)((uintptr_t)child - pycds_image_anchor());
        store_slot(w, slot_off, (uint64_t)delta);
        return add_reloc(w, slot_off, PYCDS_RELOC_EXTERNAL);
    }
    uint64_t off;
    int rc = copy_object(w, child, depth + 1, &off);
    if (rc) {
        return rc;
    }
    int kind = PYCDS_RELOC_INTERNAL;
    if (PyFrozenSet_CheckExact(child)) {
        kind = PYCDS_RELOC_FROZENSET;
    }
    else if (PyUnicode_CheckExact(child) && pycds_layout_str_interned(child)) {
        kind = PYCDS_RELOC_INTERN;
    }
    else if (pycds_layout_heap_singleton(child)) {
        kind = PYCDS_RELOC_SINGLETON;
    }
    store_slot(w, slot_off, off - w->chunk_start);
    return add_reloc(w, slot_off, kind);
}

int
pycds_w_raw(pycds_writer *w, uint64_t slot_off, const void *data, size_t size)
{
    size_t padded = size < sizeof(PyObject) ? sizeof(PyObject) : size;
    uint64_t off;
    int rc = pycds_w_alloc(w, padded, &off);
    if (rc) {
        return rc;
    }
    w->nobjects--;            /* data, not an object */
    memcpy(w->heap + off, data, size);
    store_slot(w, slot_off, off - w->chunk_start);
    return add_reloc(w, slot_off, PYCDS_RELOC_INTERNAL);
}

/* ---- exported --------------------------------------------------------- */

int
pycds_writer_new(uint64_t seed, pycds_writer **out)
{
    if (out == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no out pointer");
    }
    *out = NULL;
    pycds_writer *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate a writer");
    }
    w->seed = seed;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = pycds_image_init();
    if (rc == PYCDS_OK) {
        w->keepalive = PyList_New(0);
        if (w->keepalive == NULL) {
            rc = pycds_fail_python("writer keepalive list");
        }
    }
    PyGILState_Release(g);
    if (rc) {
        free(w);
        return rc;
    }
    *out = w;
    return PYCDS_OK;
}

int
pycds_writer_add(pycds_writer *w, uintptr_t code, pycds_chunk_info *info)
{
    if (w == NULL || info == NULL || code == 0) {
        return pycds_fail(PYCDS_E_ARG, "bad writer arguments");
    }
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *co = (PyObject *)code;
    int rc = PYCDS_OK;
    size_t saved_len = w->len, saved_nrelocs = w->nrelocs;
    uint64_t saved_nobjects = w->nobjects;

    if (!PyCode_Check(co)) {
        rc = pycds_fail(PYCDS_E_ARG, "root object is a %.100s, not code",
                        Py_TYPE(co)->tp_name);
        goto done;
    }
    w->len = (w->len + 7u) & ~(size_t)7u;
    w->chunk_start = w->len;
    memo_clear(w);
    uint64_t root;
    rc = copy_object(w, co, 0, &root);
    if (rc) {
        goto done;
    }
    info->chunk_off = w->chunk_start;
    info->chunk_len = w->len - w->chunk_start;
    info->root_off = root - w->chunk_start;
    info->reloc_first = saved_nrelocs;
    info->reloc_count = w->nrelocs - saved_nrelocs;
    info->nobjects = w->nobjects - saved_nobjects;
    uint64_t h = pycds_hash64(w->heap + w->chunk_start, info->chunk_len, w->seed);
    info->checksum = pycds_hash64(w->relocs + saved_nrelocs,
                                  info->reloc_count * sizeof(uint32_t), h);
done:
    if (rc) {
        /* Drop the partial chunk: the archive keeps only whole modules. */
        w->len = saved_len;
        w->nrelocs = saved_nrelocs;
        w->nobjects = saved_nobjects;
    }
    memo_clear(w);
    if (PyList_SetSlice(w->keepalive, 0, PyList_GET_SIZE(w->keepalive), NULL) < 0) {
        PyErr_Clear();
    }
    PyGILState_Release(g);
    return rc;
}

int
pycds_writer_heap(pycds_writer *w, const uint8_t **data, size_t *len)
{
    if (w == NULL || data == NULL || len == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad writer arguments");
    }
    *data = w->heap;
    *len = w->len;
    return PYCDS_OK;
}

int
pycds_writer_relocs(pycds_writer *w, const uint32_t **data, size_t *count)
{
    if (w == NULL || data == NULL || count == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad writer arguments");
    }
    *data = w->relocs;
    *count = w->nrelocs;
    return PYCDS_OK;
}

void
pycds_writer_free(pycds_writer *w)
{
    if (w == NULL) {
        return;
    }
    if (w->keepalive != NULL) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_CLEAR(w->keepalive);
        PyGILState_Release(g);
    }
    free(w->heap);
    free(w->relocs);
    free(w->memo);
    free(w);
}
