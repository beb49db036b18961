/* file.c -- what writing an archive file needs that Python's os module lacks.
 *
 * pycds_preallocate: allocate a new archive's blocks before it is written.
 * The writer (pycds/_files.py) renames the finished file over the old
 * archive; ext4 (mount option auto_da_alloc, the default) then allocates
 * the new file's delayed-allocation blocks and flushes them inside
 * rename(2), so that a replaced file survives a crash (ext4_rename() in
 * fs/ext4/namei.c).  An archive is a checksummed cache that needs no such
 * care (a damaged one is refused and rewritten); blocks that fallocate(2)
 * allocated are not delayed, so rename has nothing to flush.
 * FALLOC_FL_KEEP_SIZE: the file's size (and so its content) is what the
 * writes make it, as without preallocation, and vfat, which zero-fills a
 * range that extends the file, only reserves it.
 *
 * os.posix_fallocate() is not used: where the file system has no
 * fallocate, glibc emulates it by writing every block, which costs more
 * than not preallocating at all.  Touches no Python object (no GIL needed).
 */
#include "pycds_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

int
pycds_preallocate(int fd, uint64_t length, int *err)
{
    if (err == NULL)
        return pycds_fail(PYCDS_E_ARG, "preallocate: no errno slot");
    *err = 0;
    if (fd < 0 || length > (uint64_t)INT64_MAX)
        return pycds_fail(PYCDS_E_ARG, "preallocate: fd %d, length %llu",
                          fd, (unsigned long long)length);
    if (length == 0)
        return PYCDS_OK;
#if defined(__linux__)
    int rc;
    do    /* (EINTR: a signal came, as on NFS or FUSE; try again) */
        rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)length);
    while (rc != 0 && errno == EINTR);
    if (rc == 0)
        return PYCDS_OK;
    /* No fallocate here (file system or kernel): the file is written as
     * it would be without it.  Any other failure (ENOSPC, EFBIG, EIO) is
     * the write's failure too, reported now. */
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL)
        return PYCDS_OK;
    *err = errno;
    return pycds_fail(PYCDS_E_IO, "fallocate of %llu bytes: %s",
                      (unsigned long long)length, strerror(*err));
#else
    return PYCDS_OK;
#endif
}
