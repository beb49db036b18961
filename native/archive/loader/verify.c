/* verify.c -- the deep structural check of a loaded chunk (opt-in:
 * PYCDSVERIFY=1, pycds_archive_set_verify()).
 *
 * Runs on the main side of a load, holding the GIL, after the relocations
 * and before any object of the chunk is used.
 */
#include "archive.h"
#include "layout.h"

#include <stdlib.h>
#include <string.h>

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
 * Then the fields unmarshal computes rather than reads
 * (pycds_layout_check_object), and that no constant contains itself
 * (check_acyclic).  Runs after apply_relocations(), before any object is
 * used.  What it does not check is what CPython does not check in a .pyc
 * either: the bytecode and the code object's fields a .pyc carries (see
 * docs/reliability.md).
 */

enum { SLOT_NONE = 0 };   /* else kind + 1 */

#if PY_VERSION_HEX >= 0x030C0000
#  define PYCDS_LONG_DIGITS long_value.ob_digit
#else
#  define PYCDS_LONG_DIGITS ob_digit
#endif

typedef struct {
    const pycds_place *p;     /* the chunk's head and tail */
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
    return pycds_place_room(v->p, p) > 0;
}

/* Size in bytes of the chunk object op, or 0 if its header is not that of
 * a well-formed object of its type fitting in avail bytes. */
size_t
pycds_object_size(PyObject *op, uint64_t avail)
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
    uint64_t off = pycds_place_off(v->p, p);
    uint64_t room = pycds_place_room(v->p, p);
    if (off % 8 != 0 || room < sizeof(PyObject)) {
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
    if (Py_REFCNT(p) != pycds_layout_refcnt(off >= v->p->root_off)) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu has a wrong reference "
                          "count", (unsigned long long)off);
    }
    /* The types a chunk holds (layout.c copies no others). */
    if (!(t == &PyUnicode_Type || t == &PyTuple_Type || t == &PyBytes_Type
          || t == &PyCode_Type || t == &PyLong_Type || t == &PyFloat_Type
          || t == &PyComplex_Type)) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu has a wrong type",
                          (unsigned long long)off);
    }
    size_t size = pycds_object_size(p, room);
    if (size == 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "object at %llu is malformed or "
                          "does not fit in its chunk", (unsigned long long)off);
    }
    if (t == &PyTuple_Type) {
        /* GC header before the object: in the same part of the chunk and
         * untracked. */
        uint64_t gc = 2 * sizeof(uintptr_t);
        uint64_t zero[2] = {0, 0};
        uint64_t in_part = off < v->p->root_off ? off : off - v->p->root_off;
        if (in_part < gc || memcmp((uint8_t *)p - gc, zero, gc) != 0) {
            return pycds_fail(PYCDS_E_CORRUPT, "tuple at %llu has a bad GC header",
                              (unsigned long long)off);
        }
    }
    if (t == &PyUnicode_Type) {
        int rc = pycds_layout_check_object(v->p, p);
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
 * to an object (not DATA; not FROZENSET unless any type is allowed), then
 * its target checked. */
static int
check_field(verifier *v, PyObject **field, PyTypeObject *want)
{
    uint64_t off = pycds_place_off(v->p, field);
    uint8_t k = v->slot_kind[off / 8];
    if (off % 8 != 0 || k == SLOT_NONE || k == PYCDS_RELOC_DATA + 1
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

/* ---- no constant contains itself -----------------------------------------
 *
 * marshal.c reserves a code object's reference until its fields are read
 * and refuses a reference to it meanwhile ("bad marshal data (invalid
 * reference)"), so no .pyc holds a code object among its own constants;
 * CPython's hash() of one (and of a tuple containing itself) recurses
 * without end.  A depth-first walk of the chunk's tuples and code objects
 * (edges: tuple items, co_consts; a FROZENSET slot still points at its item
 * tuple here) refuses any cycle.  color: per 8-byte word of the chunk, 0
 * unseen, 1 on the walk's path, 2 done; zeroed by the caller.  Runs after
 * the structural check: every object reached is well formed. */

typedef struct {
    PyObject *op;
    Py_ssize_t next;          /* the next edge to follow */
} walk_frame;

/* Edge i of op (a tuple or code object of the chunk), or NULL past the last. */
static PyObject *
edge(PyObject *op, Py_ssize_t i)
{
    if (Py_TYPE(op) == &PyTuple_Type) {
        return i < Py_SIZE(op) ? PyTuple_GET_ITEM(op, i) : NULL;
    }
    return i == 0 ? ((PyCodeObject *)op)->co_consts : NULL;
}

static int
check_acyclic(const pycds_place *p, uint8_t *color, PyObject *root)
{
    size_t depth = 0, cap = 256;
    walk_frame *stack = malloc(cap * sizeof(*stack));
    if (stack == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "cannot allocate the walk of the constants");
    }
    int rc = PYCDS_OK;
    stack[depth++] = (walk_frame){root, 0};
    color[pycds_place_off(p, root) / 8] = 1;
    while (depth > 0) {
        walk_frame *f = &stack[depth - 1];
        PyObject *next = edge(f->op, f->next++);
        if (next == NULL) {
            color[pycds_place_off(p, f->op) / 8] = 2;
            depth--;
            continue;
        }
        if (pycds_place_room(p, next) == 0
            || (Py_TYPE(next) != &PyTuple_Type && Py_TYPE(next) != &PyCode_Type)) {
            continue;         /* a static object, or one without such edges */
        }
        uint8_t *c = &color[pycds_place_off(p, next) / 8];
        if (*c == 1) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "a constant contains itself");
            break;
        }
        if (*c == 2) {
            continue;
        }
        if (depth == cap) {
            walk_frame *s = realloc(stack, 2 * cap * sizeof(*stack));
            if (s == NULL) {
                rc = pycds_fail(PYCDS_E_NOMEM, "cannot grow the walk of the constants");
                break;
            }
            stack = s;
            cap *= 2;
        }
        *c = 1;
        stack[depth++] = (walk_frame){next, 0};
    }
    free(stack);
    return rc;
}

int
pycds_verify_chunk(const pycds_place *p, const uint32_t *rel, uint64_t n)
{
    uint64_t len = p->len;
    uint8_t *maps = calloc(2 * (len / 8 + 1), 1);
    verifier v = {p, maps, maps ? maps + len / 8 + 1 : NULL, NULL, 0, 0};
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
    rc = check_target(&v, (PyObject *)pycds_place_at(p, p->root_off), &PyCode_Type);
    for (uint64_t i = 0; rc == PYCDS_OK && i < n; i++) {
        int kind = (int)(rel[i] & 7u);
        PyObject **slot = (PyObject **)pycds_place_at(p, rel[i] & ~(uint32_t)7u);
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
                rc = pycds_layout_check_object(v.p, op);
            }
        }
    }
    if (rc == PYCDS_OK) {
        /* The slot map is done with: it becomes the walk's colours. */
        memset(v.slot_kind, 0, len / 8 + 1);
        rc = check_acyclic(p, v.slot_kind,
                           (PyObject *)pycds_place_at(p, p->root_off));
    }
done:
    free(maps);
    free(v.stack);
    return rc;
}

