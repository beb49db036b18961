/* serve.c -- the served hit in C: the finder's find_spec where the native
 * verdict takes a name, and a served module's get_code.
 *
 * pycds/share/__init__.py makes one server per opened archive and, where the
 * verdict may serve (PYCDSCHECK=mtime, not verbose, the import system's
 * parts stock), puts the server's find_spec on its finder as an instance
 * attribute.  A hit then runs no Python of pycds: the index lookup, the
 * stats and the verdict (find.c), the spec built as pycds._search builds
 * it (importlib's own SourceFileLoader and spec_from_file_location), and
 * the loader's get_code an ArchivedCode (type made here, methods from the
 * Python class pycds.share.ArchivedCode) whose call loads the archived
 * code object.  Whatever the verdict does not take, and every failure,
 * goes to the Python side unchanged (the finder's Python find_spec, the
 * ArchivedCode's _call_py / _failed), which judges and warns as before:
 * the rules stay written once, in Python, and this path only takes the
 * case where they all hold (tests/share/test_serve.py runs both on the same
 * inputs).
 *
 * Called by the interpreter, with the GIL held (not through cffi), except
 * pycds_serve_new / pycds_serve_use, which take it.
 */
#include "archive.h"

#include <structmember.h>
#include <time.h>

/* Counters of served hits (pycds.share.stats adds them), in the bytearray
 * pycds.share._served_counts (each interpreter's, as pycds.share's own
 * counters are: a subinterpreter of 3.10/3.11 has its pycds.share). */
enum { N_SERVED, N_REPLAYED, BYTES_SERVED, LOAD_NS, BYTES_RELEASED, N_COUNTS };

typedef struct {
    PyObject_HEAD
    PyObject *finder_slow;   /* the finder's Python find_spec (bound); a 4th
                              * argument gives it the facts gathered here */
    PyObject *release;       /* _Archive.release_finished (bound) */
    PyObject *ran;           /* _Archive.ran: (entry, spec) pairs */
    PyObject *missed;        /* pycds.share.missed */
    PyObject *ctx;           /* IndexFinder._ctx: find.c's verdict context */
    PyObject *loader_type;   /* SourceFileLoader */
    PyObject *spec_from;     /* spec_from_file_location */
    PyObject *plain_reduce;  /* pycds.share._PlainReduce */
    PyObject *fix_filename;  /* _imp._fix_co_filename */
    PyObject *archive;       /* the Python _Archive */
    PyObject *counts;        /* pycds.share._served_counts (a bytearray) */
    PyTypeObject *code_type; /* its ArchivedCode type */
    pycds_index *ix;   /* the index (IndexFinder's, kept alive there) */
    pycds_archive *a;        /* the native handle, once open */
    int find_on;             /* find_spec may serve here */
    int call_on;             /* get_code may load here */
    int checked;             /* PYCDSCHECK is not "unchecked" */
    int release_mode;        /* hand finished modules to `ran` */
} server;

typedef struct {
    PyObject_HEAD
    server *srv;
    PyObject *loader, *name, *number, *chunk_len, *mtime_ns, *size;
} served_code;

/* The types, made for the Python class `methods` they were last made for
 * (a subinterpreter of 3.10/3.11 has its own pycds.share). */
static PyTypeObject *server_type, *code_type;
static PyObject *code_methods;
static PyObject *s_name, *s_path, *s_dict_get_code, *s_reduce_ex, *s_cached,
                *s_initializing, *s_spec, *s_call_py, *s_failed, *s_kwnames;

static uint64_t
now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Call f as PyObject_Vectorcall does, at the depth the interpreter called
 * this file's function from: 3.10 and 3.11 count a call of a C function
 * against the recursion limit, and the Python side called then counts its
 * own frame, as it did when it was called directly (a program's
 * RecursionError comes where it came; 3.12+ count C calls apart). */
static PyObject *
call_at_callers_depth(PyObject *f, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
#if PY_VERSION_HEX < 0x030C0000
    PyThreadState *ts = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030B0000
    ts->recursion_remaining++;
#else
    ts->recursion_depth--;
#endif
    PyObject *r = PyObject_Vectorcall(f, args, nargsf, kwnames);
#if PY_VERSION_HEX >= 0x030B0000
    ts->recursion_remaining--;
#else
    ts->recursion_depth++;
#endif
    return r;
#else
    return PyObject_Vectorcall(f, args, nargsf, kwnames);
#endif
}

