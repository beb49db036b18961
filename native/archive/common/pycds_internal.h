/* pycds_internal.h -- declarations the writer and the loader share (not
 * cffi's): the units of common/ (errors, hash, address tables, the
 * interpreter image, the object layout), the chunk placement both sides
 * agree on, and the writer services the layout's copy functions call back.
 *
 * Version-free code (writer/, loader/, image.c) talks to the object layout
 * of the running CPython only through the pycds_layout_* functions, which
 * layout.c implements by including the one header for this minor version
 * (layout/layout_3XX.h).
 */
#ifndef PYCDS_INTERNAL_H
#define PYCDS_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pycds_native.h"

#if PY_VERSION_HEX < 0x030A0000 || PY_VERSION_HEX >= 0x030E0000
#  error "pycds supports CPython 3.10 to 3.13"
#endif

/* Deepest nesting of constants copied; marshal.c refuses deeper data
 * (MAX_MARSHAL_STACK_DEPTH is 2000), so no loadable .pyc goes beyond it. */
#define PYCDS_MAX_DEPTH 2000

/* Slot of pointer p in an open-addressing table of mask + 1 slots (a power
 * of 2): Fibonacci hashing of the address, whose low 3 bits are always 0.
 * The writer's copy memo and the set of code objects a load initialises
 * use it. */
static inline size_t
pycds_addr_hash(const void *p, size_t mask)
{
    uintptr_t k = ((uintptr_t)p >> 3) * (uintptr_t)0x9E3779B97F4A7C15ULL;
    return (size_t)(k >> 16) & mask;
}

/* table.c: a table keyed by object address (the slots are the caller's to
 * walk; free(slots) when done). */
typedef struct {
    PyObject *key;            /* NULL: empty */
    uint64_t value;
} pycds_table_slot;
typedef struct {
    pycds_table_slot *slots;
    size_t used, cap;
} pycds_table;
/* key's slot in t (its value may be changed), or NULL. */
pycds_table_slot *pycds_table_find(const pycds_table *t, const void *key);
/* 1 and *value if key is in t, else 0. */
int pycds_table_get(const pycds_table *t, const void *key, uint64_t *value);
/* Add key, which t lacks; PYCDS_OK or PYCDS_E_NOMEM. */
int pycds_table_put(pycds_table *t, PyObject *key, uint64_t value);
/* Empty t, keeping its capacity. */
void pycds_table_clear(pycds_table *t);

/* errors.c: record a detail message for pycds_last_error(); returns code. */
int pycds_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Record the pending Python exception as the detail, clear it, return
 * PYCDS_E_PYTHON (or PYCDS_E_NOMEM for MemoryError). */
int pycds_fail_python(const char *what);

/* Little-endian integers of the archive's header, buckets and entries. */
static inline uint32_t
pycds_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16
           | (uint32_t)p[3] << 24;
}

static inline uint64_t
pycds_le64(const uint8_t *p)
{
    return (uint64_t)pycds_le32(p) | (uint64_t)pycds_le32(p + 4) << 32;
}

/* hash.c: pycds/_archive.py checksum(), pycds_keyed_hash with the key as
 * _imp.source_hash takes it (63 bits). */
static inline uint64_t
pycds_checksum(const void *src, size_t n, uint64_t key)
{
    return pycds_keyed_hash(key & 0x7FFFFFFFFFFFFFFFULL, src, n);
}

/* io.c: read n bytes of fd at offset off into buf.  0; -1 with errno set
 * (EINTR retried); 1 where the file ends first. */
int pycds_pread_all(int fd, void *buf, size_t n, uint64_t off);
/* The same for the file's bytes [off, off + na + nb) into a then b, in
 * one preadv where the kernel gives it all. */
int pycds_pread2_all(int fd, void *a, size_t na, void *b, size_t nb, uint64_t off);

/* image.c: the loaded object (libpython or the executable) that holds the
 * interpreter's static objects.  Anchor: &_Py_NoneStruct. */
int pycds_image_init(void);
int pycds_image_contains(const void *p, size_t size);
/* The address range [lo, hi) of the segment holding the anchor, where
 * nearly every external relocation lands ([0, 0) before init). */
void pycds_image_hot(uintptr_t *lo, uintptr_t *hi);
uintptr_t pycds_image_anchor(void);
const char *pycds_image_build_id(void);   /* hex, or "" if none */
/* The address of the data symbol `name` of `size` bytes of that object,
 * exported or not, read from its file's symbol table when the file is the
 * loaded build (its build id) and the address lies in the object.  Not for
 * a hot path: it reads the file's .symtab and .strtab. */
int pycds_image_symbol(const char *name, uint64_t size, uintptr_t *addr);

