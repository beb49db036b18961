/* find.c -- the raw work of the finder's archive hit (pycds/share/__init__.py), in
 * one call: the index lookup of a name and the stats its checks need.
 *
 * Facts only, no verdict: pycds_index_find() finds the name's entry as
 * pycds/_archive.py's Index.lookup does (bucket probe, pread, keyed SipHash,
 * unmarshal) and stats what the entry names -- the directories of its
 * recorded search, its source and its .pyc -- handing back the fields
 * pycds/_search.py and pycds/_pyc.py compare, as the tuples their own stat
 * helpers make from os.stat.  Whether a search replays and whether plain
 * import would run the archived code is decided there, once, on either
 * kind of facts (tests/share/test_cfind.py checks that both agree).  An
 * entry this path does not expect, or any failure, makes it decline:
 * Index.lookup then runs, and raises or answers as it does.
 */
#include "archive.h"

#include <marshal.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* Paths stat'ed per call: the search's directories, its package
 * directory, the source and the .pyc; a longer search declines. */
#define MAX_PATHS 64
/* find()'s flags for pycds_find_hit, whose caller holds the GIL and raises
 * what a directory's listing raised (listed_none): FIND_FILL lets it read
 * a listing again; FIND_HELD takes no GIL (PyGILState_Ensure would, in a
 * subinterpreter of 3.10/3.11, take the main interpreter's thread state of
 * this thread and wait for the GIL the caller holds). */
#define FIND_FILL 0x100
#define FIND_HELD 0x200

/* ---- the entry -------------------------------------------------------- */

/* pread all of [off, off + n), retrying EINTR, without the GIL; 0 or -1. */
static int
read_at(int fd, uint8_t *buf, size_t n, uint64_t off)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pycds_read_full(fd, buf, n, off);
    Py_END_ALLOW_THREADS
    return rc == PYCDS_OK ? 0 : -1;
}

/* Bytes [off, off + n) of ix's entries section, from its window (entries
 * lie in the order the dump met their modules, about the order a run
 * imports them, so one read serves the lookups that follow), read anew
 * from off where the window does not hold them; NULL where that read
 * fails.  The window is the caller's and the GIL guards it: the read goes
 * to a buffer of its own (read_at lets other threads run, which may use
 * the window meanwhile), copied in once the GIL is back; the caller copies
 * the bytes out before it lets another thread run. */
static const uint8_t *
window_at(pycds_index *ix, uint64_t off, uint64_t n, uint8_t *own)
{
    if (ix->window_cap < PYCDS_FMT_ENTRY_READ || ix->window == NULL) {
        return read_at(ix->fd, own, (size_t)n, ix->entries_off + off) < 0 ? NULL : own;
    }
    if (ix->window_len == 0 || off < ix->window_lo
            || off + n > ix->window_lo + ix->window_len) {
        uint64_t len = ix->entries_len - off < ix->window_cap ? ix->entries_len - off
                                                              : ix->window_cap;
        uint8_t *buf = len < n ? NULL : malloc((size_t)len);
        if (buf == NULL || read_at(ix->fd, buf, (size_t)len, ix->entries_off + off) < 0) {
            free(buf);
            return NULL;
        }
        memcpy(ix->window, buf, (size_t)len);
        free(buf);
        ix->window_lo = off;
        ix->window_len = len;
    }
    return ix->window + (off - ix->window_lo);
}

/* The unmarshalled payload of the entry at offset off of the entries
 * section (a new reference), or NULL (no exception set) where
 * Index._read_entry would not give a ModuleEntry of a 21-tuple. */
static PyObject *
read_entry(pycds_index *ix, uint64_t off)
{
    uint8_t head[PYCDS_FMT_ENTRY_READ];
    uint8_t *rec = head;
    const uint8_t *in;
    uint64_t avail, length;
    PyObject *obj = NULL;

    if (off + PYCDS_FMT_ENTRY_HEAD > ix->entries_len) {
        return NULL;
    }
    avail = ix->entries_len - off < PYCDS_FMT_ENTRY_READ ? ix->entries_len - off : PYCDS_FMT_ENTRY_READ;
    in = window_at(ix, off, avail, head);
    if (in == NULL) {
        return NULL;
    }
    if (in != head) {
        memcpy(head, in, (size_t)avail);
    }
    length = pycds_le32(head);
    if (length < PYCDS_FMT_ENTRY_HEAD || off + length > ix->entries_len) {
        return NULL;
    }
    if (length > avail) {
        rec = malloc((size_t)length);
        if (rec == NULL) {
            return NULL;
        }
        memcpy(rec, head, (size_t)avail);
        if (read_at(ix->fd, rec + avail, (size_t)(length - avail),
                    ix->entries_off + off + avail) < 0) {
            goto done;
        }
    }
    if (pycds_checksum(rec + PYCDS_FMT_ENTRY_HEAD, (size_t)length - PYCDS_FMT_ENTRY_HEAD, ix->key)
            != pycds_le64(rec + 4)) {
        goto done;
    }
    obj = PyMarshal_ReadObjectFromString((const char *)rec + PYCDS_FMT_ENTRY_HEAD,
                                         (Py_ssize_t)length - PYCDS_FMT_ENTRY_HEAD);
    if (obj == NULL) {
        PyErr_Clear();
    } else if (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != PYCDS_FMT_ENTRY_FIELDS) {
        Py_CLEAR(obj);
    }
done:
    if (rec != head) {
        free(rec);
    }
    return obj;
}

