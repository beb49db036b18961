/* An LD_PRELOAD shim that makes one file operation of a process fail.
 *
 * Counted: the calls below whose path, or whose descriptor's path, lies
 * under $PYCDS_FAULT_DIR (the archive's directory, so the program's own
 * output is never touched).  $PYCDS_FAULT="<call>:<n>:<kind>" makes the
 * n-th counted call named <call> (1-based) fail:
 *   ENOSPC, EIO, EINTR   return -1 with that errno, doing nothing;
 *   SHORT                write/pwrite: write half the bytes (at least 1);
 *   KILL                 raise SIGKILL before the call.
 * $PYCDS_FAULT_LOG, if set, gets one line "<call>" per counted call (a
 * census run: which calls, how many).  Built by
 * scripts/write_faults.py (tests/reliability/test_write_faults.py).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

static const char *
fault_dir(void)
{
    const char *d = getenv("PYCDS_FAULT_DIR");
    return (d && *d) ? d : NULL;
}

static int
under_dir(const char *path)
{
    const char *d = fault_dir();
    size_t n;
    if (d == NULL || path == NULL)
        return 0;
    n = strlen(d);
    return strncmp(path, d, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

static int
fd_under_dir(int fd)
{
    char link[64], target[4096];
    ssize_t n;
    if (fd < 0 || fault_dir() == NULL)
        return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    return under_dir(target);
}

static int
at_under_dir(int dirfd, const char *path)
{
    if (path != NULL && path[0] == '/')
        return under_dir(path);
    if (dirfd == AT_FDCWD) {
        char cwd[4096];
        return getcwd(cwd, sizeof cwd) != NULL && under_dir(cwd);
    }
    return fd_under_dir(dirfd);
}

/* The fault to make at this counted call: 0 none, else an errno, or one of
 * the two codes below.  Logs the call when asked to. */
#define FAULT_SHORT (-1)
#define FAULT_KILL (-2)

static int
counted(const char *call)
{
    static int seen[32];
    static const char *names[32];
    const char *spec = getenv("PYCDS_FAULT");
    const char *log = getenv("PYCDS_FAULT_LOG");
    int i, saved = errno;

    if (log && *log) {
        int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        /* (open is ours too, but log is not under the fault directory) */
        if (fd >= 0) {
            char line[64];
            int len = snprintf(line, sizeof line, "%s\n", call);
            if (len > 0 && write(fd, line, (size_t)len) < 0)
                len = 0;
            close(fd);
        }
    }
    for (i = 0; i < 32 && names[i] != NULL && strcmp(names[i], call) != 0; i++)
        ;
    if (i == 32)
        return 0;
    names[i] = call;
    seen[i]++;
    errno = saved;
    if (spec == NULL || *spec == '\0')
        return 0;
    {
        size_t n = strlen(call);
        const char *kind;
        long nth;
        char *end;
        if (strncmp(spec, call, n) != 0 || spec[n] != ':')
            return 0;
        nth = strtol(spec + n + 1, &end, 10);
        if (*end != ':' || nth != seen[i])
            return 0;
        kind = end + 1;
        if (strcmp(kind, "ENOSPC") == 0) return ENOSPC;
        if (strcmp(kind, "EIO") == 0) return EIO;
        if (strcmp(kind, "EINTR") == 0) return EINTR;
        if (strcmp(kind, "SHORT") == 0) return FAULT_SHORT;
        if (strcmp(kind, "KILL") == 0) {
            raise(SIGKILL);
            return 0;
        }
    }
    return 0;
}

