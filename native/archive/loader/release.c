/* release.c -- gives back the memory of a module's tail once its body ran.
 *
 * Plain import frees, after a module body has run, the module's code object,
 * its class bodies and what only they used (bytecode, line tables, names,
 * the constants nobody kept), and at once every string unmarshal made and
 * then found already interned.  In an archive those bytes sit in the
 * module's chunk.  The writer puts them last, in the chunk's tail (writer.c:
 * from root_off to the end) and gives tail objects a known mortal reference
 * count (pycds_layout_refcnt).  After the module body has run (the
 * finder calls pycds_archive_release on the next import), with the GIL held
 * so that no reference count moves:
 *
 *   1. the tail is walked object by object (the writer lays them back to
 *      back, 8-aligned, tuples after their zeroed GC header; the module code
 *      object first);
 *   2. alive is: an object with a higher count than the base (held by a
 *      global, a default argument, a class, a frame, a traceback...); a
 *      string that became the interpreter's interned one (the interned dict
 *      holds it uncounted); a code object with a weak reference or tool data
 *      on it (pycds_layout_may_release); and everything an alive tuple or
 *      code object of the tail refers to.  The rest is dead: nothing outside
 *      the tail refers to it (parts 1 and 2 of the chunk reach the tail only
 *      through INTERN slots, which re-interning rewrote), and a copy that
 *      re-interning replaced has lost the count it had;
 *   3. what the interpreter holds of a dead code object without a count is
 *      dropped as code_dealloc would (pycds_layout_forget_code: 3.13's
 *      function version cache);
 *   4. the dead bytes are taken off the counts of the tails' arena pages
 *      they lie on (loader.c packs the tails of loaded modules there, in
 *      load order, and counts each page's tail bytes), and every page left
 *      with none -- all the tails on it dead, whichever modules they are
 *      of -- goes back to the kernel: madvise(MADV_DONTNEED) on the private
 *      anonymous reservation (a later read would see zeros; nothing reads).
 *      A page the arena may still grow into is kept.
 * Anything unexpected -- a pointer from before the tail into it other than
 * an INTERN slot (relocate.c, fill_fixups), an object in the walk that is not
 * one a chunk holds, a pointer into the middle of one -- keeps the whole
 * tail: a re-signed archive that breaks the writer's layout loses memory,
 * never objects.  A released module is never
 * handed out again (pycds_archive_load says so; the loader then compiles it
 * from its .pyc, as for importlib.reload()).
 */
#include "archive.h"
#include "layout.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    uint32_t start;   /* tail offset of the object's memory (its GC header) */
    uint32_t obj;     /* tail offset of the PyObject */
    uint32_t end;     /* tail offset after it (8-aligned) */
    uint32_t alive;
} tail_obj;

/* Split the len bytes at tail into objects; 0 on success, -1 if it is not a
 * tail as the writer lays it out (the caller keeps the memory then). */
static int
walk_tail(uint8_t *tail, uint64_t len, tail_obj **out, size_t *count)
{
    size_t cap = 64, n = 0;
    tail_obj *v = malloc(cap * sizeof(*v));
    if (v == NULL) {
        return -1;
    }
    uint64_t p = 0;
    while (p < len) {
        uint64_t start = p;
        uint64_t word;
        /* Nothing is read past the tail: the next one is another module's
         * (released, or being read ahead). */
        if (len - p < sizeof(PyObject)) {
            goto bad;
        }
        memcpy(&word, tail + p, sizeof(word));
        int gc = word == 0;    /* an object starts with a nonzero count */
        if (gc) {
            p += 2 * sizeof(uintptr_t);   /* PyGC_Head */
            if (p >= len || len - p < sizeof(PyObject)) {
                goto bad;
            }
        }
        PyObject *op = (PyObject *)(tail + p);
        size_t size = pycds_object_size(op, len - p);
        if (size == 0 || gc != PyTuple_CheckExact(op)
            || (n == 0 && !PyCode_Check(op))) {
            goto bad;     /* not a tail as the writer lays it out */
        }
        uint64_t end = p + ((size + 7u) & ~(uint64_t)7u);
        if (end > len || end > UINT32_MAX) {
            goto bad;
        }
        if (n == cap) {
            tail_obj *nv = realloc(v, 2 * cap * sizeof(*v));
            if (nv == NULL) {
                goto bad;
            }
            v = nv;
            cap *= 2;
        }
        v[n].start = (uint32_t)start;
        v[n].obj = (uint32_t)p;
        v[n].end = (uint32_t)end;
        v[n].alive = 0;
        n++;
        p = end;
    }
    *out = v;
    *count = n;
    return 0;
bad:
    free(v);
    return -1;
}

