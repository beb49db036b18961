/* pycds_native.h -- the boundary between Python (cffi) and the native archiver.
 *
 * Only plain C types cross it.  Python objects travel as uintptr_t (id(obj) on
 * CPython) and stay owned by the caller, who keeps them alive for the call;
 * results come back in out-parameters or are appended to a list the caller
 * owns (passed by id()).  Every function returns 0 or a negative PYCDS_E_*
 * code; pycds_strerror() names the code and pycds_last_error() gives the
 * detail of the most recent failure.  No function leaves a Python exception
 * set.  cffi calls these functions with the GIL released; those that touch
 * Python objects take it first (PyGILState_Ensure).
 *
 * The cffi cdef (pycds_native.cdef) repeats these declarations and must match.
 */
#ifndef PYCDS_NATIVE_H
#define PYCDS_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "pycds_format.h"   /* written by the build from pycds/_format.py */

/* Status codes. */
#define PYCDS_OK 0
/* Mirrored as pycds.errors.E_*. */
#define PYCDS_E_NOMEM (-1)        /* an allocation failed */
#define PYCDS_E_UNSUPPORTED (-2)  /* an object the archive cannot hold */
#define PYCDS_E_TOODEEP (-3)      /* constants nested deeper than the limit */
#define PYCDS_E_TOOBIG (-4)       /* a module's objects exceed 4 GiB */
#define PYCDS_E_IO (-5)           /* read or map of the archive failed */
#define PYCDS_E_CORRUPT (-6)      /* checksum or bounds check failed */
#define PYCDS_E_FOREIGN (-7)      /* archive made by another interpreter build */
#define PYCDS_E_STATE (-8)        /* module failed before, or bad handle */
#define PYCDS_E_ARG (-9)          /* an argument is out of range */
#define PYCDS_E_PYTHON (-10)      /* a Python C-API call failed */

/* Relocation kinds: the low 3 bits of a relocation entry.  The entry's
 * other bits are the slot's byte offset in its module chunk (8-aligned). */
#define PYCDS_RELOC_INTERNAL 0    /* slot holds a chunk offset */
#define PYCDS_RELOC_EXTERNAL 1    /* slot holds an offset from the image anchor */
#define PYCDS_RELOC_INTERN 2      /* slot holds the str's archive-wide number
                                     << 32 | its chunk offset: INTERNAL, then
                                     re-intern the str (once per number and
                                     process) */
#define PYCDS_RELOC_FROZENSET 3   /* INTERNAL to a tuple, then frozenset(tuple) */
#define PYCDS_RELOC_SINGLETON 4   /* INTERNAL to a copy of a value the interpreter
                                     shares (3.10: small int, empty or 1-char
                                     str, (), b''), then its shared instance */
#define PYCDS_RELOC_DATA 5        /* slot holds a chunk offset inside an object,
                                     not of one (3.10/3.11: a str's wstr, which
                                     points at its own code units) */

/* What pycds_writer_add() reports about one module's chunk. */
typedef struct {
    uint64_t chunk_off;    /* byte offset of the chunk in the heap section */
    uint64_t chunk_len;    /* bytes */
    uint64_t root_off;     /* offset of the code object inside the chunk */
    uint64_t reloc_first;  /* index of the first relocation entry */
    uint64_t reloc_count;  /* number of relocation entries */
    uint64_t checksum;     /* pycds_hash64 over chunk bytes, then entries */
    uint64_t nobjects;     /* objects copied */
} pycds_chunk_info;

typedef struct pycds_writer pycds_writer;
typedef struct pycds_archive pycds_archive;

/* pycds_archive_set_release() modes */
#define PYCDS_RELEASE_OFF 0
#define PYCDS_RELEASE_ON 1
#define PYCDS_RELEASE_PROTECT 2

/* Errors.  Both return static or per-thread storage: do not free. */
const char *pycds_strerror(int code);
const char *pycds_last_error(void);

/* Version of this build of the native module; pycds/_nativeapi.py compares
 * it with the Python package's version.  Static string. */
const char *pycds_build_version(void);

/* Digest of the archive format this module was built for (PYCDS_FMT_DIGEST:
 * native/archive/format_header.py over pycds/_format.py). */
uint64_t pycds_format_digest(void);

/* 64-bit hash (XXH64 algorithm) of n bytes with a seed. Pure, no GIL. */
uint64_t pycds_hash64(const void *data, size_t n, uint64_t seed);
/* XXH64 of the concatenation a[0, na) || b[0, nb), without making it. */
uint64_t pycds_hash64_2(const void *a, size_t na, const void *b, size_t nb,
                        uint64_t seed);

