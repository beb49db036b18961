/* layout_310.h -- CPython 3.10 object layout for archived objects.
 *
 * Included by layout.c only, the one file it includes for 3.10.  Sources
 * (3.10 branch): Include/cpython/code.h
 * (struct PyCodeObject), Include/cpython/unicodeobject.h (PyASCIIObject,
 * PyCompactUnicodeObject), Include/cpython/bytesobject.h,
 * Include/longintrepr.h, Include/internal/pycore_gc.h (PyGC_Head) and
 * Include/internal/pycore_interp.h (the per-interpreter singletons);
 * Objects/codeobject.c (PyCode_NewWithPosOnlyArgs: co_cell2arg, the fields a
 * new code object starts with) and Python/marshal.c (r_object: which objects
 * a .pyc produces).
 *
 * What differs from 3.11:
 *   - 3.10 predates the adaptive interpreter: co_code is an immutable bytes
 *     object, so a code object that has run can be copied as it is; only its
 *     per-process state (co_zombieframe, co_weakreflist, co_extra and the
 *     opcache: co_opcache_map, co_opcache, co_opcache_flag,
 *     co_opcache_size) is reset to what PyCode_NewWithPosOnlyArgs sets.
 *   - co_cell2arg is a PyMem-allocated Py_ssize_t[len(co_cellvars)] or NULL;
 *     it is copied into the chunk as raw data (pycds_w_raw).
 *   - The shared instances marshal hands out -- small ints (-5..256), the
 *     empty str and one-character latin-1 strs, the empty tuple and the
 *     empty bytes -- live in the interpreter state (pycore_interp.h:
 *     small_ints, unicode.empty_string/latin1, tuple.free_list[0],
 *     bytes.empty_string), i.e. on the C heap, not in the libpython image.
 *     They are copied like any object, recorded as SINGLETON, and swapped
 *     for the interpreter's instance at load, so identity (`x is 0`,
 *     `() is ()`) is as after unmarshal.  One-byte bytes are not shared by
 *     unmarshal (PyBytes_FromStringAndSize(NULL, 1) makes a new object) and
 *     stay copies, even when the compiler handed us its cached instance.
 *
 * 3.10 has no immortal objects (layout_310_311.h: reference counts, and the
 * str layout it shares with 3.11).  Tuples are GC types: they get a
 * zeroed (untracked) PyGC_Head.
 * Code objects are not GC types in 3.10 (no Py_TPFLAGS_HAVE_GC).
 */
#include "internal/pycore_gc.h"
#include "internal/pycore_interp.h"

#define PYCDS_LAYOUT_NAME "cpython-3.10"

#include "layout/layout_common.h"
#include "layout/layout_310_311.h"

/* Fields of PyCodeObject copied with the code object; order matches
 * Include/cpython/code.h (3.10).  Scalars are copied as they are, object
 * pointers with their targets; co_cell2arg is raw data (copy_code()).  The
 * fields not listed are per-process state that a new code object starts
 * with zeroed (PyCode_NewWithPosOnlyArgs): co_zombieframe, co_weakreflist,
 * co_extra, co_opcache_map, co_opcache, co_opcache_flag, co_opcache_size. */
#define PYCDS_CODE_SCALAR_FIELDS(X)                                \
    X(co_argcount) X(co_posonlyargcount) X(co_kwonlyargcount)      \
    X(co_nlocals) X(co_stacksize) X(co_flags) X(co_firstlineno)
#define PYCDS_CODE_PTR_FIELDS(X)                                   \
    X(co_code) X(co_consts) X(co_names) X(co_varnames)             \
    X(co_freevars) X(co_cellvars) X(co_filename) X(co_name)        \
    X(co_linetable)