/* The tail object whose PyObject is at tail offset off, or NULL. */
static tail_obj *
find_obj(tail_obj *v, size_t n, uint64_t off)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].obj < off) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < n && v[lo].obj == off ? &v[lo] : NULL;
}

/* Mark tail object o alive and queue it if it refers to others. */
static void
mark(tail_obj *o, tail_obj *v, uint8_t *tail, size_t *stack, size_t *depth)
{
    if (!o->alive) {
        o->alive = 1;
        PyObject *op = (PyObject *)(tail + o->obj);
        if (PyTuple_CheckExact(op) || PyCode_Check(op)) {
            stack[(*depth)++] = (size_t)(o - v);    /* each queued once */
        }
    }
}

/* The tail object child refers to, if child is in the tail: 0 and *o set
 * (NULL outside the tail), or -1 if it points inside the tail but not at
 * an object (not this writer's layout). */
static int
target(uint8_t *tail, uint64_t len, tail_obj *v, size_t n, PyObject *child,
       tail_obj **o)
{
    uintptr_t p = (uintptr_t)child;
    *o = NULL;
    if (p < (uintptr_t)tail || p - (uintptr_t)tail >= len) {
        return 0;
    }
    *o = find_obj(v, n, (uint64_t)(p - (uintptr_t)tail));
    return *o != NULL ? 0 : -1;
}

/* Mark what step 2 says is alive; 0, or -1 to keep the whole tail. */
static int
mark_alive(uint8_t *tail, uint64_t len, tail_obj *v, size_t n)
{
    Py_ssize_t base = pycds_layout_refcnt(1);
    const pycds_code_field *fields;
    size_t nfields = pycds_layout_code_fields(&fields);
    size_t *stack = malloc((n ? n : 1) * sizeof(size_t));
    size_t depth = 0;
    if (stack == NULL) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *op = (PyObject *)(tail + v[i].obj);
        Py_ssize_t rc = Py_REFCNT(op);
        int alive;
        if (PyUnicode_CheckExact(op)) {
            /* Re-interning drops the count of a copy it replaced. */
            alive = rc > base || PyUnicode_CHECK_INTERNED(op);
        }
        else if (PyCode_Check(op)) {
            alive = rc != base || !pycds_layout_may_release(op);
        }
        else {
            alive = rc != base;
        }
        if (alive) {
            mark(&v[i], v, tail, stack, &depth);
        }
    }
    int ret = 0;
    while (depth > 0 && ret == 0) {
        PyObject *op = (PyObject *)(tail + v[stack[--depth]].obj);
        tail_obj *o;
        if (PyTuple_CheckExact(op)) {
            for (Py_ssize_t k = 0; ret == 0 && k < PyTuple_GET_SIZE(op); k++) {
                ret = target(tail, len, v, n, PyTuple_GET_ITEM(op, k), &o);
                if (o != NULL) {
                    mark(o, v, tail, stack, &depth);
                }
            }
        }
        else {
            for (size_t k = 0; ret == 0 && k < nfields; k++) {
                PyObject *child = *(PyObject **)((char *)op + fields[k].offset);
                ret = target(tail, len, v, n, child, &o);
                if (o != NULL) {
                    mark(o, v, tail, stack, &depth);
                }
            }
        }
    }
    free(stack);
    return ret;
}

/* Give back the pages [lo, hi) of the tails' arena (byte offsets, whole
 * pages): on the read-ahead thread, once the imports pause, when there is
 * one (prefetch.c: each call flushes the TLB of every CPU the program runs
 * on), else now.  A failure leaves the pages where they are. */
static uint64_t
give_back(pycds_archive *a, uint64_t lo, uint64_t hi)
{
    uintptr_t p0 = (uintptr_t)(a->tails + lo);
    size_t len = (size_t)(hi - lo);
    /* PROTECT (tests) at once, so that any later use faults. */
    int queued = a->release_mode != PYCDS_RELEASE_PROTECT
        && pycds_prefetch_give_back(a, p0, len);
    if (!queued && pycds_release_pages(a, p0, len) != 0) {
        return 0;
    }
    return (uint64_t)len;
}

