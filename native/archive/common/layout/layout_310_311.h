/* layout_310_311.h -- what the 3.10 and 3.11 layouts share word for word.
 *
 * Included by layout_310.h and layout_311.h only.  Both versions have the
 * same str (PyASCIIObject with wstr and the ready bit,
 * Include/cpython/unicodeobject.h) and no immortal objects: archived
 * objects get a reference count so large that no program brings it to zero
 * (PYCDS_REFCNT), so they are never deallocated, tail objects included.
 */
#ifndef PYCDS_LAYOUT_310_311_H
#define PYCDS_LAYOUT_310_311_H

#define PYCDS_STR2(x) #x
#define PYCDS_STR(x) PYCDS_STR2(x)
#define PYCDS_LAYOUT_SIZES                                         \
    "code=" PYCDS_STR(SIZEOF_VOID_P) "/"                           \
    "gc=" PYCDS_STR(SIZEOF_VOID_P)

#define PYCDS_REFCNT ((Py_ssize_t)1 << 60)
#define PYCDS_HEAD_REFCNT PYCDS_REFCNT
#define PYCDS_TAIL_REFCNT PYCDS_REFCNT     /* the same for tail objects */

static void
set_refcnt(pycds_writer *w, uint64_t off)
{
    PyObject *copy = (PyObject *)pycds_w_at(w, off);
    copy->ob_refcnt = PYCDS_REFCNT;
}

static int
copy_str(pycds_writer *w, PyObject *op, uint64_t *off)
{
    if (!PyUnicode_IS_READY(op) || !PyUnicode_IS_COMPACT(op)) {
        return pycds_fail(PYCDS_E_UNSUPPORTED, "str is not in compact form");
    }
    int rc = copy_raw(w, op, compact_str_size(op), 0, off);
    if (rc) {
        return rc;
    }
    set_refcnt(w, *off);
    PyASCIIObject *a = (PyASCIIObject *)pycds_w_at(w, *off);
    a->hash = -1;
    /* PyUnicode_New sets the state bit-fields one by one and never writes
     * the unnamed 24 bits nor the padding up to wstr: rebuild the state in
     * zeroed memory, so the archive holds no uninitialised bytes.  interned
     * stays 0 (SSTATE_NOT_INTERNED). */
    unsigned int kind = a->state.kind, compact = a->state.compact;
    unsigned int ascii = a->state.ascii, ready = a->state.ready;
    memset((char *)a + offsetof(PyASCIIObject, state), 0,
           offsetof(PyASCIIObject, wstr) - offsetof(PyASCIIObject, state));
    a->state.kind = kind;
    a->state.compact = compact;
    a->state.ascii = ascii;
    a->state.ready = ready;
    rc = reset_str_caches(w, op, *off);
    if (rc) {
        return rc;
    }
    return copy_type_slot(w, *off, op);
}

/* The digits of an int: the same PyLongObject in both versions. */
static int
copy_long(pycds_writer *w, PyObject *op, uint64_t *off)
{
    Py_ssize_t n = Py_SIZE(op) < 0 ? -Py_SIZE(op) : Py_SIZE(op);
    size_t size = offsetof(PyLongObject, ob_digit)
                  + sizeof(digit) * (size_t)(n > 0 ? n : 1);
    int rc = copy_plain(w, op, size, 0, off);
    if (rc == PYCDS_OK && n == 0) {
        /* 0 has room for one digit that _PyLong_New leaves unwritten (3.12's
         * long_alloc zeroes it).  The 0 a .pyc gives is the static small
         * int (EXTERNAL); this is for a 0 made on the heap. */
        ((PyLongObject *)pycds_w_at(w, *off))->ob_digit[0] = 0;
    }
    return rc;
}

#endif /* PYCDS_LAYOUT_310_311_H */
