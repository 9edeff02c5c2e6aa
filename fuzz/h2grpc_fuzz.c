/* libFuzzer target of service/native's h2grpc: one Session per input, fed the client preface and then
 * the input's bytes (in chunks whose size the input's last byte sets, so DATA and the 5-byte prefix split
 * at many places), answered as service/api/grpc/transport.py answers: each finished request through
 * the Session's Python methods (reply; finish with a status message far over the cap; send now and finish after the
 * connection's last byte, so answers wait on an empty queue; all of it later), GOAWAY when the first byte
 * is odd, every problem with its status, pending() after each read (up to a limit the input's second
 * byte sets: answers stay queued across reads; Session.answers checked after each), the stall guard's
 * reset_stalled (every waiting stream reset after each read, or once after the last, as the third byte
 * says; and one that resets none after each read, its next due time checked) and Session.idle checked
 * against the streams open. CPython is
 * embedded (PYTHONMALLOC=malloc: ASan sees every object) and the extension compiled in, so an input costs
 * microseconds where a Python-driven target (atheris) costs milliseconds.
 * A finding: a sanitizer report, a leak (LeakSanitizer, per input), or an exception the server would not
 * expect (receive() raising anything but H2Error; send/finish/reply raising at all) -> abort(). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "embedded_python.h"
#include <stdint.h>
#include <stdlib.h>

PyMODINIT_FUNC PyInit__h2grpc(void);

static PyObject *session_type, *h2error, *routes, *preface, *huge_message, *problem_message;

enum { REPLY, STREAM, ERROR, LATER, BIDI };  /* how a route answers */

static void fail(const char *what) {
    fprintf(stderr, "h2grpc_fuzz: %s raised\n", what);
    PyErr_Print();
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    PyObject *module = embedded_module("_h2grpc", PyInit__h2grpc);
    if (module == NULL) fail("import");
    session_type = PyObject_GetAttrString(module, "Session");
    h2error = PyObject_GetAttrString(module, "H2Error");
    routes = Py_BuildValue("{y:i,y:i,y:i,y:i,y:i,y:i,y:i}", "/inference.GRPCInferenceService/ModelInfer", REPLY,
                           "/inference.GRPCInferenceService/ServerLive", REPLY, "/grpc.health.v1.Health/Check", ERROR,
                           "/grpc.health.v1.Health/Watch", STREAM, "/u", REPLY, "/s", STREAM, "/l", LATER);
    /* a streaming route (grpc_transport's Route with bidi set): h2grpc reads its "bidi" attribute */
    PyObject *globals = PyDict_New();
    PyObject *ran = globals ? PyRun_String("class Bidi(int):\n    bidi = True\n", Py_file_input, globals, globals) : NULL;
    PyObject *bidi = ran ? PyObject_CallFunction(PyDict_GetItemString(globals, "Bidi"), "i", BIDI) : NULL;
    if (bidi == NULL) fail("bidi route");
    PyObject *paths[] = {PyBytes_FromString("/inference.GRPCInferenceService/ModelStreamInfer"), PyBytes_FromString("/b")};
    for (int i = 0; i < 2; i++)
        if (paths[i] == NULL || PyDict_SetItem(routes, paths[i], bidi) < 0) fail("bidi route");
    Py_DECREF(paths[0]);
    Py_DECREF(paths[1]);
    Py_DECREF(bidi);
    Py_XDECREF(ran);
    Py_XDECREF(globals);
    preface = PyBytes_FromString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    huge_message = PyBytes_FromStringAndSize(NULL, 70000);
    memset(PyBytes_AS_STRING(huge_message), '%', 70000);  /* the cap must not split a %XX: all '%' */
    problem_message = PyBytes_FromString("the request stream ended inside its message");
    if (!session_type || !h2error || !routes || !preface || !huge_message || !problem_message) fail("setup");
    Py_DECREF(module);
    return 0;
}