/* The tail bytes [lo, hi) of the tails' arena (offsets) are dead: take
 * them off the counts of their pages, and give back the pages left with no
 * live tail byte that the arena will not grow into (below tails_used).
 * Those are consecutive: every page inside [lo, hi) and, if their counts
 * reached zero, the two it ends on.  Returns the bytes given back. */
static uint64_t
dead(pycds_archive *a, uint64_t lo, uint64_t hi)
{
    if (hi <= lo) {
        return 0;
    }
    uint64_t pg = a->page, first = UINT64_MAX, last = 0;
    pthread_mutex_lock(&a->mu);
    for (uint64_t p = lo / pg; p * pg < hi && !a->tail_count_broken; p++) {
        uint64_t share = pycds_page_share(p, pg, lo, hi);
        if (p >= a->tail_pages || a->tail_live[p] < share) {
            /* Never with the loader's counts: stop giving back. */
            a->tail_count_broken = 1;
            break;
        }
        a->tail_live[p] -= (uint32_t)share;
        if (a->tail_live[p] == 0 && (p + 1) * pg <= a->tails_used) {
            first = first < p ? first : p;
            last = p;
        }
    }
    int broken = a->tail_count_broken;
    pthread_mutex_unlock(&a->mu);
    if (broken || first > last) {
        return 0;
    }
    return give_back(a, first * pg, (last + 1) * pg);
}

int
pycds_archive_release(pycds_archive *a, uint32_t module_no, uint64_t *released)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = pycds_archive_release_held(a, module_no, released);
    PyGILState_Release(g);
    return rc;
}

int
pycds_archive_release_held(pycds_archive *a, uint32_t module_no, uint64_t *released)
{
    /* (The caller holds the GIL: serve.c, called by the interpreter,
     * maybe in a subinterpreter, where PyGILState_Ensure would take the
     * main interpreter's thread state and wait for the GIL held here.) */
    if (a == NULL || released == NULL) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_release arguments");
    }
    *released = 0;
    if (module_no >= a->nmodules) {
        return pycds_fail(PYCDS_E_CORRUPT, "module number %u out of range",
                          module_no);
    }
    if (a->release_mode == PYCDS_RELEASE_OFF || !pycds_layout_tail_walkable()) {
        return PYCDS_OK;
    }
    if (a->base == NULL) {
        return PYCDS_OK;
    }
    pycds_place p;
    uint64_t len = 0, at = 0;
    tail_obj *v = NULL;
    size_t n = 0;
    /* LOADED modules change only under the GIL: the state cannot move
     * between this check and the end. */
    pthread_mutex_lock(&a->mu);
    int loaded = a->state[module_no] == MOD_LOADED;
    pthread_mutex_unlock(&a->mu);
    if (!loaded || a->keep_tail[module_no]) {
        goto done;
    }
    pycds_archive_place(a, module_no, &p);     /* placed when it loaded */
    len = p.len - p.root_off;
    at = (uint64_t)(p.tail - a->tails);        /* in the tails' arena */
    if (a->roots[module_no] != (PyObject *)p.tail
        || walk_tail(p.tail, len, &v, &n) != 0) {
        goto done;
    }
    if (mark_alive(p.tail, len, v, n) == 0) {
        for (size_t i = 0; i < n; i++) {
            PyObject *op = (PyObject *)(p.tail + v[i].obj);
            if (!v[i].alive && PyCode_Check(op)) {
                pycds_layout_forget_code(op);
            }
        }
        uint64_t from = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i].alive) {
                *released += dead(a, at + from, at + v[i].start);
                from = v[i].end;
            }
        }
        *released += dead(a, at + from, at + len);
        /* Not handed out again, even if it or its page stayed (its module
         * is then compiled from the .pyc, as importlib.reload() would). */
        a->roots[module_no] = NULL;
        pthread_mutex_lock(&a->mu);
        a->state[module_no] = MOD_RELEASED;
        pthread_mutex_unlock(&a->mu);
    }
    free(v);
done:
    return PYCDS_OK;
}

int
pycds_archive_set_release(pycds_archive *a, int mode)
{
    if (a == NULL || mode < PYCDS_RELEASE_OFF || mode > PYCDS_RELEASE_PROTECT) {
        return pycds_fail(PYCDS_E_ARG, "bad archive_set_release arguments");
    }
    a->release_mode = mode;
    return PYCDS_OK;
}
