/* layout_313.h -- CPython 3.13 object layout for archived objects.
 *
 * Included by layout.c only, the one file it includes for 3.13.  What 3.13
 * shares with 3.12 is in layout_312_313.h; the 3.13 sources are the same
 * files of the 3.13 branch, checked against the 3.13.0 headers and the
 * disassembly of its libpython, plus Include/internal/pycore_function.h and
 * Include/internal/pycore_opcode_metadata.h (the opcode tables).
 *
 * What differs from 3.12:
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
 *     which drop references to co_varnames items they never took.  A tail's
 *     str, and any in a debug build, is never made the interned one
 *     (pycds_layout_intern gives the slot an interpreter-owned copy): code
 *     in _PyUnicode_ClearInterned that makes SSTATE_INTERNED_IMMORTAL
 *     strings mortal again at exit (debug builds, and every build from
 *     3.14; a 3.13.0 release build leaves them immortal, checked with gdb)
 *     would free() it.
 *   - bytecode: RESUME becomes RESUME_CHECK when it first runs; JUMP_BACKWARD
 *     and the POP_JUMP_IF_* instructions start with caches of their own
 *     (initial_cache).
 */
#ifdef Py_GIL_DISABLED
#  error "pycds does not support the free-threaded build (its object header differs)"
#endif

#include "internal/pycore_gc.h"
#include "internal/pycore_code.h"        /* _Py_CODEUNIT */
#include "opcode.h"                      /* opcode_ids.h: RESUME, CACHE */
#include "internal/pycore_pyhash.h"      /* _Py_HashBytes */

/* 3.13's tables of inline cache sizes and of the base opcode of every
 * specialised one, in its pycore_opcode_metadata.h, which defines more
 * with them (each renamed: libpython's are its own, not exported):
 * check_bytecode() in layout_311_313.h, bytecode_is_fresh() in
 * layout_312_313.h. */
#define NEED_OPCODE_METADATA
#define _PyOpcode_num_popped pycds_opcode_num_popped_313
#define _PyOpcode_num_pushed pycds_opcode_num_pushed_313
#define _PyOpcode_opcode_metadata pycds_opcode_metadata_313
#define _PyOpcode_macro_expansion pycds_opcode_macro_expansion_313
#define _PyOpcode_OpName pycds_opcode_opname_313
#define _PyOpcode_Caches pycds_opcode_caches_313
#define _PyOpcode_Deopt pycds_opcode_deopt_313
#define _PyOpcode_PseudoTargets pycds_opcode_pseudo_targets_313
#include "internal/pycore_opcode_metadata.h"
#undef NEED_OPCODE_METADATA
#define PYCDS_OPCODE_CACHES pycds_opcode_caches_313
#define PYCDS_OPCODE_DEOPT pycds_opcode_deopt_313

#include "internal/pycore_frame.h"       /* FRAME_SPECIALS_SIZE */
#include "internal/pycore_interp.h"
#include "internal/pycore_long.h"
#include "internal/pycore_pystate.h"
#include "internal/pycore_hashtable.h"
#include "internal/pycore_runtime.h"
/* PyDictKeysObject: dk_usable.  (Its pycore_object.h has an unused
 * parameter under -Wextra: not ours to fix.) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "internal/pycore_dict.h"
#pragma GCC diagnostic pop

#define PYCDS_LAYOUT_NAME "cpython-3.13"

#include "layout/layout_common.h"
#include "layout/layout_311_313.h"
#include "layout/layout_312_313.h"

/* ---- bytecode ----------------------------------------------------------- */

/* Unmarshal leaves every instruction its own base opcode, none
 * instrumented nor ENTER_EXECUTOR (which read _co_monitoring and
 * co_executors, NULL here). */
static int
op_unmarshal_makes(int op, int base, int caches)
{
    (void)caches;
    return op < MIN_INSTRUMENTED_OPCODE && op != ENTER_EXECUTOR && op == base;
}

/* Every instruction is its own base opcode until it runs (RESUME_CHECK,
 * which has no caches, included). */
static int
op_init_code_leaves(int op, int base, int caches)
{
    (void)caches;
    return op == base;
}

/* _PyCode_Quicken (Python/specialize.c) writes the adaptive counter at
 * adaptive_counter_warmup(), as 3.12 does, but JUMP_BACKWARD's starts at
 * initial_jump_backoff_counter() and the POP_JUMP_IF_* ones hold a branch
 * history that starts as alternating bits, 0x5555 (3.13.0: every code
 * object compiled from 150 stdlib modules has exactly these values). */
static uint16_t
initial_cache(int base)
{
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
}

/* ---- code objects ------------------------------------------------------- */

static int
code_has_executors(const PyCodeObject *co)
{
    return co->co_executors != NULL;
}

static void
clear_executors(PyCodeObject *c)
{
    c->co_executors = NULL;
}

/* The function version cache holds a borrowed pointer to the code object
 * of every function given a version (_PyFunction_SetVersion,
 * Objects/funcobject.c), cleared by _PyFunction_ClearCodeByVersion (not
 * exported) when the code object is deallocated, and read by it, and by
 * _PyFunction_LookupByVersion, for any code object of the same version
 * modulo FUNC_VERSION_CACHE_SIZE. */
static void
forget_function_version(PyCodeObject *co)
{
    struct _func_version_cache_item *slot =
        PyInterpreterState_Get()->func_state.func_version_cache
        + (co->co_version % FUNC_VERSION_CACHE_SIZE);
    if (slot->code == (PyObject *)co) {
        slot->code = NULL;
        slot->func = NULL;
    }
}

static void
report_watcher_error(PyCodeObject *co)
{
    PyErr_FormatUnraisable("Exception ignored in %s watcher callback for %R",
                           "PY_CODE_EVENT_CREATE", (PyObject *)co);
}

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

/* Code versions come from the interpreter here (draw_code_version): no
 * counter of libpython's to find. */
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

/* ---- str interning ------------------------------------------------------ */

/* Unmarshal interns with _PyUnicode_InternImmortal (a string interned
 * mortal before is made immortal). */
static void
intern_immortal(PyObject **p)
{
    _PyUnicode_InternImmortal(PyInterpreterState_Get(), p);
}

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

/* ---- frozenset order ---------------------------------------------------- */

/* 3.13's marshal iterates a frozenset with new references
 * (_PySet_NextEntryRef): every item's bytes carry FLAG_REF as written. */
static int
frozenset_item_unflagged(PyObject *item)
{
    (void)item;
    return 0;
}
