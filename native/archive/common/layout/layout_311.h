/* layout_311.h -- CPython 3.11 object layout for archived objects.
 *
 * Included by layout.c only, the one file it includes for 3.11.  Sources:
 * Include/cpython/code.h (_PyCode_DEF), Include/cpython/unicodeobject.h
 * (PyASCIIObject, PyCompactUnicodeObject), Include/cpython/bytesobject.h,
 * Include/cpython/longintrepr.h, Include/internal/pycore_gc.h (PyGC_Head),
 * Include/internal/pycore_code.h (QUICKENING_INITIAL_WARMUP_VALUE) and
 * Include/internal/pycore_opcode.h (_PyOpcode_Deopt, _PyOpcode_Caches) of
 * 3.11; Python/marshal.c (r_object) says which objects a .pyc produces and
 * Tools/scripts/deepfreeze.py shows how 3.11 lays out static code objects.
 *
 * 3.11 has no immortal objects (layout_310_311.h: reference counts, and the
 * str layout it shares with 3.10); its code objects are those of 3.12 and
 * 3.13 but for their per-process state (layout_311_313.h).  Tuples are GC
 * types: they get a zeroed (untracked) PyGC_Head.
 */
#include "internal/pycore_gc.h"
#include "internal/pycore_code.h"        /* CO_FAST_*, _Py_OPCODE, _Py_CODEUNIT */
#include "opcode.h"                      /* RESUME, CACHE */

/* 3.11's tables of inline cache sizes and of the base opcode of every
 * specialised one, from its own header (libpython does not export them;
 * each renamed): check_bytecode() in layout_311_313.h. */
#define NEED_OPCODE_TABLES
#define _PyOpcode_RelativeJump pycds_opcode_relative_jump
#define _PyOpcode_Jump pycds_opcode_jump
#define _PyOpcode_Caches pycds_opcode_caches
#define _PyOpcode_Deopt pycds_opcode_deopt
#include "internal/pycore_opcode.h"
#undef NEED_OPCODE_TABLES
#define PYCDS_OPCODE_CACHES pycds_opcode_caches
#define PYCDS_OPCODE_DEOPT pycds_opcode_deopt

#define PYCDS_LAYOUT_NAME "cpython-3.11"

#include "layout/layout_common.h"
#include "layout/layout_310_311.h"
#include "layout/layout_311_313.h"

/* Unmarshal and init_code leave every instruction its own base opcode:
 * 3.11 quickens a code object only once co_warmup reaches 0. */
static int
op_unmarshal_makes(int op, int base, int caches)
{
    (void)caches;
    return op == base;
}

/* Overwrite the bytecode of copy c with the deoptimised bytecode of src
 * (co_code: _PyCode_GetCode, Objects/codeobject.c, 3.11). */
static int
fresh_bytecode(PyCodeObject *src, PyCodeObject *c)
{
    PyObject *bytes = PyCode_GetCode(src);
    if (bytes == NULL) {
        return pycds_fail_python("reading co_code");
    }
    size_t n = (size_t)Py_SIZE(src) * sizeof(_Py_CODEUNIT);
    int rc = PYCDS_OK;
    if (!PyBytes_Check(bytes) || (size_t)PyBytes_GET_SIZE(bytes) != n) {
        rc = pycds_fail(PYCDS_E_UNSUPPORTED,
                        "co_code does not match the bytecode size");
    }
    else {
        memcpy(c->co_code_adaptive, PyBytes_AS_STRING(bytes), n);
    }
    Py_DECREF(bytes);
    return rc;
}

