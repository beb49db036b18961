/* archive.h -- an open archive, shared by the loader's units.  Private to
 * the native module.
 *
 * The units, each calling only those listed after it:
 *   serve.c     the served hit: find.c's verdict, then a load (loader.c)
 *               and a release (release.c), called by the interpreter;
 *   find.c      the finder's hit: index lookup, stats, verdict;
 *   loader.c    open, stage 2 of a load, close (the public entry points);
 *   release.c   gives back the tail of a module whose body ran;
 *   prefetch.c  the read-ahead thread, which runs stage 1 ahead;
 *   relocate.c  stage 1 of a load;
 *   fixpool.c   the read-ahead thread's pool of fix-up records;
 *   archive.c   the handle's locks, chunk placement, giving pages back;
 *   verify.c, descriptor.c   leaf services (see their declarations below).
 *
 * Loading a module has two stages:
 *   stage 1 (relocate.c, no Python): pread the chunk's head and
 *           tail into their places in the heap reservation (pycds_place)
 *           and its relocation entries into a
 *           buffer, verify the checksum, apply the pointer relocations;
 *   stage 2 (loader.c, holding the GIL): re-interning, shared instances,
 *           frozensets, the per-process code-object work.
 * The read-ahead thread runs stage 1 for the modules that follow, in heap
 * order, the one the program imports now (the order of the dump run), so
 * that the importing thread finds them READY and only runs stage 2.
 *
 * Every field below `mu` is guarded by it.  A module's state moves
 *   NEW -> AHEAD -> READY -> IMPORTING -> LOADED | FAILED  (read ahead)
 *   NEW -> IMPORTING -> LOADED | FAILED                    (all on import)
 *   LOADED -> RELEASED    (its body ran; release.c gave its tail back)
 * and NEW -> AHEAD -> NOPREFETCH when stage 1 failed on the read-ahead
 * thread (the importing thread then redoes it, from the pread on, and
 * reports why).  Only the thread that set AHEAD or IMPORTING touches the
 * chunk's bytes until it moves the state on, so no byte of the heap is
 * written by two threads.  An importer waits for AHEAD (one stage 1 of the
 * read-ahead thread, which needs no lock of the importer's); a module met
 * IMPORTING -- stage 2 ran Python code (a finalizer during a collection)
 * that asked for the same module, or let another thread do so -- is
 * refused with PYCDS_E_STATE and imported plainly, never waited for.
 */
#ifndef PYCDS_ARCHIVE_H
#define PYCDS_ARCHIVE_H

#include "pycds_internal.h"

#include <pthread.h>

enum {
    MOD_NEW = 0,
    MOD_LOADED = 1,
    MOD_FAILED = 2,
    MOD_AHEAD = 3,       /* the read-ahead thread runs stage 1 on it */
    MOD_READY = 4,       /* stage 1 done ahead; its fix-up list in fixups[] */
    MOD_NOPREFETCH = 5,  /* like NEW, but the read-ahead thread gave up on it */
    MOD_IMPORTING = 6,   /* an importing thread is loading it */
    MOD_RELEASED = 7,    /* LOADED, then its tail was given back (release.c) */
};

/* One record of the archive's chunk table (docs/archive-format.md), in the
 * writer's native byte order (struct "=" in pycds/_archive.py, chunk_table), which is
 * this machine's: the meta block's byteorder is checked at open. */
typedef struct {
    uint64_t chunk_off;    /* offset of the chunk in the heap section */
    uint32_t chunk_len;    /* bytes */
    uint32_t root_off;     /* offset of the module's code object in the chunk */
    uint64_t reloc_first;  /* index of its first relocation entry */
    uint32_t reloc_count;
    uint32_t zero;         /* reserved, 0 */
    uint64_t checksum;     /* XXH64(chunk, seed) then XXH64(entries, that) */
} pycds_chunk_rec;
_Static_assert(sizeof(pycds_chunk_rec) == PYCDS_FMT_CHUNK_REC
               && offsetof(pycds_chunk_rec, chunk_len) == PYCDS_FMT_CHUNK_CHUNK_LEN
               && offsetof(pycds_chunk_rec, root_off) == PYCDS_FMT_CHUNK_ROOT_OFF
               && offsetof(pycds_chunk_rec, reloc_first) == PYCDS_FMT_CHUNK_RELOC_FIRST
               && offsetof(pycds_chunk_rec, reloc_count) == PYCDS_FMT_CHUNK_RELOC_COUNT
               && offsetof(pycds_chunk_rec, checksum) == PYCDS_FMT_CHUNK_CHECKSUM,
               "pycds_chunk_rec is pycds/_format.py's CHUNK_FIELDS");

/* What stage 1 hands to stage 2. */
typedef struct {
    uint32_t *rel;         /* the module's relocation entries, kept for the
                            * deep check only (NULL when it is off) */
    uint64_t nrel;
    uint32_t *fix;         /* INTERN and SINGLETON entries, then FROZENSET */
    uint32_t *num;         /* per entry of the first nstr: an INTERN slot's
                            * string number (0 for SINGLETON) */
    uint64_t nstr, nset;
    uint64_t nintern;      /* INTERN entries among the nstr */
    int tail_shared;       /* an INTERNAL slot before root_off points at or
                            * after it: the tail is not the writer's, keep it
                            * (release.c) */
    void *block;           /* the read-ahead pool's block it lies in
                            * (fixpool.c), or NULL: malloc'd */
} pycds_fixups;

