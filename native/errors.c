/* errors.c -- status-code names and the detail message of the last failure.
 *
 * The detail buffer is thread-local: cffi calls may come from any thread.
 */
#include "pycds_internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

const char *
pycds_strerror(int code)
{
    switch (code) {
    case PYCDS_OK: return "success";
    case PYCDS_E_NOMEM: return "out of memory";
    case PYCDS_E_UNSUPPORTED: return "object type not supported in an archive";
    case PYCDS_E_TOODEEP: return "constants nested too deeply";
    case PYCDS_E_TOOBIG: return "module too large for an archive chunk";
    case PYCDS_E_IO: return "archive read or map failed";
    case PYCDS_E_CORRUPT: return "archive data is corrupt";
    case PYCDS_E_FOREIGN: return "archive was made by another interpreter build";
    case PYCDS_E_STATE: return "module cannot be loaded from this archive";
    case PYCDS_E_ARG: return "argument out of range";
    case PYCDS_E_PYTHON: return "Python C-API call failed";
    default: return "unknown pycds error";
    }
}

const char *
pycds_last_error(void)
{
    return last_error;
}

const char *
pycds_build_version(void)
{
    return PYCDS_BUILD_VERSION;
}

int
pycds_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return code;
}

int
pycds_fail_python(const char *what)
{
    /* Caller holds the GIL. */
    int code = PyErr_ExceptionMatches(PyExc_MemoryError) ? PYCDS_E_NOMEM
                                                         : PYCDS_E_PYTHON;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    const char *msg = NULL;
    PyObject *s = value ? PyObject_Str(value) : NULL;
    if (s != NULL) {
        msg = PyUnicode_AsUTF8(s);
    }
    pycds_fail(code, "%s: %s", what, msg ? msg : "(no detail)");
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return code;
}
