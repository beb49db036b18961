/* layout_common.h -- copy helpers every CPython layout (3.10 to 3.13) uses.
 *
 * Included first by each version file (layout_3XX.h), which layout.c
 * includes.  What is here is the same in every supported version: the
 * object header, compact str sizes, bytes, float, complex and tuple (with
 * its PyGC_Head), and the argument count a code object's constructor
 * derives.  The version file defines what these helpers call back:
 * set_refcnt() and PYCDS_CODE_PTR_FIELDS (which layout.c's
 * copy_code_refs() walks).
 */
#ifndef PYCDS_LAYOUT_COMMON_H
#define PYCDS_LAYOUT_COMMON_H

#include "internal/pycore_gc.h"          /* PyGC_Head */

#include <string.h>

/* The layout id's sizes part (layout.c, describe_layout). */
#define PYCDS_STR2(x) #x
#define PYCDS_STR(x) PYCDS_STR2(x)
#define PYCDS_LAYOUT_SIZES                                         \
    "code=" PYCDS_STR(SIZEOF_VOID_P) "/"                           \
    "gc=" PYCDS_STR(SIZEOF_VOID_P)

/* The reference count of the copy at off (head or tail: pycds_w_in_tail):
 * 3.10/3.11 one no program brings to zero, 3.12+ immortal.  Defined by
 * the version file. */
static void set_refcnt(pycds_writer *w, uint64_t off);

/* The references of the copy at off of code object src: its ob_type slot
 * and its pointer fields (the version file's PYCDS_CODE_PTR_FIELDS), each
 * target copied or referred to.  Defined by layout.c. */
static int copy_code_refs(pycds_writer *w, uint64_t off, PyCodeObject *src,
                          int depth);

/* Reserve size bytes (plus a zeroed GC header for GC types) and copy the
 * object's memory there.  *off is the offset of the PyObject itself. */
static int
copy_raw(pycds_writer *w, PyObject *op, size_t size, size_t gc_size,
         uint64_t *off)
{
    uint64_t start;
    int rc = pycds_w_alloc(w, gc_size + size, &start);
    if (rc) {
        return rc;
    }
    memcpy((char *)pycds_w_at(w, start) + gc_size, op, size);
    *off = start + gc_size;
    return PYCDS_OK;
}

/* The ob_type slot of the copy at off: always a static type object. */
static int
copy_type_slot(pycds_writer *w, uint64_t off, PyObject *op)
{
    return pycds_w_slot(w, off + offsetof(PyObject, ob_type),
                        (PyObject *)Py_TYPE(op), 0);
}

static int
unsupported(PyObject *op)
{
    return pycds_fail(PYCDS_E_UNSUPPORTED,
                      "cannot archive an object of type %.100s",
                      Py_TYPE(op)->tp_name);
}

/* Bytes of a compact str (the only form a .pyc gives): its header, then its
 * code units and a NUL. */
static size_t
compact_str_size(PyObject *op)
{
    size_t len = (size_t)PyUnicode_GET_LENGTH(op);
    if (PyUnicode_IS_ASCII(op)) {
        return sizeof(PyASCIIObject) + len + 1;
    }
    return sizeof(PyCompactUnicodeObject) + (len + 1) * PyUnicode_KIND(op);
}

/* Copy an object's memory and set up its header: reference count and the
 * ob_type relocation.  Enough for objects without pointers to fix or caches
 * to reset. */
static int
copy_plain(pycds_writer *w, PyObject *op, size_t size, size_t gc_size,
           uint64_t *off)
{
    int rc = copy_raw(w, op, size, gc_size, off);
    if (rc) {
        return rc;
    }
    set_refcnt(w, *off);
    return copy_type_slot(w, *off, op);
}

/* A tuple: a zeroed (untracked) PyGC_Head, then the items, each copied or
 * referred to.  An untracked tuple of immutable items never needs the GC. */
static int
copy_tuple(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    Py_ssize_t n = PyTuple_GET_SIZE(op);
    int rc = copy_plain(w, op, _PyObject_VAR_SIZE(&PyTuple_Type, n),
                        sizeof(PyGC_Head), off);
    for (Py_ssize_t i = 0; rc == PYCDS_OK && i < n; i++) {
        rc = pycds_w_slot(w, *off + offsetof(PyTupleObject, ob_item)
                                 + (size_t)i * sizeof(PyObject *),
                          PyTuple_GET_ITEM(op, i), depth);
    }
    return rc;
}

/* bytes: the hash cache (deprecated since 3.11, still there) starts
 * empty. */
static int
copy_bytes(pycds_writer *w, PyObject *op, uint64_t *off)
{
    size_t size = offsetof(PyBytesObject, ob_sval) + (size_t)Py_SIZE(op) + 1;
    int rc = copy_raw(w, op, size, 0, off);
    if (rc) {
        return rc;
    }
    set_refcnt(w, *off);
    _Py_COMP_DIAG_PUSH
    _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    ((PyBytesObject *)pycds_w_at(w, *off))->ob_shash = -1;
    _Py_COMP_DIAG_POP
    return copy_type_slot(w, *off, op);
}

/* ---- helpers of the load-time check (pycds_layout_check_object) --------
 *
 * (PYCDSVERIFY=1.)  The loader's structural check (verify.c) proves types
 * and bounds; each version's check_str() and check_code() prove what
 * marshal.c never reads from a .pyc but the code object's constructor
 * computes or starts empty, and what it rejects (_PyCode_Validate,
 * 3.11-3.13; PyCode_NewWithPosOnlyArgs, 3.10, Objects/codeobject.c), so
 * that a re-signed archive cannot hand CPython a code object no .pyc could
 * give it. */

/* The arguments a code object takes, as its constructor counts them. */
static long long
code_nargs(const PyCodeObject *co)
{
    return (long long)co->co_argcount + co->co_kwonlyargcount
           + ((co->co_flags & CO_VARARGS) != 0)
           + ((co->co_flags & CO_VARKEYWORDS) != 0);
}

#endif /* PYCDS_LAYOUT_COMMON_H */