/* Allocate the first length bytes of the file fd (a new archive, before it
 * is written: file.c says why), keeping its size.  Where the file system
 * cannot, does nothing.
 * PYCDS_E_IO with *err = errno on another failure (ENOSPC, ...). No GIL. */
int pycds_preallocate(int fd, uint64_t length, int *err);

/* Identity of the running interpreter image and object layout, written as
 * text into buf (at most cap bytes, NUL-terminated).  It changes whenever
 * the static objects could sit at other offsets from the anchor. */
int pycds_layout_id(char *buf, size_t cap);

/* CPython 3.12 draws each code object's co_version from a counter private
 * to libpython (_Py_next_func_version), which the loader otherwise draws
 * from by making and freeing a tiny code object per loaded one.  The
 * writer finds the counter in libpython's symbol table (not stripped, the
 * file the loaded build's) and gives its offset from the image anchor, to
 * be recorded in the archive; the loader checks that the offset holds the
 * counter (two draws) and then draws from it directly (so does a process
 * once its writer has found and checked it).  Elsewhere, and
 * where it cannot be found or checked: PYCDS_E_UNSUPPORTED with why.
 * Both take the GIL. */
int pycds_layout_version_counter_at(int64_t *offset);
int pycds_layout_use_version_counter(int64_t offset);

/* Writer: deep-copies code objects into a growing heap.  The writer owns
 * its buffers; pycds_writer_free() releases them (NULL is allowed). */
int pycds_writer_new(uint64_t seed, pycds_writer **out);
/* Copy code object code (a PyObject *) and all it reaches as one chunk,
 * bytecode in its fresh form (as unmarshal makes it) whether or not it has
 * run.  ran: code is the one the import executed; its function code
 * objects that nothing else holds are predicted dead (writer.c).  orders:
 * a dict (PyObject *, or 0) from a frozenset's address to the tuple of its
 * items in the order unmarshal adds them, for frozensets whose reference
 * counts have changed since unmarshal (pycds_frozenset_items). */
int pycds_writer_add(pycds_writer *w, uintptr_t code, int ran, uintptr_t orders,
                     pycds_chunk_info *info);
/* Append to list out_list the items of frozenset set (PyObject *s) in the
 * order unmarshal adds them, inferred from their reference counts: right
 * for a frozenset only its code object holds (common/layout.c). */
int pycds_frozenset_items(uintptr_t set, uintptr_t out_list);
/* Borrowed views of the heap and relocation buffers, valid until the next
 * pycds_writer_add() or pycds_writer_free(). */
int pycds_writer_heap(pycds_writer *w, const uint8_t **data, size_t *len);
int pycds_writer_relocs(pycds_writer *w, const uint32_t **data, size_t *count);
/* How many interned strings the writer has numbered (the numbers of the
 * INTERN slots of its chunks are below it). */
int pycds_writer_nstrings(pycds_writer *w, uint32_t *n);
/* Renumber the INTERN slots of a chunk carried over from another archive
 * (len bytes, its nrel relocation entries rel): string number k becomes
 * map[k] - 1, where map (map_len entries, caller-owned, shared by all the
 * chunks carried from one archive) has a nonzero entry, else the next new
 * number, *next, which is then recorded in map[k] (as *next + 1) and
 * *next incremented.  PYCDS_E_CORRUPT for a slot or number out of range
 * (chunk is then partly renumbered).  No GIL. */
int pycds_strings_renumber(uint8_t *chunk, size_t len, const uint32_t *rel,
                           size_t nrel, uint32_t *map, size_t map_len,
                           uint32_t *next);
void pycds_writer_free(pycds_writer *w);

/* The heap section's alignment in the file (pycds/_format.py HEAP_ALIGN):
 * the format's, whatever the page size where the archive is written or read. */
#define PYCDS_HEAP_ALIGN PYCDS_FMT_HEAP_ALIGN

/* What pycds_archive_open() needs of an archive's header and meta block
 * (docs/archive-format.md).  The caller owns it and layout_id. */
typedef struct {
    uint64_t heap_off;     /* heap section: file offset (PYCDS_HEAP_ALIGN) */
    uint64_t heap_len;     /* ... and bytes */
    uint64_t reloc_off;    /* relocation table: file offset */
    uint64_t reloc_count;  /* ... and entries (uint32 each) */
    uint64_t chunks_off;   /* chunk table: file offset of nmodules records */
    uint64_t chunks_sum;   /* ... and its XXH64 with seed */
    uint32_t nmodules;
    uint64_t seed;         /* the archive's id (of its content), the checksums' seed */
    const char *layout_id; /* pycds_layout_id() of the dump run */
} pycds_archive_header;