/* Where a loaded module's chunk lives.  Its head (chunk bytes [0, root_off):
 * function code and what it may keep alive) and its tail ([root_off, len):
 * the module code object, class bodies and what only they use, release.c)
 * are placed apart (archive.c), each packed with the heads or the tails of
 * the modules loaded before it, so that the tails given back once module
 * bodies ran make whole pages.  No object spans the two: the writer starts
 * the tail with the module code object, and both offsets are multiples of
 * 8.  Chunk offsets (relocation slots and targets) map to addresses with
 * pycds_place_at(). */
typedef struct {
    uint8_t *head, *tail;
    uint64_t root_off, len;
} pycds_place;

static inline uint8_t *
pycds_place_at(const pycds_place *p, uint64_t off)
{
    return off < p->root_off ? p->head + off : p->tail + (off - p->root_off);
}

/* Bytes from ptr to the end of the part (head or tail) holding it; 0 when
 * ptr is in neither. */
static inline uint64_t
pycds_place_room(const pycds_place *p, const void *ptr)
{
    uintptr_t q = (uintptr_t)ptr;
    uintptr_t h = (uintptr_t)p->head, t = (uintptr_t)p->tail;
    if (q >= h && q - h < p->root_off) {
        return p->root_off - (q - h);
    }
    if (q >= t && q - t < p->len - p->root_off) {
        return p->len - p->root_off - (q - t);
    }
    return 0;
}

/* The chunk offset of ptr, which pycds_place_room() says is in the chunk. */
static inline uint64_t
pycds_place_off(const pycds_place *p, const void *ptr)
{
    uintptr_t q = (uintptr_t)ptr, h = (uintptr_t)p->head;
    return q >= h && q - h < p->root_off ? q - h
           : p->root_off + (q - (uintptr_t)p->tail);
}

/* writer.c: services the layout code uses while copying one object. */
int pycds_w_alloc(pycds_writer *w, size_t size, uint64_t *off);
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

/* layout.c: one CPython minor version's object layout. */
/* Copy op (an exact instance of a supported type, not static) into the
 * heap; *off receives the offset of the PyObject (after any GC header). */
int pycds_layout_copy(pycds_writer *w, PyObject *op, int depth, uint64_t *off);
/* A new tuple of frozenset op's items in the order unmarshal of a .pyc
 * adds them (3.11+; 3.10: op's iteration order), or NULL with an
 * exception.  GIL held. */
PyObject *pycds_layout_frozenset_items(PyObject *op);
/* Nonzero if str op is interned and must be re-interned at load. */
int pycds_layout_str_interned(PyObject *op);
/* Re-intern the str in *slot at load (replaces *slot). */
int pycds_layout_intern(PyObject **slot);
/* Before a load re-interns n strs: room for them in the interpreter's
 * interned dict, made where a failure leaves it intact (3.13; layout.c's
 * default does nothing).  *room: how many of them it has room for now
 * (n, or fewer but at least one: reserve again after those).  GIL held. */
int pycds_layout_intern_reserve(uint64_t n, uint64_t *room);
/* Store in str op's hash cache what unicode_hash() would compute; op was
 * checked to fit in its chunk.  Pure: callable without the GIL. */
void pycds_layout_str_prehash(PyObject *op);
/* Nonzero if op (not in the image, so copied) has a value for which
 * unmarshal hands out an instance the interpreter shares (3.10: small ints,
 * the empty and 1-char latin-1 strs, (), b''); the slot is then recorded as
 * PYCDS_RELOC_SINGLETON.  Layouts whose shared instances are all static in
 * the image (3.11+) get layout.c's default, which returns 0. */
int pycds_layout_heap_singleton(PyObject *op);
/* At load: replace the copy in *slot with the interpreter's shared instance
 * of its value (a new reference the archive keeps for good).  The default
 * refuses: a layout without heap singletons never writes such a slot. */
int pycds_layout_use_singleton(PyObject **slot);
/* At load, after all fix-ups: the per-process work a fresh unmarshal does
 * for each code object reachable from root (3.12+: draw co_version, tell
 * the code watchers).  Layouts that need none get layout.c's no-op. */
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
/* The pointer fields of a code object (offset, and the exact type their
 * target must have), for the loader's structural check; *out is static. */
typedef struct {
    size_t offset;
    PyTypeObject *type;
    PyTypeObject *item_type;  /* tuples: exact type of every item, or NULL */
} pycds_code_field;
size_t pycds_layout_code_fields(const pycds_code_field **out);
/* At load, after the structural check: 0 if op's fields are what a fresh
 * unmarshal could produce (code object counts, reset caches; 3.10: the
 * co_cell2arg data, which must lie in chunk p), else PYCDS_E_CORRUPT.
 * Layouts without the check get layout.c's default. */
int pycds_layout_check_object(const pycds_place *p, PyObject *op);

#endif /* PYCDS_INTERNAL_H */