/* real_fn: the libc function of that name, as the headers declare it. */
#define REAL(name) \
    static __typeof__(name) *real_fn; \
    if (real_fn == NULL) \
        real_fn = (__typeof__(name) *)dlsym(RTLD_NEXT, #name); \
    if (real_fn == NULL) { errno = ENOSYS; return -1; }

/* Fails with the fault's errno (the SHORT code makes no sense here: no
 * fault). */
#define FAIL_IF(f) \
    if ((f) > 0) { errno = (f); return -1; }

/* mode: the optional third argument of open(), there with O_CREAT or
 * O_TMPFILE. */
#define TAKE_MODE(last) \
    if (flags & (O_CREAT | __O_TMPFILE)) { \
        va_list ap; \
        va_start(ap, last); \
        mode = (mode_t)va_arg(ap, int); \
        va_end(ap); \
    }

#define OPEN_LIKE(fname) \
int fname(const char *path, int flags, ...) \
{ \
    mode_t mode = 0; \
    int f = 0; \
    REAL(fname) \
    TAKE_MODE(flags) \
    if (under_dir(path)) \
        f = counted("open"); \
    FAIL_IF(f) \
    return real_fn(path, flags, mode); \
}

OPEN_LIKE(open)
OPEN_LIKE(open64)

#define OPENAT_LIKE(fname) \
int fname(int dirfd, const char *path, int flags, ...) \
{ \
    mode_t mode = 0; \
    int f = 0; \
    REAL(fname) \
    TAKE_MODE(flags) \
    if (at_under_dir(dirfd, path)) \
        f = counted("open"); \
    FAIL_IF(f) \
    return real_fn(dirfd, path, flags, mode); \
}

OPENAT_LIKE(openat)
OPENAT_LIKE(openat64)

/* A call on a descriptor: counted when the descriptor's file lies under
 * the directory; on_short is what a SHORT fault does to the arguments. */
#define FD_WRAP(type, fname, call, params, args, on_short) \
type fname params \
{ \
    int f = 0; \
    REAL(fname) \
    if (fd_under_dir(fd)) \
        f = counted(call); \
    FAIL_IF(f) \
    if (f == FAULT_SHORT) { \
        on_short; \
    } \
    return real_fn args; \
}

#define WRITE_LIKE(fname, call, params, args) \
    FD_WRAP(ssize_t, fname, call, params, args, if (n > 1) n /= 2)
#define FD_CALL(fname, call, params, args) \
    FD_WRAP(int, fname, call, params, args, (void)0)

WRITE_LIKE(write, "write", (int fd, const void *buf, size_t n), (fd, buf, n))
WRITE_LIKE(pwrite, "pwrite", (int fd, const void *buf, size_t n, off_t off),
           (fd, buf, n, off))
WRITE_LIKE(pwrite64, "pwrite", (int fd, const void *buf, size_t n, off_t off),
           (fd, buf, n, off))

FD_CALL(fallocate, "fallocate", (int fd, int mode, off_t off, off_t len),
        (fd, mode, off, len))
FD_CALL(fallocate64, "fallocate", (int fd, int mode, off_t off, off_t len),
        (fd, mode, off, len))
FD_CALL(ftruncate, "ftruncate", (int fd, off_t len), (fd, len))
FD_CALL(ftruncate64, "ftruncate", (int fd, off_t len), (fd, len))
FD_CALL(fchmod, "fchmod", (int fd, mode_t mode), (fd, mode))
FD_CALL(fsync, "fsync", (int fd), (fd))
FD_CALL(fdatasync, "fsync", (int fd), (fd))
FD_CALL(fsetxattr, "fsetxattr",
        (int fd, const char *name, const void *value, size_t size, int flags),
        (fd, name, value, size, flags))

int
linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags)
{
    int f = 0;
    REAL(linkat)
    if (at_under_dir(newdirfd, newpath))
        f = counted("link");
    FAIL_IF(f)
    return real_fn(olddirfd, oldpath, newdirfd, newpath, flags);
}

int
rename(const char *old, const char *new)
{
    int f = 0;
    REAL(rename)
    if (under_dir(new))
        f = counted("rename");
    FAIL_IF(f)
    return real_fn(old, new);
}

int
renameat(int olddirfd, const char *old, int newdirfd, const char *new)
{
    int f = 0;
    REAL(renameat)
    if (at_under_dir(newdirfd, new))
        f = counted("rename");
    FAIL_IF(f)
    return real_fn(olddirfd, old, newdirfd, new);
}
