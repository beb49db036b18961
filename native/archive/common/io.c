/* io.c -- reading n bytes of a file at an offset, whole: for the loader
 * (the archive's chunks, tables and entries: loader/relocate.c,
 * pycds_read_full) and for image.c (the interpreter's own file). */
#include "pycds_internal.h"

#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

int
pycds_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = (uint8_t *)buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (got == 0) {
            return 1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

int
pycds_pread2_all(int fd, void *a, size_t na, void *b, size_t nb, uint64_t off)
{
    struct iovec iov[2] = {{a, na}, {b, nb}};
    ssize_t got;
    do {
        got = preadv(fd, iov, 2, (off_t)off);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        return -1;
    }
    size_t done = (size_t)got;
    if (done < na) {
        int rc = pycds_pread_all(fd, (uint8_t *)a + done, na - done, off + done);
        if (rc != 0) {
            return rc;
        }
        done = na;
    }
    return pycds_pread_all(fd, (uint8_t *)b + (done - na), nb - (done - na), off + done);
}