struct pycds_archive {
    int fd;
    uint8_t *base;            /* anonymous reservation for the heap, or NULL:
                               * the heads' arena, then (on a page) the tails' */
    uint8_t *tails;           /* the tails' arena */
    size_t map_len;
    size_t page;
    uint64_t heap_off, heap_len;
    uint64_t reloc_off, reloc_count;
    uint32_t nmodules;
    uint64_t seed;
    pycds_chunk_rec *chunks;  /* nmodules records, validated at open */
    int verify;               /* run pycds_verify_chunk() on every load */
    int sync_made;            /* mu and the condition variables exist */
    int release_mode;         /* PYCDS_RELEASE_*: release.c */
    /* The interpreter's interned string of each archive-wide string number
     * met so far (a reference of its own), in leaves of PYCDS_STRTAB_LEAF
     * numbers made on first use; numbers are below reloc_count (each has
     * an INTERN slot).  Written by stage 2 only, under the GIL (loader.c),
     * atomically: stage 1 reads it (pycds_strtab_met). */
    PyObject ***strtab;
    size_t strtab_leaves;

    pthread_mutex_t mu;
    pthread_cond_t done_cv;   /* a stage-1 run of the read-ahead thread ended */
    pthread_cond_t work_cv;   /* the read-ahead thread has something to do */
    uint8_t *state;           /* per module: MOD_* */
    pycds_fixups **fixups;    /* per READY module: what stage 1 handed over */
    PyObject **roots;         /* per LOADED module: its code object */
    uint8_t *keep_tail;       /* per LOADED module: fixups' tail_shared */
    /* Placement (pycds_archive_place): per module, its head's offset in the
     * heads' arena and its tail's in the tails' arena, plus one (0: not
     * placed yet); bump offsets of the two arenas; per page of the tails'
     * arena, the tail bytes on it not yet found dead (release.c). */
    uint64_t *head_at, *tail_at;
    uint64_t heads_used, tails_used;
    uint32_t *tail_live;
    size_t tail_pages;
    int tail_count_broken;    /* an inconsistency seen: give back no more */

    /* read-ahead (prefetch.c) */
    uint64_t pf_window;       /* most bytes of heap read ahead; 0: off */
    uint64_t pf_cur;          /* the window now (ramps up, prefetch.c) */
    uint32_t pf_next;         /* first module it may read ahead */
    uint64_t pf_limit;        /* ... as long as the chunk starts below this */
    int pf_stop;              /* the thread must exit (fork, close) */
    int pf_running;           /* the thread is in its loop */
    int pf_waiting;           /* ... and waits for work */
    uint64_t pf_woken_limit;  /* pf_limit when it was last woken */
    int pf_joinable;          /* a thread was started and not yet joined */
    pthread_t pf_thread;
    pid_t pf_tid;             /* its kernel thread id, once it runs (0: not yet) */
    uint64_t pf_ahead;        /* stage-1 runs done ahead (statistics) */
    struct pycds_archive *pf_next_archive;   /* fork registry (prefetch.c) */
    /* page ranges of released tails left for the read-ahead thread to give
     * back (release.c): pairs of address and length */
    uintptr_t *gb_q;
    size_t gb_n, gb_cap;
    /* the read-ahead thread's pool of fix-up records (fixpool.c): the
     * block it fills, and one empty block kept for reuse */
    struct pycds_fixblock *fb_cur, *fb_spare;
};

#define PYCDS_STRTAB_LEAF 2048

/* Whether a's table has string number n's interned string (n below
 * a->reloc_count): set by stage 2, never cleared while a is open.  Stage 1
 * reads it without the GIL as a hint (what it says stays true). */
static inline int
pycds_strtab_met(pycds_archive *a, uint32_t n)
{
    PyObject **leaf = __atomic_load_n(&a->strtab[n / PYCDS_STRTAB_LEAF], __ATOMIC_ACQUIRE);
    return leaf != NULL
           && __atomic_load_n(&leaf[n % PYCDS_STRTAB_LEAF], __ATOMIC_RELAXED) != NULL;
}

/* A buffer for the relocation entries that one thread reuses from chunk to
 * chunk (the read-ahead thread's), mapped apart from malloc: what that
 * thread malloc'd and the importing thread freed would stay in the
 * read-ahead thread's own malloc arena, never given back. */
typedef struct {
    void *p;
    size_t cap;            /* bytes */
} pycds_scratch;

/* How many bytes of the range [lo, hi) of the tails' arena lie on its page
 * p (pages of pg bytes; p overlaps the range).  The loader counts a tail's
 * bytes per page with it, release.c takes the dead ones off. */
static inline uint64_t
pycds_page_share(uint64_t p, uint64_t pg, uint64_t lo, uint64_t hi)
{
    uint64_t from = p * pg > lo ? p * pg : lo;
    uint64_t to = (p + 1) * pg < hi ? (p + 1) * pg : hi;
    return to - from;
}