static int
copy_code(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    PyCodeObject *src = (PyCodeObject *)op;
    if (Py_TYPE(op)->tp_basicsize != (Py_ssize_t)sizeof(PyCodeObject)) {
        return pycds_fail(PYCDS_E_UNSUPPORTED,
                          "code objects are %zd bytes, this layout expects %zu",
                          Py_TYPE(op)->tp_basicsize, sizeof(PyCodeObject));
    }
    /* Field by field into zeroed memory (pycds_w_alloc): the per-process
     * state starts as PyCode_NewWithPosOnlyArgs (Objects/codeobject.c,
     * 3.10) sets it, and no padding byte comes from the source. */
    int rc = pycds_w_alloc(w, sizeof(PyCodeObject), off);
    if (rc) {
        return rc;
    }
    PyCodeObject *c = (PyCodeObject *)pycds_w_at(w, *off);
    c->ob_base.ob_refcnt = PYCDS_REFCNT;
#define COPY_SCALAR(f) c->f = src->f;
    PYCDS_CODE_SCALAR_FIELDS(COPY_SCALAR)
#undef COPY_SCALAR
    rc = copy_code_refs(w, *off, src, depth);
    if (rc == PYCDS_OK && src->co_cell2arg != NULL) {
        /* Py_ssize_t[len(co_cellvars)]: the argument index of each cell
         * variable, or CO_CELL_NOT_AN_ARG. */
        if (!PyTuple_Check(src->co_cellvars)) {
            return pycds_fail(PYCDS_E_UNSUPPORTED,
                              "co_cell2arg without a co_cellvars tuple");
        }
        size_t n = (size_t)PyTuple_GET_SIZE(src->co_cellvars);
        rc = pycds_w_raw(w, *off + offsetof(PyCodeObject, co_cell2arg),
                         src->co_cell2arg, n * sizeof(Py_ssize_t));
    }
    return rc;
}

/* ---- shared instances ---------------------------------------------------
 *
 * marshal.c (3.10) r_object builds ints with PyLong_FromLong (TYPE_INT),
 * strs with PyUnicode_FromKindAndData / PyUnicode_DecodeUTF8 (both return
 * unicode_new_empty() or get_latin1_char() for length 0 or 1), tuples with
 * PyTuple_New (the empty tuple is free_list[0]) and bytes with
 * PyBytes_FromStringAndSize(NULL, n) (the empty bytes for n == 0, a new
 * object otherwise).  Those constructors are what the load side calls. */

/* Value of an int in the small-int range, or 0 with *in_range unset. */
static long
small_int_value(PyObject *op, int *in_range)
{
    *in_range = 0;
    Py_ssize_t size = Py_SIZE(op);
    if (size < -1 || size > 1) {
        return 0;
    }
    long v = size == 0 ? 0
             : (size < 0 ? -(long)((PyLongObject *)op)->ob_digit[0]
                         : (long)((PyLongObject *)op)->ob_digit[0]);
    *in_range = v >= -_PY_NSMALLNEGINTS && v < _PY_NSMALLPOSINTS;
    return v;
}

