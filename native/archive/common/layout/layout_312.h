/* layout_312.h -- CPython 3.12 and 3.13 object layout for archived objects.
 *
 * Included by layout.c only.  Sources (3.12 branch, checked against the
 * 3.12.1 headers): Include/cpython/code.h (_PyCode_DEF),
 * Include/cpython/unicodeobject.h (PyASCIIObject, PyCompactUnicodeObject),
 * Include/cpython/bytesobject.h, Include/cpython/longintrepr.h
 * (_PyLongValue), Include/internal/pycore_long.h (_PyLong_DigitCount),
 * Include/object.h (_Py_IMMORTAL_REFCNT), Include/internal/pycore_gc.h
 * (PyGC_Head), Include/internal/pycore_interp.h (code_watchers,
 * cached_objects.interned_strings), Include/internal/pycore_global_objects.h
 * (_PyRuntime.cached_objects.interned_strings, the table of statically
 * allocated strings); Objects/codeobject.c (init_code, _PyCode_Quicken,
 * notify_code_watchers), Objects/unicodeobject.c
 * (_PyUnicode_InternInPlace), Python/marshal.c (r_object) and
 * Tools/build/deepfreeze.py.
 *
 * What differs from 3.11:
 *   - Immortal objects (PEP 683): every archived object gets the immortal
 *     reference count, so Py_INCREF/Py_DECREF never write to it and it is
 *     never deallocated.  Strings interned by unmarshal are immortal too.
 *   - int: ob_size became long_value.lv_tag (digit count << 3 | sign).
 *   - str: no wstr; state has a statically_allocated bit; interning has the
 *     states MORTAL / IMMORTAL / IMMORTAL_STATIC.  See pycds_layout_intern().
 *   - code: quickened at creation (init_code calls _PyCode_Quicken), so a
 *     fresh code object's co_code_adaptive already holds the adaptive
 *     counters a fresh unmarshal leaves; copy_code() writes that state,
 *     taken from a replica made by code.replace() (which runs init_code on
 *     the deoptimised bytecode, as unmarshal does), whatever the source's
 *     run left in it.  New
 *     per-process fields: co_version (drawn from a global counter by
 *     init_code; functions take it as func_version, which specialised CALLs
 *     use as a guard, so it must be unique in the process),
 *     _co_cached, _co_instrumentation_version, _co_monitoring; and code
 *     watchers are told about each new code object.  co_version and the
 *     watchers are handled at load by pycds_layout_after_load().
 *
 * What differs in 3.13 (marked PYCDS_313 below; the 3.13 sources are the
 * same files of the 3.13 branch, checked against the 3.13.0 headers and the
 * disassembly of its libpython, plus Include/internal/pycore_function.h):
 *   - code: a new per-process pointer, co_executors (tier-2 executors),
 *     NULL at creation.  co_version is drawn from the interpreter's
 *     func_state.next_version (init_code: take it, increment unless 0), which
 *     3.13 keeps in PyInterpreterState, so the load draws it directly.
 *     PyFunction_New copies co_version into func_version, the guard of
 *     specialised calls and the key of the function version cache: a copied
 *     (stale) value would collide with the dump process's numbering.
 *   - str interning: unmarshal calls _PyUnicode_InternImmortal (a string
 *     already interned mortal is made immortal); PyUnicode_InternInPlace
 *     interns mortal (_PyUnicode_InternMortal), so the loader calls
 *     _PyUnicode_InternImmortal as unmarshal does: a mortal name in a code
 *     object is freed by CPython 3.13.0's keyword-argument suggestions,
 *     which drop references to co_varnames items they never took.  A tail's str, and any in a debug build, is
 *     never made the interned one (pycds_layout_intern gives the slot an
 *     interpreter-owned copy): code in _PyUnicode_ClearInterned that makes
 *     SSTATE_INTERNED_IMMORTAL strings mortal again at exit (debug builds,
 *     and every build from 3.14; a 3.13.0 release build leaves them
 *     immortal, checked with gdb) would free() it.
 */
#ifdef Py_GIL_DISABLED
#  error "pycds does not support the free-threaded build (its object header differs)"
#endif
#define PYCDS_313 (PY_VERSION_HEX >= 0x030D0000)

