/* open.c -- opening an archive: everything a reader checks before it uses
 * any part of the file (docs/archive-format.md, "Reading an archive").
 *
 * pycds_archive_read_index() opens the file without blocking (a FIFO put
 * at the archive path must not hang start-up), refuses what is not a
 * regular file, what others could have written or could replace
 * (pycds_trust_check), then checks the header (magic, format, Python
 * version, keyed checksum, file length, section bounds, bucket table size)
 * and reads the meta block and the bucket table, each checked against its
 * checksum keyed by the archive's id.  Whether the meta block names this
 * interpreter is for the caller (pycds/_nativeapi.py): it is marshal data.
 * No Python object is touched: no GIL.
 */
#include "archive.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_LINKS 40              /* symbolic links followed (MAXSYMLINKS) */

uint64_t
pycds_format_digest(void)
{
    return PYCDS_FMT_DIGEST;
}

/* ---- trust ------------------------------------------------------------ */

static int
check_owner(const struct stat *st)
{
    if (st->st_mode & 022) {
        return pycds_fail(PYCDS_E_CORRUPT, "writable by group or others (mode %o)",
                          (unsigned)(st->st_mode & 0777));
    }
    uid_t uid = getuid();
    if (st->st_uid != uid && st->st_uid != 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "owned by uid %lu, not by this user (%lu) or root",
                          (unsigned long)st->st_uid, (unsigned long)uid);
    }
    return PYCDS_OK;
}

static int
check_dir_mode(const char *d, mode_t mode)
{
    if ((mode & 002) && !(mode & 01000)) {
        return pycds_fail(PYCDS_E_CORRUPT, "its directory %s is writable by others "
                          "(mode %o, no sticky bit)", d, (unsigned)(mode & 07777));
    }
    return PYCDS_OK;
}

/* The lexically normalised absolute form of path (os.path.abspath) in out
 * (cap bytes); -1 where it does not fit. */
static int
absolute(const char *path, char *out, size_t cap)
{
    char joined[2 * PATH_MAX];
    if (path[0] == '/') {
        if (strlen(path) >= sizeof joined) {
            return -1;
        }
        strcpy(joined, path);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL
                || (size_t)snprintf(joined, sizeof joined, "%s/%s", cwd, path) >= sizeof joined) {
            return -1;
        }
    }
    size_t n = 0;
    const char *p = joined;
    while (*p) {
        while (*p == '/') {
            p++;
        }
        const char *e = p;
        while (*e && *e != '/') {
            e++;
        }
        size_t len = (size_t)(e - p);
        if (len == 0 || (len == 1 && p[0] == '.')) {
            /* skipped */
        } else if (len == 2 && p[0] == '.' && p[1] == '.') {
            while (n > 0 && out[n - 1] != '/') {
                n--;
            }
            if (n > 0) {
                n--;          /* the slash before the dropped name */
            }
        } else {
            if (n + 1 + len + 1 > cap) {
                return -1;
            }
            out[n++] = '/';
            memcpy(out + n, p, len);
            n += len;
        }
        p = e;
    }
    if (n == 0) {
        out[n++] = '/';
    }
    out[n] = '\0';
    return 0;
}

/* Refuse a path reached through a directory writable by others without
 * the sticky bit: every directory name resolution passes through, from
 * "/" down, including those holding the symbolic links on the way (whose
 * links others could change).  One lstat a path component.  The walk of
 * pycds's first reader (a Python module then), its messages kept. */
