/* layout.c -- selects the object layout of the CPython being built against.
 *
 * Each supported minor version has one header in layout/ that knows how that
 * version lays out the objects an archive holds (str, bytes, int, float,
 * complex, tuple, code) and what must be reset so that a copy looks exactly
 * like a fresh unmarshal.  Nothing outside these headers depends on a
 * version's struct layout.  This is the only source that sees CPython's
 * internal headers, hence Py_BUILD_CORE here and nowhere else.
 */
#define Py_BUILD_CORE 1
#include "pycds_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- helpers common to every layout ------------------------------------ */

/* Reserve size bytes (plus a zeroed GC header for GC types) and copy the
 * object's memory there.  *off is the offset of the PyObject itself. */
static int
copy_raw(pycds_writer *w, PyObject *op, size_t size, size_t gc_size,
         uint64_t *off)
{
    uint64_t start;
    int rc = pycds_w_alloc(w, gc_size + size, &start);
    if (rc) {
        return rc;
    }
    memcpy((char *)pycds_w_at(w, start) + gc_size, op, size);
    *off = start + gc_size;
    return PYCDS_OK;
}

/* The ob_type slot of the copy at off: always a static type object. */
static int
copy_type_slot(pycds_writer *w, uint64_t off, PyObject *op)
{
    return pycds_w_slot(w, off + offsetof(PyObject, ob_type),
                        (PyObject *)Py_TYPE(op), 0);
}

static int
unsupported(PyObject *op)
{
    return pycds_fail(PYCDS_E_UNSUPPORTED,
                      "cannot archive an object of type %.100s",
                      Py_TYPE(op)->tp_name);
}

#if PY_VERSION_HEX >= 0x030D0000
#  include "layout/layout_313.h"
#elif PY_VERSION_HEX >= 0x030C0000
#  include "layout/layout_312.h"
#elif PY_VERSION_HEX >= 0x030B0000
#  include "layout/layout_311.h"
#else
#  include "layout/layout_310.h"
#endif

/* Facts every layout shares: the offsets of the static objects an archive
 * may point at, from the anchor.  Same build id => same offsets, but the
 * offsets also catch a rebuilt interpreter without a build id. */
static uint64_t
static_offsets_hash(void)
{
    const void *objs[] = {
        &PyUnicode_Type, &PyBytes_Type, &PyLong_Type, &PyFloat_Type,
        &PyComplex_Type, &PyTuple_Type, &PyFrozenSet_Type, &PyCode_Type,
        &PyBool_Type, Py_True, Py_False, Py_Ellipsis,
    };
    int64_t deltas[sizeof(objs) / sizeof(objs[0])];
    for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
        deltas[i] = (int64_t)((uintptr_t)objs[i] - pycds_image_anchor());
    }
    return pycds_hash64(deltas, sizeof(deltas), 0);
}

int
pycds_layout_describe(char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s;hex=%08lx;build=%s;statics=%016llx;%s",
                     PYCDS_LAYOUT_NAME, (unsigned long)PY_VERSION_HEX,
                     pycds_image_build_id(),
                     (unsigned long long)static_offsets_hash(),
                     PYCDS_LAYOUT_SIZES);
    if (n < 0 || (size_t)n >= cap) {
        return pycds_fail(PYCDS_E_ARG, "layout id buffer too small");
    }
    return PYCDS_OK;
}