/* ---- the server ------------------------------------------------------- */

static int
server_traverse(server *s, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->finder_slow);
    Py_VISIT(s->release);
    Py_VISIT(s->ran);
    Py_VISIT(s->missed);
    Py_VISIT(s->ctx);
    Py_VISIT(s->loader_type);
    Py_VISIT(s->spec_from);
    Py_VISIT(s->plain_reduce);
    Py_VISIT(s->fix_filename);
    Py_VISIT(s->archive);
    Py_VISIT(s->counts);
    Py_VISIT((PyObject *)s->code_type);
    return 0;
}

static int
server_clear(server *s)
{
    s->find_on = s->call_on = 0;
    Py_CLEAR(s->finder_slow);
    Py_CLEAR(s->release);
    Py_CLEAR(s->ran);
    Py_CLEAR(s->missed);
    Py_CLEAR(s->ctx);
    Py_CLEAR(s->loader_type);
    Py_CLEAR(s->spec_from);
    Py_CLEAR(s->plain_reduce);
    Py_CLEAR(s->fix_filename);
    Py_CLEAR(s->archive);
    Py_CLEAR(s->counts);
    Py_CLEAR(s->code_type);
    return 0;
}

static void
server_dealloc(server *s)
{
    PyTypeObject *tp = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    server_clear(s);
    tp->tp_free((PyObject *)s);
    Py_DECREF(tp);
}

/* Add n to counter i of s (a bytearray too short: not counted). */
static void
count(server *s, int i, uint64_t n)
{
    if (s->counts != NULL && PyByteArray_GET_SIZE(s->counts) >= (Py_ssize_t)(N_COUNTS * 8)) {
        uint64_t v;
        char *at = PyByteArray_AS_STRING(s->counts) + 8 * i;
        memcpy(&v, at, 8);
        v += n;
        memcpy(at, &v, 8);
    }
}

/* Whether obj is true (any error: no). */
static int
truthy(PyObject *obj)
{
    int t = obj != NULL ? PyObject_IsTrue(obj) : 0;
    if (t < 0) {
        PyErr_Clear();
        t = 0;
    }
    return t;
}

/* getattr(obj, name, None): a new reference, never NULL. */
static PyObject *
attr_or_none(PyObject *obj, PyObject *name)
{
    PyObject *v = obj != NULL ? PyObject_GetAttr(obj, name) : NULL;
    if (v == NULL) {
        PyErr_Clear();
        v = Py_NewRef(Py_None);
    }
    return v;
}

/* Give back what finished modules used (CDSFinder.find_spec's first step,
 * _Archive.release_finished's loop): pop the handed-out modules whose body
 * has run, innermost first, and release each (release.c).  0, or -1 with
 * what the program raised through it. */
static int
release_finished(server *s)
{
    for (;;) {
        Py_ssize_t n = PyList_GET_SIZE(s->ran);
        PyObject *last, *init, *r;
        uint64_t released = 0;
        int running;

        if (n == 0 || s->a == NULL) {
            return 0;
        }
        last = PyList_GET_ITEM(s->ran, n - 1);
        if (!PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 2
                || !Py_IS_TYPE(PyTuple_GET_ITEM(last, 0), s->code_type)
                || !PyLong_CheckExact(((served_code *)PyTuple_GET_ITEM(last, 0))->number)) {
            /* (Not what this file puts there: the Python side's loop.) */
            r = PyObject_CallNoArgs(s->release);
            Py_XDECREF(r);
            return r == NULL ? -1 : 0;
        }
        Py_INCREF(last);
        init = attr_or_none(PyTuple_GET_ITEM(last, 1), s_initializing);
        running = truthy(init);
        Py_DECREF(init);
        n = PyList_GET_SIZE(s->ran);
        if (running || n == 0 || PyList_GET_ITEM(s->ran, n - 1) != last) {
            Py_DECREF(last);
            if (running) {
                return 0;
            }
            continue;               /* (the list changed meanwhile) */
        }
        if (PyList_SetSlice(s->ran, n - 1, n, NULL) < 0) {
            Py_DECREF(last);
            return -1;
        }
        unsigned long number =
            PyLong_AsUnsignedLong(((served_code *)PyTuple_GET_ITEM(last, 0))->number);
        if (PyErr_Occurred() || number > UINT32_MAX) {
            PyErr_Clear();
        } else if (pycds_archive_release_held(s->a, (uint32_t)number, &released) == PYCDS_OK) {
            count(s, BYTES_RELEASED, released);
        }
        Py_DECREF(last);
    }
}