#include "internal/pycore_gc.h"
#include "opcode.h"                      /* 3.13: opcode_ids.h */
#include "internal/pycore_code.h"
#include "internal/pycore_frame.h"       /* FRAME_SPECIALS_SIZE */
#include "internal/pycore_interp.h"
#include "internal/pycore_long.h"
#include "internal/pycore_pystate.h"
#include "internal/pycore_hashtable.h"
#include "internal/pycore_runtime.h"
#if PYCDS_313
/* PyDictKeysObject: dk_usable.  (Its pycore_object.h has an unused
 * parameter under -Wextra: not ours to fix.) */
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wunused-parameter"
#  include "internal/pycore_dict.h"
#  pragma GCC diagnostic pop
#endif

#if PYCDS_313
#  define PYCDS_LAYOUT_NAME "cpython-3.13"
#else
#  define PYCDS_LAYOUT_NAME "cpython-3.12"
#endif
#define PYCDS_STR2(x) #x
#define PYCDS_STR(x) PYCDS_STR2(x)
#define PYCDS_LAYOUT_SIZES                                         \
    "code=" PYCDS_STR(SIZEOF_VOID_P) "/"                           \
    "gc=" PYCDS_STR(SIZEOF_VOID_P)

/* This layout needs per-process work on each loaded code object. */
#define PYCDS_LAYOUT_HAS_AFTER_LOAD 1

/* Pointer fields of PyCodeObject copied with the code object; order matches
 * Include/cpython/code.h (3.12).  Fields not listed are scalars copied as
 * they are, or per-process state reset by copy_code(). */
#define PYCDS_CODE_PTR_FIELDS(X)                                   \
    X(co_consts) X(co_names) X(co_exceptiontable)                  \
    X(co_localsplusnames) X(co_localspluskinds) X(co_filename)     \
    X(co_name) X(co_qualname) X(co_linetable)

/* Objects of a module's tail (writer.c) are mortal, so that the loader can
 * tell whether anything holds them once the module body has run
 * (release.c, pycds_archive_release); the rest are immortal.  The tail count
 * is one no program brings to zero nor into the immortal range: Py_INCREF
 * (Include/object.h, 64-bit) adds to the low 32 bits only, which start at
 * 2^30, far below the 2^31 where _Py_IsImmortal() would say immortal;
 * Py_DECREF subtracts from the whole word. */
#define PYCDS_TAIL_REFCNT (((Py_ssize_t)1 << 60) + ((Py_ssize_t)1 << 30))
#define PYCDS_HEAD_REFCNT _Py_IMMORTAL_REFCNT

static void
set_refcnt(pycds_writer *w, uint64_t off)
{
    PyObject *copy = (PyObject *)pycds_w_at(w, off);
    copy->ob_refcnt = pycds_w_in_tail(w, off) ? PYCDS_TAIL_REFCNT
                                              : PYCDS_HEAD_REFCNT;
}

/* A code object may go only if nothing refers to it without a reference
 * count: a weak reference, co_extra data (PEP 523), sys.monitoring data,
 * tier-2 executors (3.13), or a code watcher, which would expect a
 * PY_CODE_EVENT_DESTROY first. */
#define PYCDS_LAYOUT_HAS_RELEASE_HOOKS 1
#define PYCDS_LAYOUT_HAS_FORGET_CODE 1

int
pycds_layout_may_release(PyObject *root)
{
    PyCodeObject *co = (PyCodeObject *)root;
    if (co->co_weakreflist != NULL || co->co_extra != NULL
        || co->_co_monitoring != NULL
        || PyInterpreterState_Get()->active_code_watchers != 0) {
        return 0;
    }
#if PYCDS_313
    if (co->co_executors != NULL) {
        return 0;
    }
#endif
    return 1;
}

/* What code_dealloc (Objects/codeobject.c) undoes that a code object about
 * to be given back may still be registered in: 3.13's function version
 * cache holds a borrowed pointer to the code object of every function
 * given a version (_PyFunction_SetVersion, Objects/funcobject.c), cleared
 * by _PyFunction_ClearCodeByVersion (not exported) when the code object is
 * deallocated, and read by it, and by _PyFunction_LookupByVersion, for any
 * code object of the same version modulo FUNC_VERSION_CACHE_SIZE. */