static void call(PyObject *session, const char *method, const char *format, int id, PyObject *arg, int status) {
    PyObject *r = *format == 'i' && format[1] == 'i' ? PyObject_CallMethod(session, method, format, id, status, arg)
                                                     : PyObject_CallMethod(session, method, format, id, arg);
    if (r == NULL) fail(method);
    Py_DECREF(r);
}

/* Each event as transport.py's data_received meets it; LATER calls go to `later`. */
static void answer(PyObject *session, PyObject *events, PyObject *later) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        int id = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 0));
        PyObject *route = PyTuple_GET_ITEM(e, 1), *message = PyTuple_GET_ITEM(e, 2);
        if (route == Py_None) continue;  /* a reset: the server cancels the call's task */
        if (message == Py_None) {
            call(session, "finish", "iiO", id, problem_message, 13);
            continue;
        }
        switch (PyLong_AsLong(route)) {
        case REPLY: call(session, "reply", "iO", id, message, 0); break;
        case STREAM:  /* one message now, the rest after the client's last byte (the answer waits: DEFERRED) */
            call(session, "send", "iO", id, message, 0);
            if (PyList_Append(later, PyTuple_GET_ITEM(e, 0)) < 0) fail("append");
            break;
        case ERROR: call(session, "finish", "iiO", id, huge_message, 5); break;
        case BIDI:  /* each message answered as it comes; the call ends at the client's end ("end": above) */
            call(session, "send", "iO", id, message, 0);
            if (PyList_Append(later, PyTuple_GET_ITEM(e, 0)) < 0) fail("append");
            break;
        default:
            if (PyList_Append(later, PyTuple_GET_ITEM(e, 0)) < 0) fail("append");
        }
    }
}

/* pending()'s limit for this input: unbounded, or a few bytes so answers stay queued (Session.answers)
 * across reads, resets and the session's end, as when the transport's write buffer is full. */
static Py_ssize_t drain_limit;

/* reset_stalled(limit): the ids it reset (each answered: later send/finish calls on them are refused),
 * and the seconds until the next waiting stream falls due (-1 or, when limit is far off, positive). */
static void reset_stalled(PyObject *session, double limit) {
    PyObject *r = PyObject_CallMethod(session, "reset_stalled", "diO", limit, 1, problem_message);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(h2error)) fail("reset_stalled");
        PyErr_Clear();
        return;
    }
    double next_due = PyFloat_AsDouble(PyTuple_GET_ITEM(r, 1));
    if (!PyList_Check(PyTuple_GET_ITEM(r, 0)) || (limit > 0 && (PyList_GET_SIZE(PyTuple_GET_ITEM(r, 0)) != 0 || (next_due < 0 && next_due != -1.0)))) {
        fprintf(stderr, "h2grpc_fuzz: reset_stalled(%g) reset streams or gave next_due %g\n", limit, next_due);
        abort();
    }
    Py_DECREF(r);
}

/* Session.idle: seconds without a stream, 0.0 while one is open. */
static void check_idle(PyObject *session) {
    PyObject *idle = PyObject_GetAttrString(session, "idle"), *streams = PyObject_GetAttrString(session, "streams");
    if (idle == NULL || streams == NULL) fail("idle/streams");
    double seconds = PyFloat_AsDouble(idle);
    if (seconds < 0 || (PyLong_AsSsize_t(streams) > 0 && seconds != 0.0)) {
        fprintf(stderr, "h2grpc_fuzz: idle %g with %zd streams open\n", seconds, PyLong_AsSsize_t(streams));
        abort();
    }
    Py_DECREF(idle);
    Py_DECREF(streams);
}

/* Session.answers: never negative, and nothing queued once no stream is open. */
static void check_answers(PyObject *session) {
    PyObject *answers = PyObject_GetAttrString(session, "answers"), *streams = PyObject_GetAttrString(session, "streams");
    if (answers == NULL || streams == NULL) fail("answers/streams");
    Py_ssize_t queued = PyLong_AsSsize_t(answers), open = PyLong_AsSsize_t(streams);
    if (queued < 0 || (open == 0 && queued != 0)) {
        fprintf(stderr, "h2grpc_fuzz: answers %zd with %zd streams open\n", queued, open);
        abort();
    }
    Py_DECREF(answers);
    Py_DECREF(streams);
}

