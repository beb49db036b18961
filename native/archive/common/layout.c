/* layout.c -- selects the object layout of the CPython being built against.
 *
 * Each supported minor version has one header in layout/ that knows how that
 * version lays out the objects an archive holds (str, bytes, int, float,
 * complex, tuple, code) and what must be reset so that a copy looks exactly
 * like a fresh unmarshal.  Nothing outside these headers depends on a
 * version's struct layout.  This is the only source that sees CPython's
 * internal headers, hence Py_BUILD_CORE here and nowhere else.
 */
#define Py_BUILD_CORE 1
#include "pycds_internal.h"
#include "internal/pycore_gc.h"
#if PY_VERSION_HEX >= 0x030B0000
#  include "internal/pycore_code.h"      /* CO_FAST_*, _Py_OPCODE, _Py_CODEUNIT */
#  include "opcode.h"                    /* RESUME (3.13: opcode_ids.h) */
#endif
#if PY_VERSION_HEX >= 0x030D0000
#  include "internal/pycore_pyhash.h"    /* _Py_HashBytes */
#endif

#include "marshal.h"                     /* PyMarshal_WriteObjectToString */

#include <stdio.h>
#include <string.h>

/* ---- helpers common to every layout ------------------------------------ */

/* unicode_hash() in Objects/unicodeobject.c, the same from 3.10 to 3.13:
 * _Py_HashBytes over the code units, cached in the PyASCIIObject. */
void
pycds_layout_str_prehash(PyObject *op)
{
    ((PyASCIIObject *)op)->hash = _Py_HashBytes(
        PyUnicode_DATA(op), PyUnicode_GET_LENGTH(op) * PyUnicode_KIND(op));
}

/* The items of frozenset op in the order unmarshal adds them (r_object in
 * Python/marshal.c), that is in the order w_complex_object wrote them.
 * 3.11+ writes them sorted by each item's own marshalled bytes, whose first
 * byte carries FLAG_REF where w_ref() takes the item for shared: an interned
 * str, or one with more than one reference.  3.11/3.12 iterate the set with
 * borrowed references, so an item only the set holds is written without the
 * flag; 3.13 iterates with new ones (_PySet_NextEntryRef): always flagged.
 * 3.10 writes them in the writing process's iteration order, which is not
 * known here: sorted by their bytes without the flag, an order that does
 * not depend on the dump's hash seed (docs/importer-compliance.md). */
PyObject *
pycds_layout_frozenset_items(PyObject *op)
{
    PyObject *items = PySequence_Tuple(op);   /* one more reference each */
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *pairs = PyList_New(n), *sorted = NULL;
    if (pairs == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        PyObject *dump = PyMarshal_WriteObjectToString(item, Py_MARSHAL_VERSION);
        if (dump == NULL) {
            goto done;
        }
#if PY_VERSION_HEX < 0x030D0000
        /* Held by the set and by items only: the writer saw one reference
         * (3.11, 3.12).  3.10: never flagged, for the order's sake. */
        if (PyBytes_GET_SIZE(dump) > 0
            && (PY_VERSION_HEX < 0x030B0000
                || (Py_REFCNT(item) == 2
                    && !(PyUnicode_CheckExact(item)
                         && PyUnicode_CHECK_INTERNED(item))))) {
            PyObject *bare = PyBytes_FromStringAndSize(PyBytes_AS_STRING(dump),
                                                       PyBytes_GET_SIZE(dump));
            Py_DECREF(dump);
            if (bare == NULL) {
                goto done;
            }
            PyBytes_AS_STRING(bare)[0] &= (char)0x7f;     /* FLAG_REF */
            dump = bare;
        }
#endif
        PyObject *pair = PyTuple_Pack(2, dump, item);
        Py_DECREF(dump);
        if (pair == NULL) {
            goto done;
        }
        PyList_SET_ITEM(pairs, i, pair);
    }
    if (PyList_Sort(pairs) < 0) {
        goto done;
    }
    sorted = PyTuple_New(n);
    if (sorted != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, i), 1);
            PyTuple_SET_ITEM(sorted, i, Py_NewRef(item));
        }
    }
done:
    Py_XDECREF(pairs);
    Py_DECREF(items);
    return sorted;
}

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
 * code units and a NUL.  The same in every supported version. */
static size_t
compact_str_size(PyObject *op)
{
    size_t len = (size_t)PyUnicode_GET_LENGTH(op);
    if (PyUnicode_IS_ASCII(op)) {
        return sizeof(PyASCIIObject) + len + 1;
    }
    return sizeof(PyCompactUnicodeObject) + (len + 1) * PyUnicode_KIND(op);
}