/* Loader.  pycds_archive_open() dup()s fd (the caller keeps its own) to a
 * number out of the program's way (descriptor.c), reads and checks the
 * chunk table, reserves address space for the heap and checks the header's
 * layout_id against this image.  The handle and its
 * reservation live until pycds_archive_close(); objects handed out by
 * pycds_archive_load() are never freed, so a handle whose modules were
 * loaded must never be closed (close is for tests and refused archives). */
int pycds_archive_open(int fd, const pycds_archive_header *header,
                       pycds_archive **out);
/* Loads module `module_no` (once; later calls return the same object):
 * reads its chunk into the reservation, verifies the checksum, applies the
 * relocation entries, re-interns strings, rebuilds frozensets, and appends
 * the module's code object to the list `out_list` (a new reference).
 * Takes the GIL. */
int pycds_archive_load(pycds_archive *a, uint32_t module_no, uintptr_t out_list);
/* Turn the deep structural check of every loaded chunk (verify.c) on or
 * off (default off).  Checksums and relocation bounds are always checked;
 * the deep check guards against re-signed, crafted archives, at a cost
 * to every load. */
int pycds_archive_set_verify(pycds_archive *a, int on);
/* Read ahead (prefetch.c): after each load, a thread reads and relocates
 * the chunks that follow within `window` bytes of heap.  0 turns it off
 * (the default); it also stays off with fewer than two usable CPUs. */
int pycds_archive_set_prefetch(pycds_archive *a, uint64_t window);
/* How many modules the read-ahead thread has read and relocated so far. */
int pycds_archive_prefetched(pycds_archive *a, uint64_t *count);
/* After the module body of `module_no` ran: give back the pages of its
 * chunk's tail that nothing holds any more (release.c); *released gets the
 * bytes given back.  A released module is never handed out again
 * (pycds_archive_load fails with PYCDS_E_STATE).  Takes the GIL. */
int pycds_archive_release(pycds_archive *a, uint32_t module_no, uint64_t *released);
/* PYCDS_RELEASE_OFF, _ON (the default) or _PROTECT (tests: PROT_NONE
 * instead of giving the pages back, so a stray access faults). */
int pycds_archive_set_release(pycds_archive *a, int mode);
/* The handle's own descriptor on the archive (which it closes), so that
 * the caller can read through it and close its own. */
int pycds_archive_fd(pycds_archive *a, int *fd);
int pycds_archive_close(pycds_archive *a);

/* Opening an archive (loader/open.c): the header's fields
 * (docs/archive-format.md; pycds/_archive.py Header), the file's identity
 * and modification time, the meta block and the bucket table, checked. */
typedef struct {
    int fd;                /* a descriptor on the file, or -1 (PYCDS_OPEN_CLOSE) */
    uint32_t format, header_size, nmodules, flags, py_hexversion;
    uint64_t archive_id, created_ns, meta_off, meta_len, buckets_off, nbuckets;
    uint64_t entries_off, entries_len, heap_off, heap_len, reloc_off, reloc_count;
    uint64_t file_len, meta_sum, buckets_sum, chunks_off, chunks_sum;
    uint64_t st_dev, st_ino;
    int64_t mtime_ns;
    uint8_t *meta;         /* meta_len bytes (marshal data); pycds_opened_free */
    uint8_t *buckets;      /* nbuckets records of 8 bytes; pycds_opened_free */
} pycds_opened;

/* pycds_archive_read_index() flags */
#define PYCDS_OPEN_OWNER 1     /* refuse what pycds_trust_check refuses */
#define PYCDS_OPEN_VERSION 2   /* refuse another minor version's archive */
#define PYCDS_OPEN_CLOSE 4     /* hold no descriptor once read */

/* Open the archive at path and check its header, meta block and bucket
 * table (not whether the meta block names this interpreter: marshal data,
 * for the caller).  PYCDS_E_FOREIGN for another format or Python version,
 * PYCDS_E_IO where the file cannot be opened or read (the detail is
 * strerror's text alone where open() failed), PYCDS_E_CORRUPT for anything
 * else refused, with the reason as the detail.  On success the caller
 * owns o->fd (unless -1) and frees o's buffers with pycds_opened_free().
 * No GIL. */
int pycds_archive_read_index(const char *path, int flags, pycds_opened *o);
void pycds_opened_free(pycds_opened *o);

/* pycds_trust_check() flags: also refuse the file itself for its mode or
 * owner (stat, following links). */
