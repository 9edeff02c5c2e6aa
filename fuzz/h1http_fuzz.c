/* libFuzzer target of service/native's h1http: the input is a connection's bytes, read by two Sessions,
 * one in a single receive() and one in chunks whose size the input's last byte sets (so heads, bodies and
 * the blank line split at many places). Both must agree: the same events, the same fallback, the same
 * rest() (which is then a suffix of the input, the bytes from the first request not taken on); each
 * event's body is as long as its Content-Length says (a large one's, over 2 KiB up to 4 KiB, with body_left:
 * its body's bytes the session hands over at its head, the rest skipped as http_body.py reads it), its names
 * lower-case. Small bounds (a 512-byte head, a 2 KiB body, 4 KiB large) put every limit in reach. CPython is embedded and the extension compiled in, as for
 * h2grpc_fuzz.c. A finding: a sanitizer report, a leak (per input), an exception other than MemoryError,
 * or a broken invariant -> abort(). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "embedded_python.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

PyMODINIT_FUNC PyInit__h1http(void);

static PyObject *session_type;

static void fail(const char *what) {
    fprintf(stderr, "h1http_fuzz: %s\n", what);
    if (PyErr_Occurred()) PyErr_Print();
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    PyObject *module = embedded_module("_h1http", PyInit__h1http);
    if (module == NULL) fail("import");
    session_type = PyObject_GetAttrString(module, "Session");
    if (session_type == NULL) fail("Session");
    Py_DECREF(module);
    return 0;
}

#define MAX_BODY 2048
#define MAX_LARGE 4096

/* Every event of `events` appended to `all`, each checked; `left`: the session's body_left after them.
 * A large event is appended without its body, which depends on how the bytes were split. */
static void take(PyObject *all, PyObject *events, Py_ssize_t left) {
    if (events == NULL) fail("receive raised");
    if (left < 0 || (left && PyList_GET_SIZE(events) == 0)) fail("body_left without an event");
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        PyObject *headers = PyTuple_GET_ITEM(e, 2), *body = PyTuple_GET_ITEM(e, 3);
        Py_ssize_t length = -1;
        for (Py_ssize_t h = 0; h < PyList_GET_SIZE(headers); h++) {
            PyObject *name = PyTuple_GET_ITEM(PyList_GET_ITEM(headers, h), 0);
            const char *n = PyBytes_AS_STRING(name);
            for (Py_ssize_t k = 0; k < PyBytes_GET_SIZE(name); k++)
                if (n[k] >= 'A' && n[k] <= 'Z') fail("an upper-case header name");
            if (strcmp(n, "content-length") == 0) {
                PyObject *value = PyTuple_GET_ITEM(PyList_GET_ITEM(headers, h), 1);
                length = (Py_ssize_t)strtoll(PyBytes_AS_STRING(value), NULL, 10);
            }
        }
        int last = i == PyList_GET_SIZE(events) - 1;
        if (length != PyBytes_GET_SIZE(body) + (last ? left : 0)) fail("a body not as long as its Content-Length");
        if (length > MAX_LARGE || (left && last && length <= MAX_BODY)) fail("a body over its bound");
        if (length > MAX_BODY) {
            e = Py_BuildValue("(OOOOO)", PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1), headers, Py_None, PyTuple_GET_ITEM(e, 4));
            if (e == NULL || PyList_Append(all, e) < 0) fail("append");
            Py_DECREF(e);
            continue;
        }
        if (PyList_Append(all, e) < 0) fail("append");
    }
    Py_DECREF(events);
}

static PyObject *attribute(PyObject *session, const char *name) {
    PyObject *value = PyObject_GetAttrString(session, name);
    if (value == NULL) fail(name);
    return value;
}

static Py_ssize_t body_left(PyObject *session) {
    PyObject *value = attribute(session, "body_left");
    Py_ssize_t left = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return left;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    PyObject *whole = PyObject_CallFunction(session_type, "nnn", (Py_ssize_t)512, (Py_ssize_t)MAX_BODY, (Py_ssize_t)MAX_LARGE);
    PyObject *split = PyObject_CallFunction(session_type, "nnn", (Py_ssize_t)512, (Py_ssize_t)MAX_BODY, (Py_ssize_t)MAX_LARGE);
    PyObject *input = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
    PyObject *a = PyList_New(0), *b = PyList_New(0);
    if (!whole || !split || !input || !a || !b) fail("setup");
    PyObject *events = PyObject_CallMethod(whole, "receive", "O", input);
    Py_ssize_t left = body_left(whole);
    take(a, events, left);
    size_t chunk = size ? 1 + (size_t)data[size - 1] % 64 : 1;
    for (size_t at = 0; at < size;) {
        size_t n = size - at < chunk ? size - at : chunk;
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)data + at, (Py_ssize_t)n);
        if (bytes == NULL) fail("bytes");
        events = PyObject_CallMethod(split, "receive", "O", bytes);
        left = body_left(split);
        take(b, events, left);
        Py_DECREF(bytes);
        at += n + (size_t)left;  /* a large body's rest: read by the caller, not the session */
        PyObject *state = attribute(split, "state");
        long s = PyLong_AsLong(state);
        Py_DECREF(state);
        if (s < 0 || s > 2) fail("a state out of range");
    }
    if (PyObject_RichCompareBool(a, b, Py_EQ) != 1) fail("the events depend on how the bytes were split");
    PyObject *fa = attribute(whole, "fallback"), *fb = attribute(split, "fallback");
    if (PyObject_RichCompareBool(fa, fb, Py_EQ) != 1) fail("the fallback depends on how the bytes were split");
    PyObject *ra = PyObject_CallMethod(whole, "rest", NULL), *rb = PyObject_CallMethod(split, "rest", NULL);
    if (ra == NULL || rb == NULL) fail("rest");
    if (PyObject_RichCompareBool(ra, rb, Py_EQ) != 1) {
        fprintf(stderr, "rest: %zd vs %zd bytes, chunk %zu, input %zu bytes\n", PyBytes_GET_SIZE(ra), PyBytes_GET_SIZE(rb), chunk, size);
        fail("rest() depends on how the bytes were split");
    }
    if (PyObject_IsTrue(fa)) {
        Py_ssize_t n = PyBytes_GET_SIZE(ra);
        if ((size_t)n > size || memcmp(PyBytes_AS_STRING(ra), data + size - (size_t)n, (size_t)n) != 0)
            fail("rest() is not the input's end");
    }
    Py_DECREF(fa);
    Py_DECREF(fb);
    Py_DECREF(ra);
    Py_DECREF(rb);
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(input);
    Py_DECREF(whole);
    Py_DECREF(split);
    return 0;
}