void
pycds_layout_forget_code(PyObject *op)
{
    PyCodeObject *co = (PyCodeObject *)op;
    /* The cached co_code, co_varnames, co_cellvars and co_freevars, as
     * code_dealloc frees them (Objects/codeobject.c, 3.12 and 3.13). */
    _PyCoCached *cached = co->_co_cached;
    if (cached != NULL) {
        co->_co_cached = NULL;
        Py_XDECREF(cached->_co_code);
        Py_XDECREF(cached->_co_cellvars);
        Py_XDECREF(cached->_co_freevars);
        Py_XDECREF(cached->_co_varnames);
        PyMem_Free(cached);
    }
#if PYCDS_313
    struct _func_version_cache_item *slot =
        PyInterpreterState_Get()->func_state.func_version_cache
        + (co->co_version % FUNC_VERSION_CACHE_SIZE);
    if (slot->code == op) {
        slot->code = NULL;
        slot->func = NULL;
    }
#endif
}

/* ---- load-time check of what marshal would have validated --------------
 *
 * (layout.c, pycds_layout_check_object.)  Besides the counts 3.11 to 3.13
 * share (check_code_counts): co_framesize (3.12+ sizes every frame from it:
 * _PyFrame_PushUnchecked), and the per-process fields copy_code() resets
 * (co_version is drawn after this check: pycds_layout_after_load).  For
 * str: the interning state and the cached UTF-8 block copy_str() resets.
 * The object has passed the structural check (its pointer fields point at
 * objects of the right types). */

static int
check_str(PyObject *op)
{
    PyASCIIObject *a = (PyASCIIObject *)op;
    if (a->state.interned != SSTATE_NOT_INTERNED || a->state.statically_allocated
        || (!a->state.ascii
            && (((PyCompactUnicodeObject *)op)->utf8 != NULL
                || ((PyCompactUnicodeObject *)op)->utf8_length != 0))) {
        return pycds_fail(PYCDS_E_CORRUPT, "str with per-process state");
    }
    return PYCDS_OK;
}

static int
check_code(const pycds_place *p, PyCodeObject *co)
{
    (void)p;
    if (co->co_version != 0 || co->co_weakreflist != NULL || co->_co_cached != NULL
        || co->_co_instrumentation_version != 0 || co->_co_monitoring != NULL
#if PYCDS_313
        || co->co_executors != NULL
#endif
        || co->co_extra != NULL) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object with per-process state");
    }
    int nplain = 0;
    int rc = check_code_counts(co, &nplain);
    if (rc == PYCDS_OK
        && (long long)co->co_framesize
               != (long long)co->co_nlocalsplus + co->co_stacksize + FRAME_SPECIALS_SIZE) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "code object frame size does not match");
    }
    if (rc == PYCDS_OK) {
        rc = check_bytecode(co);
    }
    return rc;
}

