/* layout.c -- the object layout of the CPython being built against.
 *
 * Includes the one file of layout/ that knows how this minor version lays
 * out the objects an archive holds (str, bytes, int, float, complex, tuple,
 * code) and what must be reset so that a copy looks exactly like a fresh
 * unmarshal: layout_310.h, layout_311.h, layout_312.h or layout_313.h,
 * each with the shared parts it includes (layout_common.h and the
 * layout_3XX_3YY.h of the versions that share them).  What is here is the
 * same in every version: the pycds_layout_* entry points layout.h declares,
 * built on what the version file defines.  This is the only source that
 * sees CPython's internal headers, hence Py_BUILD_CORE here and nowhere
 * else.
 */
#define Py_BUILD_CORE 1
#include "layout.h"

#include "marshal.h"                     /* PyMarshal_WriteObjectToString */

#include <stdio.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030D0000
#  include "layout/layout_313.h"
#elif PY_VERSION_HEX >= 0x030C0000
#  include "layout/layout_312.h"
#elif PY_VERSION_HEX >= 0x030B0000
#  include "layout/layout_311.h"
#else
#  include "layout/layout_310.h"
#endif

/* unicode_hash() in Objects/unicodeobject.c, the same from 3.10 to 3.13:
 * _Py_HashBytes over the code units, cached in the PyASCIIObject (3.13
 * declares _Py_HashBytes in internal/pycore_pyhash.h: layout_313.h). */
void
pycds_layout_str_prehash(PyObject *op)
{
    ((PyASCIIObject *)op)->hash = _Py_HashBytes(
        PyUnicode_DATA(op), PyUnicode_GET_LENGTH(op) * PyUnicode_KIND(op));
}

/* The items of frozenset op in the order unmarshal adds them (r_object in
 * Python/marshal.c), that is in the order w_complex_object wrote them.
 * 3.11+ writes them sorted by each item's own marshalled bytes, whose first
 * byte carries FLAG_REF where w_ref() takes the item for shared: an interned
 * str, or one with more than one reference.  3.11/3.12 iterate the set with
 * borrowed references, so an item only the set holds is written without the
 * flag; 3.13 iterates with new ones (_PySet_NextEntryRef): always flagged.
 * 3.10 writes them in the writing process's iteration order, which is not
 * known here: sorted by their bytes without the flag, an order that does
 * not depend on the dump's hash seed (docs/importer-compliance.md).  Each
 * version file's frozenset_item_unflagged() says which items lose the
 * flag. */
PyObject *
pycds_layout_frozenset_items(PyObject *op)
{
    PyObject *items = PySequence_Tuple(op);   /* one more reference each */
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *pairs = PyList_New(n), *sorted = NULL;
    if (pairs == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        PyObject *dump = PyMarshal_WriteObjectToString(item, Py_MARSHAL_VERSION);
        if (dump == NULL) {
            goto done;
        }
        /* The version file says whether the item was written without
         * FLAG_REF (frozenset_item_unflagged). */
        if (PyBytes_GET_SIZE(dump) > 0 && frozenset_item_unflagged(item)) {
            PyObject *bare = PyBytes_FromStringAndSize(PyBytes_AS_STRING(dump),
                                                       PyBytes_GET_SIZE(dump));
            Py_DECREF(dump);
            if (bare == NULL) {
                goto done;
            }
            PyBytes_AS_STRING(bare)[0] &= (char)0x7f;     /* FLAG_REF */
            dump = bare;
        }
        PyObject *pair = PyTuple_Pack(2, dump, item);
        Py_DECREF(dump);
        if (pair == NULL) {
            goto done;
        }
        PyList_SET_ITEM(pairs, i, pair);
    }
    if (PyList_Sort(pairs) < 0) {
        goto done;
    }
    sorted = PyTuple_New(n);
    if (sorted != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, i), 1);
            PyTuple_SET_ITEM(sorted, i, Py_NewRef(item));
        }
    }
done:
    Py_XDECREF(pairs);
    Py_DECREF(items);
    return sorted;
}

/* (Declared in layout_common.h; defined here, after the version file's
 * PYCDS_CODE_PTR_FIELDS.) */
static int
copy_code_refs(pycds_writer *w, uint64_t off, PyCodeObject *src, int depth)
{
    int rc = copy_type_slot(w, off, (PyObject *)src);
#define COPY_FIELD(f)                                                   \
    if (rc == PYCDS_OK) {                                               \
        rc = pycds_w_slot(w, off + offsetof(PyCodeObject, f),           \
                          (PyObject *)src->f, depth);                   \
    }
    PYCDS_CODE_PTR_FIELDS(COPY_FIELD)
#undef COPY_FIELD
    return rc;
}

