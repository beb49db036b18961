/* layout_312.h -- CPython 3.12 object layout for archived objects.
 *
 * Included by layout.c only, the one file it includes for 3.12.  What 3.12
 * shares with 3.13 is in layout_312_313.h (the sources it was checked
 * against are listed there); here are 3.12's own parts: code versions
 * drawn from _Py_next_func_version, a counter private to libpython
 * (Objects/codeobject.c), interning with PyUnicode_InternInPlace (immortal
 * in 3.12), the superinstructions _PyCode_Quicken writes, and the opcode
 * tables of Include/internal/pycore_opcode.h.
 */
#include "internal/pycore_gc.h"
#include "internal/pycore_code.h"        /* _Py_CODEUNIT, _PyCode_New */
#include "opcode.h"                      /* RESUME, CACHE */

/* 3.12's tables of inline cache sizes and of the base opcode of every
 * specialised one, from its own header (libpython does not export them;
 * each renamed): check_bytecode() in layout_311_313.h, bytecode_is_fresh()
 * in layout_312_313.h. */
#define NEED_OPCODE_TABLES
#define _PyOpcode_RelativeJump pycds_opcode_relative_jump
#define _PyOpcode_Jump pycds_opcode_jump
#define _PyOpcode_Caches pycds_opcode_caches
#define _PyOpcode_Deopt pycds_opcode_deopt
#include "internal/pycore_opcode.h"
#undef NEED_OPCODE_TABLES
#define PYCDS_OPCODE_CACHES pycds_opcode_caches
#define PYCDS_OPCODE_DEOPT pycds_opcode_deopt

#include "internal/pycore_frame.h"       /* FRAME_SPECIALS_SIZE */
#include "internal/pycore_interp.h"
#include "internal/pycore_long.h"
#include "internal/pycore_pystate.h"
#include "internal/pycore_hashtable.h"
#include "internal/pycore_runtime.h"

#define PYCDS_LAYOUT_NAME "cpython-3.12"

#include "layout/layout_common.h"
#include "layout/layout_311_313.h"
#include "layout/layout_312_313.h"

/* ---- bytecode ----------------------------------------------------------- */

/* Unmarshal leaves no instruction specialised nor instrumented; the
 * superinstructions _PyCode_Quicken writes (Python/specialize.c) have no
 * caches. */
static int
op_unmarshal_makes(int op, int base, int caches)
{
    return op < MIN_INSTRUMENTED_OPCODE && (op == base || caches == 0);
}

/* Every instruction with caches is its own base opcode until it runs; the
 * cache-less superinstructions are _PyCode_Quicken's own. */
static int
op_init_code_leaves(int op, int base, int caches)
{
    return op == base || caches == 0;
}

/* The adaptive counter at adaptive_counter_warmup() (Python/specialize.c,
 * _PyCode_Quicken). */
static uint16_t
initial_cache(int base)
{
    (void)base;
    return adaptive_counter_warmup();
}

/* ---- code objects ------------------------------------------------------- */

static int
code_has_executors(const PyCodeObject *co)
{
    (void)co;
    return 0;
}

static void
clear_executors(PyCodeObject *c)
{
    (void)c;
}

static void
forget_function_version(PyCodeObject *co)
{
    (void)co;
}

static void
report_watcher_error(PyCodeObject *co)
{
    PyErr_WriteUnraisable((PyObject *)co);
}

/* ---- str interning ------------------------------------------------------ */

/* Unmarshal interns with PyUnicode_InternInPlace, immortal in 3.12. */
static void
intern_immortal(PyObject **p)
{
    PyUnicode_InternInPlace(p);
}

/* Room in the interned dict is reserved on 3.13 only (layout_313.h). */
int
pycds_layout_intern_reserve(uint64_t n, uint64_t *room)
{
    *room = n;
    return PYCDS_OK;
}

/* ---- code versions ------------------------------------------------------ */

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

/* ---- frozenset order ---------------------------------------------------- */

/* 3.12's marshal writes a frozenset's items sorted by their own marshalled
 * bytes, iterating the set with borrowed references: an item held by the
 * set and by pycds_layout_frozenset_items' tuple only (two references) was
 * written without FLAG_REF, unless an interned str (w_ref shares those). */
static int
frozenset_item_unflagged(PyObject *item)
{
    return Py_REFCNT(item) == 2
           && !(PyUnicode_CheckExact(item) && PyUnicode_CHECK_INTERNED(item));
}