static int
copy_str(pycds_writer *w, PyObject *op, uint64_t *off)
{
    if (!PyUnicode_IS_COMPACT(op)) {
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
     * the unnamed 24 bits nor the padding after them: rebuild the state in
     * zeroed memory, so the archive holds no uninitialised bytes.  interned
     * stays 0 (SSTATE_NOT_INTERNED) and statically_allocated 0: the copy is
     * a heap string. */
    unsigned int kind = a->state.kind, compact = a->state.compact;
    unsigned int ascii = a->state.ascii;
    memset((char *)a + offsetof(PyASCIIObject, state), 0,
           sizeof(PyASCIIObject) - offsetof(PyASCIIObject, state));
    a->state.kind = kind;
    a->state.compact = compact;
    a->state.ascii = ascii;
    if (!PyUnicode_IS_ASCII(op)) {
        /* The UTF-8 cache is a PyObject_Malloc block of this process. */
        PyCompactUnicodeObject *c = (PyCompactUnicodeObject *)a;
        c->utf8 = NULL;
        c->utf8_length = 0;
    }
    return copy_type_slot(w, *off, op);
}

static int
copy_long(pycds_writer *w, PyObject *op, uint64_t *off)
{
    /* long_alloc() always allocates at least one digit. */
    Py_ssize_t n = _PyLong_DigitCount((PyLongObject *)op);
    size_t size = offsetof(PyLongObject, long_value.ob_digit)
                  + sizeof(digit) * (size_t)(n > 0 ? n : 1);
    return copy_plain(w, op, size, 0, off);
}

/* The first inline cache entry of an instruction with caches as
 * _PyCode_Quicken writes it (Python/specialize.c): 3.12, the adaptive
 * counter at adaptive_counter_warmup(); 3.13, that too, but JUMP_BACKWARD's
 * starts at initial_jump_backoff_counter() and the POP_JUMP_IF_* ones hold
 * a branch history that starts as alternating bits, 0x5555 (3.13.0: every
 * code object compiled from 150 stdlib modules has exactly these values). */
static uint16_t
initial_cache(int base)
{
#if PYCDS_313
    switch (base) {
    case JUMP_BACKWARD:
        return initial_jump_backoff_counter().as_counter;
    case POP_JUMP_IF_FALSE:
    case POP_JUMP_IF_TRUE:
    case POP_JUMP_IF_NONE:
    case POP_JUMP_IF_NOT_NONE:
        return 0x5555;
    default:
        return adaptive_counter_warmup().as_counter;
    }
#else
    (void)base;
    return adaptive_counter_warmup();
#endif
}

/* 1 if the adaptive bytecode of src is still what init_code left in it (as
 * after unmarshal): never executed, never instrumented, no executor; 0 when
 * that is not certain.  Every instruction is its own base opcode (not
 * specialised: 3.13's RESUME becomes RESUME_CHECK the first time it runs;
 * not instrumented; 3.12's superinstructions, cache-less, are written by
 * _PyCode_Quicken itself), every first cache entry holds its initial value
 * (initial_cache: the first execution moves the counter, and later ones
 * specialise the instruction or back the counter off, never to that value
 * again) and the other entries are zero, as _PyCode_Quicken leaves them
 * (Python/specialize.c, 3.12 and 3.13); a deoptimised instruction keeps
 * what its specialisation wrote there.  No test of the first RESUME alone:
 * code that ran only under sys.settrace keeps a plain RESUME, its body
 * specialised.  Instrumentation sets
 * _co_instrumentation_version and _co_monitoring (Python/instrumentation.c);
 * 3.13's executors hang on co_executors. */
static int
bytecode_is_fresh(PyCodeObject *src)
{
    if (src->_co_instrumentation_version != 0 || src->_co_monitoring != NULL) {
        return 0;
    }
#if PYCDS_313
    if (src->co_executors != NULL) {
        return 0;
    }
#endif
    const _Py_CODEUNIT *code = _PyCode_CODE(src);
    Py_ssize_t n = Py_SIZE(src);
    for (Py_ssize_t i = 0; i < n; i++) {
        int op = code[i].op.code;
        if (op >= MIN_INSTRUMENTED_OPCODE) {
            return 0;
        }
        int base = PYCDS_OPCODE_DEOPT[op];
        int caches = PYCDS_OPCODE_CACHES[base];
#if PYCDS_313
        if (op != base) {
            return 0;             /* RESUME_CHECK has no caches */
        }
#endif
        if (caches == 0) {
            continue;
        }
        if (op != base || i + caches >= n || code[i + 1].cache != initial_cache(base)) {
            return 0;
        }
        for (int k = 2; k <= caches; k++) {
            if (code[i + k].cache != 0) {
                return 0;
            }
        }
        i += caches;
    }
    return 1;
}

/* Overwrite the bytecode of copy c with what init_code makes of src's
 * bytecode (as after unmarshal: no specialised or instrumented instruction,
 * every counter at its initial value).  Code that has run holds
 * specialisations and counters, and instrumentation under sys.monitoring or
 * a trace function.  The reference is a replica from code.replace(), which
 * deoptimises the bytecode (_PyCode_GetCode) and builds a new code object
 * through init_code and _PyCode_Quicken (Objects/codeobject.c, 3.12 and
 * 3.13), as marshal's round trip does. */
static int
fresh_bytecode(PyCodeObject *src, PyCodeObject *c)
{
    if (bytecode_is_fresh(src)) {
        return PYCDS_OK;          /* copied as it is */
    }
    PyObject *replica = PyObject_CallMethod((PyObject *)src, "replace", NULL);
    if (replica == NULL) {
        return pycds_fail_python("replicating a code object");
    }
    int rc = PYCDS_OK;
    if (!PyCode_Check(replica) || Py_SIZE(replica) != Py_SIZE(src)) {
        rc = pycds_fail(PYCDS_E_UNSUPPORTED,
                        "a replica of a code object has another size");
    }
    else {
        memcpy(c->co_code_adaptive,
               ((PyCodeObject *)replica)->co_code_adaptive,
               (size_t)Py_SIZE(src) * sizeof(_Py_CODEUNIT));
    }
    Py_DECREF(replica);
    return rc;
}

static int
copy_code(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    PyCodeObject *src = (PyCodeObject *)op;
    int rc = copy_code_raw(w, op, off);
    if (rc) {
        return rc;
    }
    set_refcnt(w, *off);
    PyCodeObject *c = (PyCodeObject *)pycds_w_at(w, *off);
    /* Per-process state starts as init_code leaves it; co_version is drawn
     * at load (pycds_layout_after_load). */
    c->co_version = 0;
    c->co_weakreflist = NULL;
    c->_co_cached = NULL;
    c->_co_instrumentation_version = 0;
    c->_co_monitoring = NULL;
#if PYCDS_313
    c->co_executors = NULL;
#endif
    c->co_extra = NULL;
    rc = fresh_bytecode(src, c);
    if (rc) {
        return rc;
    }
    zero_code_padding(c);
    rc = copy_code_refs(w, *off, src, depth);
    return rc;
}

int
pycds_layout_intern(PyObject **slot)
{
    /* Unmarshal interns immortal: PyUnicode_InternInPlace in 3.12,
     * _PyUnicode_InternImmortal in 3.13 (SSTATE_INTERNED_IMMORTAL; a string
     * interned mortal before is made immortal), or hands out the one already
     * interned.  The slot gets exactly that object:
     *   1. a statically allocated string (_PyRuntime's table, looked up
     *      first, as _PyUnicode_InternInPlace does) or an interned one of
     *      this interpreter, if there is one: both are immortal;
     *   2. otherwise, on a release build, the chunk's own string if it lies
     *      in the head (immortal: set_refcnt), interned as unmarshal interns
     *      its own.  A release build never frees an immortal interned
     *      string: 3.12's _PyUnicode_ClearInterned only clears the dict
     *      (also after 3.12.6 backported mortal interned strings,
     *      gh-113993); 3.13's gives the dict's references back to mortal
     *      ones only and clears the state bits of immortal ones (making
     *      those mortal again is Py_DEBUG-only there, gh-120520, and in
     *      every build from 3.14, gh-113601).  A copy would leave the head's
     *      string dead and cost a heap string as well;
     *   3. otherwise a new interpreter-owned copy, interned as unmarshal
     *      would: never the chunk's own string in a debug build (its
     *      _PyUnicode_ClearInterned makes interned strings mortal again at
     *      exit and would free() it) or one with assertions on (3.13's
     *      immortalize_interned asserts the string is not immortal yet;
     *      NDEBUG comes with the interpreter's own CFLAGS, which build this
     *      module), nor a tail's (it would keep its tail page). */
    PyObject *s = *slot;
#if !defined(Py_DEBUG) && defined(NDEBUG)
    if (_Py_IsImmortal(s)) {
        /* Cases 1 and 2 in one call: the interpreter's own interning looks
         * the static strings up first, then this interpreter's interned
         * dict, and inserts s only where neither has its value. */
#  if PYCDS_313
        _PyUnicode_InternImmortal(PyInterpreterState_Get(), slot);
#  else
        PyUnicode_InternInPlace(slot);
#  endif
        if (PyErr_Occurred()) {
            return pycds_fail_python("interning a string");
        }
        return PYCDS_OK;
    }
#endif
    _Py_hashtable_t *statics = _PyRuntime.cached_objects.interned_strings;
    if (statics != NULL) {
        PyObject *r = (PyObject *)_Py_hashtable_get(statics, s);
        if (r != NULL) {
            *slot = r;
            return PYCDS_OK;
        }
    }
    PyInterpreterState *interp = PyInterpreterState_Get();
    PyObject *interned = _Py_INTERP_CACHED_OBJECT(interp, interned_strings);
    if (interned != NULL) {
        PyObject *t = PyDict_GetItemWithError(interned, s);
        if (t != NULL && _Py_IsImmortal(t)) {
            *slot = t;
            return PYCDS_OK;
        }
        if (t == NULL && PyErr_Occurred()) {
            return pycds_fail_python("looking up an interned string");
        }
    }
    PyObject *fresh = PyUnicode_FromKindAndData(PyUnicode_KIND(s),
                                                PyUnicode_DATA(s),
                                                PyUnicode_GET_LENGTH(s));
    if (fresh == NULL) {
        return pycds_fail_python("copying a string to intern");
    }
#if PYCDS_313
    _PyUnicode_InternImmortal(interp, &fresh);
#else
    PyUnicode_InternInPlace(&fresh);     /* immortal in 3.12 */
#endif
    if (PyErr_Occurred()) {
        Py_DECREF(fresh);
        return pycds_fail_python("interning a string");
    }
    /* The archive keeps this reference for good. */
    *slot = fresh;
    return PYCDS_OK;
}

#if PYCDS_313
#define PYCDS_LAYOUT_HAS_INTERN_RESERVE 1

/* 3.13's dict_setdefault_ref_lock_held (Objects/dictobject.c, 3.13.0)
 * counts an entry it failed to insert: when the table must grow and the
 * allocation fails, ma_used goes up all the same, and the next resize of
 * that dict reads past its entries.  _PyUnicode_InternImmortal inserts
 * with PyDict_SetDefaultRef, so one string failing to intern under memory
 * pressure corrupted the interned dict and crashed the process later (any
 * import's unmarshal).  Before a load interns n strings, the interned dict
 * is given room for them through PyDict_SetItem, whose failure leaves the
 * dict intact: the load then fails cleanly (the module is imported
 * plainly) and no intern of the load grows the table.
 *
 * The room one resize gives is what is left of three times the dict's
 * entries (GROWTH_RATE), not any number: when n is more, *room says how
 * many the dict takes now without growing (at least one), and the caller
 * reserves again after that many. */
int
pycds_layout_intern_reserve(uint64_t n, uint64_t *room)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    PyObject *interned = _Py_INTERP_CACHED_OBJECT(interp, interned_strings);
    *room = n;
    if (interned == NULL || !PyDict_CheckExact(interned)
        || ((PyDictObject *)interned)->ma_keys->dk_usable > (Py_ssize_t)n) {
        return PYCDS_OK;
    }
    /* A str key, so that the dict keeps its unicode-keys form; a fresh
     * object no interned string can be (lookups compare by value, and the
     * GIL is held until it is gone again). */
    PyObject *tmp = PyUnicode_FromString("\x01pycds: room for interned strings");
    if (tmp == NULL) {
        return pycds_fail_python("reserving room for interned strings");
    }
    int rc = PYCDS_OK;
    int had = PyDict_Contains(interned, tmp);
    int resized = 0;
    /* Each insert takes one free entry until the table grows; after one
     * resize, another would give no more room (the dict's size is what
     * decides it, and that does not change here). */
    while (rc == PYCDS_OK && had == 0 && !resized
           && ((PyDictObject *)interned)->ma_keys->dk_usable <= (Py_ssize_t)n) {
        PyDictKeysObject *keys = ((PyDictObject *)interned)->ma_keys;
        if (PyDict_SetItem(interned, tmp, tmp) < 0) {
            rc = pycds_fail_python("reserving room for interned strings");
        }
        else if (PyDict_DelItem(interned, tmp) < 0) {
            rc = pycds_fail_python("reserving room for interned strings");
        }
        resized = ((PyDictObject *)interned)->ma_keys != keys;
    }
    if (had < 0) {
        rc = pycds_fail_python("reserving room for interned strings");
    }
    Py_DECREF(tmp);
    if (rc == PYCDS_OK) {
        Py_ssize_t usable = ((PyDictObject *)interned)->ma_keys->dk_usable;
        if (usable <= (Py_ssize_t)n) {
            *room = usable > 1 ? (uint64_t)usable - 1 : 1;
        }
    }
    return rc;
}
#endif