/* ---- the stats -------------------------------------------------------- */

typedef struct {
    PyObject *str;         /* the path (borrowed from the entry), or NULL */
    PyObject *bytes;       /* its file-system encoding where not ASCII */
    const char *c;         /* NUL-terminated, or NULL: os.stat would fail */
    int dir;               /* a search directory: give its stamp */
    int ok;
    struct stat st;
} path_fact;

/* Record path p (a str, else decline: -1) to be stat'ed. */
static int
add_path(path_fact *f, PyObject *p, int dir)
{
    Py_ssize_t n;

    memset(f, 0, sizeof(*f));
    if (!PyUnicode_CheckExact(p)) {
        return -1;
    }
    f->str = p;
    f->dir = dir;
    if (PyUnicode_IS_ASCII(p)) {
        f->c = (const char *)PyUnicode_DATA(p);
        n = PyUnicode_GET_LENGTH(p);
    } else {
        /* os.stat's encoding (os.fsencode): the file system's, with
         * surrogateescape. */
        f->bytes = PyUnicode_EncodeFSDefault(p);
        if (f->bytes == NULL) {
            PyErr_Clear();
            return -1;
        }
        f->c = PyBytes_AS_STRING(f->bytes);
        n = PyBytes_GET_SIZE(f->bytes);
    }
    if ((Py_ssize_t)strlen(f->c) != n) {
        f->c = NULL;       /* an embedded NUL: os.stat raises ValueError */
    }
    return 0;
}

/* ts as nanoseconds (os.stat's *_ns) in *ns: 0, or -1 where that does not
 * fit a long long (time_ns() declines the same times). */
static int
ns_of(struct timespec ts, long long *ns)
{
    if (ts.tv_sec > LLONG_MAX / 1000000000 - 1 || ts.tv_sec < LLONG_MIN / 1000000000 + 1) {
        return -1;
    }
    *ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    return 0;
}

/* st's seconds and nanoseconds as os.stat's *_ns (sec * 10**9 + nsec);
 * NULL without an exception where that does not fit a long long. */
