/* layout.h -- the interface between the object layout and its users.
 *
 * layout.c (with the one layout/layout_3XX.h of the running CPython's minor
 * version) knows how that version lays out the objects an archive holds;
 * nothing else depends on a version's structs.  This header names every
 * call across that boundary, grouped by direction:
 *   - writer.c -> layout.c: copy one object, the frozenset order, which
 *     strs and values need a relocation of their own;
 *   - layout.c -> writer.c: the heap services a layout's copy functions
 *     call back while copying one object (its memory, its pointer slots);
 *   - loader/ -> layout.c: what a load does per object that depends on the
 *     version (interning, shared instances, code versions, the checks, the
 *     release of a tail).
 * The writer and layout.c call each other only through what is declared
 * here.  pycds_layout_id and the version counter calls, which Python uses
 * too, are in pycds_native.h.
 */
#ifndef PYCDS_LAYOUT_H
#define PYCDS_LAYOUT_H

#include "pycds_internal.h"

/* ---- writer.c -> layout.c ---------------------------------------------- */

/* Copy op (an exact instance of a supported type, not static) into the
 * heap; *off receives the offset of the PyObject (after any GC header). */
int pycds_layout_copy(pycds_writer *w, PyObject *op, int depth, uint64_t *off);
/* A new tuple of frozenset op's items in the order unmarshal of a .pyc
 * adds them (3.11+; 3.10: op's iteration order), or NULL with an
 * exception.  GIL held. */
PyObject *pycds_layout_frozenset_items(PyObject *op);
/* Nonzero if str op is interned and must be re-interned at load. */
int pycds_layout_str_interned(PyObject *op);
/* Nonzero if op (not in the image, so copied) has a value for which
 * unmarshal hands out an instance the interpreter shares (3.10: small ints,
 * the empty and 1-char latin-1 strs, (), b''); the slot is then recorded as
 * PYCDS_RELOC_SINGLETON.  Layouts whose shared instances are all static in
 * the image (3.11+) return 0. */
int pycds_layout_heap_singleton(PyObject *op);
/* The pointer fields of a code object (offset, and the exact type their
 * target must have), for the writer's placement walks and the loader's
 * structural check and release; *out is static. */
typedef struct {
    size_t offset;
    PyTypeObject *type;
    PyTypeObject *item_type;  /* tuples: exact type of every item, or NULL */
} pycds_code_field;
size_t pycds_layout_code_fields(const pycds_code_field **out);

/* ---- layout.c -> writer.c ---------------------------------------------- */

/* Reserve size bytes of the heap for one object, zeroed and 8-byte
 * aligned; *off receives their heap offset. */
int pycds_w_alloc(pycds_writer *w, size_t size, uint64_t *off);
/* The address of heap offset off, valid until the next allocation
 * (pycds_w_alloc, pycds_w_slot, pycds_w_raw: the heap moves as it grows). */
void *pycds_w_at(pycds_writer *w, uint64_t off);
/* Copy `child` (or refer to it, if static) and store the reference in the
 * pointer slot at heap offset slot_off, recording its relocation entry. */
int pycds_w_slot(pycds_writer *w, uint64_t slot_off, PyObject *child, int depth);
/* Copy size bytes of plain data (no pointers) into the chunk and store an
 * INTERNAL reference to them in the pointer slot at heap offset slot_off.
 * The block is padded to at least sizeof(PyObject): the loader checks that
 * every internal target has room for an object header. */
int pycds_w_raw(pycds_writer *w, uint64_t slot_off, const void *data,
                size_t size);
/* Store a reference to heap offset target_off, inside an object of the
 * chunk being written (not the start of one), in the pointer slot at heap
 * offset slot_off, recording its DATA relocation entry. */
int pycds_w_inner(pycds_writer *w, uint64_t slot_off, uint64_t target_off);
/* Nonzero if heap offset off is in the tail of the chunk being written
 * (writer.c: the module's code object, what only it reaches, and the
 * interned strings). */
int pycds_w_in_tail(pycds_writer *w, uint64_t off);

/* ---- loader/ -> layout.c ----------------------------------------------- */

/* Re-intern the str in *slot at load (replaces *slot). */
int pycds_layout_intern(PyObject **slot);
/* Before a load re-interns n strs: room for them in the interpreter's
 * interned dict, made where a failure leaves it intact (3.13; other
 * versions have nothing to do).  *room: how many of them it has room for
 * now (n, or fewer but at least one: reserve again after those).  GIL
 * held. */
int pycds_layout_intern_reserve(uint64_t n, uint64_t *room);
/* Store in str op's hash cache what unicode_hash() would compute; op was
 * checked to fit in its chunk.  Pure: callable without the GIL. */
void pycds_layout_str_prehash(PyObject *op);
/* At load: replace the copy in *slot with the interpreter's shared instance
 * of its value (a new reference the archive keeps for good).  A layout
 * without heap singletons refuses: it never writes such a slot. */
int pycds_layout_use_singleton(PyObject **slot);
/* At load, after all fix-ups: the per-process work a fresh unmarshal does
 * for each code object reachable from root (3.12+: draw co_version, tell
 * the code watchers).  3.10 and 3.11 need none. */
int pycds_layout_after_load(PyObject *root);
/* The reference count the writer gives every object of a chunk's head
 * (in_tail 0) or tail (set_refcnt): a smaller one would let the program
 * free archive memory (PYCDSVERIFY=1 checks it); one more on a tail
 * object means somebody holds it (release.c). */
Py_ssize_t pycds_layout_refcnt(int in_tail);
/* Nonzero if a chunk's tail holds nothing but objects (3.10's raw
 * co_cell2arg data is not one: no memory is given back on 3.10). */
int pycds_layout_tail_walkable(void);
/* Nonzero if the module code object root, which no reference count says
 * is held, may be given back (no weak reference, no tool data on it). */
int pycds_layout_may_release(PyObject *root);
/* Before a dead code object's memory is given back: free what it owns
 * outside the heap (the caches code_dealloc frees: 3.11's _co_code and
 * _co_linearray, 3.12+'s _co_cached) and drop what the interpreter holds
 * of it uncounted (3.13: the function version cache).  GIL held. */
void pycds_layout_forget_code(PyObject *op);
/* At load, after the structural check: 0 if op's fields are what a fresh
 * unmarshal could produce (code object counts, reset caches; 3.10: the
 * co_cell2arg data, which must lie in chunk p), else PYCDS_E_CORRUPT. */
int pycds_layout_check_object(const pycds_place *p, PyObject *op);

#endif /* PYCDS_LAYOUT_H */