/* ---- per-process state of loaded code objects ------------------------ */

#if PYCDS_313
/* Draw the next code version exactly as init_code does (3.13.0
 * Objects/codeobject.c): the interpreter's counter, incremented unless it
 * ran out (0: no more versions; functions then never specialise). */
static int
draw_code_version(PyInterpreterState *interp, uint32_t *version)
{
    uint32_t v = interp->func_state.next_version;
    if (v != 0) {
        interp->func_state.next_version = v + 1;
    }
    *version = v;
    return PYCDS_OK;
}
#else
/* A tiny code object (never freed; the main interpreter's, as all of pycds)
 * and the constructor arguments taken from it once: replicas made from
 * them draw code versions. */
static PyCodeObject *version_template;
static struct _PyCodeConstructor version_con;
/* _Py_next_func_version itself, once found and checked
 * (pycds_layout_use_version_counter): versions are then drawn from it
 * as init_code draws them, without a replica. */
static uint32_t *version_counter;

/* Draw the next code version the way init_code does: 3.12 keeps the
 * counter in a variable private to libpython (_Py_next_func_version in
 * Objects/codeobject.c, not exported), so the only way to draw from it is
 * to have init_code run: make a replica of a tiny code object with
 * _PyCode_New (internal/pycore_code.h, exported), take its co_version and
 * free it.  Not code.replace() or PyCode_New*: those raise the audit event
 * code.__new__ (code_replace_impl; PyUnstable_Code_NewWithPosOnlyArgs does
 * not, but validates and copies every argument), which plain unmarshal
 * never raises: an audit hook would have seen one per loaded code object
 * (and one refusing it, every load fail).  Code watchers are paused from
 * the replica's creation to its destruction: neither is an event a watcher
 * should see.  Once the arguments are made, a replica costs one allocation. */
