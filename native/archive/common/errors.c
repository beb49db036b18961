/* errors.c -- status-code names and the detail message of the last failure.
 *
 * The detail buffer is per thread: cffi calls may come from any thread.  It
 * is a POSIX thread-specific value made on a thread's first failure, not a
 * _Thread_local: in a dlopen'd module glibc allocates a thread's block of
 * _Thread_local storage on its first use, and aborts the process (exit 127,
 * "cannot allocate memory for thread-local data") when that allocation
 * fails.  The read-ahead thread's first failure is typically out of memory.
 * Without memory for the buffer, the detail is lost; the status code is
 * not.
 */
#include "pycds_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define DETAIL_SIZE 512

static pthread_once_t detail_once = PTHREAD_ONCE_INIT;
static pthread_key_t detail_key;
static int detail_key_made;

static void
make_detail_key(void)
{
    detail_key_made = pthread_key_create(&detail_key, free) == 0;
}

/* Whether the key of the per-thread buffers exists (made on first use). */
static int
detail_key_ready(void)
{
    return pthread_once(&detail_once, make_detail_key) == 0 && detail_key_made;
}

/* The calling thread's buffer, made now if need be; NULL without memory. */
static char *
detail_buffer(void)
{
    if (!detail_key_ready()) {
        return NULL;
    }
    char *buf = pthread_getspecific(detail_key);
    if (buf == NULL) {
        buf = malloc(DETAIL_SIZE);
        if (buf == NULL) {
            return NULL;
        }
        if (pthread_setspecific(detail_key, buf) != 0) {
            free(buf);
            return NULL;
        }
    }
    return buf;
}

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
    const char *buf = detail_key_ready() ? pthread_getspecific(detail_key) : NULL;
    return buf != NULL ? buf : "(no detail)";
}

const char *
pycds_build_version(void)
{
    return PYCDS_BUILD_VERSION;
}

int
pycds_fail(int code, const char *fmt, ...)
{
    char *buf = detail_buffer();
    if (buf != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, DETAIL_SIZE, fmt, ap);
        va_end(ap);
    }
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
