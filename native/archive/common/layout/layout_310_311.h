/* layout_310_311.h -- what the 3.10 and 3.11 layouts share word for word.
 *
 * Included by layout_310.h and layout_311.h only, after layout_common.h.
 * Both versions have the same str (PyASCIIObject with wstr and the ready
 * bit, Include/cpython/unicodeobject.h), the same int (ob_size, the
 * digits) and no immortal objects: archived objects get a reference count
 * so large that no program brings it to zero (PYCDS_REFCNT), so they are
 * never deallocated, tail objects included.  Neither version's code
 * objects carry per-process state that init_code sets, and nothing of the
 * interpreter refers to one uncounted but a weak reference or co_extra.
 */
#ifndef PYCDS_LAYOUT_310_311_H
#define PYCDS_LAYOUT_310_311_H

#define PYCDS_REFCNT ((Py_ssize_t)1 << 60)
#define PYCDS_HEAD_REFCNT PYCDS_REFCNT
#define PYCDS_TAIL_REFCNT PYCDS_REFCNT     /* the same for tail objects */

static void
set_refcnt(pycds_writer *w, uint64_t off)
{
    PyObject *copy = (PyObject *)pycds_w_at(w, off);
    copy->ob_refcnt = PYCDS_REFCNT;
}

/* 3.10 and 3.11's PyUnicode_New (Objects/unicodeobject.c): a str whose code
 * units are wchar_t-sized (the 4-byte kind, with Linux's 4-byte wchar_t)
 * shares them as its wchar_t form: wstr = its data, wstr_length = its
 * length.  unicode_copy_as_widechar() and unicode_get_widechar_size() read
 * wstr first and _PyUnicode_CheckConsistency() requires it; with wstr NULL
 * a non-BMP str reached the wchar_t API (ctypes, locale.strxfrm) as UTF-16
 * halves.  Every other str starts with wstr NULL. */
static int
str_shares_wstr(PyObject *op)
{
    return !PyUnicode_IS_ASCII(op) && PyUnicode_KIND(op) == sizeof(wchar_t);
}

/* The str copy at heap offset off (of op) with the caches a process fills
 * on demand as a fresh str has them: no UTF-8 form, and no wchar_t form
 * but the shared one (a DATA relocation to the copy's own code units). */
static int
reset_str_caches(pycds_writer *w, PyObject *op, uint64_t off)
{
    PyASCIIObject *a = (PyASCIIObject *)pycds_w_at(w, off);
    _Py_COMP_DIAG_PUSH
    _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    a->wstr = NULL;
    if (PyUnicode_IS_ASCII(op)) {
        return PYCDS_OK;
    }
    PyCompactUnicodeObject *c = (PyCompactUnicodeObject *)a;
    c->utf8 = NULL;
    c->utf8_length = 0;
    c->wstr_length = 0;
    if (!str_shares_wstr(op)) {
        return PYCDS_OK;
    }
    c->wstr_length = PyUnicode_GET_LENGTH(op);
    _Py_COMP_DIAG_POP
    return pycds_w_inner(w, off + offsetof(PyASCIIObject, wstr),
                         off + sizeof(PyCompactUnicodeObject));
}

/* 3.10 and 3.11's str: what only a process fills in must be as
 * reset_str_caches() leaves it: the interning state, the UTF-8 cache and
 * the wchar_t form. */
static int
check_str(PyObject *op)
{
    PyASCIIObject *a = (PyASCIIObject *)op;
    int shares = str_shares_wstr(op);
    const void *wstr = shares ? PyUnicode_DATA(op) : NULL;
    Py_ssize_t wlen = shares ? PyUnicode_GET_LENGTH(op) : 0;
    _Py_COMP_DIAG_PUSH
    _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    if ((const void *)a->wstr != wstr || a->state.interned != SSTATE_NOT_INTERNED
        || (!a->state.ascii
            && (((PyCompactUnicodeObject *)op)->utf8 != NULL
                || ((PyCompactUnicodeObject *)op)->utf8_length != 0
                || ((PyCompactUnicodeObject *)op)->wstr_length != wlen))) {
        return pycds_fail(PYCDS_E_CORRUPT, "str with per-process state");
    }
    _Py_COMP_DIAG_POP
    return PYCDS_OK;
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

/* The copy is complete as it is: no code version to draw, no code
 * watchers to tell. */
int
pycds_layout_after_load(PyObject *root)
{
    (void)root;
    return PYCDS_OK;
}

/* A code object may go unless a weak reference or co_extra data (PEP 523)
 * refers to it. */
int
pycds_layout_may_release(PyObject *root)
{
    PyCodeObject *co = (PyCodeObject *)root;
    return co->co_weakreflist == NULL && co->co_extra == NULL;
}

/* Room in the interned dict is reserved on 3.13 only (layout_313.h). */
int
pycds_layout_intern_reserve(uint64_t n, uint64_t *room)
{
    *room = n;
    return PYCDS_OK;
}

/* Code objects of 3.10 and 3.11 have no version (only 3.12 draws them from
 * a counter private to libpython). */
int
pycds_layout_version_counter_at(int64_t *offset)
{
    (void)offset;
    return pycds_fail(PYCDS_E_UNSUPPORTED, "code versions need no counter here");
}

int
pycds_layout_use_version_counter(int64_t offset)
{
    (void)offset;
    return pycds_fail(PYCDS_E_UNSUPPORTED, "code versions need no counter here");
}

#endif /* PYCDS_LAYOUT_310_311_H */