static int
draw_code_version(PyInterpreterState *interp, uint32_t *version)
{
    if (version_counter != NULL) {
        /* (init_code, 3.12 Objects/codeobject.c; the GIL is held) */
        uint32_t v = *version_counter;
        if (v != 0) {
            *version_counter = v + 1;
        }
        *version = v;
        return PYCDS_OK;
    }
    uint8_t watchers = interp->active_code_watchers;
    interp->active_code_watchers = 0;
    if (version_template == NULL) {
        PyCodeObject *t = PyCode_NewEmpty("<pycds>", "<version>", 0);
        PyObject *bytecode = t == NULL ? NULL : PyCode_GetCode(t);
        if (bytecode == NULL) {
            Py_XDECREF(t);
        }
        else {
            version_template = t;
            version_con = (struct _PyCodeConstructor){
                .filename = t->co_filename,
                .name = t->co_name,
                .qualname = t->co_qualname,
                .flags = t->co_flags,
                .code = bytecode,          /* the reference is kept */
                .firstlineno = t->co_firstlineno,
                .linetable = t->co_linetable,
                .consts = t->co_consts,
                .names = t->co_names,
                .localsplusnames = t->co_localsplusnames,
                .localspluskinds = t->co_localspluskinds,
                .argcount = t->co_argcount,
                .posonlyargcount = t->co_posonlyargcount,
                .kwonlyargcount = t->co_kwonlyargcount,
                .stacksize = t->co_stacksize,
                .exceptiontable = t->co_exceptiontable,
            };
        }
    }
    int ok = 0;
    if (version_template != NULL) {
        /* A copy: _PyCode_New points the constructor's linetable at a
         * compacted one it frees before returning, under -X
         * no_debug_ranges (3.12 Objects/codeobject.c). */
        struct _PyCodeConstructor con = version_con;
        PyCodeObject *replica = _PyCode_New(&con);
        if (replica != NULL) {
            *version = replica->co_version;
            Py_DECREF(replica);
            ok = 1;
        }
    }
    interp->active_code_watchers = watchers;
    if (!ok) {
        return pycds_fail_python("drawing a code version");
    }
    return PYCDS_OK;
}