static void drain(PyObject *session) {
    PyObject *out = PyObject_CallMethod(session, "pending", "n", drain_limit);
    if (out == NULL) {
        if (!PyErr_ExceptionMatches(h2error)) fail("pending");
        PyErr_Clear();
        return;
    }
    Py_DECREF(out);
}

/* How the input's streams stall, by its third byte (its SETTINGS frame's length / 6, mod 3): 0 never,
 * 1 every waiting stream reset after each read, 2 after the last one (before the late answers). */
static int stall_mode;

/* One read of the connection: receive, answer, write. 0 once the Session has closed it (H2Error). */
static int feed(PyObject *session, PyObject *bytes, PyObject *later) {
    PyObject *events = PyObject_CallMethod(session, "receive", "O", bytes);
    int open = events != NULL;
    if (events == NULL) {
        if (!PyErr_ExceptionMatches(h2error)) fail("receive");
        PyErr_Clear();
    } else {
        answer(session, events, later);
        Py_DECREF(events);
    }
    reset_stalled(session, 1e9);  /* the guard's check between its deadlines: nothing reset */
    if (stall_mode == 1) reset_stalled(session, 0.0);
    drain(session);
    check_answers(session);
    check_idle(session);
    PyObject *streams = PyObject_GetAttrString(session, "streams"), *is_open = PyObject_GetAttrString(session, "open");
    if (streams == NULL || is_open == NULL) fail("streams/open");
    Py_DECREF(streams);
    Py_DECREF(is_open);
    return open;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    PyObject *session = PyObject_CallFunction(session_type, "Onnn", routes, (Py_ssize_t)(1 << 20), (Py_ssize_t)16,
                                              (Py_ssize_t)65535);
    PyObject *later = PyList_New(0);
    if (session == NULL || later == NULL) fail("Session");
    PyObject *room = PyLong_FromLong(60000);  /* the in-flight budget: over-budget is reachable */
    if (room == NULL || PyObject_SetAttrString(session, "room", room) < 0) fail("room");
    Py_DECREF(room);
    size_t chunk = size ? 1 + (size_t)data[size - 1] * 37 : 1;
    drain_limit = size > 1 && (data[1] & 1) ? 1 + data[1] * 64 : PY_SSIZE_T_MAX;
    stall_mode = size > 2 ? data[2] / 6 % 3 : 0;  /* a SETTINGS payload of 0, 6 or 12 bytes: 0, 1, 2 */
    int open = feed(session, preface, later);
    for (size_t at = 0; open && at < size; at += chunk) {
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)data + at, (Py_ssize_t)(size - at < chunk ? size - at : chunk));
        if (bytes == NULL) fail("bytes");
        open = feed(session, bytes, later);
        Py_DECREF(bytes);
        if (open && at == 0 && (data[0] & 1)) {  /* the server shutting down: GOAWAY after the first read */
            PyObject *r = PyObject_CallMethod(session, "goaway", NULL);
            if (r == NULL) fail("goaway");
            Py_DECREF(r);
        }
    }
    if (open && stall_mode == 2) {
        reset_stalled(session, 0.0);
        drain(session);
        check_answers(session);
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(later); i++) {  /* answers after the client's last byte */
        int id = (int)PyLong_AsLong(PyList_GET_ITEM(later, i));
        call(session, "send", "iO", id, preface, 0);  /* False once the stream is gone: fine */
        call(session, "finish", "iiO", id, huge_message, i & 1 ? 0 : 2);
    }
    drain(session);
    check_answers(session);
    drain_limit = PY_SSIZE_T_MAX;  /* then everything the flow-control windows let go */
    drain(session);
    check_answers(session);
    check_idle(session);
    PyObject *buffered = PyObject_GetAttrString(session, "buffered");
    if (buffered == NULL || PyLong_AsSsize_t(buffered) < 0) fail("buffered");
    Py_DECREF(buffered);
    Py_DECREF(later);
    Py_DECREF(session);
    return 0;
}
