/* An LD_PRELOAD shim that makes a process see another page size.
 *
 * sysconf(_SC_PAGESIZE) and getpagesize() answer $PYCDS_PAGESIZE (a power
 * of two from 4096 on) instead of the kernel's, so that code which reads
 * the page size at run time -- pycds's loader: its arenas, the pages it
 * gives back -- runs as on a 16 or 64 KiB aarch64 kernel.  The kernel
 * still works in its own pages, which divide the pretended ones, so every
 * mmap, madvise and mprotect sized and aligned in pretended pages stays
 * valid.  (QEMU_PAGESIZE does this for aarch64 binaries under qemu-user,
 * scripts/aarch64_check.sh; qemu's x86-64 target ignores it.)
 *
 * Built by tests/native/test_pagesize.py:
 *     cc -shared -fPIC -O2 -Wall -Wextra pagesize_shim.c -o shim.so -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static long
pretended_page(void)
{
    const char *s = getenv("PYCDS_PAGESIZE");
    if (s == NULL || *s == '\0') {
        return -1;
    }
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 4096 || (v & (v - 1)) != 0) {
        return -1;
    }
    return v;
}

long
sysconf(int name)
{
    static long (*real)(int);
    if (name == _SC_PAGESIZE) {
        long v = pretended_page();
        if (v > 0) {
            return v;
        }
    }
    if (real == NULL) {
        real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    }
    return real(name);
}

int
getpagesize(void)
{
    long v = pretended_page();
    return v > 0 ? (int)v : (int)sysconf(_SC_PAGESIZE);
}