/* Each layout header defines the reference count archived objects get
 * (3.10/3.11: one no program brings to zero; 3.12+: immortal). */
static void set_refcnt(pycds_writer *w, uint64_t off);

/* The references of the copy at off of code object src: its ob_type slot
 * and its pointer fields (the layout header's PYCDS_CODE_PTR_FIELDS), each
 * target copied or referred to. */
static int copy_code_refs(pycds_writer *w, uint64_t off, PyCodeObject *src,
                          int depth);

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
 * referred to.  The same layout in every supported version; an untracked
 * tuple of immutable items never needs the GC. */
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

/* bytes: the same layout in every version; the hash cache (deprecated
 * since 3.11, still there) starts empty. */
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

#if PY_VERSION_HEX >= 0x030B0000
/* Zero the alignment padding between _co_firsttraceable (an int) and
 * co_extra of the code copy c, which init_code never writes
 * (Objects/codeobject.c, 3.11-3.13): the copy took whatever the allocation
 * held before, and no stale process memory may reach the archive, whose
 * bytes are then the same for the same code. */
static void
zero_code_padding(PyCodeObject *c)
{
    memset((char *)c + offsetof(PyCodeObject, _co_firsttraceable)
               + sizeof(c->_co_firsttraceable),
           0, offsetof(PyCodeObject, co_extra)
                  - offsetof(PyCodeObject, _co_firsttraceable)
                  - sizeof(c->_co_firsttraceable));
}

/* Copy the memory of code object op up to its bytecode's exact end:
 * _PyObject_VAR_SIZE rounds up to 8, and the allocation's tail past the
 * last code unit is uninitialised (the heap block is zero-padded instead).
 * The layout header sets up the rest. */
static int
copy_code_raw(pycds_writer *w, PyObject *op, uint64_t *off)
{
    size_t size = offsetof(PyCodeObject, co_code_adaptive)
                  + (size_t)Py_SIZE(op) * sizeof(_Py_CODEUNIT);
    return copy_raw(w, op, size, 0, off);
}
#endif

/* ---- helpers of pycds_layout_check_object ------------------------------
 *
 * (PYCDSVERIFY=1.)  The loader's structural check (verify.c) proves types
 * and bounds; pycds_layout_check_object proves what marshal.c never reads
 * from a .pyc but the code object's constructor computes or starts empty,
 * and what it rejects (_PyCode_Validate, 3.11-3.13;
 * PyCode_NewWithPosOnlyArgs, 3.10, Objects/codeobject.c), so that a
 * re-signed archive cannot hand CPython a code object no .pyc could give
 * it.  Each layout header defines check_code() (and, 3.12+, check_str()). */

/* The arguments a code object takes, as its constructor counts them. */
static long long
code_nargs(const PyCodeObject *co)
{
    return (long long)co->co_argcount + co->co_kwonlyargcount
           + ((co->co_flags & CO_VARARGS) != 0)
           + ((co->co_flags & CO_VARKEYWORDS) != 0);
}

#if PY_VERSION_HEX >= 0x030B0000
/* init_code() (3.11-3.13): the index of the first RESUME, or the code's
 * length.  A fresh code object's RESUME is not specialised yet (3.13's
 * RESUME_CHECK comes with its first run: layout_312.h, bytecode_is_fresh). */
static Py_ssize_t
first_traceable(PyCodeObject *co)
{
    Py_ssize_t i = 0;
    while (i < Py_SIZE(co) && _Py_OPCODE(_PyCode_CODE(co)[i]) != RESUME) {
        i++;
    }
    return i;
}

/* The counts 3.11 to 3.13 compute alike: argument counts as
 * _PyCode_Validate() accepts them, _co_firsttraceable as init_code() finds
 * it, co_nlocalsplus = names = kinds, and the local, cell and free counts
 * init_code() derives from the kinds (get_localsplus_counts); *nplain gets
 * the cells that are not arguments (3.11's co_nplaincellvars).  0 or
 * PYCDS_E_CORRUPT. */