static int
check_directories(const char *path)
{
    char cur[PATH_MAX], nxt[PATH_MAX], target[PATH_MAX];
    /* The components still to resolve, '/'-separated, from p on; `more`:
     * whether that list is non-empty (a trailing "" counts, as str.split
     * gives it). */
    size_t cap = 4 * PATH_MAX;
    char *rest = malloc(cap), *tmp = malloc(cap), *p;
    struct stat st;
    int links = 0, rc = PYCDS_OK, more = 1;
    if (rest == NULL || tmp == NULL) {
        rc = pycds_fail(PYCDS_E_NOMEM, "no memory to check the archive's directories");
        goto done;
    }
    strcpy(cur, "/");
    if (lstat(cur, &st) != 0) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "cannot stat / (%s)", strerror(errno));
        goto done;
    }
    if ((rc = check_dir_mode(cur, st.st_mode)) != PYCDS_OK) {
        goto done;
    }
    if (absolute(path, tmp, cap) != 0) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "cannot stat %s (%s)", path, strerror(ENAMETOOLONG));
        goto done;
    }
    strcpy(rest, tmp + 1);
    p = rest;
    while (more) {
        char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        char *name = p;
        more = slash != NULL;
        name[len] = '\0';
        p = more ? slash + 1 : p + len;
        if (len == 0 || strcmp(name, ".") == 0) {
            continue;
        }
        if (strcmp(name, "..") == 0) {
            /* cur has no links: its real parent (the root keeps its slash). */
            char *last = strrchr(cur, '/');
            last[last == cur] = '\0';
            continue;
        }
        if ((size_t)snprintf(nxt, sizeof nxt, "%s%s%s", cur, strcmp(cur, "/") ? "/" : "",
                             name) >= sizeof nxt) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "cannot stat %s/%s (%s)", cur, name,
                            strerror(ENAMETOOLONG));
            goto done;
        }
        if (lstat(nxt, &st) != 0) {
            rc = pycds_fail(PYCDS_E_CORRUPT, "cannot stat %s (%s)", nxt, strerror(errno));
            goto done;
        }
        if (S_ISLNK(st.st_mode)) {
            if (++links > MAX_LINKS) {
                rc = pycds_fail(PYCDS_E_CORRUPT, "too many symbolic links in %s", path);
                goto done;
            }
            ssize_t t = readlink(nxt, target, sizeof target - 1);
            if (t < 0) {
                rc = pycds_fail(PYCDS_E_CORRUPT, "cannot read the link %s (%s)", nxt,
                                strerror(errno));
                goto done;
            }
            target[t] = '\0';
            if (target[0] == '/') {
                strcpy(cur, "/");
            }
            /* The target's components go first. */
            if ((size_t)snprintf(tmp, cap, "%s%s%s", target, more ? "/" : "",
                                 more ? p : "") >= cap) {
                rc = pycds_fail(PYCDS_E_CORRUPT, "cannot stat %s (%s)", nxt,
                                strerror(ENAMETOOLONG));
                goto done;
            }
            char *swap = rest;
            rest = tmp;
            tmp = swap;
            p = rest;
            more = 1;
        } else if (more) {
            if ((rc = check_dir_mode(nxt, st.st_mode)) != PYCDS_OK) {   /* on the way */
                goto done;
            }
            strcpy(cur, nxt);
        }
    }
done:
    free(rest);
    free(tmp);
    return rc;
}

int
pycds_trust_check(const char *path, int flags)
{
    if (path == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no path");
    }
    if (flags & PYCDS_TRUST_FILE) {
        struct stat st;
        if (stat(path, &st) != 0) {
            return pycds_fail(PYCDS_E_IO, "cannot stat %s (%s)", path, strerror(errno));
        }
        int rc = check_owner(&st);
        if (rc != PYCDS_OK) {
            return rc;
        }
    }
    return check_directories(path);
}

/* ---- the header ------------------------------------------------------- */

static int
foreign_version(uint32_t hexversion, const char *tail)
{
    return pycds_fail(PYCDS_E_FOREIGN, "made by Python %u.%u%s", hexversion >> 24,
                      hexversion >> 16 & 0xFF, tail);
}

/* Parse and check the header b (PYCDS_FMT_HEADER_SIZE bytes) of a file of
 * file_len
 * bytes into o: pycds/_archive.py's Header fields. */