static PyObject *code_make(PyTypeObject *tp, PyObject *const *fields);

/* The spec of a native verdict for entry tuple e: _verdict_spec's, built
 * here (a new reference, or NULL with an exception). */
static PyObject *
verdict_spec(server *s, PyObject *fullname, PyObject *e)
{
    PyObject *origin = PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_ORIGIN);
    PyObject *search = PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_SEARCH);
    PyObject *pkg_dir, *loader = NULL, *locs = NULL, *spec = NULL, *code = NULL;
    PyObject *reduce = NULL, *pair = NULL, *dict = NULL;

    if (!PyTuple_CheckExact(search) || PyTuple_GET_SIZE(search) < 2) {
        PyErr_SetString(PyExc_ValueError, "archive entry's search is malformed");
        return NULL;
    }
    pkg_dir = PyTuple_GET_ITEM(search, 1);
    PyObject *largs[2] = {fullname, origin};
    loader = PyObject_Vectorcall(s->loader_type, largs, 2, NULL);
    if (loader == NULL) {
        goto done;
    }
    if (pkg_dir == Py_None) {
        locs = Py_NewRef(Py_None);
    } else if ((locs = PyList_New(1)) != NULL) {
        PyList_SET_ITEM(locs, 0, Py_NewRef(pkg_dir));
    } else {
        goto done;
    }
    PyObject *sargs[4] = {fullname, origin, loader, locs};
    spec = PyObject_Vectorcall(s->spec_from, sargs, 2, s_kwnames);
    if (spec == NULL
            || PyObject_SetAttr(spec, s_cached, PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_PYC_PATH)) < 0) {
        Py_CLEAR(spec);
        goto done;
    }
    count(s, N_REPLAYED, 1);
    PyObject *fields[7] = {(PyObject *)s, loader, fullname,
                           PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_NUMBER), PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_CHUNK_LEN),
                           PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_MTIME_NS), PyTuple_GET_ITEM(e, PYCDS_FMT_ENTRY_SIZE)};
    code = code_make(s->code_type, fields);
    if (code == NULL) {
        Py_CLEAR(spec);
        goto done;
    }
    pair = PyTuple_Pack(2, fullname, origin);
    if (pair == NULL) {
        Py_CLEAR(spec);
        goto done;
    }
    reduce = PyObject_CallOneArg(s->plain_reduce, pair);
    dict = PyObject_GenericGetDict(loader, NULL);
    if (reduce == NULL || dict == NULL || !PyDict_Check(dict)
            || PyDict_SetItem(dict, s_dict_get_code, code) < 0
            || PyDict_SetItem(dict, s_reduce_ex, reduce) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "loader has no instance dict");
        }
        Py_CLEAR(spec);
    }
done:
    Py_XDECREF(dict);
    Py_XDECREF(reduce);
    Py_XDECREF(pair);
    Py_XDECREF(code);
    Py_XDECREF(locs);
    Py_XDECREF(loader);
    return spec;
}

/* CDSFinder.find_spec where the native verdict serves; anything else is
 * the Python find_spec's, with the facts gathered here where there are. */
