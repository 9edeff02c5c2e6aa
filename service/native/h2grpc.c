/* gRPC's server side of HTTP/2 in C, on libnghttp2: what grpcio's asyncio server spent ~80% of vkact's
 * gRPC CPU on (py-spy), done per connection without a thread, a completion queue or a Python object per
 * frame.  nghttp2 keeps HTTP/2 correct (framing, HPACK, flow control, SETTINGS, PING, GOAWAY, limits);
 * this module adds gRPC's part of it: one length-prefixed message per request stream (or a stream of
 * them, for a streaming route), answered with
 * messages and a grpc-status trailer (or a trailers-only HEADERS for an error before any message).
 *
 * Python owns the socket (an asyncio Protocol, service/api/grpc/transport.py):
 *   events = session.receive(bytes)  -> [(stream_id, route, message, timeout, encoding), ...]
 *       one tuple per request stream the client has finished; route None: the client reset a stream
 *       it had sent whole (cancel its work); message None: the body is not one whole message, and
 *       `encoding` names why (str); else `encoding` is the grpc-encoding of a compressed message
 *       (bytes, b"" when the client named none) or None for an uncompressed one.
 *       A streaming route (one whose `bidi` attribute is not None) gets a tuple per message as it
 *       completes, then one with message None and encoding "end" when the client ends its side
 *       (a too-large or over-budget message is reported at once); nothing after it has finished.
 *   session.send(stream_id, message)     queue one message (the 5-byte prefix is added here)
 *   session.finish(stream_id, status, message=b"")   grpc-status/grpc-message, after the queue
 *   session.reply(stream_id, message)    send + finish(0): a unary answer in one call
 *   data = session.pending(limit)        bytes to write to the socket now (b"" when none), about limit
 *                                        at most: the rest waits in the streams' queues
 *   session.answers                      answer bytes queued and not yet taken by nghttp2 (the client's
 *                                        flow-control window, or pending's limit, holds them back)
 *   session.buffered                     bytes the partial request messages hold (grown as DATA comes)
 *   session.room = n                     the most they may hold at once (problem "over-budget" beyond)
 *   ids, next_due = session.reset_stalled(limit, status, message)
 *                                        answer (status, message) and reset each stream that has waited
 *                                        `limit` s or more on its client's bytes (a request not yet whole;
 *                                        a streaming call's message begun); next_due: seconds until the
 *                                        next waiting stream would, -1.0 when none waits
 *   session.idle                         seconds since the last stream closed (or the session began)
 *                                        while none is open, 0.0 while one is: PINGs, SETTINGS and
 *                                        WINDOW_UPDATEs leave a connection idle
 * Unknown methods, non-POST requests and other content types are answered here, without Python.
 *
 * Files: h2grpc.c the Session type, h2grpc_request.c the request side, h2grpc_answer.c the answers.
 */
#include "h2grpc.h"

#include <structmember.h>

PyObject *H2Error;

static int Session_init(Session *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"routes", "max_message", "max_streams", "window", NULL};
    PyObject *routes;
    Py_ssize_t max_message, max_streams, window;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!nnn", keywords, &PyDict_Type, &routes, &max_message,
                                     &max_streams, &window))
        return -1;
    if (self->session != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Session is initialised once");
        return -1;
    }
    if (max_message < 0 || max_streams < 1 || window < 65535 || window > 0x7fffffff) {
        PyErr_SetString(PyExc_ValueError, "max_message >= 0, max_streams >= 1, 65535 <= window < 2**31");
        return -1;
    }
    Py_INCREF(routes);
    self->routes = routes;
    self->max_message = (size_t)max_message;
    self->room = PY_SSIZE_T_MAX;
    self->idle_since = self->now = monotonic_now();
    nghttp2_session_callbacks *callbacks;
    if (nghttp2_session_callbacks_new(&callbacks) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    set_request_callbacks(callbacks);
    int rv = nghttp2_session_server_new(&self->session, callbacks, self);
    nghttp2_session_callbacks_del(callbacks);
    if (rv != 0) {
        PyErr_Format(H2Error, "nghttp2_session_server_new: %s", nghttp2_strerror(rv));
        return -1;
    }
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, (uint32_t)max_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)window},
    };
    rv = nghttp2_submit_settings(self->session, NGHTTP2_FLAG_NONE, settings, 2);
    if (rv == 0) rv = nghttp2_session_set_local_window_size(self->session, NGHTTP2_FLAG_NONE, 0, (int32_t)window);
    if (rv != 0) {
        PyErr_Format(H2Error, "settings: %s", nghttp2_strerror(rv));
        return -1;
    }
    return 0;
}