static int
parse_header(const uint8_t *b, uint64_t file_len, int check_version, pycds_opened *o)
{
    if (memcmp(b, PYCDS_FMT_MAGIC, PYCDS_FMT_MAGIC_LEN) != 0) {
        return pycds_fail(PYCDS_E_CORRUPT, "not a pycds archive (bad magic)");
    }
    o->format = pycds_le32(b + PYCDS_FMT_H_FORMAT);
    o->header_size = pycds_le32(b + PYCDS_FMT_H_HEADER_SIZE);
    o->archive_id = pycds_le64(b + PYCDS_FMT_H_ARCHIVE_ID);
    o->created_ns = pycds_le64(b + PYCDS_FMT_H_CREATED_NS);
    o->nmodules = pycds_le32(b + PYCDS_FMT_H_NMODULES);
    o->flags = pycds_le32(b + PYCDS_FMT_H_FLAGS);
    o->meta_off = pycds_le64(b + PYCDS_FMT_H_META_OFF);
    o->meta_len = pycds_le64(b + PYCDS_FMT_H_META_LEN);
    o->buckets_off = pycds_le64(b + PYCDS_FMT_H_BUCKETS_OFF);
    o->nbuckets = pycds_le64(b + PYCDS_FMT_H_NBUCKETS);
    o->entries_off = pycds_le64(b + PYCDS_FMT_H_ENTRIES_OFF);
    o->entries_len = pycds_le64(b + PYCDS_FMT_H_ENTRIES_LEN);
    o->heap_off = pycds_le64(b + PYCDS_FMT_H_HEAP_OFF);
    o->heap_len = pycds_le64(b + PYCDS_FMT_H_HEAP_LEN);
    o->reloc_off = pycds_le64(b + PYCDS_FMT_H_RELOC_OFF);
    o->reloc_count = pycds_le64(b + PYCDS_FMT_H_RELOC_COUNT);
    o->file_len = pycds_le64(b + PYCDS_FMT_H_FILE_LEN);
    o->meta_sum = pycds_le64(b + PYCDS_FMT_H_META_SUM);
    o->buckets_sum = pycds_le64(b + PYCDS_FMT_H_BUCKETS_SUM);
    o->py_hexversion = pycds_le32(b + PYCDS_FMT_H_PY_HEXVERSION);
    o->chunks_off = pycds_le64(b + PYCDS_FMT_H_CHUNKS_OFF);
    o->chunks_sum = pycds_le64(b + PYCDS_FMT_H_CHUNKS_SUM);
    if (o->format != PYCDS_FMT_FORMAT_VERSION) {
        return pycds_fail(PYCDS_E_FOREIGN, "archive format %u, this pycds reads format %d",
                          o->format, PYCDS_FMT_FORMAT_VERSION);
    }
    /* Before the checksum: SipHash-2-4 on 3.10, 1-3 from 3.11 on, so another
     * version's header could not even be verified; say which made it. */
    if (check_version && o->py_hexversion >> 16 != PY_VERSION_HEX >> 16) {
        char tail[64];
        snprintf(tail, sizeof tail, ", this is Python %d.%d", PY_MAJOR_VERSION,
                 PY_MINOR_VERSION);
        return foreign_version(o->py_hexversion, tail);
    }
    if (pycds_le64(b + PYCDS_FMT_HEADER_SUM_AT)
            != pycds_checksum(b, PYCDS_FMT_HEADER_SUM_AT, PYCDS_FMT_HEADER_KEY)) {
        if ((o->py_hexversion >= 0x030B0000) != (PY_VERSION_HEX >= 0x030B0000)) {
            char tail[128];
            snprintf(tail, sizeof tail, ", whose checksums this Python %d.%d cannot verify; "
                     "read it with that version", PY_MAJOR_VERSION, PY_MINOR_VERSION);
            return foreign_version(o->py_hexversion, tail);
        }
        return pycds_fail(PYCDS_E_CORRUPT, "header checksum mismatch");
    }
    if (o->file_len != file_len) {
        return pycds_fail(PYCDS_E_CORRUPT, "file is %llu bytes, header says %llu "
                          "(truncated or appended to)", (unsigned long long)file_len,
                          (unsigned long long)o->file_len);
    }
    const struct { uint64_t off, count, size; } sections[] = {
        {o->meta_off, o->meta_len, 1}, {o->buckets_off, o->nbuckets, PYCDS_FMT_BUCKET_SIZE},
        {o->entries_off, o->entries_len, 1}, {o->chunks_off, o->nmodules, PYCDS_FMT_CHUNK_REC},
        {o->heap_off, o->heap_len, 1}, {o->reloc_off, o->reloc_count, PYCDS_FMT_RELOC_SIZE},
    };
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        uint64_t off = sections[i].off;
        if (off < PYCDS_FMT_HEADER_SIZE || off > file_len
                || sections[i].count > (file_len - off) / sections[i].size) {
            return pycds_fail(PYCDS_E_CORRUPT, "section outside the file");
        }
    }
    /* (The writer makes at least 8 and twice the modules: a lookup always
     * ends at an empty bucket.) */
    if (o->nbuckets < 1 || (o->nbuckets & (o->nbuckets - 1)) || o->nbuckets < o->nmodules) {
        return pycds_fail(PYCDS_E_CORRUPT, "bad bucket table size");
    }
    return PYCDS_OK;
}