static PyObject *
server_find_spec(server *s, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *out, *r;
    int rc;

    if (s->finder_slow == NULL) {
        /* (Cleared by the collector, the finder with it: a finalizer of
         * that cycle importing.) */
        Py_RETURN_NONE;
    }
    if (!s->find_on || s->a == NULL || kwnames != NULL || nargs < 1 || nargs > 3
            || !PyUnicode_CheckExact(args[0])) {
        return call_at_callers_depth(s->finder_slow, args, nargs, kwnames);
    }
    if (release_finished(s) < 0) {
        return NULL;
    }
    if (!s->find_on) {              /* (disabled meanwhile) */
        return call_at_callers_depth(s->finder_slow, args, nargs, NULL);
    }
    out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    rc = pycds_find_hit(s->ix, args[0], nargs > 1 ? args[1] : Py_None, s->ctx, out);
    if (rc != PYCDS_OK) {
        Py_DECREF(out);
        if (PyErr_Occurred()) {
            return NULL;            /* (what a directory's listing raised) */
        }
        return call_at_callers_depth(s->finder_slow, args, nargs, NULL);
    }
    Py_ssize_t n = PyList_GET_SIZE(out);
    if (n == 0) {                   /* not in the archive */
        Py_DECREF(out);
        if (PySet_Add(s->missed, args[0]) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (n == 2 && PyList_GET_ITEM(out, 1) == Py_True) {
        r = verdict_spec(s, args[0], PyList_GET_ITEM(out, 0));
        Py_DECREF(out);
        return r;
    }
    /* The facts without the verdict (False), for the Python side. */
    if (PyList_SetSlice(out, n - 1, n, NULL) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *fargs[4] = {args[0], nargs > 1 ? args[1] : Py_None,
                          nargs > 2 ? args[2] : Py_None, out};
    r = call_at_callers_depth(s->finder_slow, fargs, 4, NULL);
    Py_DECREF(out);
    return r;
}

static PyObject *
server_stop(server *s, PyObject *Py_UNUSED(ignored))
{
    s->find_on = s->call_on = 0;
    Py_RETURN_NONE;
}

static PyMethodDef server_methods[] = {
    {"find_spec", (PyCFunction)(void (*)(void))server_find_spec,
     METH_FASTCALL | METH_KEYWORDS,
     "find_spec(fullname, path=None, target=None): the finder's, served in C."},
    {"stop", (PyCFunction)server_stop, METH_NOARGS,
     "stop(): everything goes to the Python side from now on."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot server_slots[] = {
    {Py_tp_dealloc, server_dealloc},
    {Py_tp_traverse, server_traverse},
    {Py_tp_clear, server_clear},
    {Py_tp_methods, server_methods},
    {0, NULL},
};

static PyType_Spec server_spec = {
    "pycds.share.Server", sizeof(server), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, server_slots,
};

/* ---- the served module's get_code ------------------------------------- */

static int
code_traverse(served_code *c, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(c));
    Py_VISIT((PyObject *)c->srv);
    Py_VISIT(c->loader);
    Py_VISIT(c->name);
    Py_VISIT(c->number);
    Py_VISIT(c->chunk_len);
    Py_VISIT(c->mtime_ns);
    Py_VISIT(c->size);
    return 0;
}

static int
code_clear(served_code *c)
{
    Py_CLEAR(c->srv);
    Py_CLEAR(c->loader);
    Py_CLEAR(c->name);
    Py_CLEAR(c->number);
    Py_CLEAR(c->chunk_len);
    Py_CLEAR(c->mtime_ns);
    Py_CLEAR(c->size);
    return 0;
}

static void
code_dealloc(served_code *c)
{
    PyTypeObject *tp = Py_TYPE(c);
    PyObject_GC_UnTrack(c);
    code_clear(c);
    tp->tp_free((PyObject *)c);
    Py_DECREF(tp);
}

/* ArchivedCode(server, loader, name, number, chunk_len, mtime_ns, size) */
static PyObject *
code_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    PyObject *srv, *f[6];
    if (kw != NULL && PyDict_GET_SIZE(kw) != 0) {
        PyErr_SetString(PyExc_TypeError, "ArchivedCode takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "ArchivedCode", 7, 7, &srv, &f[0], &f[1], &f[2],
                           &f[3], &f[4], &f[5])) {
        return NULL;
    }
    if (Py_TYPE(srv)->tp_dealloc != (destructor)server_dealloc) {
        PyErr_SetString(PyExc_TypeError, "ArchivedCode: not a server");
        return NULL;
    }
    PyObject *fields[7] = {srv, f[0], f[1], f[2], f[3], f[4], f[5]};
    return code_make(tp, fields);
}

/* A new ArchivedCode of type tp: fields are its server, loader, name,
 * number, chunk_len, mtime_ns and size (a new reference, or NULL). */
static PyObject *
code_make(PyTypeObject *tp, PyObject *const *fields)
{
    served_code *c = (served_code *)tp->tp_alloc(tp, 0);
    if (c == NULL) {
        return NULL;
    }
    c->srv = (server *)Py_NewRef(fields[0]);
    c->loader = Py_NewRef(fields[1]);
    c->name = Py_NewRef(fields[2]);
    c->number = Py_NewRef(fields[3]);
    c->chunk_len = Py_NewRef(fields[4]);
    c->mtime_ns = Py_NewRef(fields[5]);
    c->size = Py_NewRef(fields[6]);
    return (PyObject *)c;
}

/* Whether the loader parts plain import's get_code uses are the stock ones
 * (pycds._config.loader_patched() false): the `loader` part of the verdict's
 * serving context, as find.c's serving_stock() checks it. */
static int
loader_stock(server *s)
{
    PyObject *serving = PyTuple_GET_ITEM(s->ctx, 6);
    if (!PyTuple_CheckExact(serving) || PyTuple_GET_SIZE(serving) != 4) {
        return 0;
    }
    return pycds_stored_stock(PyTuple_GET_ITEM(serving, 3));
}

static PyObject *
call_py(served_code *c, PyObject *args, PyObject *kw)
{
    PyObject *m = PyObject_GetAttr((PyObject *)c, s_call_py), *r;
    if (m == NULL) {
        return NULL;
    }
    if (kw == NULL) {
        r = call_at_callers_depth(m, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), NULL);
    } else {
        r = PyObject_Call(m, args, kw);
    }
    Py_DECREF(m);
    return r;
}

/* ArchivedCode.__call__: the archived code object, where everything its
 * Python twin (_call_py) checks holds; that twin otherwise. */
static PyObject *
code_call(served_code *c, PyObject *args, PyObject *kw)
{
    server *s = c->srv;
    PyObject *fullname, *loader_name, *modules, *mod, *spec = NULL, *dict = NULL;
    PyObject *code = NULL, *path = NULL, *r;
    uint64_t t0;
    int same, rc;

    if (kw != NULL || PyTuple_GET_SIZE(args) != 1 || s == NULL || !s->call_on
            || s->a == NULL || !PyLong_CheckExact(c->number)) {
        return call_py(c, args, kw);
    }
    fullname = PyTuple_GET_ITEM(args, 0);
    loader_name = PyObject_GetAttr(c->loader, s_name);
    if (loader_name == NULL) {
        PyErr_Clear();
        return call_py(c, args, kw);
    }
    same = PyUnicode_CheckExact(fullname) && PyUnicode_CheckExact(loader_name)
           && PyUnicode_Compare(fullname, loader_name) == 0;
    Py_DECREF(loader_name);
    if (!same || !loader_stock(s)) {
        return call_py(c, args, kw);
    }
    /* importlib runs exec_module with the module in sys.modules, its spec
     * marked _initializing; elsewhere the Python side checks the stats. */
    modules = PySys_GetObject("modules");      /* borrowed */
    mod = modules != NULL && PyDict_CheckExact(modules)
          ? PyDict_GetItemWithError(modules, fullname) : NULL;
    if (mod != NULL) {
        Py_INCREF(mod);
        spec = attr_or_none(mod, s_spec);
        Py_DECREF(mod);
    } else {
        PyErr_Clear();
        spec = Py_NewRef(Py_None);
    }
    if (s->checked) {
        PyObject *init = attr_or_none(spec, s_initializing);
        int running = truthy(init);
        Py_DECREF(init);
        if (!running) {
            Py_DECREF(spec);
            return call_py(c, args, kw);
        }
    }
    /* Plain from now on. */
    dict = PyObject_GenericGetDict(c->loader, NULL);
    if (dict == NULL || !PyDict_Check(dict)) {
        PyErr_Clear();
        Py_XDECREF(dict);
        Py_DECREF(spec);
        return call_py(c, args, kw);
    }
    if (PyDict_GetItemWithError(dict, s_dict_get_code) == (PyObject *)c) {
        if (PyDict_DelItem(dict, s_dict_get_code) < 0
                || (PyDict_GetItemWithError(dict, s_reduce_ex) != NULL
                    && PyDict_DelItem(dict, s_reduce_ex) < 0)) {
            PyErr_Clear();
        }
    }
    PyErr_Clear();
    Py_DECREF(dict);
    unsigned long number = PyLong_AsUnsignedLong(c->number);
    if (PyErr_Occurred() || number > UINT32_MAX) {
        PyErr_Clear();
        Py_DECREF(spec);
        return call_py(c, args, kw);
    }
    t0 = now_ns();
    rc = pycds_archive_load_root(s->a, (uint32_t)number, &code);
    if (rc != PYCDS_OK) {
        Py_DECREF(spec);
        PyObject *code_obj = PyLong_FromLong(rc);
        if (code_obj == NULL) {
            return NULL;
        }
        PyObject *failed = PyObject_GetAttr((PyObject *)c, s_failed);
        PyObject *fargs[2] = {fullname, code_obj};
        r = failed != NULL ? call_at_callers_depth(failed, fargs, 2, NULL) : NULL;
        Py_XDECREF(failed);
        Py_DECREF(code_obj);
        return r;
    }
    /* As plain import names a .pyc's code after the source it found. */
    path = PyObject_GetAttr(c->loader, s_path);
    r = path != NULL ? PyObject_CallFunctionObjArgs(s->fix_filename, code, path, NULL) : NULL;
    Py_XDECREF(path);
    if (r == NULL) {
        Py_DECREF(code);
        Py_DECREF(spec);
        return NULL;
    }
    Py_DECREF(r);
    if (s->release_mode) {
        PyObject *pair = PyTuple_Pack(2, (PyObject *)c, spec);
        if (pair == NULL || PyList_Append(s->ran, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(code);
            Py_DECREF(spec);
            return NULL;
        }
        Py_DECREF(pair);
    }
    Py_DECREF(spec);
    count(s, N_SERVED, 1);
    count(s, LOAD_NS, now_ns() - t0);
    count(s, BYTES_SERVED, PyLong_AsUnsignedLongLong(c->chunk_len));
    PyErr_Clear();
    return code;
}

static PyObject *
code_get_archive(served_code *c, void *Py_UNUSED(closure))
{
    return Py_NewRef(c->srv != NULL && c->srv->archive != NULL ? c->srv->archive : Py_None);
}

static PyObject *
code_get_entry(served_code *c, void *Py_UNUSED(closure))
{
    return Py_NewRef((PyObject *)c);
}

static PyMemberDef code_members[] = {
    {"loader", T_OBJECT_EX, offsetof(served_code, loader), READONLY, NULL},
    {"name", T_OBJECT_EX, offsetof(served_code, name), READONLY, NULL},
    {"number", T_OBJECT_EX, offsetof(served_code, number), READONLY, NULL},
    {"chunk_len", T_OBJECT_EX, offsetof(served_code, chunk_len), READONLY, NULL},
    {"mtime_ns", T_OBJECT_EX, offsetof(served_code, mtime_ns), READONLY, NULL},
    {"size", T_OBJECT_EX, offsetof(served_code, size), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef code_getset[] = {
    {"archive", (getter)code_get_archive, NULL, NULL, NULL},
    {"entry", (getter)code_get_entry, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot code_slots[] = {
    {Py_tp_dealloc, code_dealloc},
    {Py_tp_traverse, code_traverse},
    {Py_tp_clear, code_clear},
    {Py_tp_new, code_new},
    {Py_tp_call, code_call},
    {Py_tp_members, code_members},
    {Py_tp_getset, code_getset},
    {0, NULL},
};

static PyType_Spec code_spec = {
    "pycds.share.ArchivedCode", sizeof(served_code), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, code_slots,
};

/* ---- the boundary ------------------------------------------------------ */

static int
make_types(PyObject *methods)
{
    static const char *const names[] = {"name", "path", "get_code", "__reduce_ex__",
                                        "_cached", "_initializing", "__spec__",
                                        "_call_py", "_failed"};
    PyObject **slots[] = {&s_name, &s_path, &s_dict_get_code, &s_reduce_ex, &s_cached,
                          &s_initializing, &s_spec, &s_call_py, &s_failed};
    if (code_type != NULL && code_methods == methods) {
        return 0;
    }
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        if (*slots[i] == NULL && (*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) {
            return -1;
        }
    }
    if (s_kwnames == NULL
            && (s_kwnames = Py_BuildValue("(ss)", "loader", "submodule_search_locations"))
               == NULL) {
        return -1;
    }
    PyObject *bases = PyTuple_Pack(1, methods);
    PyTypeObject *st = (PyTypeObject *)PyType_FromSpec(&server_spec);
    PyTypeObject *ct = bases == NULL || st == NULL
                       ? NULL : (PyTypeObject *)PyType_FromSpecWithBases(&code_spec, bases);
    Py_XDECREF(bases);
    if (ct == NULL) {
        Py_XDECREF(st);
        return -1;
    }
    /* (Those made before stay alive while their servers and objects do.) */
    Py_XSETREF(server_type, st);
    Py_XSETREF(code_type, ct);
    Py_XSETREF(code_methods, Py_NewRef(methods));
    return 0;
}

/* The server's parts, by name: the keys of pycds_serve_new's dict (pycds/
 * share/__init__.py, _Archive.start); objects first, then flags. */
static const char *const part_names[] = {
    "methods", "finder_slow", "release", "ran", "missed", "ctx", "loader_type",
    "spec_from", "plain_reduce", "fix_filename", "archive", "counts",
};
static const char *const flag_names[] = {"find_on", "checked", "release_mode", "call_on"};
#define NPARTS (sizeof(part_names) / sizeof(part_names[0]))
#define NFLAGS (sizeof(flag_names) / sizeof(flag_names[0]))

int
pycds_serve_new(uintptr_t args_obj, pycds_index *ix, uintptr_t out_list)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *args = (PyObject *)args_obj, *out = (PyObject *)out_list;
    PyObject *f[NPARTS];
    int flags[NFLAGS];
    int rc = PYCDS_E_ARG;

    if (!PyDict_CheckExact(args) || PyDict_GET_SIZE(args) != (Py_ssize_t)(NPARTS + NFLAGS)
            || !PyList_Check(out) || ix == NULL) {
        goto done;
    }
    for (size_t i = 0; i < NPARTS; i++) {
        f[i] = PyDict_GetItemString(args, part_names[i]);    /* borrowed */
        if (f[i] == NULL) {
            goto done;
        }
    }
    for (size_t i = 0; i < NFLAGS; i++) {
        PyObject *flag = PyDict_GetItemString(args, flag_names[i]);
        flags[i] = flag == NULL ? -1 : PyObject_IsTrue(flag);
        if (flags[i] < 0) {
            rc = flag == NULL ? PYCDS_E_ARG : pycds_fail_python("server flags");
            goto done;
        }
    }
    if (!PyType_Check(f[0]) || !PyList_CheckExact(f[3]) || !PySet_Check(f[4])
            || !PyTuple_CheckExact(f[5]) || PyTuple_GET_SIZE(f[5]) != 7
            || !PyByteArray_CheckExact(f[11])) {
        goto done;
    }
    if (make_types(f[0]) < 0) {
        rc = pycds_fail_python("serving types");
        goto done;
    }
    server *s = PyObject_GC_New(server, server_type);
    if (s == NULL) {
        rc = pycds_fail_python("server");
        goto done;
    }
    s->finder_slow = Py_NewRef(f[1]);
    s->release = Py_NewRef(f[2]);
    s->ran = Py_NewRef(f[3]);
    s->missed = Py_NewRef(f[4]);
    s->ctx = Py_NewRef(f[5]);
    s->loader_type = Py_NewRef(f[6]);
    s->spec_from = Py_NewRef(f[7]);
    s->plain_reduce = Py_NewRef(f[8]);
    s->fix_filename = Py_NewRef(f[9]);
    s->archive = Py_NewRef(f[10]);
    s->counts = Py_NewRef(f[11]);
    s->code_type = (PyTypeObject *)Py_NewRef((PyObject *)code_type);
    s->ix = ix;
    s->a = NULL;
    s->find_on = flags[0];
    s->call_on = flags[3];
    s->checked = flags[1];
    s->release_mode = flags[2];
    PyObject_GC_Track(s);
    rc = PyList_Append(out, (PyObject *)s) < 0
         || PyList_Append(out, (PyObject *)s->code_type) < 0
         ? pycds_fail_python("server") : PYCDS_OK;
    Py_DECREF(s);
done:
    PyGILState_Release(g);
    return rc;
}

int
pycds_serve_use(uintptr_t server_obj, pycds_archive *a)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = PYCDS_E_ARG;
    PyObject *obj = (PyObject *)server_obj;
    if (Py_TYPE(obj)->tp_dealloc == (destructor)server_dealloc && a != NULL) {
        ((server *)obj)->a = a;
        rc = PYCDS_OK;
    }
    PyGILState_Release(g);
    return rc;
}