static int
check_code_counts(PyCodeObject *co, int *nplain)
{
    if (co->co_argcount < co->co_posonlyargcount || co->co_posonlyargcount < 0
        || co->co_kwonlyargcount < 0 || co->co_stacksize < 0
        || co->co_flags < 0 || co->co_firstlineno < 0 || Py_SIZE(co) < 1
        || co->_co_firsttraceable != first_traceable(co)) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object with bad counts");
    }
    Py_ssize_t n = PyTuple_GET_SIZE(co->co_localsplusnames);
    if (co->co_nlocalsplus != n || PyBytes_GET_SIZE(co->co_localspluskinds) != n) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object locals do not match");
    }
    const unsigned char *kinds =
        (const unsigned char *)PyBytes_AS_STRING(co->co_localspluskinds);
    int nlocals = 0, ncells = 0, nfree = 0;
    *nplain = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kinds[i] & CO_FAST_LOCAL) {
            nlocals++;
            if (kinds[i] & CO_FAST_CELL) {
                ncells++;
            }
        }
        else if (kinds[i] & CO_FAST_CELL) {
            ncells++;
            ++*nplain;
        }
        else if (kinds[i] & CO_FAST_FREE) {
            nfree++;
        }
    }
    if (co->co_nlocals != nlocals || co->co_ncellvars != ncells
        || co->co_nfreevars != nfree || code_nargs(co) > nlocals) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object counts do not match "
                          "its locals");
    }
    return PYCDS_OK;
}
#endif

#if PY_VERSION_HEX < 0x030C0000
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
#endif

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
/* 3.11's and 3.12's tables of inline cache sizes and of the base opcode of
 * every specialised one, from their own header (libpython does not export
 * them): check_bytecode() below, bytecode_is_fresh() in layout_312.h. */
#  define NEED_OPCODE_TABLES
#  define _PyOpcode_RelativeJump pycds_opcode_relative_jump
#  define _PyOpcode_Jump pycds_opcode_jump
#  define _PyOpcode_Caches pycds_opcode_caches
#  define _PyOpcode_Deopt pycds_opcode_deopt
#  include "internal/pycore_opcode.h"
#  undef NEED_OPCODE_TABLES
#  define PYCDS_OPCODE_CACHES pycds_opcode_caches
#  define PYCDS_OPCODE_DEOPT pycds_opcode_deopt
#elif PY_VERSION_HEX >= 0x030D0000
/* The same tables of 3.13, in its pycore_opcode_metadata.h, which defines
 * more with them (each renamed: libpython's are its own, not exported). */
#  define NEED_OPCODE_METADATA
#  define _PyOpcode_num_popped pycds_opcode_num_popped_313
#  define _PyOpcode_num_pushed pycds_opcode_num_pushed_313
#  define _PyOpcode_opcode_metadata pycds_opcode_metadata_313
#  define _PyOpcode_macro_expansion pycds_opcode_macro_expansion_313
#  define _PyOpcode_OpName pycds_opcode_opname_313
#  define _PyOpcode_Caches pycds_opcode_caches_313
#  define _PyOpcode_Deopt pycds_opcode_deopt_313
#  define _PyOpcode_PseudoTargets pycds_opcode_pseudo_targets_313
#  include "internal/pycore_opcode_metadata.h"
#  undef NEED_OPCODE_METADATA
#  define PYCDS_OPCODE_CACHES pycds_opcode_caches_313
#  define PYCDS_OPCODE_DEOPT pycds_opcode_deopt_313
#endif

#if PY_VERSION_HEX >= 0x030B0000
/* Bytecode as a fresh code object has it (the writer's copy_code writes no
 * other), checked under PYCDSVERIFY=1: every instruction its own base
 * opcode (3.12: or a cache-less superinstruction _PyCode_Quicken writes);
 * none instrumented (3.12+) nor ENTER_EXECUTOR (3.13), which read
 * _co_monitoring and co_executors, NULL here; no CACHE or unknown opcode as
 * an instruction; the inline caches inside the code.  Even reading co_code
 * relies on that: deopt_code (Objects/codeobject.c, 3.11-3.13) follows
 * those pointers and zeroes caches past the end of a code that cuts them
 * short. */
static int
check_bytecode(PyCodeObject *co)
{
    const _Py_CODEUNIT *code = _PyCode_CODE(co);
    Py_ssize_t n = Py_SIZE(co);
    for (Py_ssize_t i = 0; i < n; i++) {
        int op = _Py_OPCODE(code[i]);
        int base = PYCDS_OPCODE_DEOPT[op];
        int caches = PYCDS_OPCODE_CACHES[base];
        if (base == CACHE || caches > n - 1 - i
#  if PY_VERSION_HEX >= 0x030C0000
            || op >= MIN_INSTRUMENTED_OPCODE
#  endif
#  if PY_VERSION_HEX >= 0x030D0000
            || op == ENTER_EXECUTOR
#  endif
#  if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
            || (op != base && caches != 0)
#  else
            || op != base
#  endif
            ) {
            return pycds_fail(PYCDS_E_CORRUPT, "code object bytecode holds an "
                              "instruction unmarshal never makes (opcode %d at %zd)",
                              op, i);
        }
        i += caches;
    }
    return PYCDS_OK;
}
#endif