static PyObject *
time_ns(struct timespec ts)
{
    long long ns;

    if (ns_of(ts, &ns) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(ns);
}

/* The fact of f, as the Python helpers make it: None where stat failed; a
 * directory's stamp (pycds._search._stamp); a file's (st_mtime_ns, st_size,
 * st_mtime) (pycds._pyc.file_facts).  NULL (exception cleared): decline. */
static PyObject *
fact_object(const path_fact *f)
{
    PyObject *a = NULL, *b = NULL, *c = NULL, *d = NULL, *out = NULL;

    if (!f->ok) {
        Py_RETURN_NONE;
    }
    a = time_ns(f->st.st_mtim);
    if (a == NULL) {
        goto done;
    }
    if (f->dir) {
        if ((unsigned long long)f->st.st_dev > LLONG_MAX) {
            goto done;     /* os.stat's st_dev differs across versions */
        }
        b = time_ns(f->st.st_ctim);
        c = PyLong_FromUnsignedLongLong((unsigned long long)f->st.st_ino);
        d = PyLong_FromLongLong((long long)f->st.st_dev);
        if (b != NULL && c != NULL && d != NULL) {
            out = PyTuple_Pack(4, a, b, c, d);
        }
    } else {
        b = PyLong_FromLongLong((long long)f->st.st_size);
        /* os.stat's st_mtime (fill_time, Modules/posixmodule.c) */
        c = PyFloat_FromDouble((double)f->st.st_mtim.tv_sec
                               + f->st.st_mtim.tv_nsec * 1e-9);
        if (b != NULL && c != NULL) {
            out = PyTuple_Pack(3, a, b, c);
        }
    }
done:
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    Py_XDECREF(d);
    if (out == NULL) {
        PyErr_Clear();
    }
    return out;
}

/* An empty fact slot (a step without a stamp, no package directory, no
 * .pyc): None. */
static void
no_path(path_fact *f)
{
    memset(f, 0, sizeof(*f));
}

/* Gather entry's paths into facts[*n...]: per search step its directory
 * (where it has a stamp), then the package directory (where it has one),
 * and with files set the source and the .pyc.  *nsteps: the steps.
 * Returns 0, or -1 where the entry is not as pycds.dump writes it. */
static int
gather(PyObject *entry, int files, path_fact *facts, int *n, Py_ssize_t *nsteps)
{
    PyObject *search = PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_SEARCH);
    PyObject *pyc = PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_PYC_PATH);
    PyObject *steps, *step;

    *nsteps = 0;
    if (search != Py_None) {
        if (!PyTuple_CheckExact(search) || PyTuple_GET_SIZE(search) != 3) {
            return -1;
        }
        steps = PyTuple_GET_ITEM(search, 0);
        if (!PyTuple_CheckExact(steps) || PyTuple_GET_SIZE(steps) > MAX_PATHS - 3) {
            return -1;
        }
        *nsteps = PyTuple_GET_SIZE(steps);
        for (Py_ssize_t i = 0; i < *nsteps; i++) {
            step = PyTuple_GET_ITEM(steps, i);
            if (!PyTuple_CheckExact(step) || PyTuple_GET_SIZE(step) != 3) {
                return -1;
            }
            if (PyTuple_GET_ITEM(step, 2) == Py_None) {
                no_path(&facts[(*n)++]);
            } else if (add_path(&facts[(*n)++], PyTuple_GET_ITEM(step, 1), 1) < 0) {
                return -1;
            }
        }
    }
    if (search == Py_None || PyTuple_GET_ITEM(search, 2) == Py_None) {
        no_path(&facts[(*n)++]);
    } else if (add_path(&facts[(*n)++], PyTuple_GET_ITEM(search, 1), 1) < 0) {
        return -1;
    }
    if (!files) {
        return 0;
    }
    if (add_path(&facts[(*n)++], PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_ORIGIN), 0) < 0) {
        return -1;
    }
    if (pyc == Py_None || (PyUnicode_CheckExact(pyc) && PyUnicode_GET_LENGTH(pyc) == 0)) {
        no_path(&facts[(*n)++]);     /* (falsy: _pyc.check stats none) */
    } else if (add_path(&facts[(*n)++], pyc, 0) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *
fact_or_none(const path_fact *f)
{
    return f->str == NULL ? Py_NewRef(Py_None) : fact_object(f);
}

/* out_list += [entry, dirs, pkg, source, pyc]: dirs the tuple of the
 * steps' stamps (None where not taken), the others a fact or None.
 * 0, or -1 (exception cleared). */
static int
report(PyObject *out, PyObject *entry, const path_fact *facts,
       Py_ssize_t nsteps, int files)
{
    PyObject *items[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *item;
    int rc = -1, k;

    items[0] = Py_NewRef(entry);
    items[1] = PyTuple_New(nsteps);
    if (items[1] == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        item = fact_or_none(&facts[i]);
        if (item == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(items[1], i, item);
    }
    for (k = 0; k < 3; k++) {
        items[2 + k] = k == 0 || files ? fact_or_none(&facts[nsteps + k])
                                       : Py_NewRef(Py_None);
        if (items[2 + k] == NULL) {
            goto done;
        }
    }
    for (k = 0; k < 5; k++) {
        if (PyList_Append(out, items[k]) < 0) {
            goto done;
        }
    }
    rc = 0;
done:
    for (k = 0; k < 5; k++) {
        Py_XDECREF(items[k]);
    }
    if (rc < 0) {
        PyErr_Clear();
    }
    return rc;
}

/* ---- the verdict --------------------------------------------------------- */

/* Whether item i of tuple t is an int equal to v. */
static int
item_is(PyObject *t, Py_ssize_t i, long long v)
{
    PyObject *o = PyTuple_GET_ITEM(t, i);
    int overflow;
    long long x;

    if (!PyLong_CheckExact(o)) {
        return 0;
    }
    x = PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow && !(x == -1 && PyErr_Occurred()) && x == v;
}

/* Whether directory fact f has the recorded stamp rec, a tuple
 * (st_mtime_ns, st_ctime_ns, st_ino, st_dev) as pycds._search._stamp
 * makes it (compared as fact_object would make it). */
static int
stamp_is(const path_fact *f, PyObject *rec)
{
    const struct stat *st = &f->st;
    long long mtime_ns, ctime_ns;

    if (!f->ok || !PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4
            || (unsigned long long)st->st_ino > LLONG_MAX
            || (unsigned long long)st->st_dev > LLONG_MAX
            || ns_of(st->st_mtim, &mtime_ns) < 0 || ns_of(st->st_ctim, &ctime_ns) < 0) {
        return 0;
    }
    return item_is(rec, 0, mtime_ns) && item_is(rec, 1, ctime_ns)
           && item_is(rec, 2, (long long)st->st_ino)
           && item_is(rec, 3, (long long)st->st_dev);
}

/* The key PathFinder._path_importer_cache looks entry up by (a new
 * reference): the entry, or the working directory for '' (NULL where
 * getcwd fails: that method answers None then, which is not a hit). */
static PyObject *
cache_key(PyObject *entry)
{
    char buf[PATH_MAX];

    if (PyUnicode_GET_LENGTH(entry) != 0) {
        return Py_NewRef(entry);
    }
    if (getcwd(buf, sizeof(buf)) == NULL) {
        return NULL;
    }
    return PyUnicode_DecodeFSDefault(buf);
}

/* Whether obj.attr == want (attr: an interned str): 1, 0 or -1. */
static int
attr_equals(PyObject *obj, PyObject *attr, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(obj, attr);
    int eq;

    if (v == NULL) {
        return -1;
    }
    eq = PyObject_RichCompareBool(v, want, Py_EQ);
    Py_DECREF(v);
    return eq;
}

/* Whether FileFinder instance f has a search method of its own in its
 * dict, which PathFinder would call (pycds._search.own_search_methods);
 * any error counts as yes. */
static int
own_search_methods(PyObject *f)
{
    static PyObject *names[3];
    static const char *const cnames[3] = {"find_spec", "_get_spec", "_fill_cache"};
    PyObject *d = PyObject_GenericGetDict(f, NULL);
    int own = d == NULL || !PyDict_Check(d);
    for (int i = 0; i < 3 && !own; i++) {
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(cnames[i])) == NULL) {
            own = 1;
        }
        else if (PyDict_GetItemWithError(d, names[i]) != NULL || PyErr_Occurred()) {
            own = 1;
        }
    }
    Py_XDECREF(d);
    PyErr_Clear();
    return own;
}

/* ---- a directory changed since the dump ------------------------------ */

/* importlib's _path_join(dir, name): dir's trailing slashes dropped.  A new
 * str, or NULL (exception set). */
static PyObject *
path_join(PyObject *dir, PyObject *name)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(dir);
    while (n > 0 && PyUnicode_READ_CHAR(dir, n - 1) == '/') {
        n--;
    }
    PyObject *head = PyUnicode_Substring(dir, 0, n);
    if (head == NULL) {
        return NULL;
    }
    PyObject *out = PyUnicode_FromFormat("%U/%U", head, name);
    Py_DECREF(head);
    return out;
}

