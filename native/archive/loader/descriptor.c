/* descriptor.c -- keeps the archive's descriptor out of the program's way.
 *
 * A SHARE process holds one descriptor on its archive for as long as it
 * runs.  Opened plainly, it would take the lowest free number, the one the
 * program's next open() gets in a plain run, and count against the
 * program's RLIMIT_NOFILE: programs that number or count their descriptors
 * (close_fds code, daemons, CPython's test_subprocess pass_fds tests, a
 * program at the edge of ulimit -n) would see a difference.
 *
 * pycds_fd_place() moves it past the soft limit: the limit bounds the
 * numbers open() and dup() hand out, not the descriptors a process holds
 * (fs/file.c: alloc_fd(), F_DUPFD's "arg >= rlimit" check), so a
 * descriptor numbered at the soft limit, made while the limit is one
 * higher, is outside every number and count the program is allowed, and
 * outside a scan up to SC_OPEN_MAX (CPython's fd_status.py).  That needs a
 * soft limit below the hard one (or the privilege to raise the hard one)
 * and at most PYCDS_FD_PAST_MAX (the kernel sizes a process's descriptor
 * table by its highest number).  Otherwise it takes the highest free number
 * below min(soft limit, PYCDS_FD_CEILING).  Callers hold the GIL, so that
 * no Python thread sees the limit raised or changes it meanwhile.  (Until
 * the first archive hit, SHARE holds no descriptor: pycds/_archive.py.)
 */
#include "archive.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

/* Numbers tried below the ceiling before taking any free one. */
#define PLACE_TRIES 64

/* A duplicate of fd numbered `at` (the soft limit), made while the soft
 * limit is at + 1; the limits are put back as they were.  -1 if the limit
 * cannot be raised. */
static int
dup_past_limit(int fd, const struct rlimit *rl)
{
    struct rlimit up = *rl;
    up.rlim_cur = rl->rlim_cur + 1;
    if (up.rlim_max != RLIM_INFINITY && up.rlim_max < up.rlim_cur) {
        up.rlim_max = up.rlim_cur;   /* needs CAP_SYS_RESOURCE */
    }
    if (setrlimit(RLIMIT_NOFILE, &up) != 0) {
        return -1;
    }
    int nfd = fcntl(fd, F_DUPFD_CLOEXEC, (int)rl->rlim_cur);
    if (setrlimit(RLIMIT_NOFILE, rl) != 0) {
        /* Lowering a limit does not fail; if it did, the program must not
         * keep a limit it did not set: no descriptor past it either. */
        if (nfd >= 0) {
            close(nfd);
        }
        return -1;
    }
    return nfd;
}

int
pycds_fd_place(int fd)
{
    struct rlimit rl;
    int top = PYCDS_FD_CEILING;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        if (rl.rlim_cur > 3 && rl.rlim_cur <= PYCDS_FD_PAST_MAX) {
            int nfd = dup_past_limit(fd, &rl);
            if (nfd >= 0) {
                return nfd;
            }
        }
        if (rl.rlim_cur < PYCDS_FD_CEILING) {
            top = (int)rl.rlim_cur;
        }
    }
    for (int n = top - 1; n >= 3 && n >= top - PLACE_TRIES; n--) {
        /* The lowest free number >= n: n itself where it is free. */
        int nfd = fcntl(fd, F_DUPFD_CLOEXEC, n);
        if (nfd >= 0 && nfd < top) {
            return nfd;
        }
        if (nfd >= 0) {
            close(nfd);
        }
    }
    return fcntl(fd, F_DUPFD_CLOEXEC, 0);
}