#if PY_VERSION_HEX >= 0x030C0000
#  include "layout/layout_312.h"        /* 3.12 and 3.13 */
#elif PY_VERSION_HEX >= 0x030B0000
#  include "layout/layout_311.h"
#else
#  include "layout/layout_310.h"
#endif

static int
copy_code_refs(pycds_writer *w, uint64_t off, PyCodeObject *src, int depth)
{
    int rc = copy_type_slot(w, off, (PyObject *)src);
#define COPY_FIELD(f)                                                   \
    if (rc == PYCDS_OK) {                                               \
        rc = pycds_w_slot(w, off + offsetof(PyCodeObject, f),           \
                          (PyObject *)src->f, depth);                   \
    }
    PYCDS_CODE_PTR_FIELDS(COPY_FIELD)
#undef COPY_FIELD
    return rc;
}

/* The same test in every supported version. */
int
pycds_layout_str_interned(PyObject *op)
{
    return PyUnicode_CHECK_INTERNED(op) != SSTATE_NOT_INTERNED;
}

/* Every layout header defines copy_str, copy_long and copy_code for its
 * version; bytes, floats, complexes and tuples are alike in all. */
int
pycds_layout_copy(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    if (PyUnicode_CheckExact(op)) {
        return copy_str(w, op, off);
    }
    if (PyBytes_CheckExact(op)) {
        return copy_bytes(w, op, off);
    }
    if (PyLong_CheckExact(op)) {
        return copy_long(w, op, off);
    }
    if (PyFloat_CheckExact(op)) {
        return copy_plain(w, op, sizeof(PyFloatObject), 0, off);
    }
    if (PyComplex_CheckExact(op)) {
        return copy_plain(w, op, sizeof(PyComplexObject), 0, off);
    }
    if (PyTuple_CheckExact(op)) {
        return copy_tuple(w, op, depth, off);
    }
    if (PyCode_Check(op)) {
        return copy_code(w, op, depth, off);
    }
    return unsupported(op);
}

#ifndef PYCDS_LAYOUT_HEAP_SINGLETONS
/* The layout's shared instances (small ints, 1-char strs, empty
 * singletons) are static objects of the image: pycds_w_slot() refers to
 * them as EXTERNAL before asking, so there is never a SINGLETON slot. */
int
pycds_layout_heap_singleton(PyObject *op)
{
    (void)op;
    return 0;
}

int
pycds_layout_use_singleton(PyObject **slot)
{
    (void)slot;
    return pycds_fail(PYCDS_E_CORRUPT,
                      "SINGLETON relocation in a %s archive", PYCDS_LAYOUT_NAME);
}
#endif

#ifndef PYCDS_LAYOUT_HAS_INTERN_RESERVE
int
pycds_layout_intern_reserve(uint64_t n, uint64_t *room)
{
    *room = n;
    return PYCDS_OK;
}
#endif

#ifndef PYCDS_LAYOUT_HAS_VERSION_COUNTER
/* Only 3.12 draws code versions from a counter private to libpython. */
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
#endif

#ifndef PYCDS_LAYOUT_HAS_AFTER_LOAD
/* Code objects of this layout carry no per-process state that init_code
 * sets (3.10, 3.11: the copy is complete as it is). */
int
pycds_layout_after_load(PyObject *root)
{
    (void)root;
    return PYCDS_OK;
}
#endif

/* Release of a module's tail (release.c). */
int
pycds_layout_tail_walkable(void)
{
#ifdef PYCDS_LAYOUT_RAW_DATA
    return 0;
#else
    return 1;
#endif
}

Py_ssize_t
pycds_layout_refcnt(int in_tail)
{
    return in_tail ? PYCDS_TAIL_REFCNT : PYCDS_HEAD_REFCNT;
}

#ifndef PYCDS_LAYOUT_HAS_RELEASE_HOOKS
/* 3.10, 3.11: a code object may go unless a weak reference or co_extra
 * data (PEP 523) refers to it.  Nothing else of the interpreter refers to
 * a code object uncounted. */
int
pycds_layout_may_release(PyObject *root)
{
    PyCodeObject *co = (PyCodeObject *)root;
    return co->co_weakreflist == NULL && co->co_extra == NULL;
}
#endif