/* Whether path (a str) is of file type `type` (S_IFREG, S_IFDIR) now, as
 * importlib's _path_is_mode_type (stat, following links): 1 or 0; -1
 * where it cannot be said. */
static int
is_type(PyObject *path, mode_t type)
{
    path_fact f;
    int rc = -1;
    if (add_path(&f, path, 0) == 0 && f.c != NULL) {
        rc = stat(f.c, &f.st) == 0 && (f.st.st_mode & S_IFMT) == type;
    }
    Py_XDECREF(f.bytes);
    return rc;
}

/* Whether the listing of directory dir can be read (os.listdir, which
 * FileFinder._fill_cache takes as empty where it cannot): 1 or 0. */
static int
listable(PyObject *dir)
{
    path_fact f;
    int ok = 0;
    if (add_path(&f, dir, 0) == 0 && f.c != NULL) {
        DIR *d = opendir(f.c);
        if (d != NULL) {
            closedir(d);
            ok = 1;
        }
    }
    Py_XDECREF(f.bytes);
    return ok;
}

/* The file FileFinder(dir), with the stock (suffix, loader) list loaders,
 * takes for tail now (FileFinder.find_spec, importlib/
 * _bootstrap_external.py, 3.10-3.13): the first of tail/__init__<suffix>,
 * then of tail<suffix>, suffixes in the loaders' order, that is a regular
 * file; a directory tail without one is a namespace portion, which does
 * not end PathFinder's search.  Each name is taken as listed where it is
 * there (on Linux the listing is the directory's names; the caller checks
 * that it can be read where a name must be listed).  A new str, Py_None
 * (a new reference) where there is none, NULL where it cannot be said
 * (no exception set). */
static PyObject *
first_file(PyObject *dir, PyObject *tail, PyObject *loaders)
{
    PyObject *base = path_join(dir, tail);
    if (base == NULL || !PyList_CheckExact(loaders)) {
        goto fail;
    }
    /* (No directory tail: no tail/__init__ file either.) */
    int package = is_type(base, S_IFDIR);
    if (package < 0) {
        goto fail;
    }
    for (int pass = !package; pass < 2; pass++) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(loaders); i++) {
            PyObject *pair = PyList_GET_ITEM(loaders, i), *suffix, *name, *path;
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
                    || !PyUnicode_CheckExact(suffix = PyTuple_GET_ITEM(pair, 0))) {
                goto fail;
            }
            name = pass == 0 ? PyUnicode_FromFormat("__init__%U", suffix)
                             : PyUnicode_Concat(tail, suffix);
            path = name == NULL ? NULL : path_join(pass == 0 ? base : dir, name);
            Py_XDECREF(name);
            if (path == NULL) {
                goto fail;
            }
            int file = is_type(path, S_IFREG);
            if (file != 0) {
                if (file < 0) {
                    Py_DECREF(path);
                    goto fail;
                }
                Py_DECREF(base);
                return path;
            }
            Py_DECREF(path);
        }
    }
    Py_DECREF(base);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(base);
    PyErr_Clear();
    return NULL;
}

/* Whether FileFinder(dir) answers for the module named name now as it did
 * at the dump, where dir's stamp no longer says so: nothing there
 * (origin NULL: a step before the module's), or origin itself, first of
 * its candidates, in a directory whose listing can be read (the module's
 * own step).  1 or 0 (any doubt). */
static int
answers_as_dumped(PyObject *dir, PyObject *name, PyObject *origin, PyObject *loaders)
{
    Py_ssize_t dot = PyUnicode_FindChar(name, '.', 0, PyUnicode_GET_LENGTH(name), -1);
    PyObject *tail, *found;
    int same;
    if (dot == -2 || !PyUnicode_CheckExact(dir)) {
        PyErr_Clear();
        return 0;
    }
    tail = PyUnicode_Substring(name, dot + 1, PyUnicode_GET_LENGTH(name));
    if (tail == NULL) {
        PyErr_Clear();
        return 0;
    }
    found = first_file(dir, tail, loaders);
    Py_DECREF(tail);
    if (found == NULL) {
        return 0;
    }
    if (origin == NULL) {
        same = found == Py_None;
    } else {
        same = found != Py_None && PyUnicode_CheckExact(origin)
               && PyUnicode_Compare(found, origin) == 0 && listable(dir);
    }
    Py_DECREF(found);
    PyErr_Clear();
    return same;
}

/* Whether FileFinder instance f answers None for the module named name,
 * taken as its find_spec (importlib/_bootstrap_external.py, 3.10-3.13)
 * takes it: it compares the directory's st_mtime now (dir_fact) with its
 * _path_mtime, reads the listing again where they differ (_fill_cache,
 * then _path_mtime set), and looks tail and tail<suffix> up in its
 * _path_cache; where none is listed it answers None.  1 or 0 (any doubt,
 * a name listed; a listing not current where `fill` is 0); -1 with what
 * _fill_cache raised (the program's: it catches OSError). */
