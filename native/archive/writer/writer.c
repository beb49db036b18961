/* writer.c -- deep copy of code objects into an archive heap (the dump side).
 *
 * Each module becomes one chunk: its code object and every object reachable
 * from it, laid out back to back (8-byte aligned) exactly as the running
 * CPython lays them out, with the per-process parts reset (layout.c).  Every
 * pointer slot written into the heap gets a relocation entry:
 *   - to an object copied into the same chunk: INTERNAL (value = chunk offset),
 *     or INTERN for strings the interpreter had interned (value = the
 *     string's archive-wide number << 32 | chunk offset), or SINGLETON for
 *     values of which the interpreter shares one heap instance (layout.c
 *     says which: 3.10's small ints, 1-char strs, empty singletons);
 *   - to a static object of the interpreter image: EXTERNAL (value = offset
 *     from the image anchor);
 *   - into an object copied into the same chunk (3.10/3.11: a str's wstr,
 *     which shares its code units): DATA (value = chunk offset);
 *   - to a frozenset: FROZENSET; the heap holds a tuple of its items and the
 *     load pass builds a fresh frozenset (its table depends on str hashes,
 *     which PYTHONHASHSEED changes per process).
 * Objects shared within one module are copied once (a memo by address).
 * Chunks never point into each other, so each loads on its own.  Each
 * distinct interned string gets a number, the same in every chunk that
 * holds a copy (the first is 0, in the order strings are first copied), so
 * that a process interns it once, at the first chunk it loads that holds
 * it, and every later slot of that number takes the result from a table
 * (loader.c) without probing the interpreter's interned dict.
 *
 * Order inside a chunk (what lets the loader give memory back once the
 * module body has run, release.c):
 *   1. the code objects of the module's functions (lambdas, generators,
 *      comprehensions, methods: in the co_consts of the module code or of
 *      its class bodies) with everything they reach, and the module's
 *      docstring (it lives on as __doc__), then the interned strings of all
 *      these that no earlier chunk holds.  Not the functions predicted
 *      dead (when the module code is the one its import ran: no function
 *      of them alive at the dump -- deleted, or replaced as operator.py's
 *      are by _operator's: predicted_dead): they go to part 3 with the
 *      module code, and only the new interned strings they reach come
 *      here (place_names);
 *   2. what the code objects that run once (the module's, its class bodies)
 *      reach that may live on after they ran: constants (str, int, float,
 *      complex: globals, class attributes, default arguments, dict
 *      entries), interned strings no earlier chunk holds (most become the
 *      interpreter's interned strings), and the constant tuples they hand
 *      to something that may keep them (defaults, __slots__, globals:
 *      place_kept_tuples);
 *   3. the module code object (root_off), its class bodies and the rest of
 *      what only they reach -- bytecode, line and exception tables, names
 *      and constant tuples -- then the interned strings an earlier chunk
 *      also holds: at load each INTERN slot gets the interpreter's interned
 *      string, which the earlier module most likely made already, so these
 *      copies are dead.
 * Parts 1 and 2 never point into part 3 except through INTERN slots (part 1
 * is closed: all it reaches is copied with it); part 3 is the module's
 * "tail", from root_off to the end of the chunk (the loader places it apart
 * from the rest, with the other modules' tails: loader.c).  Tail objects
 * get the mortal
 * reference count of the layout's set_refcnt (pycds_w_in_tail), so the
 * loader can tell which of them anything holds.
 *
 * The caller holds the objects alive; the writer holds the GIL while it
 * walks them.  Structure after marshal.c's WFILE / w_object.
 */
#include "layout.h"
#include "opcode.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_LIMIT ((uint64_t)1 << 32)   /* relocation entries are 32-bit */

typedef struct {
    PyObject *key;            /* the object to copy */
    uint64_t slot;            /* heap offset of the slot that refers to it */
    int done;                 /* already copied (flush_pending) */
} pending_slot;

