/* layout_312_313.h -- the object layout 3.12 and 3.13 share.
 *
 * Included by layout_312.h and layout_313.h only, after layout_common.h
 * and layout_311_313.h.  Sources (3.12 branch, checked against the 3.12.1
 * headers, and the same files of the 3.13 branch, checked against the
 * 3.13.0 headers): Include/cpython/code.h (_PyCode_DEF),
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
 *     run left in it.  New per-process fields: co_version (drawn by
 *     init_code; functions take it as func_version, which specialised
 *     CALLs use as a guard, so it must be unique in the process),
 *     _co_cached, _co_instrumentation_version, _co_monitoring; and code
 *     watchers are told about each new code object.  co_version and the
 *     watchers are handled at load by pycds_layout_after_load().
 *
 * Where 3.12 and 3.13 differ, this file calls what each version file
 * defines (declared below, before their first use): how a code version is
 * drawn, how unmarshal interns, the tier-2 executors (3.13), the function
 * version cache (3.13), the initial inline caches and which instructions
 * _PyCode_Quicken writes.  The version file includes the internal headers
 * all this reads and defines PYCDS_LAYOUT_NAME and its opcode tables.
 */
#ifndef PYCDS_LAYOUT_312_313_H
#define PYCDS_LAYOUT_312_313_H

/* ---- what each of layout_312.h and layout_313.h defines ---------------- */

/* Nonzero if code object co has tier-2 executors (3.13's co_executors;
 * 3.12 has none). */
static int code_has_executors(const PyCodeObject *co);
/* Reset the code copy c's executors as init_code leaves them (3.13). */
static void clear_executors(PyCodeObject *c);
/* Drop what the function version cache holds of code object co, about to
 * be given back (3.13; 3.12 has no such cache). */
static void forget_function_version(PyCodeObject *co);
/* The first inline cache entry of an instruction of base opcode base with
 * caches, as _PyCode_Quicken writes it. */
static uint16_t initial_cache(int base);
/* Whether instruction op (base opcode base, with caches inline cache
 * entries) is one init_code leaves in bytecode that never ran. */
static int op_init_code_leaves(int op, int base, int caches);
/* Intern *p immortal as unmarshal does (replaces *p). */
static void intern_immortal(PyObject **p);
/* Draw the next code version as init_code does. */
static int draw_code_version(PyInterpreterState *interp, uint32_t *version);
/* Report a code watcher's failure as notify_code_watchers does. */
static void report_watcher_error(PyCodeObject *co);

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
int
pycds_layout_may_release(PyObject *root)
{
    PyCodeObject *co = (PyCodeObject *)root;
    if (co->co_weakreflist != NULL || co->co_extra != NULL
        || co->_co_monitoring != NULL
        || PyInterpreterState_Get()->active_code_watchers != 0) {
        return 0;
    }
    return !code_has_executors(co);
}

/* What code_dealloc (Objects/codeobject.c) undoes that a code object about
 * to be given back may still hold or be registered in: its cached
 * attributes, and (3.13) the function version cache. */
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
    forget_function_version(co);
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
        || code_has_executors(co)
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
    if (code_has_executors(src)) {
        return 0;
    }
    const _Py_CODEUNIT *code = _PyCode_CODE(src);
    Py_ssize_t n = Py_SIZE(src);
    for (Py_ssize_t i = 0; i < n; i++) {
        int op = code[i].op.code;
        if (op >= MIN_INSTRUMENTED_OPCODE) {
            return 0;
        }
        int base = PYCDS_OPCODE_DEOPT[op];
        int caches = PYCDS_OPCODE_CACHES[base];
        if (!op_init_code_leaves(op, base, caches)) {
            return 0;
        }
        if (caches == 0) {
            continue;
        }
        if (i + caches >= n || code[i + 1].cache != initial_cache(base)) {
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

/* A replica of src from code.replace(co_filename=<an equal str of its own>).
 * init_code interns the new code object's co_filename in place (3.13:
 * _PyUnicode_InternMortal): given src's own str -- one _fix_co_filename set,
 * not interned, when the .pyc was compiled at another path -- that would
 * change the program's object, in the middle of the copy that took it for
 * a plain str. */
static PyObject *
replicate(PyCodeObject *src)
{
    PyObject *name = src->co_filename, *replace, *noargs = NULL, *kw = NULL, *out = NULL;
    if (!PyUnicode_CheckExact(name)) {
        return PyObject_CallMethod((PyObject *)src, "replace", NULL);
    }
    PyObject *copy = PyUnicode_FromKindAndData(PyUnicode_KIND(name), PyUnicode_DATA(name),
                                               PyUnicode_GET_LENGTH(name));
    replace = copy == NULL ? NULL : PyObject_GetAttrString((PyObject *)src, "replace");
    if (replace != NULL && (noargs = PyTuple_New(0)) != NULL
            && (kw = PyDict_New()) != NULL
            && PyDict_SetItemString(kw, "co_filename", copy) == 0) {
        out = PyObject_Call(replace, noargs, kw);
    }
    Py_XDECREF(kw);
    Py_XDECREF(noargs);
    Py_XDECREF(replace);
    Py_XDECREF(copy);
    return out;
}

/* Overwrite the bytecode of copy c with what init_code makes of src's
 * bytecode (as after unmarshal: no specialised or instrumented instruction,
 * every counter at its initial value).  Code that has run holds
 * specialisations and counters, and instrumentation under sys.monitoring or
 * a trace function.  The reference is a replica (replicate()), which
 * deoptimises the bytecode (_PyCode_GetCode) and builds a new code object
 * through init_code and _PyCode_Quicken (Objects/codeobject.c, 3.12 and
 * 3.13), as marshal's round trip does. */
static int
fresh_bytecode(PyCodeObject *src, PyCodeObject *c)
{
    if (bytecode_is_fresh(src)) {
        return PYCDS_OK;          /* copied as it is */
    }
    PyObject *replica = replicate(src);
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
    clear_executors(c);
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
        intern_immortal(slot);
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
    intern_immortal(&fresh);
    if (PyErr_Occurred()) {
        Py_DECREF(fresh);
        return pycds_fail_python("interning a string");
    }
    /* The archive keeps this reference for good. */
    *slot = fresh;
    return PYCDS_OK;
}

/* ---- per-process state of loaded code objects ------------------------ */

/* notify_code_watchers(PY_CODE_EVENT_CREATE, co) of Objects/codeobject.c. */
static void
notify_created(PyInterpreterState *interp, PyCodeObject *co)
{
    uint8_t bits = interp->active_code_watchers;
    for (int i = 0; bits != 0 && i < CODE_MAX_WATCHERS; i++, bits >>= 1) {
        if ((bits & 1) && interp->code_watchers[i] != NULL) {
            if (interp->code_watchers[i](PY_CODE_EVENT_CREATE, co) < 0) {
                report_watcher_error(co);
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

#endif /* PYCDS_LAYOUT_312_313_H */