static int
listed_none(PyObject *f, PyObject *dir, const path_fact *dir_fact, PyObject *name,
            PyObject *loaders, int fill)
{
    static PyObject *mtime_attr, *cache_attr, *fill_name;
    PyObject *mtime = NULL, *cache = NULL, *tail = NULL;
    path_fact own;
    Py_ssize_t dot;
    int none = 0;

    if (!PyList_CheckExact(loaders)) {
        return 0;
    }
    if (!dir_fact->ok) {
        /* (Not stat'ed with the others: the dump recorded no stamp.) */
        if (add_path(&own, dir, 1) < 0 || own.c == NULL) {
            Py_XDECREF(own.bytes);
            PyErr_Clear();
            return 0;
        }
        own.ok = stat(own.c, &own.st) == 0;
        Py_XDECREF(own.bytes);
        if (!own.ok) {
            return 0;
        }
        dir_fact = &own;
    }
    if ((mtime_attr == NULL && (mtime_attr = PyUnicode_InternFromString("_path_mtime")) == NULL)
            || (cache_attr == NULL
                && (cache_attr = PyUnicode_InternFromString("_path_cache")) == NULL)
            || (fill_name == NULL
                && (fill_name = PyUnicode_InternFromString("_fill_cache")) == NULL)) {
        goto done;
    }
    /* (os.stat's st_mtime: posixmodule.c's fill_time, sec + nsec * 1e-9.) */
    double now = (double)dir_fact->st.st_mtim.tv_sec
                 + (double)dir_fact->st.st_mtim.tv_nsec * 1e-9;
    mtime = PyObject_GetAttr(f, mtime_attr);
    if (mtime == NULL) {
        goto done;
    }
    if (!PyFloat_CheckExact(mtime) || PyFloat_AS_DOUBLE(mtime) != now) {
        if (!fill) {
            goto done;
        }
        PyObject *r = PyObject_CallMethodNoArgs(f, fill_name), *stamp;
        if (r == NULL) {
            Py_DECREF(mtime);
            return -1;
        }
        Py_DECREF(r);
        stamp = PyFloat_FromDouble(now);
        if (stamp == NULL || PyObject_SetAttr(f, mtime_attr, stamp) < 0) {
            Py_XDECREF(stamp);
            goto done;
        }
        Py_DECREF(stamp);
    }
    cache = PyObject_GetAttr(f, cache_attr);
    dot = PyUnicode_FindChar(name, '.', 0, PyUnicode_GET_LENGTH(name), -1);
    if (cache == NULL || !PySet_CheckExact(cache) || dot == -2
            || (tail = PyUnicode_Substring(name, dot + 1, PyUnicode_GET_LENGTH(name))) == NULL
            || PySet_Contains(cache, tail) != 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(loaders); i++) {
        PyObject *pair = PyList_GET_ITEM(loaders, i), *listed;
        int in;
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
                || !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))
                || (listed = PyUnicode_Concat(tail, PyTuple_GET_ITEM(pair, 0))) == NULL) {
            goto done;
        }
        in = PySet_Contains(cache, listed);
        Py_DECREF(listed);
        if (in != 0) {
            goto done;
        }
    }
    none = 1;
done:
    Py_XDECREF(mtime);
    Py_XDECREF(cache);
    Py_XDECREF(tail);
    PyErr_Clear();
    return none;
}

/* Whether the search recorded in entry replays on path (None: sys.path)
 * with every directory answering as at the dump: its stamp as recorded
 * (pycds._search.find_spec's walk when each step ends in "unchanged since
 * the dump", the last one building the spec), or, where it changed or has
 * no stamp, its names now (answers_as_dumped), which pycds._search would
 * ask its FileFinder for (the rules the Python side checks beside it:
 * search_replayable()).
 * A step's entry with no finder in sys.path_importer_cache yet is no
 * verdict, unless ctx says that the path hooks are importlib's own
 * (pycds._config.path_hooks_stock): they would make a FileFinder of the entry,
 * whose path is the entry (absolute) or the working directory (''), with
 * the stock loaders; the step replays when that is the recorded directory
 * and its stamp holds.  1 or 0 (any doubt, any error); -1 with the
 * exception a directory's listing raised (listed_none, with `fill`). */
