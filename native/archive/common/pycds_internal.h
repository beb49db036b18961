/* pycds_internal.h -- declarations the writer and the loader share (not
 * cffi's): the units of common/ (errors, hash, address tables, the
 * interpreter image) and the chunk placement both sides agree on.
 *
 * The object layout's interface (what layout.c offers the writer and the
 * loader, and what the writer offers layout.c) is declared in layout.h.
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

#endif /* PYCDS_INTERNAL_H */