struct pycds_writer {
    uint8_t *heap;
    size_t len, cap;
    uint32_t *relocs;
    size_t nrelocs, rcap;
    uint64_t seed;
    uint64_t chunk_start;     /* heap offset of the chunk being written */
    uint64_t nobjects;
    pycds_table memo;          /* copies of this chunk: object -> heap offset */
    pending_slot *pending;    /* slots whose target is copied at the chunk's end */
    size_t npending, pcap;
    pycds_table seen;          /* interned strs the chunks hold (owned refs)
                                * -> their archive-wide numbers */
    uint32_t nstrings;        /* numbers given so far */
    uint64_t tail_start;      /* heap offset where the chunk's tail starts */
    PyObject *keepalive;      /* proxies whose addresses must not be reused */
    int ran;                  /* the root is the code the import ran */
    PyObject *orders;         /* borrowed, of pycds_writer_add: id -> items */
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

static int
memo_get(pycds_writer *w, PyObject *key, uint64_t *off)
{
    return pycds_table_get(&w->memo, key, off);
}

/* A str interned in the dump process is the one object of its value, so
 * the set of those the chunks hold is by address (and its number is the
 * value's); it holds a reference, so no address is reused. */
static int
seen_has(pycds_writer *w, PyObject *s)
{
    uint64_t unused;
    return pycds_table_get(&w->seen, s, &unused);
}

/* Add s, which the set lacks, under the next number. */
static int
seen_add(pycds_writer *w, PyObject *s)
{
    if (w->nstrings == UINT32_MAX) {
        return pycds_fail(PYCDS_E_TOOBIG, "more than 2^32 - 1 interned strings");
    }
    int rc = pycds_table_put(&w->seen, s, w->nstrings);
    if (rc == PYCDS_OK) {
        w->nstrings++;
        Py_INCREF(s);
    }
    return rc;
}

/* Forget the strings numbered from `first` on (a chunk that failed: its
 * strings are not in the archive, and later chunks must not leave them to
 * their tails as held by an earlier one, nor skip their numbers). */
static void
seen_rollback(pycds_writer *w, uint32_t first)
{
    if (w->nstrings == first) {
        return;
    }
    pycds_table old = w->seen;
    w->seen = (pycds_table){NULL, 0, 0};
    for (size_t i = 0; i < old.cap; i++) {
        PyObject *s = old.slots[i].key;
        /* Out of memory, a string kept is dropped too: a later chunk then
         * copies it anew under a new number, which is as correct. */
        if (s != NULL && (old.slots[i].value >= first
                          || pycds_table_put(&w->seen, s, old.slots[i].value))) {
            Py_DECREF(s);
        }
    }
    free(old.slots);
    w->nstrings = first;
}

/* ---- the copy --------------------------------------------------------- */

/* A new reference to the items of frozenset op in the order unmarshal adds
 * them: the order given for it to pycds_writer_add, else the one layout.c
 * infers from op's reference counts now. */
static PyObject *
frozenset_items(pycds_writer *w, PyObject *op)
{
    if (w->orders != NULL) {
        PyObject *key = PyLong_FromVoidPtr(op);
        if (key == NULL) {
            return NULL;
        }
        PyObject *items = PyDict_GetItemWithError(w->orders, key);
        Py_DECREF(key);
        if (items != NULL && PyTuple_CheckExact(items)
            && PyTuple_GET_SIZE(items) == PySet_GET_SIZE(op)) {
            return Py_NewRef(items);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return pycds_layout_frozenset_items(op);
}

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
        /* The heap holds a tuple of the items, in the order unmarshal
         * adds them; FROZENSET rebuilds it. */
        PyObject *items = frozenset_items(w, op);
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
    return pycds_table_put(&w->memo, op, *off);
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
    if (PyUnicode_CheckExact(child) && pycds_layout_str_interned(child)) {
        /* Placed by flush_pending (see the top of this file); the slot is
         * written then. */
        int rc = grow((void **)&w->pending, &w->pcap, w->npending + 1,
                      sizeof(pending_slot));
        if (rc) {
            return rc;
        }
        w->pending[w->npending].key = child;
        w->pending[w->npending].slot = slot_off;
        w->pending[w->npending].done = 0;
        w->npending++;
        return add_reloc(w, slot_off, PYCDS_RELOC_INTERN);
    }
    int rc = copy_object(w, child, depth + 1, &off);
    if (rc) {
        return rc;
    }
    int kind = PYCDS_RELOC_INTERNAL;
    if (PyFrozenSet_CheckExact(child)) {
        kind = PYCDS_RELOC_FROZENSET;
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

int
pycds_w_inner(pycds_writer *w, uint64_t slot_off, uint64_t target_off)
{
    store_slot(w, slot_off, target_off - w->chunk_start);
    return add_reloc(w, slot_off, PYCDS_RELOC_DATA);
}

int
pycds_w_in_tail(pycds_writer *w, uint64_t off)
{
    return off >= w->tail_start;
}

/* A code object that runs once, when the module body runs: the module's
 * own, and a class body (not CO_OPTIMIZED, unlike functions, lambdas,
 * generators and comprehensions). */
static int
runs_once(PyObject *op)
{
    return PyCode_Check(op) && !(((PyCodeObject *)op)->co_flags & CO_OPTIMIZED);
}

/* Whether no function of code object op is predicted to outlive the import
 * (a function the module body deleted, or replaced -- operator.py's by
 * _operator's).  Only when the root is the code object the import ran: op
 * is predicted dead if nothing but the co_consts tuple that holds it does
 * (every live function, generator and frame of it would hold a reference;
 * the writer itself takes none on what it copies).  A wrong guess costs a
 * page that is not given back, never an object (release.c). */
static int
predicted_dead(pycds_writer *w, PyObject *op)
{
    return w->ran && Py_REFCNT(op) == 1;
}

/* Part 1 of a chunk: the function code objects of the module (in root's
 * co_consts, or in those of its class bodies, recursively), with all they
 * reach (nested code objects sit directly in co_consts, never inside a
 * constant tuple: marshal.c and the compiler), and the module's docstring
 * (its first constant, when a str), which lives on as __doc__. */
static int
copy_part1(pycds_writer *w, PyCodeObject *code, int depth)
{
    PyObject *consts = code->co_consts;
    if (consts == NULL || !PyTuple_CheckExact(consts)) {
        return PYCDS_OK;     /* pycds_layout_copy says what is wrong */
    }
    if (depth > PYCDS_MAX_DEPTH) {
        return pycds_fail(PYCDS_E_TOODEEP, "code objects nested deeper than %d",
                          PYCDS_MAX_DEPTH);
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) {
        PyObject *item = PyTuple_GET_ITEM(consts, i);
        int rc = PYCDS_OK;
        uint64_t off;
        if (runs_once(item)) {
            rc = copy_part1(w, (PyCodeObject *)item, depth + 1);
        }
        else if ((PyCode_Check(item) && !predicted_dead(w, item))
                 || (depth == 0 && i == 0 && PyUnicode_CheckExact(item)
                     && !pycds_layout_str_interned(item)
                     && !pycds_image_contains(item, sizeof(PyObject)))) {
            rc = copy_object(w, item, depth + 1, &off);
        }
        if (rc) {
            return rc;
        }
    }
    return PYCDS_OK;
}

/* Copy an interned string into the chunk and note that a chunk holds it
 * (known: seen_has() said so already). */
static int
copy_interned(pycds_writer *w, PyObject *s, int known, uint64_t *off)
{
    int rc = copy_object(w, s, 0, off);
    if (rc == PYCDS_OK && !known) {
        rc = seen_add(w, s);
    }
    return rc;
}

/* Write the pending slots, copying their strings: only those new to the
 * archive (not held by an earlier chunk), or all that are left. */
static int
flush_pending(pycds_writer *w, int only_new)
{
    for (size_t i = 0; i < w->npending; i++) {
        /* By value: a copy may grow w->pending (not a str's, today). */
        pending_slot p = w->pending[i];
        uint64_t off;
        if (p.done) {
            continue;
        }
        if (!memo_get(w, p.key, &off)) {
            int known = seen_has(w, p.key);
            if (only_new && known) {
                continue;
            }
            int rc = copy_interned(w, p.key, known, &off);
            if (rc) {
                return rc;
            }
        }
        uint64_t number;
        if (!pycds_table_get(&w->seen, p.key, &number)) {
            /* Every interned string is copied by copy_interned(). */
            return pycds_fail(PYCDS_E_ARG, "interned string copied without a number");
        }
        store_slot(w, p.slot, number << 32 | (off - w->chunk_start));
        w->pending[i].done = 1;
    }
    return PYCDS_OK;
}

/* Part 2 skips what is copied already, static, or past the work budget. */
static int
placed_or_spent(pycds_writer *w, PyObject *op, long *budget)
{
    uint64_t off;
    return op == NULL || --*budget < 0 || pycds_image_contains(op, sizeof(PyObject))
           || memo_get(w, op, &off);
}

typedef int (*placer)(pycds_writer *w, PyObject *op, int depth, long *budget);

/* Apply place to the items of constant container op: a tuple's (one level
 * deeper), a frozenset's (as the tuple the writer stores it as: one tuple
 * of its items, the same depth).  Anything else has no items. */
static int
place_items(pycds_writer *w, PyObject *op, int depth, long *budget, placer place)
{
    if (PyTuple_CheckExact(op)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(op); i++) {
            int rc = place(w, PyTuple_GET_ITEM(op, i), depth + 1, budget);
            if (rc) {
                return rc;
            }
        }
        return PYCDS_OK;
    }
    if (PyFrozenSet_CheckExact(op)) {
        PyObject *items = frozenset_items(w, op);
        if (items == NULL) {
            return pycds_fail_python("frozenset items");
        }
        int rc = place(w, items, depth, budget);
        Py_DECREF(items);
        return rc;
    }
    return PYCDS_OK;
}

/* Part 2: copy now what the code objects that run once (the module's, its
 * class bodies) reach that may live on after they ran -- their constants
 * (str, int, float, complex, and the items of constant tuples and
 * frozensets: globals, class attributes and docstrings, default
 * arguments, dict entries) and the interned strings new to the archive
 * (most become the interpreter's interned strings) -- so that what follows,
 * part 3, is mostly dead by then.  Containers and bytes are left to the copy
 * of the code objects (part 3); depth is bounded, and so is the work (a
 * constant tuple may hold the same tuple many times). */
static int
place_early(pycds_writer *w, PyObject *op, int depth, long *budget)
{
    uint64_t off;
    if (placed_or_spent(w, op, budget)) {
        return PYCDS_OK;
    }
    if (PyUnicode_CheckExact(op)) {
        if (!pycds_layout_str_interned(op)) {
            return copy_object(w, op, depth, &off);
        }
        if (seen_has(w, op)) {
            return PYCDS_OK;      /* its copy will be dead: part 3 */
        }
        return copy_interned(w, op, 0, &off);
    }
    if (PyLong_CheckExact(op) || PyFloat_CheckExact(op) || PyComplex_CheckExact(op)) {
        return copy_object(w, op, depth, &off);
    }
    if (depth >= 3) {
        return PYCDS_OK;
    }
    return place_items(w, op, depth, budget, place_early);
}

/* Whether an instruction with opcode op, right after the LOAD_CONST of a
 * tuple, is done with the tuple once it ran (opcode.h of this version):
 * an import's from-list, `in`, iteration, the items of a list or set
 * display, the keys of a dict display, a call's keyword names. */
static int
drops_tuple(int op)
{
    switch (op) {
    case IMPORT_NAME:
    case CONTAINS_OP:
    case GET_ITER:
    case LIST_EXTEND:
    case SET_UPDATE:
#ifdef BUILD_CONST_KEY_MAP
    case BUILD_CONST_KEY_MAP:
#endif
#ifdef CALL_FUNCTION_KW
    case CALL_FUNCTION_KW:
#endif
#ifdef CALL_KW
    case CALL_KW:
#endif
        return 1;
    default:
        return 0;
    }
}

#ifdef CACHE
#  define PYCDS_OP_CACHE CACHE       /* inline cache entries (3.11+) */
#else
#  define PYCDS_OP_CACHE (-1)
#endif

/* Part 2, containers: the constant tuples that a code object that runs
 * once loads and hands to anything that may keep them -- a function's
 * defaults or annotations, a global, a class attribute (__slots__), a call
 * -- are copied whole.  One such tuple left in the tail and alive would
 * keep a page of the tails' arena from going back (release.c); a few
 * thousand of them did, for numpy, flask and boto3.  Only the uses that
 * drops_tuple() knows leave a tuple to the tail.  Read from co_code (the
 * deoptimised bytecode on 3.11+): 2-byte units, EXTENDED_ARG prefixes,
 * CACHE entries skipped. */
static int
place_kept_tuples(pycds_writer *w, PyObject *code, int depth)
{
    PyObject *consts = ((PyCodeObject *)code)->co_consts;
    PyObject *bytes = PyObject_GetAttrString(code, "co_code");
    if (bytes == NULL) {
        return pycds_fail_python("reading co_code");
    }
    int rc = PYCDS_OK;
    if (PyBytes_CheckExact(bytes) && PyTuple_CheckExact(consts)) {
        const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(bytes);
        Py_ssize_t n = PyBytes_GET_SIZE(bytes) / 2;
        uint32_t arg = 0;
        for (Py_ssize_t i = 0; rc == PYCDS_OK && i < n; i++) {
            int op = b[2 * i];
            arg = (arg << 8) | b[2 * i + 1];
            if (op == EXTENDED_ARG) {
                continue;
            }
            uint32_t full = arg;
            arg = 0;
            if (op != LOAD_CONST || full >= (uint32_t)PyTuple_GET_SIZE(consts)) {
                continue;
            }
            PyObject *t = PyTuple_GET_ITEM(consts, full);
            uint64_t off;
            if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) == 0
                || pycds_image_contains(t, sizeof(PyObject)) || memo_get(w, t, &off)) {
                continue;
            }
            int next = -1;
            for (Py_ssize_t j = i + 1; j < n && next < 0; j++) {
                int o = b[2 * j];
                next = o == EXTENDED_ARG || o == PYCDS_OP_CACHE ? -1 : o;
            }
            if (next < 0 || !drops_tuple(next)) {
                rc = copy_object(w, t, depth, &off);
            }
        }
    }
    Py_DECREF(bytes);
    return rc;
}

/* Part 2, for a function code object predicted dead: only the interned
 * strings new to the archive that it reaches.  The code object itself goes
 * to the tail with the module code; a string it alone reaches would be
 * copied there too and, becoming the interpreter's interned one, keep its
 * page of the tails' arena for good (release.c). */
static int
place_names(pycds_writer *w, PyObject *op, int depth, long *budget)
{
    uint64_t off;
    if (placed_or_spent(w, op, budget)) {
        return PYCDS_OK;
    }
    if (PyUnicode_CheckExact(op)) {
        if (!pycds_layout_str_interned(op) || seen_has(w, op)) {
            return PYCDS_OK;
        }
        return copy_interned(w, op, 0, &off);
    }
    if (depth >= PYCDS_MAX_DEPTH) {
        return PYCDS_OK;
    }
    if (!PyCode_Check(op)) {
        return place_items(w, op, depth, budget, place_names);
    }
    int rc = PYCDS_OK;
    const pycds_code_field *fields;
    size_t n = pycds_layout_code_fields(&fields);
    for (size_t i = 0; rc == PYCDS_OK && i < n; i++) {
        PyObject *child = *(PyObject **)((char *)op + fields[i].offset);
        rc = place_names(w, child, depth + 1, budget);
    }
    return rc;
}

static int
place_part2(pycds_writer *w, PyObject *code, int depth, long *budget)
{
    const pycds_code_field *fields;
    size_t n = pycds_layout_code_fields(&fields);
    for (size_t i = 0; i < n; i++) {
        PyObject *child = *(PyObject **)((char *)code + fields[i].offset);
        int rc = place_early(w, child, 1, budget);
        if (rc) {
            return rc;
        }
    }
    int rc = place_kept_tuples(w, code, depth + 1);
    if (rc) {
        return rc;
    }
    /* Class bodies: checked for depth by copy_part1. */
    PyObject *consts = ((PyCodeObject *)code)->co_consts;
    for (Py_ssize_t i = 0; depth < PYCDS_MAX_DEPTH && i < PyTuple_GET_SIZE(consts); i++) {
        PyObject *item = PyTuple_GET_ITEM(consts, i);
        int rc = PYCDS_OK;
        if (runs_once(item)) {
            rc = place_part2(w, item, depth + 1, budget);
        }
        else if (PyCode_Check(item) && predicted_dead(w, item)) {
            rc = place_names(w, item, depth + 1, budget);
        }
        if (rc) {
            return rc;
        }
    }
    return PYCDS_OK;
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
    w->tail_start = UINT64_MAX;
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
pycds_writer_add(pycds_writer *w, uintptr_t code, int ran, uintptr_t orders,
                 pycds_chunk_info *info)
{
    if (w == NULL || info == NULL || code == 0) {
        return pycds_fail(PYCDS_E_ARG, "bad writer arguments");
    }
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *co = (PyObject *)code;
    int rc = PYCDS_OK;
    w->ran = ran != 0;
    w->orders = (PyObject *)orders;
    if (w->orders != NULL && !PyDict_CheckExact(w->orders)) {
        w->orders = NULL;
        rc = pycds_fail(PYCDS_E_ARG, "frozenset orders are not a dict");
        PyGILState_Release(g);
        return rc;
    }
    size_t saved_len = w->len, saved_nrelocs = w->nrelocs;
    uint64_t saved_nobjects = w->nobjects;
    uint32_t saved_nstrings = w->nstrings;

    if (!PyCode_Check(co)) {
        rc = pycds_fail(PYCDS_E_ARG, "root object is a %.100s, not code",
                        Py_TYPE(co)->tp_name);
        goto done;
    }
    /* 8-aligned; the gap is zeros. */
    size_t start = (w->len + 7u) & ~(size_t)7u;
    rc = grow((void **)&w->heap, &w->cap, start, 1);
    if (rc) {
        goto done;
    }
    if (start > w->len)     /* (the heap is NULL until it holds a byte) */
        memset(w->heap + w->len, 0, start - w->len);
    w->len = start;
    w->chunk_start = w->len;
    /* memo, pending and tail_start start empty: writer_new, and the end of
     * every add (done: below) */
    uint64_t root;
    long budget = 1L << 16;
    rc = copy_part1(w, (PyCodeObject *)co, 0);
    if (rc == PYCDS_OK) {
        rc = flush_pending(w, 1);
    }
    if (rc == PYCDS_OK) {
        rc = place_part2(w, co, 0, &budget);
    }
    if (rc) {
        goto done;
    }
    w->tail_start = (w->len + 7u) & ~(size_t)7u;
    rc = copy_object(w, co, 0, &root);
    if (rc == PYCDS_OK) {
        rc = flush_pending(w, 0);
    }
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
        seen_rollback(w, saved_nstrings);
    }
    pycds_table_clear(&w->memo);
    w->npending = 0;
    w->tail_start = UINT64_MAX;
    w->ran = 0;
    w->orders = NULL;
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

int
pycds_writer_nstrings(pycds_writer *w, uint32_t *n)
{
    if (w == NULL || n == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad writer arguments");
    }
    *n = w->nstrings;
    return PYCDS_OK;
}

int
pycds_strings_renumber(uint8_t *chunk, size_t len, const uint32_t *rel,
                       size_t nrel, uint32_t *map, size_t map_len,
                       uint32_t *next)
{
    if (chunk == NULL || rel == NULL || map == NULL || next == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad renumber arguments");
    }
    for (size_t i = 0; i < nrel; i++) {
        if ((rel[i] & 7u) != PYCDS_RELOC_INTERN) {
            continue;
        }
        size_t slot = rel[i] & ~(uint32_t)7u;
        uint64_t v;
        if (slot > len || len - slot < sizeof(v)) {
            return pycds_fail(PYCDS_E_CORRUPT, "INTERN slot %zu outside chunk", slot);
        }
        memcpy(&v, chunk + slot, sizeof(v));
        uint64_t old = v >> 32;
        if (old >= map_len) {
            return pycds_fail(PYCDS_E_CORRUPT, "string number %llu out of range",
                              (unsigned long long)old);
        }
        if (map[old] == 0) {
            if (*next == UINT32_MAX) {
                return pycds_fail(PYCDS_E_TOOBIG, "more than 2^32 - 1 interned strings");
            }
            map[old] = ++*next;       /* the new number, plus one */
        }
        v = (uint64_t)(map[old] - 1) << 32 | (v & UINT32_MAX);
        memcpy(chunk + slot, &v, sizeof(v));
    }
    return PYCDS_OK;
}

void
pycds_writer_free(pycds_writer *w)
{
    if (w == NULL) {
        return;
    }
    if (w->keepalive != NULL || w->seen.slots != NULL) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_CLEAR(w->keepalive);
        for (size_t i = 0; i < w->seen.cap; i++) {
            Py_XDECREF(w->seen.slots[i].key);
        }
        PyGILState_Release(g);
    }
    free(w->heap);
    free(w->relocs);
    free(w->memo.slots);
    free(w->pending);
    free(w->seen.slots);
    free(w);
}

int
pycds_frozenset_items(uintptr_t set, uintptr_t out_list)
{
    PyObject *op = (PyObject *)set, *out = (PyObject *)out_list;
    if (op == NULL || out == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad frozenset arguments");
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PYCDS_OK;
    if (!PyFrozenSet_CheckExact(op) || !PyList_CheckExact(out)) {
        rc = pycds_fail(PYCDS_E_ARG, "not a frozenset and a list");
    }
    else {
        PyObject *items = pycds_layout_frozenset_items(op);
        if (items == NULL) {
            rc = pycds_fail_python("frozenset items");
        }
        else {
            if (PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, items) < 0) {
                rc = pycds_fail_python("frozenset items");
            }
            Py_DECREF(items);
        }
    }
    PyGILState_Release(g);
    return rc;
}