static int
replays(PyObject *entry, const path_fact *facts, Py_ssize_t nsteps,
        PyObject *path, PyObject *ctx, int fill)
{
    PyObject *file_finder = PyTuple_GET_ITEM(ctx, 0);
    PyObject *loaders = PyTuple_GET_ITEM(ctx, 1);
    PyObject *loaders_attr = PyTuple_GET_ITEM(ctx, 3);
    PyObject *path_attr = PyTuple_GET_ITEM(ctx, 4);
    PyObject *search = PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_SEARCH);
    PyObject *name = PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_NAME);
    PyObject *steps, *cache;
    int ok = 0;
    int stock_hooks = PyTuple_GET_ITEM(ctx, 5) == Py_True;

    if (search == Py_None || nsteps == 0) {
        return 0;
    }
    steps = PyTuple_GET_ITEM(search, 0);
    if (path == Py_None) {
        path = PySys_GetObject("path");       /* borrowed */
    }
    cache = PySys_GetObject("path_importer_cache");
    if (path == NULL || !PyList_CheckExact(path) || cache == NULL || !PyDict_CheckExact(cache)) {
        return 0;
    }
    /* Held: the attribute lookups below may run Python code (a property a
     * program put on FileFinder), which may rebind or empty these. */
    Py_INCREF(path);
    Py_INCREF(cache);
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        PyObject *step = PyTuple_GET_ITEM(steps, i);
        PyObject *recorded = PyTuple_GET_ITEM(step, 0);
        PyObject *now, *key, *finder, *dir, *want;
        int same;

        if (i >= PyList_GET_SIZE(path)) {
            goto done;
        }
        now = PyList_GET_ITEM(path, i);
        if (!PyUnicode_CheckExact(now) || !PyUnicode_CheckExact(recorded)
                || PyUnicode_Compare(now, recorded) != 0) {
            goto done;
        }
        key = cache_key(now);
        if (key == NULL) {
            goto done;
        }
        finder = PyDict_GetItemWithError(cache, key);     /* borrowed */
        dir = PyTuple_GET_ITEM(step, 1);
        /* (The module's own step: its file must be what the directory
         * gives first.) */
        want = i == nsteps - 1 ? PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_ORIGIN) : NULL;
        if (finder == NULL) {
            /* Not cached: PathFinder would run the path hooks here, in the
             * middle of its search.  Unless they are importlib's own, the
             * Python side searches as it does. */
            same = !PyErr_Occurred() && stock_hooks && PyUnicode_CheckExact(dir)
                   && PyUnicode_Compare(dir, key) == 0
                   && (stamp_is(&facts[i], PyTuple_GET_ITEM(step, 2))
                       || answers_as_dumped(dir, name, want, loaders));
            Py_DECREF(key);
            if (!same) {
                goto done;
            }
            continue;
        }
        Py_DECREF(key);
        if (finder == Py_None && i < nsteps - 1) {
            continue;          /* PathFinder skips it too */
        }
        Py_INCREF(finder);
        same = (PyObject *)Py_TYPE(finder) == file_finder
               && !own_search_methods(finder)
               && attr_equals(finder, path_attr, dir) == 1
               && attr_equals(finder, loaders_attr, loaders) == 1;
        if (same && !stamp_is(&facts[i], PyTuple_GET_ITEM(step, 2))) {
            int none = want == NULL
                       ? listed_none(finder, dir, &facts[i], name, loaders, fill) : 0;
            if (none < 0) {
                Py_DECREF(finder);
                ok = -1;
                goto done;
            }
            same = none || answers_as_dumped(dir, name, want, loaders);
        }
        Py_DECREF(finder);
        if (!same) {
            goto done;
        }
    }
    /* The package's directory, when the module is a package: its first
     * __init__ file is the archived one. */
    ok = PyTuple_GET_ITEM(search, 1) == Py_None
         || stamp_is(&facts[nsteps], PyTuple_GET_ITEM(search, 2))
         || answers_as_dumped(PyTuple_GET_ITEM(PyTuple_GET_ITEM(steps, nsteps - 1), 1),
                              name, PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_ORIGIN), loaders);
done:
    Py_DECREF(path);
    Py_DECREF(cache);
    return ok;
}

/* Whether the (st_mtime_ns, st_size) of fact f are the ints a, b. */
static int
facts_are(const path_fact *f, PyObject *a, PyObject *b)
{
    long long mtime_ns, size, now_ns;

    if (!f->ok || !PyLong_CheckExact(a) || !PyLong_CheckExact(b)
            || ns_of(f->st.st_mtim, &now_ns) < 0) {
        return 0;
    }
    mtime_ns = PyLong_AsLongLong(a);
    size = PyLong_AsLongLong(b);
    if (PyErr_Occurred()) {
        return 0;
    }
    return mtime_ns == now_ns && size == (long long)f->st.st_size;
}

/* Whether the .pyc path recorded for origin is what ModuleSpec.cached
 * computes for it now (pycds.share._cached): no sys.pycache_prefix, and
 * the path is in the __pycache__ beside the source. */
static int
cached_is_recorded(PyObject *origin, PyObject *pyc)
{
    PyObject *prefix = PySys_GetObject("pycache_prefix");
    PyObject *dir, *want;
    Py_ssize_t slash;
    int ok;

    if (prefix != Py_None || !PyUnicode_CheckExact(pyc) || !PyUnicode_CheckExact(origin)) {
        return 0;
    }
    slash = PyUnicode_FindChar(origin, '/', 0, PyUnicode_GET_LENGTH(origin), -1);
    if (slash < 0) {
        return 0;
    }
    dir = PyUnicode_Substring(origin, 0, slash);
    if (dir == NULL) {
        return 0;
    }
    want = PyUnicode_FromFormat("%U/__pycache__/", dir);
    Py_DECREF(dir);
    if (want == NULL) {
        return 0;
    }
    ok = PyUnicode_Tailmatch(pyc, want, 0, PyUnicode_GET_LENGTH(pyc), -1) == 1;
    Py_DECREF(want);
    return ok;
}

/* What is stored under name (borrowed; NULL, exception cleared, where
 * nothing is): in the dict of the first class of obj's MRO that has it (a
 * class), in its dict (a module); as pycds._config._dicts orders them, running no
 * descriptor and no comparison of a program's. */