/* ---- archive.c ---------------------------------------------------------- */

/* Create a's mutex and condition variables (at open, and anew in a forked
 * child); destroy them (at close). */
int pycds_archive_sync_init(pycds_archive *a);
void pycds_archive_sync_destroy(pycds_archive *a);
/* Where module k's chunk lives, placing it on first use (then for good: a
 * stage 1 redone after a failure reuses the place).  Takes a->mu; any
 * thread. */
void pycds_archive_place(pycds_archive *a, uint32_t k, pycds_place *out);
/* Give the page range back now (madvise, or mprotect in the PROTECT mode);
 * 0 on success.  Any thread, no lock needed. */
int pycds_release_pages(pycds_archive *a, uintptr_t lo, size_t len);

/* ---- fixpool.c ---------------------------------------------------------- */

/* The read-ahead thread's fix-up records, bump-allocated in mmap'd blocks.
 * alloc: the read-ahead thread, without a->mu; NULL when out of memory.
 * free: any thread, without a->mu.  trim_locked: with a->mu held, give back
 * the blocks no record is in (the thread exits).  destroy: at close, once
 * every record is freed. */
void *pycds_fixpool_alloc(pycds_archive *a, size_t bytes, void **block);
void pycds_fixpool_free(pycds_archive *a, void *block);
void pycds_fixpool_trim_locked(pycds_archive *a);
void pycds_fixpool_destroy(pycds_archive *a);

/* ---- relocate.c --------------------------------------------------------- */

/* Read n bytes at off of fd into buf, all of them (PYCDS_E_IO otherwise). */
int pycds_read_full(int fd, void *buf, size_t n, uint64_t off);
/* Stage 1 of module k (see above).  No GIL; no Python object outside the
 * chunk is touched.  scratch: the calling thread's buffer for the
 * relocation entries, or NULL (malloc).  On success *out is the fix-up
 * list for stage 2, freed with pycds_fixups_free(). */
int pycds_chunk_stage1(pycds_archive *a, uint32_t k, pycds_scratch *scratch,
                       pycds_fixups **out);
void pycds_fixups_free(pycds_archive *a, pycds_fixups *f);
void pycds_scratch_free(pycds_scratch *scratch);

/* ---- prefetch.c --------------------------------------------------------- */

/* Register a for fork handling and set its window (0: off).  No lock held. */
int pycds_prefetch_enable(pycds_archive *a, uint64_t window);
/* With a->mu held: module k is being imported (hit: it had been read
 * ahead); read ahead after it. */
void pycds_prefetch_schedule(pycds_archive *a, uint32_t k, int hit);
/* Stop and join the read-ahead thread, unregister a.  No lock held. */
void pycds_prefetch_shutdown(pycds_archive *a);
/* Leave the page range [lo, lo + len) to the read-ahead thread to give
 * back: 1 if it took it, 0 if the caller must (no thread to be had, or no
 * memory to queue it).  No lock held. */
int pycds_prefetch_give_back(pycds_archive *a, uintptr_t lo, size_t len);

/* ---- verify.c ----------------------------------------------------------- */

/* The deep structural check of a chunk whose relocations were applied
 * (loader.c runs it when the archive's verify flag is on).  GIL. */
int pycds_verify_chunk(const pycds_place *p, const uint32_t *rel, uint64_t n);
/* Size in bytes of the chunk object op (of a type a chunk holds), or 0 if
 * its header is not that of a well-formed object fitting in avail bytes.
 * Reads only op's header; no GIL needed. */
size_t pycds_object_size(PyObject *op, uint64_t avail);

/* ---- descriptor.c ------------------------------------------------------- */

/* A CLOEXEC duplicate of fd numbered at the program's soft RLIMIT_NOFILE
 * where that is at most PYCDS_FD_PAST_MAX and may be raised for a moment,
 * else as high as is free below min(limit, PYCDS_FD_CEILING); -1 with errno
 * if no duplicate can be made.  GIL held. */
#define PYCDS_FD_PAST_MAX 65536
#define PYCDS_FD_CEILING 4096
int pycds_fd_place(int fd);

/* find.c: pycds_index_hit for callers holding the GIL (serve.c), which
 * also lets a FileFinder read its directory's listing again as its
 * find_spec would (PYCDS_E_PYTHON with the exception set where that
 * raised); and
 * whether each (object, name, value) of triples is what is stored there
 * now (the verdict's check of the loader parts plain import uses). */
int pycds_find_hit(pycds_index *ix, PyObject *name, PyObject *path, PyObject *ctx,
                   PyObject *out);
int pycds_stored_stock(PyObject *triples);

/* loader.c: pycds_archive_load for a caller holding the GIL; *root a new
 * reference. */
int pycds_archive_load_root(pycds_archive *a, uint32_t module_no, PyObject **root);

/* release.c: pycds_archive_release for a caller holding the GIL. */
int pycds_archive_release_held(pycds_archive *a, uint32_t module_no, uint64_t *released);

#endif /* PYCDS_ARCHIVE_H */