#define PYCDS_TRUST_FILE 1
/* Refuse an archive at path that others could have written or could
 * replace: a directory on the way (from "/" down, through every symbolic
 * link) writable by others without the sticky bit; with PYCDS_TRUST_FILE, a
 * file writable by group or others or owned by another user than this one
 * or root.  PYCDS_E_CORRUPT with the reason; PYCDS_E_IO where the file
 * cannot be stat'ed.  No GIL. */
int pycds_trust_check(const char *path, int flags);

/* The finder's archive hit (loader/find.c): what pycds_index_find() reads
 * of an archive's index (docs/archive-format.md).  The caller owns it and
 * keeps `buckets` (nbuckets records of 8 bytes) alive and unchanged. */
typedef struct {
    int fd;                /* a descriptor on the archive, or -1: none yet */
    uint64_t entries_off;  /* module entries: file offset */
    uint64_t entries_len;  /* ... and bytes */
    const uint8_t *buckets;
    uint64_t nbuckets;     /* a power of two */
    uint64_t key;          /* the archive's id, the entries' checksum key */
    /* A window of the entries section read at once, where window_cap > 0:
     * the caller's buffer of window_cap bytes; window_len 0 until the
     * first read (and after any change of the fields above). */
    uint8_t *window;
    uint64_t window_cap, window_lo, window_len;
} pycds_index;

/* pycds_index_find() flags: also stat the entry's source and .pyc. */
#define PYCDS_FIND_FILES 1
/* What pycds_index_find() and _hit() return, nothing appended, where a
 * bucket holds the name's tag and the index has no descriptor (fd -1):
 * the name is likely in the archive; read it once a descriptor is set. */
#define PYCDS_FIND_NO_FILE 1
/* An index entry's pyc_kind where the dump run's code came from a
 * timestamp .pyc (pycds/_format.py PYC_TIMESTAMP). */
#define PYCDS_PYC_TIMESTAMP PYCDS_FMT_PYC_TIMESTAMP

/* Look up the module named `name` (a str) in the index and stat what its
 * entry names.  0 and nothing appended: not in the archive.  0 and five
 * items appended to `out_list` (a list): the entry's tuple, the stamps of
 * its search's directories (a tuple, None where a step has no stamp or its
 * stat failed), the package directory's stamp, and with PYCDS_FIND_FILES
 * the (st_mtime_ns, st_size, st_mtime) of the source and of the .pyc, each
 * None where not taken or where stat failed.  PYCDS_FIND_NO_FILE: see
 * above.  Any other code: declined (an entry that fails its checks, an
 * unusual one, a read error); the caller reads the index its own way.
 * Takes the GIL. */
int pycds_index_find(pycds_index *ix, uintptr_t name, int flags,
                     uintptr_t out_list);
/* pycds_index_find() with PYCDS_FIND_FILES, and a sixth item appended: True
 * when plain import would take the entry's module as the dump recorded it
 * -- its search replays on `path` (a list; None: sys.path) with every
 * stamp as recorded, the .pyc ModuleSpec.cached names now is the recorded
 * timestamp .pyc of the recorded mtime and size, the source has the
 * recorded mtime and size -- else False (the caller judges the facts).
 * `ctx`: (FileFinder, its stock (suffix, loader) list, PYC_TIMESTAMP,
 * "_loaders", "path", stock_hooks, serving), the two names interned;
 * stock_hooks True where the path hooks are importlib's own; serving None
 * or (finder, PathFinder, search, loader): the import system's parts the
 * verdict also requires as pycds started with them (find.c,
 * serving_stock()), and then a True verdict comes with the entry's tuple
 * alone (two items appended, not six).
 * For PYCDSCHECK=mtime.  Takes the GIL. */
int pycds_index_hit(pycds_index *ix, uintptr_t name, uintptr_t path,
                    uintptr_t ctx, uintptr_t out_list);
/* _imp.source_hash's keyed SipHash (2-4 on 3.10, 1-3 after) of n bytes.
 * Pure, no GIL. */
uint64_t pycds_keyed_hash(uint64_t key, const void *src, size_t n);

/* serve.c: the served hit in C (pycds/share/__init__.py).  pycds_serve_new appends
 * a server made of the Python objects and flags of dict args, by name
 * (serve.c's part_names and flag_names), over index ix (kept alive by the
 * caller); pycds_serve_use gives it the native handle once
 * open.  (Its counters: in a bytearray of the caller's, see serve.c.) */
int pycds_serve_new(uintptr_t args, pycds_index *ix, uintptr_t out_list);
int pycds_serve_use(uintptr_t server, pycds_archive *a);

#endif /* PYCDS_NATIVE_H */