static PyObject *
stored(PyObject *obj, PyObject *name)
{
    PyObject *v = NULL;
    if (PyType_Check(obj)) {
        PyObject *mro = ((PyTypeObject *)obj)->tp_mro;
        for (Py_ssize_t i = 0; mro != NULL && PyTuple_Check(mro)
                               && i < PyTuple_GET_SIZE(mro) && v == NULL; i++) {
            /* (A static builtin type's tp_dict may be NULL on 3.12+: it
             * holds nothing a program can have put there.) */
            PyObject *dict = ((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_dict;
            if (dict != NULL && PyDict_Check(dict)) {
                v = PyDict_GetItemWithError(dict, name);
            }
        }
    }
    else if (PyModule_Check(obj)) {
        v = PyDict_GetItemWithError(PyModule_GetDict(obj), name);
    }
    if (v == NULL) {
        PyErr_Clear();
    }
    return v;
}

/* Whether what the verdict assumes of the import system still holds
 * (`serving`, from pycds._nativeapi.IndexFinder): (finder, PathFinder,
 * search, loader).  The finder stands just before PathFinder on
 * sys.meta_path (pycds.share._path_finder_next), each (class, name,
 * original) of `search` is in the class's own dict as pycds started with it
 * (None: not there; pycds._config.search_replayable), and each (object, name, value) of `loader`
 * is what stored() finds (pycds._config.loader_patched), compared by identity.
 * 1 or 0 (any doubt, any error): the Python side then checks the same,
 * its way. */
static int
serving_stock(PyObject *serving)
{
    PyObject *finder, *path_finder, *search, *loader, *meta_path;
    Py_ssize_t i, n;

    if (!PyTuple_CheckExact(serving) || PyTuple_GET_SIZE(serving) != 4) {
        return 0;
    }
    finder = PyTuple_GET_ITEM(serving, 0);
    path_finder = PyTuple_GET_ITEM(serving, 1);
    search = PyTuple_GET_ITEM(serving, 2);
    loader = PyTuple_GET_ITEM(serving, 3);
    if (!PyTuple_CheckExact(search)) {
        return 0;
    }
    meta_path = PySys_GetObject("meta_path");     /* borrowed */
    if (meta_path == NULL || !PyList_CheckExact(meta_path)) {
        return 0;
    }
    n = PyList_GET_SIZE(meta_path);
    for (i = 0; i + 1 < n; i++) {
        if (PyList_GET_ITEM(meta_path, i) == finder) {
            break;
        }
    }
    if (i + 1 >= n || PyList_GET_ITEM(meta_path, i + 1) != path_finder) {
        return 0;
    }
    for (i = 0; i < PyTuple_GET_SIZE(search); i++) {
        PyObject *t = PyTuple_GET_ITEM(search, i), *dict;
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3
                || !PyType_Check(PyTuple_GET_ITEM(t, 0))) {
            return 0;
        }
        /* (A class defined in Python: its dict is tp_dict, 3.10-3.13.
         * None stands for a name the class inherits.) */
        dict = ((PyTypeObject *)PyTuple_GET_ITEM(t, 0))->tp_dict;
        if (dict == NULL || !PyDict_CheckExact(dict)) {
            return 0;
        }
        PyObject *v = PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(t, 1));
        if (v == NULL && PyErr_Occurred()) {
            return 0;
        }
        if ((v != NULL ? v : Py_None) != PyTuple_GET_ITEM(t, 2)) {
            return 0;
        }
    }
    return pycds_stored_stock(loader);
}

int
pycds_stored_stock(PyObject *triples)
{
    if (!PyTuple_CheckExact(triples)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(triples); i++) {
        PyObject *t = PyTuple_GET_ITEM(triples, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3
                || stored(PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1))
                   != PyTuple_GET_ITEM(t, 2)) {
            return 0;
        }
    }
    return 1;
}

/* 1 when plain import would take the archived module as recorded: the
 * search replays (replays()), the .pyc it would read is the recorded one
 * (cached_is_recorded()), a timestamp .pyc of the recorded mtime and size,
 * and the source has the recorded mtime and size: pycds._pyc.check's answer
 * "unchanged" under PYCDSCHECK=mtime without reading a file.  ctx:
 * (FileFinder, its stock loaders, PYC_TIMESTAMP, "_loaders", "path", the
 * names interned; True when the path hooks are importlib's own
 * (replays()), else False; `serving` or None), where serving_stock()
 * must hold too.  0 otherwise: the Python side judges the facts; -1 as
 * replays(). */
static int
verdict(PyObject *entry, const path_fact *facts, Py_ssize_t nsteps,
        PyObject *path, PyObject *ctx, int fill)
{
    PyObject *kind = PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_PYC_KIND);
    int eq;

    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != 7) {
        return 0;
    }
    eq = PyObject_RichCompareBool(kind, PyTuple_GET_ITEM(ctx, 2), Py_EQ);
    if (eq != 1
            || !facts_are(&facts[nsteps + 1], PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_MTIME_NS),
                          PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_SIZE))
            || !facts_are(&facts[nsteps + 2], PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_PYC_MTIME_NS),
                          PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_PYC_SIZE))
            || !cached_is_recorded(PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_ORIGIN),
                                   PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_PYC_PATH))) {
        return 0;
    }
    /* The import system's parts before the search: where a finder of the
     * program's stands before PathFinder, or a search method is the
     * program's, plain import may never ask a FileFinder of PathFinder's,
     * so replays() may not read a directory's listing either (fill: it
     * runs _fill_cache, which a trace function sees, and may raise in). */
    if (PyTuple_GET_ITEM(ctx, 6) != Py_None && !serving_stock(PyTuple_GET_ITEM(ctx, 6))) {
        return 0;
    }
    return replays(entry, facts, nsteps, path, ctx, fill);
}

/* ---- the entry point --------------------------------------------------- */

/* Stat the gathered paths, GIL released. */
static void
stat_all(path_fact *facts, int n)
{
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < n; i++) {
        facts[i].ok = facts[i].c != NULL && stat(facts[i].c, &facts[i].st) == 0;
    }
    Py_END_ALLOW_THREADS
}

