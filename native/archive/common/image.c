/* image.c -- where the interpreter's static objects live in this process.
 *
 * Type objects, None/True/False/Ellipsis, the static small ints and
 * one-character strings, the empty singletons and the interpreter's static
 * interned strings are all data of one loaded object: libpython when Python
 * is built shared, else the executable.  ASLR moves that object as a whole,
 * so a pointer to any of them is stored in an archive as an offset from one
 * anchor in the same object (&_Py_NoneStruct) and fixed up at load by adding
 * the anchor's address in the new process.
 *
 * The object is found once with dl_iterate_phdr(): its PT_LOAD segments give
 * the address ranges used to classify pointers (and to bounds-check external
 * relocations at load); its PT_NOTE NT_GNU_BUILD_ID identifies the exact build.
 */
#include "pycds_internal.h"

#include <link.h>
#include <elf.h>
#include <stdio.h>
#include <string.h>

#define MAX_SEGMENTS 16

static struct {
    int ready;
    uintptr_t anchor;
    int nseg;
    int hot;                  /* segment holding the anchor: checked first */
    uintptr_t lo[MAX_SEGMENTS];
    uintptr_t hi[MAX_SEGMENTS];
    char build_id[2 * 64 + 1];
} image;

static void
read_build_id(struct dl_phdr_info *info, const ElfW(Phdr) *ph)
{
    const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
    const uint8_t *end = p + ph->p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
        const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
        size_t namesz = (nh->n_namesz + 3u) & ~3u;
        size_t descsz = (nh->n_descsz + 3u) & ~3u;
        const uint8_t *name = p + sizeof(ElfW(Nhdr));
        const uint8_t *desc = name + namesz;
        if (desc + descsz > end) {
            return;
        }
        if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4
            && memcmp(name, "GNU", 4) == 0 && nh->n_descsz <= 64) {
            for (size_t i = 0; i < nh->n_descsz; i++) {
                snprintf(image.build_id + 2 * i, 3, "%02x", desc[i]);
            }
            return;
        }
        p = desc + descsz;
    }
}

static int
find_image(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t anchor = *(uintptr_t *)data;
    int found = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) {
            continue;
        }
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (anchor >= lo && anchor < lo + ph->p_memsz) {
            found = 1;
        }
    }
    if (!found) {
        return 0;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && image.nseg < MAX_SEGMENTS) {
            image.lo[image.nseg] = info->dlpi_addr + ph->p_vaddr;
            image.hi[image.nseg] = image.lo[image.nseg] + ph->p_memsz;
            image.nseg++;
        }
        else if (ph->p_type == PT_NOTE && image.build_id[0] == '\0') {
            read_build_id(info, ph);
        }
    }
    return 1;
}

int
pycds_image_init(void)
{
    if (image.ready) {
        return PYCDS_OK;
    }
    uintptr_t anchor = (uintptr_t)&_Py_NoneStruct;
    image.nseg = 0;
    image.build_id[0] = '\0';
    if (dl_iterate_phdr(find_image, &anchor) == 0 || image.nseg == 0) {
        return pycds_fail(PYCDS_E_FOREIGN,
                          "cannot find the loaded object holding _Py_NoneStruct");
    }
    image.anchor = anchor;
    image.hot = 0;
    for (int i = 0; i < image.nseg; i++) {
        if (anchor >= image.lo[i] && anchor < image.hi[i]) {
            image.hot = i;
        }
    }
    image.ready = 1;
    return PYCDS_OK;
}

int
pycds_image_contains(const void *p, size_t size)
{
    uintptr_t a = (uintptr_t)p;
    /* Type objects and singletons, what the loader asks about for nearly
     * every relocation, live in the anchor's (data) segment: trying it
     * first spares the scan of the others. */
    int h = image.hot;
    if (h < image.nseg && a >= image.lo[h] && a < image.hi[h]
        && size <= image.hi[h] - a) {
        return 1;
    }
    for (int i = 0; i < image.nseg; i++) {
        if (a >= image.lo[i] && a < image.hi[i] && size <= image.hi[i] - a) {
            return 1;
        }
    }
    return 0;
}

void
pycds_image_hot(uintptr_t *lo, uintptr_t *hi)
{
    *lo = *hi = 0;
    if (image.hot < image.nseg) {
        *lo = image.lo[image.hot];
        *hi = image.hi[image.hot];
    }
}

uintptr_t
pycds_image_anchor(void)
{
    return image.anchor;
}

const char *
pycds_image_build_id(void)
{
    return image.build_id;
}