#ifndef PYCDS_LAYOUT_HAS_FORGET_CODE
/* 3.10: chunks are never given back (release.c). */
void
pycds_layout_forget_code(PyObject *op)
{
    (void)op;
}
#endif

int
pycds_layout_check_object(const pycds_place *p, PyObject *op)
{
    if (PyUnicode_CheckExact(op)) {
        return check_str(op);
    }
    if (PyCode_Check(op)) {
        return check_code(p, (PyCodeObject *)op);
    }
    return PYCDS_OK;
}

/* Facts every layout shares: the offsets of the static objects an archive
 * may point at, from the anchor.  Same build id => same offsets, but the
 * offsets also catch a rebuilt interpreter without a build id. */
static uint64_t
static_offsets_hash(void)
{
    const void *objs[] = {
        &PyUnicode_Type, &PyBytes_Type, &PyLong_Type, &PyFloat_Type,
        &PyComplex_Type, &PyTuple_Type, &PyFrozenSet_Type, &PyCode_Type,
        &PyBool_Type, Py_True, Py_False, Py_Ellipsis,
    };
    int64_t deltas[sizeof(objs) / sizeof(objs[0])];
    for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
        deltas[i] = (int64_t)((uintptr_t)objs[i] - pycds_image_anchor());
    }
    return pycds_hash64(deltas, sizeof(deltas), 0);
}

/* Text describing the layout facts an archive depends on. */
static int
describe_layout(char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s;hex=%08lx;build=%s;statics=%016llx;%s",
                     PYCDS_LAYOUT_NAME, (unsigned long)PY_VERSION_HEX,
                     pycds_image_build_id(),
                     (unsigned long long)static_offsets_hash(),
                     PYCDS_LAYOUT_SIZES);
    if (n < 0 || (size_t)n >= cap) {
        return pycds_fail(PYCDS_E_ARG, "layout id buffer too small");
    }
    return PYCDS_OK;
}

int
pycds_layout_id(char *buf, size_t cap)
{
    if (buf == NULL || cap == 0) {
        return pycds_fail(PYCDS_E_ARG, "no buffer for the layout id");
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = pycds_image_init();
    if (rc == PYCDS_OK) {
        rc = describe_layout(buf, cap);
    }
    PyGILState_Release(g);
    return rc;
}

/* ---- what the loader's structural check needs to know ----------------- */

/* The type each pointer field of a code object must have, by field name,
 * for every name a layout's PYCDS_CODE_PTR_FIELDS may list (3.10-3.13:
 * Include/cpython/code.h).  A new field name fails to compile here, which is
 * the point: the loader must be told what the field holds. */
#define PYCDS_FIELD_TYPE_co_code (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_consts (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_names (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_varnames (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_freevars (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_cellvars (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_exceptiontable (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_localsplusnames (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_localspluskinds (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_filename (&PyUnicode_Type)
#define PYCDS_FIELD_TYPE_co_name (&PyUnicode_Type)
#define PYCDS_FIELD_TYPE_co_qualname (&PyUnicode_Type)
#define PYCDS_FIELD_TYPE_co_linetable (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_lnotab (&PyBytes_Type)

/* Tuples of names hold only str (codeobject.c, intern_strings()). */
#define PYCDS_FIELD_ITEMS_co_code NULL
#define PYCDS_FIELD_ITEMS_co_consts NULL
#define PYCDS_FIELD_ITEMS_co_names (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_varnames (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_freevars (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_cellvars (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_exceptiontable NULL
#define PYCDS_FIELD_ITEMS_co_localsplusnames (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_localspluskinds NULL
#define PYCDS_FIELD_ITEMS_co_filename NULL
#define PYCDS_FIELD_ITEMS_co_name NULL
#define PYCDS_FIELD_ITEMS_co_qualname NULL
#define PYCDS_FIELD_ITEMS_co_linetable NULL
#define PYCDS_FIELD_ITEMS_co_lnotab NULL

static const pycds_code_field code_fields[] = {
#define CODE_FIELD(f) {offsetof(PyCodeObject, f), PYCDS_FIELD_TYPE_##f, \
                       PYCDS_FIELD_ITEMS_##f},
    PYCDS_CODE_PTR_FIELDS(CODE_FIELD)
#undef CODE_FIELD
};

size_t
pycds_layout_code_fields(const pycds_code_field **out)
{
    *out = code_fields;
    return sizeof(code_fields) / sizeof(code_fields[0]);
}