static void Session_dealloc(Session *self) {
    if (self->session != NULL) nghttp2_session_del(self->session);
    while (self->streams) {
        Stream *s = self->streams;
        self->streams = s->next;
        stream_free(self, s);
    }
    Py_XDECREF(self->routes);
    Py_XDECREF(self->events);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(Session *self) {
    if (self->session == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Session not initialised");
        return 0;
    }
    return 1;
}

static PyObject *Session_receive(Session *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *events = PyList_New(0);
    if (events == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    self->events = events;
    self->callback_error = 0;
    self->now = monotonic_now();
    ssize_t rv = nghttp2_session_mem_recv(self->session, data.buf, (size_t)data.len);
    self->events = NULL;
    PyBuffer_Release(&data);
    if (self->callback_error) {
        Py_DECREF(events);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    if (rv < 0) {
        Py_DECREF(events);
        PyErr_Format(H2Error, "%s", nghttp2_strerror((int)rv));
        return NULL;
    }
    return events;
}

static PyObject *Session_pending(Session *self, PyObject *args) {
    Py_ssize_t limit = PY_SSIZE_T_MAX;
    if (!ready(self) || !PyArg_ParseTuple(args, "|n", &limit)) return NULL;
    const uint8_t *chunk;
    ssize_t n = nghttp2_session_mem_send(self->session, &chunk);
    if (n < 0) return PyErr_Format(H2Error, "%s", nghttp2_strerror((int)n));
    if (n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    /* Most calls produce one chunk (a small answer's frames are serialised together); copy on. */
    size_t size = (size_t)n, capacity = size < 65536 ? 65536 : size * 2;
    char *buffer = PyMem_Malloc(capacity);
    if (buffer == NULL) return PyErr_NoMemory();
    memcpy(buffer, chunk, size);
    /* up to `limit` (and one frame more): what waits for the socket stays in the queues, counted */
    while (size < (size_t)limit && (n = nghttp2_session_mem_send(self->session, &chunk)) > 0) {
        if (size + (size_t)n > capacity) {
            capacity = (size + (size_t)n) * 2;
            char *grown = PyMem_Realloc(buffer, capacity);
            if (grown == NULL) {
                PyMem_Free(buffer);
                return PyErr_NoMemory();
            }
            buffer = grown;
        }
        memcpy(buffer + size, chunk, (size_t)n);
        size += (size_t)n;
    }
    PyObject *out = n < 0 ? PyErr_Format(H2Error, "%s", nghttp2_strerror((int)n))
                          : PyBytes_FromStringAndSize(buffer, (Py_ssize_t)size);
    PyMem_Free(buffer);
    return out;
}

static PyObject *Session_send(Session *self, PyObject *args) {
    int id;
    PyObject *message;
    if (!ready(self) || !PyArg_ParseTuple(args, "iO!", &id, &PyBytes_Type, &message)) return NULL;
    Stream *s = answerable(self, id);
    if (s == NULL) Py_RETURN_FALSE;
    if (queue_message(self, s, message) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Session_finish(Session *self, PyObject *args) {
    int id, status;
    PyObject *message = NULL;
    if (!ready(self) || !PyArg_ParseTuple(args, "ii|O!", &id, &status, &PyBytes_Type, &message)) return NULL;
    Stream *s = answerable(self, id);
    if (s == NULL) Py_RETURN_FALSE;
    if (message != NULL && PyBytes_GET_SIZE(message) == 0) message = NULL;
    if (finish(self, s, status, message) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Session_reply(Session *self, PyObject *args) {
    int id;
    PyObject *message;
    if (!ready(self) || !PyArg_ParseTuple(args, "iO!", &id, &PyBytes_Type, &message)) return NULL;
    Stream *s = answerable(self, id);
    if (s == NULL) Py_RETURN_FALSE;
    s->finished = 1;  /* before the data provider first runs: the trailer follows the message */
    s->status = 0;
    if (queue_message(self, s, message) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Session_goaway(Session *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    /* No stream after the last one begun; those run to their answers, then the session wants nothing. */
    int rv = nghttp2_submit_goaway(self->session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(self->session),
                                   NGHTTP2_NO_ERROR, NULL, 0);
    if (rv != 0) return PyErr_Format(H2Error, "%s", nghttp2_strerror(rv));
    Py_RETURN_NONE;
}

static PyObject *Session_reset_stalled(Session *self, PyObject *args) {
    double limit;
    int status;
    PyObject *message;
    if (!ready(self) || !PyArg_ParseTuple(args, "diO!", &limit, &status, &PyBytes_Type, &message)) return NULL;
    PyObject *ids = PyList_New(0);
    if (ids == NULL) return NULL;
    double next_due;
    if (reset_stalled(self, limit, status, PyBytes_GET_SIZE(message) ? message : NULL, ids, &next_due) < 0) {
        Py_DECREF(ids);
        return NULL;
    }
    return Py_BuildValue("(Nd)", ids, next_due);
}

static PyObject *Session_get_open(Session *self, void *closure) {
    if (!ready(self)) return NULL;
    return PyBool_FromLong(nghttp2_session_want_read(self->session) || nghttp2_session_want_write(self->session));
}

static PyObject *Session_get_streams(Session *self, void *closure) {
    if (!ready(self)) return NULL;
    return PyLong_FromSsize_t(self->open_streams);
}

static PyObject *Session_get_idle(Session *self, void *closure) {
    if (!ready(self)) return NULL;
    return PyFloat_FromDouble(self->open_streams ? 0.0 : monotonic_now() - self->idle_since);
}

static PyMethodDef Session_methods[] = {
    {"receive", (PyCFunction)Session_receive, METH_O, "Feed bytes read from the socket; the finished requests."},
    {"pending", (PyCFunction)Session_pending, METH_VARARGS,
     "pending(limit=unbounded): bytes to write to the socket now, about limit at most (one frame more)."},
    {"send", (PyCFunction)Session_send, METH_VARARGS, "send(stream_id, message): queue one answer message."},
    {"finish", (PyCFunction)Session_finish, METH_VARARGS, "finish(stream_id, status, message=b''): end the answer."},
    {"reply", (PyCFunction)Session_reply, METH_VARARGS, "reply(stream_id, message): one message, then status 0."},
    {"goaway", (PyCFunction)Session_goaway, METH_NOARGS, "GOAWAY: no new streams; open ones run to their answers."},
    {"reset_stalled", (PyCFunction)Session_reset_stalled, METH_VARARGS,
     "reset_stalled(limit, status, message): answer and reset the streams that waited limit s or more on their "
     "client; ([their ids], seconds until the next waiting stream would, or -1.0)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Session_members[] = {
    {"buffered", T_PYSSIZET, offsetof(Session, buffered), READONLY,
     "Bytes the partial request messages hold now (each grown as its DATA arrives)."},
    {"answers", T_PYSSIZET, offsetof(Session, answers), READONLY,
     "Answer message bytes queued by send/reply and not yet taken by nghttp2 (the remote flow-control "
     "window or pending's limit holds them back); a reset stream's are dropped."},
    {"room", T_PYSSIZET, offsetof(Session, room), 0,
     "The most bytes partial messages may hold at once: a message growing past it is answered "
     "RESOURCE_EXHAUSTED (event problem 'over-budget'). Unbounded until set."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Session_getset[] = {
    {"open", (getter)Session_get_open, NULL, "Whether the connection still has anything to read or write.", NULL},
    {"streams", (getter)Session_get_streams, NULL, "Request streams open now.", NULL},
    {"idle", (getter)Session_get_idle, NULL, "Seconds since the last stream closed (or the session began) while "
     "none is open; 0.0 while one is.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "service.native._h2grpc.Session",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One HTTP/2 connection's gRPC server session (libnghttp2).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Session_init,
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_methods = Session_methods,
    .tp_getset = Session_getset,
    .tp_members = Session_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_h2grpc", .m_doc = "gRPC over HTTP/2 on libnghttp2.", .m_size = -1,
};

PyMODINIT_FUNC PyInit__h2grpc(void) {
    if (PyType_Ready(&SessionType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    H2Error = PyErr_NewException("service.native._h2grpc.H2Error", NULL, NULL);
    if (H2Error == NULL || PyModule_AddObjectRef(m, "H2Error", H2Error) < 0 ||
        PyModule_AddObjectRef(m, "Session", (PyObject *)&SessionType) < 0 ||
        PyModule_AddStringConstant(m, "NGHTTP2_VERSION", nghttp2_version(0)->version_str) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