/* The same test in every supported version. */
int
pycds_layout_str_interned(PyObject *op)
{
    return PyUnicode_CHECK_INTERNED(op) != SSTATE_NOT_INTERNED;
}

/* The version file defines copy_str, copy_long and copy_code;
 * layout_common.h the rest, alike in every version. */
int
pycds_layout_copy(pycds_writer *w, PyObject *op, int depth, uint64_t *off)
{
    if (PyUnicode_CheckExact(op)) {
        return copy_str(w, op, off);
    }
    if (PyBytes_CheckExact(op)) {
        return copy_bytes(w, op, off);
    }
    if (PyLong_CheckExact(op)) {
        return copy_long(w, op, off);
    }
    if (PyFloat_CheckExact(op)) {
        return copy_plain(w, op, sizeof(PyFloatObject), 0, off);
    }
    if (PyComplex_CheckExact(op)) {
        return copy_plain(w, op, sizeof(PyComplexObject), 0, off);
    }
    if (PyTuple_CheckExact(op)) {
        return copy_tuple(w, op, depth, off);
    }
    if (PyCode_Check(op)) {
        return copy_code(w, op, depth, off);
    }
    return unsupported(op);
}

/* The counts the version file's set_refcnt gives. */
Py_ssize_t
pycds_layout_refcnt(int in_tail)
{
    return in_tail ? PYCDS_TAIL_REFCNT : PYCDS_HEAD_REFCNT;
}

/* The version file defines check_str and check_code. */
int
pycds_layout_check_object(const pycds_place *p, PyObject *op)
{
    if (PyUnicode_CheckExact(op)) {
        return check_str(op);
    }
    if (PyCode_Check(op)) {
        return check_code(p, (PyCodeObject *)op);
    }
    return PYCDS_OK;
}

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

/* Text describing the layout facts an archive depends on. */
static int
describe_layout(char *buf, size_t cap)
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

int
pycds_layout_id(char *buf, size_t cap)
{
    if (buf == NULL || cap == 0) {
        return pycds_fail(PYCDS_E_ARG, "no buffer for the layout id");
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = pycds_image_init();
    if (rc == PYCDS_OK) {
        rc = describe_layout(buf, cap);
    }
    PyGILState_Release(g);
    return rc;
}

/* ---- what the loader's structural check needs to know ----------------- */

/* The type each pointer field of a code object must have, by field name,
 * for every name a layout's PYCDS_CODE_PTR_FIELDS may list (3.10-3.13:
 * Include/cpython/code.h).  A new field name fails to compile here, which is
 * the point: the loader must be told what the field holds. */
#define PYCDS_FIELD_TYPE_co_code (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_consts (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_names (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_varnames (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_freevars (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_cellvars (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_exceptiontable (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_localsplusnames (&PyTuple_Type)
#define PYCDS_FIELD_TYPE_co_localspluskinds (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_filename (&PyUnicode_Type)
#define PYCDS_FIELD_TYPE_co_name (&PyUnicode_Type)
#define PYCDS_FIELD_TYPE_co_qualname (&PyUnicode_Type)
#define PYCDS_FIELD_TYPE_co_linetable (&PyBytes_Type)
#define PYCDS_FIELD_TYPE_co_lnotab (&PyBytes_Type)

/* Tuples of names hold only str (codeobject.c, intern_strings()). */
#define PYCDS_FIELD_ITEMS_co_code NULL
#define PYCDS_FIELD_ITEMS_co_consts NULL
#define PYCDS_FIELD_ITEMS_co_names (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_varnames (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_freevars (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_cellvars (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_exceptiontable NULL
#define PYCDS_FIELD_ITEMS_co_localsplusnames (&PyUnicode_Type)
#define PYCDS_FIELD_ITEMS_co_localspluskinds NULL
#define PYCDS_FIELD_ITEMS_co_filename NULL
#define PYCDS_FIELD_ITEMS_co_name NULL
#define PYCDS_FIELD_ITEMS_co_qualname NULL
#define PYCDS_FIELD_ITEMS_co_linetable NULL
#define PYCDS_FIELD_ITEMS_co_lnotab NULL

static const pycds_code_field code_fields[] = {
#define CODE_FIELD(f) {offsetof(PyCodeObject, f), PYCDS_FIELD_TYPE_##f, \
                       PYCDS_FIELD_ITEMS_##f},
    PYCDS_CODE_PTR_FIELDS(CODE_FIELD)
#undef CODE_FIELD
};

size_t
pycds_layout_code_fields(const pycds_code_field **out)
{
    *out = code_fields;
    return sizeof(code_fields) / sizeof(code_fields[0]);
}
