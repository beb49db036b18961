/* layout_311_313.h -- the code object 3.11, 3.12 and 3.13 share.
 *
 * Included by layout_311.h, layout_312.h and layout_313.h only, after
 * layout_common.h.  From 3.11 a code object holds its bytecode inline
 * (co_code_adaptive, quickened in place), its locals as
 * co_localsplusnames/co_localspluskinds, and the index of its first RESUME
 * (Include/cpython/code.h, Objects/codeobject.c init_code); the shared
 * instances marshal hands out are static objects of the image; a chunk
 * holds objects only.
 *
 * The including version file defines first: PYCDS_LAYOUT_NAME, its opcode
 * tables as PYCDS_OPCODE_DEOPT and PYCDS_OPCODE_CACHES, and
 * op_unmarshal_makes() (declared below).
 */
#ifndef PYCDS_LAYOUT_311_313_H
#define PYCDS_LAYOUT_311_313_H

/* Pointer fields of PyCodeObject copied with the code object; order matches
 * Include/cpython/code.h (3.11 to 3.13).  Fields not listed are scalars
 * copied as they are, or per-process state reset by copy_code(). */
#define PYCDS_CODE_PTR_FIELDS(X)                                   \
    X(co_consts) X(co_names) X(co_exceptiontable)                  \
    X(co_localsplusnames) X(co_localspluskinds) X(co_filename)     \
    X(co_name) X(co_qualname) X(co_linetable)

/* Zero the alignment padding between _co_firsttraceable (an int) and
 * co_extra of the code copy c, which init_code never writes
 * (Objects/codeobject.c, 3.11-3.13): the copy took whatever the allocation
 * held before, and no stale process memory may reach the archive, whose
 * bytes are then the same for the same code. */
static void
zero_code_padding(PyCodeObject *c)
{
    memset((char *)c + offsetof(PyCodeObject, _co_firsttraceable)
               + sizeof(c->_co_firsttraceable),
           0, offsetof(PyCodeObject, co_extra)
                  - offsetof(PyCodeObject, _co_firsttraceable)
                  - sizeof(c->_co_firsttraceable));
}

/* Copy the memory of code object op up to its bytecode's exact end:
 * _PyObject_VAR_SIZE rounds up to 8, and the allocation's tail past the
 * last code unit is uninitialised (the heap block is zero-padded instead).
 * The layout header sets up the rest. */
static int
copy_code_raw(pycds_writer *w, PyObject *op, uint64_t *off)
{
    size_t size = offsetof(PyCodeObject, co_code_adaptive)
                  + (size_t)Py_SIZE(op) * sizeof(_Py_CODEUNIT);
    return copy_raw(w, op, size, 0, off);
}
/* init_code() (3.11-3.13): the index of the first RESUME, or the code's
 * length.  A fresh code object's RESUME is not specialised yet (3.13's
 * RESUME_CHECK comes with its first run: layout_312_313.h,
 * bytecode_is_fresh). */
static Py_ssize_t
first_traceable(PyCodeObject *co)
{
    Py_ssize_t i = 0;
    while (i < Py_SIZE(co) && _Py_OPCODE(_PyCode_CODE(co)[i]) != RESUME) {
        i++;
    }
    return i;
}

/* The counts 3.11 to 3.13 compute alike: argument counts as
 * _PyCode_Validate() accepts them, _co_firsttraceable as init_code() finds
 * it, co_nlocalsplus = names = kinds, and the local, cell and free counts
 * init_code() derives from the kinds (get_localsplus_counts); *nplain gets
 * the cells that are not arguments (3.11's co_nplaincellvars).  0 or
 * PYCDS_E_CORRUPT. */
static int
check_code_counts(PyCodeObject *co, int *nplain)
{
    if (co->co_argcount < co->co_posonlyargcount || co->co_posonlyargcount < 0
        || co->co_kwonlyargcount < 0 || co->co_stacksize < 0
        || co->co_flags < 0 || co->co_firstlineno < 0 || Py_SIZE(co) < 1
        || co->_co_firsttraceable != first_traceable(co)) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object with bad counts");
    }
    Py_ssize_t n = PyTuple_GET_SIZE(co->co_localsplusnames);
    if (co->co_nlocalsplus != n || PyBytes_GET_SIZE(co->co_localspluskinds) != n) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object locals do not match");
    }
    const unsigned char *kinds =
        (const unsigned char *)PyBytes_AS_STRING(co->co_localspluskinds);
    int nlocals = 0, ncells = 0, nfree = 0;
    *nplain = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kinds[i] & CO_FAST_LOCAL) {
            nlocals++;
            if (kinds[i] & CO_FAST_CELL) {
                ncells++;
            }
        }
        else if (kinds[i] & CO_FAST_CELL) {
            ncells++;
            ++*nplain;
        }
        else if (kinds[i] & CO_FAST_FREE) {
            nfree++;
        }
    }
    if (co->co_nlocals != nlocals || co->co_ncellvars != ncells
        || co->co_nfreevars != nfree || code_nargs(co) > nlocals) {
        return pycds_fail(PYCDS_E_CORRUPT, "code object counts do not match "
                          "its locals");
    }
    return PYCDS_OK;
}
/* Whether instruction op (base opcode base, with caches inline cache
 * entries) is one a fresh code object can hold, as this version's
 * unmarshal and init_code make it; defined by the version file. */
static int op_unmarshal_makes(int op, int base, int caches);

/* Bytecode as a fresh code object has it (the writer's copy_code writes no
 * other), checked under PYCDSVERIFY=1: every instruction one
 * op_unmarshal_makes() accepts; no CACHE or unknown opcode as an
 * instruction; the inline caches inside the code.  Even reading co_code
 * relies on that: deopt_code (Objects/codeobject.c, 3.11-3.13) follows
 * those pointers and zeroes caches past the end of a code that cuts them
 * short. */
static int
check_bytecode(PyCodeObject *co)
{
    const _Py_CODEUNIT *code = _PyCode_CODE(co);
    Py_ssize_t n = Py_SIZE(co);
    for (Py_ssize_t i = 0; i < n; i++) {
        int op = _Py_OPCODE(code[i]);
        int base = PYCDS_OPCODE_DEOPT[op];
        int caches = PYCDS_OPCODE_CACHES[base];
        if (base == CACHE || caches > n - 1 - i
            || !op_unmarshal_makes(op, base, caches)) {
            return pycds_fail(PYCDS_E_CORRUPT, "code object bytecode holds an "
                              "instruction unmarshal never makes (opcode %d at %zd)",
                              op, i);
        }
        i += caches;
    }
    return PYCDS_OK;
}

/* ---- shared instances and release --------------------------------------
 *
 * The layout's shared instances (small ints, 1-char strs, empty
 * singletons) are static objects of the image: pycds_w_slot() refers to
 * them as EXTERNAL before asking, so there is never a SINGLETON slot. */
int
pycds_layout_heap_singleton(PyObject *op)
{
    (void)op;
    return 0;
}

int
pycds_layout_use_singleton(PyObject **slot)
{
    (void)slot;
    return pycds_fail(PYCDS_E_CORRUPT,
                      "SINGLETON relocation in a %s archive", PYCDS_LAYOUT_NAME);
}

/* A chunk holds nothing but objects: release.c may walk a tail. */
int
pycds_layout_tail_walkable(void)
{
    return 1;
}

#endif /* PYCDS_LAYOUT_311_313_H */