static int find(pycds_index *ix, uintptr_t name_obj, int flags,
                uintptr_t out_list, PyObject *path, PyObject *ctx);

int
pycds_index_find(pycds_index *ix, uintptr_t name_obj, int flags,
                 uintptr_t out_list)
{
    return find(ix, name_obj, flags & ~(FIND_FILL | FIND_HELD), out_list, NULL, NULL);
}

int
pycds_find_hit(pycds_index *ix, PyObject *name, PyObject *path, PyObject *ctx,
               PyObject *out)
{
    return find(ix, (uintptr_t)name, PYCDS_FIND_FILES | FIND_FILL | FIND_HELD, (uintptr_t)out,
                path, ctx);
}

int
pycds_index_hit(pycds_index *ix, uintptr_t name_obj, uintptr_t path_obj,
                uintptr_t ctx_obj, uintptr_t out_list)
{
    return find(ix, name_obj, PYCDS_FIND_FILES, out_list, (PyObject *)path_obj,
                (PyObject *)ctx_obj);
}

static int
find(pycds_index *ix, uintptr_t name_obj, int flags, uintptr_t out_list,
     PyObject *path, PyObject *ctx)
{
    PyObject *name = (PyObject *)name_obj, *out = (PyObject *)out_list;
    PyObject *entry = NULL;
    path_fact facts[MAX_PATHS];
    const char *utf8;
    Py_ssize_t len, nsteps = 0;
    uint64_t h, mask = ix->nbuckets - 1, i;
    int n = 0, rc = PYCDS_E_CORRUPT, eq;
    PyGILState_STATE g = PyGILState_UNLOCKED;
    if (!(flags & FIND_HELD)) {
        g = PyGILState_Ensure();
    }

    if (!PyUnicode_CheckExact(name) || !PyList_CheckExact(out)
            || ix->nbuckets == 0 || (ix->nbuckets & mask) != 0) {
        rc = PYCDS_E_ARG;
        goto done;
    }
    /* (A lone surrogate, which Index.lookup encodes with surrogatepass,
     * declines.) */
    utf8 = PyUnicode_AsUTF8AndSize(name, &len);
    if (utf8 == NULL) {
        PyErr_Clear();
        rc = PYCDS_E_ARG;
        goto done;
    }
    h = pycds_checksum(utf8, (size_t)len, PYCDS_FMT_NAME_KEY);
    i = h & mask;
    for (uint64_t probe = 0; probe < ix->nbuckets; probe++, i = (i + 1) & mask) {
        const uint8_t *b = ix->buckets + PYCDS_FMT_BUCKET_SIZE * i;
        uint32_t off = pycds_le32(b + 4);
        if (off == PYCDS_FMT_EMPTY_BUCKET) {
            rc = PYCDS_OK;       /* not in the archive */
            goto done;
        }
        if (pycds_le32(b) != (uint32_t)(h >> 32)) {
            continue;
        }
        if (ix->fd < 0) {
            rc = PYCDS_FIND_NO_FILE;   /* a bucket has its tag: the caller opens */
            goto done;
        }
        entry = read_entry(ix, off);
        if (entry == NULL) {
            goto done;           /* Index.lookup raises: let it */
        }
        eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, PYCDS_FMT_ENTRY_NAME), name, Py_EQ);
        if (eq < 0) {
            PyErr_Clear();
            goto done;
        }
        if (eq) {
            break;
        }
        Py_CLEAR(entry);
    }
    if (entry == NULL) {
        rc = PYCDS_OK;           /* every bucket probed: not in the archive */
        goto done;
    }
    if (gather(entry, flags & PYCDS_FIND_FILES, facts, &n, &nsteps) < 0) {
        rc = PYCDS_E_ARG;
        goto done;
    }
    stat_all(facts, n);
    if (ctx != NULL) {
        int v = verdict(entry, facts, nsteps, path, ctx, flags & FIND_FILL);
        if (v < 0 && (flags & FIND_FILL)) {
            rc = PYCDS_E_PYTHON;     /* (the exception left set: the caller raises it) */
            goto done;
        }
        v = v > 0;
        PyErr_Clear();
        /* A verdict with `serving` checked is all the caller needs: the
         * entry, not the facts. */
        if (v && PyTuple_GET_ITEM(ctx, 6) != Py_None) {
            rc = PyList_Append(out, entry) < 0 ? PYCDS_E_PYTHON : PYCDS_OK;
        } else {
            rc = report(out, entry, facts, nsteps, 1) < 0 ? PYCDS_E_PYTHON : PYCDS_OK;
        }
        if (rc == PYCDS_OK && PyList_Append(out, v ? Py_True : Py_False) < 0) {
            rc = PYCDS_E_PYTHON;
        }
    } else {
        rc = report(out, entry, facts, nsteps, flags & PYCDS_FIND_FILES) < 0
             ? PYCDS_E_PYTHON : PYCDS_OK;
    }
    if (rc != PYCDS_OK) {
        PyList_SetSlice(out, 0, PyList_GET_SIZE(out), NULL);
        PyErr_Clear();
    }
done:
    for (int k = 0; k < n; k++) {
        Py_XDECREF(facts[k].bytes);
    }
    Py_XDECREF(entry);
    if (!(flags & FIND_HELD)) {
        PyGILState_Release(g);
    }
    return rc;
}