static int
copy_code(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    int rc = copy_code_raw(w, op, off);
    if (rc) {
        return rc;
    }
    set_refcnt(w, *off);
    PyCodeObject *c = (PyCodeObject *)pycds_w_at(w, *off);
    zero_code_padding(c);
    /* Per-process state starts as a fresh unmarshal leaves it. */
    c->co_warmup = QUICKENING_INITIAL_WARMUP_VALUE;
    c->_co_linearray_entry_size = 0;
    c->co_weakreflist = NULL;
    c->_co_code = NULL;
    c->_co_linearray = NULL;
    c->co_extra = NULL;
    /* The bytecode is the unquickened form marshal produces: init_code
     * copies co_code as it is and quickens only once co_warmup reaches 0
     * (Objects/codeobject.c, _PyCode_Warmup in pycore_code.h, 3.11).  Code
     * that has run (co_warmup moved) may hold specialised instructions and
     * filled inline caches: its co_code attribute (_PyCode_GetCode) is the
     * deoptimised bytecode with zeroed caches, as marshal writes it. */
    PyCodeObject *src = (PyCodeObject *)op;
    if (src->co_warmup != QUICKENING_INITIAL_WARMUP_VALUE) {
        rc = fresh_bytecode(src, c);
        if (rc) {
            return rc;
        }
    }
    rc = copy_code_refs(w, *off, src, depth);
    return rc;
}

int
pycds_layout_intern(PyObject **slot)
{
    /* The heap copy has a huge reference count and is never freed, so the
     * reference PyUnicode_InternInPlace drops (if an equal string is already
     * interned) or takes over (if the copy becomes the interned one) is
     * harmless; the slot then holds the interpreter's interned string. */
    PyUnicode_InternInPlace(slot);
    if (PyErr_Occurred()) {
        return pycds_fail_python("interning a string");
    }
    return PYCDS_OK;
}

/* Before a dead code object's memory is given back (release.c): what
 * code_dealloc frees besides the fields (Objects/codeobject.c, 3.11): the
 * cached co_code attribute (_PyCode_GetCode) and the line array tracing
 * builds (_PyCode_CreateLineArray).  _Py_QuickenedCount, which it also
 * decrements, is private to libpython: sys._getquickenedcount() counts the
 * quickened code objects given back as live. */

void
pycds_layout_forget_code(PyObject *op)
{
    PyCodeObject *co = (PyCodeObject *)op;
    Py_CLEAR(co->_co_code);
    if (co->_co_linearray != NULL) {
        PyMem_Free(co->_co_linearray);
        co->_co_linearray = NULL;
        co->_co_linearray_entry_size = 0;
    }
}

/* ---- load-time check of what marshal would have validated --------------
 *
 * (layout.c, pycds_layout_check_object.)  Besides the counts 3.11 to 3.13
 * share (check_code_counts): co_nplaincellvars, and the per-process state
 * copy_code() resets (the caches, the line array, co_warmup).  3.11 sizes frames from co_nlocalsplus +
 * co_stacksize (_PyFrame_NumSlotsForCodeObject).  co has passed the
 * structural check (its pointer fields are valid). */

static int
check_code(const pycds_place *p, PyCodeObject *co)
{
    (void)p;
    if (co->co_weakreflist != NULL || co->_co_code != NULL
        || co->_co_linearray != NULL || co->_co_linearray_entry_size != 0
        || co->co_warmup != QUICKENING_INITIAL_WARMUP_VALUE || co->co_extra != NULL) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object with per-process state");
    }
    int nplain = 0;
    int rc = check_code_counts(co, &nplain);
    if (rc == PYCDS_OK && co->co_nplaincellvars != nplain) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "code object counts do not match its locals");
    }
    if (rc == PYCDS_OK) {
        rc = check_bytecode(co);
    }
    return rc;
}

/* 3.11's marshal writes a frozenset's items sorted by their own marshalled
 * bytes, iterating the set with borrowed references: an item held by the
 * set and by pycds_layout_frozenset_items' tuple only (two references) was
 * written without FLAG_REF, unless an interned str (w_ref shares those). */
static int
frozenset_item_unflagged(PyObject *item)
{
    return Py_REFCNT(item) == 2
           && !(PyUnicode_CheckExact(item) && PyUnicode_CHECK_INTERNED(item));
}