/* Nonzero if str op is one marshal gives as a shared instance. */
static int
str_is_shared(PyObject *op)
{
    if (!PyUnicode_IS_READY(op)) {
        return 0;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(op);
    return len == 0 || (len == 1 && PyUnicode_READ_CHAR(op, 0) < 256);
}

int
pycds_layout_heap_singleton(PyObject *op)
{
    if (PyLong_CheckExact(op)) {
        int in_range;
        (void)small_int_value(op, &in_range);
        return in_range;
    }
    if (PyUnicode_CheckExact(op)) {
        return str_is_shared(op);
    }
    if (PyTuple_CheckExact(op)) {
        return PyTuple_GET_SIZE(op) == 0;
    }
    if (PyBytes_CheckExact(op)) {
        return PyBytes_GET_SIZE(op) == 0;
    }
    return 0;
}

/* The interpreter's shared instance equal to the archived copy op (a new
 * reference), as the 3.10 constructors marshal uses return it; NULL with
 * a Python exception set, or NULL without one if op is not such a value. */
static PyObject *
shared_instance(PyObject *op)
{
    if (PyLong_CheckExact(op)) {
        int in_range;
        long v = small_int_value(op, &in_range);
        return in_range ? PyLong_FromLong(v) : NULL;
    }
    if (PyUnicode_CheckExact(op) && str_is_shared(op)) {
        if (PyUnicode_GET_LENGTH(op) == 0) {
            return PyUnicode_New(0, 0);
        }
        return PyUnicode_FromOrdinal((int)PyUnicode_READ_CHAR(op, 0));
    }
    if (PyTuple_CheckExact(op) && PyTuple_GET_SIZE(op) == 0) {
        return PyTuple_New(0);
    }
    if (PyBytes_CheckExact(op) && PyBytes_GET_SIZE(op) == 0) {
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    return NULL;
}

int
pycds_layout_use_singleton(PyObject **slot)
{
    PyObject *copy = *slot;
    PyObject *shared = shared_instance(copy);
    if (shared == NULL) {
        if (PyErr_Occurred()) {
            return pycds_fail_python("looking up a shared instance");
        }
        return pycds_fail(PYCDS_E_CORRUPT,
                          "SINGLETON slot holds a %.100s that has no shared "
                          "instance", Py_TYPE(copy)->tp_name);
    }
    /* The reference is the archive's for good, as marshal's would be the
     * code object's; the copy stays unused in the chunk. */
    *slot = shared;
    return PYCDS_OK;
}

int
pycds_layout_intern(PyObject **slot)
{
    /* As marshal does for TYPE_*_INTERNED: build the str (which gives the
     * shared instance for the empty and one-character latin-1 strs), then
     * PyUnicode_InternInPlace it.  The heap copy has a huge reference count
     * and is never freed, so the reference InternInPlace drops (if an equal
     * string is already interned) or takes over (if the copy becomes the
     * interned one) is harmless; the slot then holds the interned string. */
    if (str_is_shared(*slot)) {
        int rc = pycds_layout_use_singleton(slot);
        if (rc) {
            return rc;
        }
    }
    PyUnicode_InternInPlace(slot);
    if (PyErr_Occurred()) {
        return pycds_fail_python("interning a string");
    }
    return PYCDS_OK;
}

/* ---- load-time check of what marshal would have validated --------------
 *
 * (layout.c, pycds_layout_check_object.)  What PyCode_NewWithPosOnlyArgs
 * (Objects/codeobject.c, 3.10) rejects or computes itself rather than
 * reading it from a .pyc: argument and local counts (co_nlocals as the
 * compiler sets it: len(co_varnames); frames are sized from it), bytecode
 * of whole code units, and co_cell2arg -- NULL, or len(co_cellvars)
 * argument indexes (each below the argument count, or CO_CELL_NOT_AN_ARG)
 * lying in chunk p: frame set-up reads them (_PyEval_MakeFrameVector).
 * Per-process state copy_code() leaves zeroed must be zero.  co has passed
 * the structural check (its pointer fields point at objects of the right
 * types). */
static int
check_code(const pycds_place *p, PyCodeObject *co)
{
    if (co->co_zombieframe != NULL || co->co_weakreflist != NULL
        || co->co_extra != NULL || co->co_opcache_map != NULL
        || co->co_opcache != NULL || co->co_opcache_flag != 0
        || co->co_opcache_size != 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object with per-process state");
    }
    Py_ssize_t ncode = PyBytes_GET_SIZE(co->co_code);
    if (co->co_argcount < co->co_posonlyargcount || co->co_posonlyargcount < 0
        || co->co_kwonlyargcount < 0 || co->co_nlocals < 0
        || co->co_stacksize < 0 || co->co_flags < 0 || co->co_firstlineno < 0
        || ncode > INT_MAX || ncode % (Py_ssize_t)sizeof(_Py_CODEUNIT) != 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object with bad counts");
    }
    long long nargs = code_nargs(co);
    if (co->co_nlocals != PyTuple_GET_SIZE(co->co_varnames) || nargs > co->co_nlocals) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object counts do not match "
                          "its locals");
    }
    if (co->co_cell2arg != NULL) {
        Py_ssize_t ncells = PyTuple_GET_SIZE(co->co_cellvars);
        if (ncells == 0 || (uintptr_t)co->co_cell2arg % sizeof(Py_ssize_t) != 0
            || pycds_place_room(p, co->co_cell2arg)
                   < (uint64_t)ncells * sizeof(Py_ssize_t)) {
            return pycds_fail(PYCDS_E_CORRUPT, "code object's cell map is "
                              "misplaced");
        }
        for (Py_ssize_t i = 0; i < ncells; i++) {
            Py_ssize_t arg = co->co_cell2arg[i];
            if (arg != CO_CELL_NOT_AN_ARG && (arg < 0 || arg >= nargs)) {
                return pycds_fail(PYCDS_E_CORRUPT, "code object's cell map is "
                                  "out of range");
            }
        }
    }
    return PYCDS_OK;
}

/* ---- per-process state, release, interning ----------------------------- */

/* Chunks hold raw data (co_cell2arg) between objects: release.c cannot walk
 * a tail, so no memory is given back on 3.10. */
int
pycds_layout_tail_walkable(void)
{
    return 0;
}

/* Never called: no chunk is given back on 3.10. */
void
pycds_layout_forget_code(PyObject *op)
{
    (void)op;
}

/* 3.10's marshal writes a frozenset's items in the writing process's
 * iteration order, which is not known here: pycds_layout_frozenset_items
 * sorts them by their bytes without FLAG_REF, an order that does not
 * depend on the dump's hash seed (docs/importer-compliance.md). */
static int
frozenset_item_unflagged(PyObject *item)
{
    (void)item;
    return 1;
}