/* Whether the 4 bytes at addr are the counter init_code draws from: two
 * replicas in a row each take the value there and leave it one more (or
 * 0, used up), after a first one that makes the template (which draws a
 * version of its own).  Holds the GIL. */
static int
is_version_counter(uintptr_t addr)
{
    volatile uint32_t *p = (volatile uint32_t *)addr;
    PyInterpreterState *interp = PyInterpreterState_Get();
    uint32_t first;
    if (draw_code_version(interp, &first) != PYCDS_OK) {
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        uint32_t before = *p, got;
        if (draw_code_version(interp, &got) != PYCDS_OK
                || got != before || *p != (before != 0 ? before + 1 : 0)) {
            return 0;
        }
    }
    return 1;
}

#define PYCDS_LAYOUT_HAS_VERSION_COUNTER
int
pycds_layout_version_counter_at(int64_t *offset)
{
    /* (The GIL also guards the image's state, set up on first use.)  Once
     * found and checked, the counter is this process's for good: later
     * dumps (AUTO's, pycds.dump) read no symbol table again, and loads
     * draw from it too. */
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PYCDS_OK;
    if (version_counter == NULL) {
        uintptr_t addr;
        rc = pycds_image_symbol("_Py_next_func_version", sizeof(uint32_t), &addr);
        if (rc == PYCDS_OK) {
            if (addr % _Alignof(uint32_t) == 0 && is_version_counter(addr)) {
                version_counter = (uint32_t *)addr;
            }
            else {
                rc = pycds_fail(PYCDS_E_UNSUPPORTED,
                                "_Py_next_func_version does not count code objects");
            }
        }
    }
    if (rc == PYCDS_OK) {
        *offset = (int64_t)((uintptr_t)version_counter - pycds_image_anchor());
    }
    PyGILState_Release(g);
    return rc;
}