/* A read or stat of the archive failed with err: os.pread's OSError as
 * the Python reader said it, "unreadable ([Errno N] text)". */
static int
unreadable(int err)
{
    return pycds_fail(PYCDS_E_IO, "unreadable ([Errno %d] %s)", err, strerror(err));
}

/* len bytes at off, checked against sum (keyed by the archive's id), into
 * a new buffer *out; what = the part's name in the messages. */
static int
read_part(int fd, uint64_t off, uint64_t len, uint64_t key, uint64_t sum,
          const char *what, uint8_t **out)
{
    uint8_t *buf = malloc(len ? (size_t)len : 1);
    if (buf == NULL) {
        return pycds_fail(PYCDS_E_NOMEM, "no memory for the %s (%llu bytes)", what,
                          (unsigned long long)len);
    }
    int r = pycds_pread_all(fd, buf, (size_t)len, off);
    if (r < 0) {
        int err = errno;
        free(buf);
        return unreadable(err);
    }
    /* (Shorter than the header says: the file shrank since.) */
    if (r > 0 || pycds_checksum(buf, (size_t)len, key) != sum) {
        free(buf);
        return pycds_fail(PYCDS_E_CORRUPT, "%s checksum mismatch", what);
    }
    *out = buf;
    return PYCDS_OK;
}

void
pycds_opened_free(pycds_opened *o)
{
    if (o != NULL) {
        free(o->meta);
        free(o->buckets);
        o->meta = NULL;
        o->buckets = NULL;
    }
}

int
pycds_archive_read_index(const char *path, int flags, pycds_opened *o)
{
    struct stat st;
    uint8_t head[PYCDS_FMT_HEADER_SIZE];
    int rc;
    if (path == NULL || o == NULL) {
        return pycds_fail(PYCDS_E_ARG, "no path or no result");
    }
    memset(o, 0, sizeof *o);
    o->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return pycds_fail(PYCDS_E_IO, "%s", strerror(errno));
    }
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return unreadable(err);
    }
    if (!S_ISREG(st.st_mode)) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "not a regular file");
        goto fail;
    }
    if ((flags & PYCDS_OPEN_OWNER)
            && ((rc = check_owner(&st)) != PYCDS_OK || (rc = check_directories(path)) != PYCDS_OK)) {
        goto fail;
    }
    if (st.st_size < PYCDS_FMT_HEADER_SIZE) {
        rc = pycds_fail(PYCDS_E_CORRUPT, "file is %lld bytes, shorter than a header",
                        (long long)st.st_size);
        goto fail;
    }
    int r = pycds_pread_all(fd, head, PYCDS_FMT_HEADER_SIZE, 0);
    if (r != 0) {
        rc = r < 0 ? unreadable(errno)
                   : pycds_fail(PYCDS_E_CORRUPT, "file is shorter than a header");
        goto fail;
    }
    if ((rc = parse_header(head, (uint64_t)st.st_size, flags & PYCDS_OPEN_VERSION, o)) != PYCDS_OK
            || (rc = read_part(fd, o->meta_off, o->meta_len, o->archive_id, o->meta_sum,
                               "meta", &o->meta)) != PYCDS_OK
            || (rc = read_part(fd, o->buckets_off, o->nbuckets * PYCDS_FMT_BUCKET_SIZE, o->archive_id,
                               o->buckets_sum, "bucket table", &o->buckets)) != PYCDS_OK) {
        goto fail;
    }
    o->st_dev = (uint64_t)st.st_dev;
    o->st_ino = (uint64_t)st.st_ino;
    o->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (flags & PYCDS_OPEN_CLOSE) {
        close(fd);
    } else {
        o->fd = fd;
    }
    return PYCDS_OK;
fail:
    close(fd);
    pycds_opened_free(o);
    return rc;
}
