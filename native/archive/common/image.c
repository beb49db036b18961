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
 * pycds_image_symbol() reads a symbol the object does not export (a static
 * variable of libpython) from its file's .symtab, when the file is that
 * build and has one.
 */
#include "pycds_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <elf.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SEGMENTS 16
/* Largest .symtab or .strtab read (libpython 3.12's: ~0.4 MB each). */
#define MAX_SYMTAB_BYTES (64u << 20)

static struct {
    int ready;
    uintptr_t anchor;
    int nseg;
    int hot;                  /* segment holding the anchor: checked first */
    uintptr_t lo[MAX_SEGMENTS];
    uintptr_t hi[MAX_SEGMENTS];
    char build_id[2 * 64 + 1];
    uintptr_t base;           /* dlpi_addr: file addresses + base = addresses */
    char path[PATH_MAX];      /* its file ("" for the executable) */
} image;

/* The hex NT_GNU_BUILD_ID among the notes [p, end) into out (2 * 64 + 1
 * bytes); out is left as it was when there is none. */
static void
parse_build_id(const uint8_t *p, const uint8_t *end, char *out)
{
    while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
        const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
        size_t namesz = (nh->n_namesz + 3u) & ~3u;
        size_t descsz = (nh->n_descsz + 3u) & ~3u;
        const uint8_t *name = p + sizeof(ElfW(Nhdr));
        if (namesz > (size_t)(end - name) || descsz > (size_t)(end - name) - namesz) {
            return;
        }
        const uint8_t *desc = name + namesz;
        if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4
            && memcmp(name, "GNU", 4) == 0 && nh->n_descsz <= 64) {
            for (size_t i = 0; i < nh->n_descsz; i++) {
                snprintf(out + 2 * i, 3, "%02x", desc[i]);
            }
            return;
        }
        p = desc + descsz;
    }
}

static void
read_build_id(struct dl_phdr_info *info, const ElfW(Phdr) *ph)
{
    const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
    parse_build_id(p, p + ph->p_memsz, image.build_id);
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
    image.base = info->dlpi_addr;
    if (info->dlpi_name != NULL && strlen(info->dlpi_name) < sizeof(image.path)) {
        strcpy(image.path, info->dlpi_name);
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
    image.path[0] = '\0';
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

/* Section i's bytes, malloc'ed (NULL: a failure said). */
static uint8_t *
read_section(int fd, const ElfW(Shdr) *sh, const char *what)
{
    if (sh->sh_type == SHT_NOBITS || sh->sh_size == 0 || sh->sh_size > MAX_SYMTAB_BYTES) {
        pycds_fail(PYCDS_E_UNSUPPORTED, "%s of %zu bytes", what, (size_t)sh->sh_size);
        return NULL;
    }
    uint8_t *buf = malloc(sh->sh_size);
    if (buf == NULL) {
        pycds_fail(PYCDS_E_NOMEM, "%s: out of memory", what);
        return NULL;
    }
    int got = pycds_pread_all(fd, buf, sh->sh_size, sh->sh_offset);
    if (got != 0) {
        pycds_fail(PYCDS_E_IO, "reading the %s: %s", what,
                   got < 0 ? strerror(errno) : "the file ends first");
        free(buf);
        return NULL;
    }
    return buf;
}

/* Whether the file's notes name the loaded build (so that its symbols'
 * addresses are the loaded object's). */
static int
same_build(int fd, const ElfW(Shdr) *sh, int n)
{
    char id[2 * 64 + 1] = "";
    for (int i = 0; i < n && id[0] == '\0'; i++) {
        if (sh[i].sh_type == SHT_NOTE && sh[i].sh_size <= 4096) {
            uint8_t *notes = read_section(fd, &sh[i], "note section");
            if (notes == NULL) {
                return 0;
            }
            parse_build_id(notes, notes + sh[i].sh_size, id);
            free(notes);
        }
    }
    return id[0] != '\0' && strcmp(id, image.build_id) == 0;
}

int
pycds_image_symbol(const char *name, uint64_t size, uintptr_t *addr)
{
    int rc = pycds_image_init();
    if (rc) {
        return rc;
    }
    if (image.build_id[0] == '\0') {
        return pycds_fail(PYCDS_E_UNSUPPORTED, "the interpreter has no build id");
    }
    const char *path = image.path[0] ? image.path : "/proc/self/exe";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return pycds_fail(PYCDS_E_IO, "open %s: %s", path, strerror(errno));
    }
    ElfW(Ehdr) eh;
    ElfW(Shdr) *sh = NULL;
    uint8_t *syms = NULL, *strs = NULL;
    rc = PYCDS_E_UNSUPPORTED;
    if (pycds_pread_all(fd, &eh, sizeof eh, 0) != 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0
            || eh.e_shentsize != sizeof(ElfW(Shdr)) || eh.e_shnum == 0) {
        pycds_fail(rc, "%s: not an ELF file with sections", path);
        goto done;
    }
    sh = calloc(eh.e_shnum, sizeof *sh);
    if (sh == NULL) {
        rc = pycds_fail(PYCDS_E_NOMEM, "section headers: out of memory");
        goto done;
    }
    int got = pycds_pread_all(fd, sh, (size_t)eh.e_shnum * sizeof *sh, eh.e_shoff);
    if (got != 0) {
        rc = pycds_fail(PYCDS_E_IO, "%s: section headers: %s", path,
                        got < 0 ? strerror(errno) : "the file ends first");
        goto done;
    }
    if (!same_build(fd, sh, eh.e_shnum)) {
        pycds_fail(rc, "%s is not the loaded build", path);
        goto done;
    }
    int t = 0;
    while (t < eh.e_shnum && sh[t].sh_type != SHT_SYMTAB) {
        t++;
    }
    if (t == eh.e_shnum || sh[t].sh_link >= eh.e_shnum
            || sh[t].sh_entsize != sizeof(ElfW(Sym))) {
        pycds_fail(rc, "%s has no symbol table (stripped)", path);
        goto done;
    }
    syms = read_section(fd, &sh[t], "symbol table");
    strs = syms == NULL ? NULL : read_section(fd, &sh[sh[t].sh_link], "string table");
    if (strs == NULL) {
        rc = PYCDS_E_IO;
        goto done;
    }
    size_t nsyms = sh[t].sh_size / sizeof(ElfW(Sym)), strsz = sh[sh[t].sh_link].sh_size;
    size_t namelen = strlen(name);
    for (size_t i = 0; i < nsyms; i++) {
        ElfW(Sym) sym;
        memcpy(&sym, syms + i * sizeof sym, sizeof sym);
        if (ELF64_ST_TYPE(sym.st_info) == STT_OBJECT && sym.st_size == size
                && sym.st_name < strsz && strsz - sym.st_name > namelen
                && memcmp(strs + sym.st_name, name, namelen + 1) == 0) {
            *addr = image.base + (uintptr_t)sym.st_value;
            rc = pycds_image_contains((const void *)*addr, size) ? PYCDS_OK
                 : pycds_fail(PYCDS_E_UNSUPPORTED, "%s is outside the loaded object", name);
            goto done;
        }
    }
    pycds_fail(rc, "%s has no symbol %s", path, name);
done:
    free(strs);
    free(syms);
    free(sh);
    close(fd);
    return rc;
}