int
pycds_layout_use_version_counter(int64_t offset)
{
    /* (The GIL also guards the image's state, set up on first use.) */
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = pycds_image_init();
    /* (An archive's layout id names the build: the offset is this one's.) */
    uintptr_t addr = rc ? 0 : pycds_image_anchor() + (uintptr_t)offset;
    int ok = rc == PYCDS_OK && pycds_image_build_id()[0] != '\0'
             && pycds_image_contains((const void *)addr, sizeof(uint32_t))
             && addr % _Alignof(uint32_t) == 0;
    if (ok && version_counter == NULL && is_version_counter(addr)) {
        version_counter = (uint32_t *)addr;
    }
    ok = ok && version_counter == (uint32_t *)addr;
    PyGILState_Release(g);
    if (rc) {
        return rc;
    }
    return ok ? PYCDS_OK
              : pycds_fail(PYCDS_E_UNSUPPORTED, "no code version counter at %lld",
                           (long long)offset);
}
#endif

/* notify_code_watchers(PY_CODE_EVENT_CREATE, co) of Objects/codeobject.c. */
static void
notify_created(PyInterpreterState *interp, PyCodeObject *co)
{
    uint8_t bits = interp->active_code_watchers;
    for (int i = 0; bits != 0 && i < CODE_MAX_WATCHERS; i++, bits >>= 1) {
        if ((bits & 1) && interp->code_watchers[i] != NULL) {
            if (interp->code_watchers[i](PY_CODE_EVENT_CREATE, co) < 0) {
#if PYCDS_313
                PyErr_FormatUnraisable(
                    "Exception ignored in %s watcher callback for %R",
                    "PY_CODE_EVENT_CREATE", (PyObject *)co);
#else
                PyErr_WriteUnraisable((PyObject *)co);
#endif
            }
        }
    }
}

/* The code objects init_loaded() has seen in one load (a pycds_table used
 * as a set).  The compiler gives every code object one place in its
 * parent's co_consts, but marshal's references (FLAG_REF) can make two
 * constants one object, and so can a crafted archive; either way unmarshal
 * runs init_code once per object, and a walk that went through a shared code
 * object again would draw it a second version and take time exponential in
 * the nesting. */

/* States of a code object in that table. */
enum { CODE_WALKED = 1, CODE_DONE = 2 };

/* What init_code does per process for one code object, innermost first
 * (unmarshal creates a code object's constants before the code object),
 * once per object. */
static int
init_loaded(PyInterpreterState *interp, pycds_table *seen, PyObject *op, int depth)
{
    if (depth > PYCDS_MAX_DEPTH) {
        return pycds_fail(PYCDS_E_TOODEEP, "constants nested deeper than %d",
                          PYCDS_MAX_DEPTH);
    }
    if (!PyCode_Check(op)) {
        return PYCDS_OK;
    }
    pycds_table_slot *s = pycds_table_find(seen, op);
    if (s != NULL) {
        /* Done before (shared), or still being walked: a code object among
         * its own constants, which no .pyc can hold (marshal reserves a
         * code object's reference until its fields are read, and refuses
         * one to it meanwhile: "bad marshal data (invalid reference)"), and
         * whose hash() would recurse without end. */
        return s->value == CODE_DONE ? PYCDS_OK
               : pycds_fail(PYCDS_E_CORRUPT, "a code object contains itself");
    }
    int rc = pycds_table_put(seen, op, CODE_WALKED);
    if (rc) {
        return rc;
    }
    /* Nested code objects sit directly in co_consts (the compiler and
     * marshal never put one inside a constant tuple), so only those are
     * walked: constant tuples can share items (((0,)*2,)*2 ...) and a walk
     * through them could take exponential time. */
    PyCodeObject *co = (PyCodeObject *)op;
    PyObject *consts = co->co_consts;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) {
        rc = init_loaded(interp, seen, PyTuple_GET_ITEM(consts, i), depth + 1);
        if (rc) {
            return rc;
        }
    }
    rc = draw_code_version(interp, &co->co_version);
    if (rc) {
        return rc;
    }
    notify_created(interp, co);
    pycds_table_find(seen, op)->value = CODE_DONE;
    return PYCDS_OK;
}

int
pycds_layout_after_load(PyObject *root)
{
    pycds_table seen = {NULL, 0, 0};
    int rc = init_loaded(PyInterpreterState_Get(), &seen, root, 0);
    free(seen.slots);
    return rc;
}
