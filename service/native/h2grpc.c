/* gRPC's server side of HTTP/2 in C, on libnghttp2: what grpcio's asyncio server spent ~80% of vkact's
 * gRPC CPU on (py-spy), done per connection without a thread, a completion queue or a Python object per
 * frame.  nghttp2 keeps HTTP/2 correct (framing, HPACK, flow control, SETTINGS, PING, GOAWAY, limits);
 * this module adds gRPC's part of it: one length-prefixed message per request stream, answered with
 * messages and a grpc-status trailer (or a trailers-only HEADERS for an error before any message).
 *
 * Python owns the socket (an asyncio Protocol, service/api/grpc_transport.py):
 *   events = session.receive(bytes)  -> [(stream_id, route, message, timeout, encoding), ...]
 *       one tuple per request stream the client has finished; route None: the client reset a stream
 *       it had sent whole (cancel its work); message None: the body is not one whole message, and
 *       `encoding` names why (str); else `encoding` is the grpc-encoding of a compressed message
 *       (bytes, b"" when the client named none) or None for an uncompressed one.
 *   session.send(stream_id, message)     queue one message (the 5-byte prefix is added here)
 *   session.finish(stream_id, status, message=b"")   grpc-status/grpc-message, after the queue
 *   session.reply(stream_id, message)    send + finish(0): a unary answer in one call
 *   data = session.pending()             bytes to write to the socket now (b"" when none)
 * Unknown methods, non-POST requests and other content types are answered here, without Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <nghttp2/nghttp2.h>
#include <string.h>

static PyObject *H2Error;

typedef struct Stream {
    struct Stream *prev, *next;  /* the session's open streams: freed with it (nghttp2_session_del calls no callback) */
    int32_t id;
    PyObject *route;           /* new ref: the routes dict's value for :path; NULL: unknown path */
    PyObject *timeout;         /* grpc-timeout's value (bytes) or NULL */
    PyObject *encoding;        /* grpc-encoding's value (bytes) or NULL */
    int not_post, not_grpc;
    /* the request's body: the 5-byte prefix, then the message straight into a bytes object */
    unsigned char prefix[5];
    size_t prefix_len;
    PyObject *body;            /* bytes of the prefix's length, filled as DATA arrives */
    size_t body_len, body_need;
    int too_large, extra;      /* over max_message; bytes after the first message */
    int dispatched;            /* handed to Python: its close before an answer is a cancellation */
    int refused;               /* answered here when its headers came (not a call vkact serves) */
    /* the answer: messages queued by send(), then the trailer once finished */
    PyObject *queue;           /* list of bytes */
    Py_ssize_t q_index;        /* the message being sent */
    size_t q_offset;           /* its bytes sent, the 5-byte prefix counted */
    int headers_sent, finished, deferred;
    int status;
    PyObject *status_message;  /* bytes, percent-encoded by the caller */
} Stream;

typedef struct {
    PyObject_HEAD
    nghttp2_session *session;
    PyObject *routes;          /* dict: :path bytes -> route object */
    PyObject *events;          /* list being filled by the receive() in progress */
    Stream *streams;           /* open streams, linked */
    size_t max_message;
    int callback_error;        /* a Python error inside a callback: receive() raises it */
} Session;

static void stream_free(Stream *s) {
    Py_XDECREF(s->route);
    Py_XDECREF(s->timeout);
    Py_XDECREF(s->encoding);
    Py_XDECREF(s->body);
    Py_XDECREF(s->queue);
    Py_XDECREF(s->status_message);
    PyMem_Free(s);
}

static void unlink_stream(Session *self, Stream *s) {
    if (s->prev) s->prev->next = s->next;
    else self->streams = s->next;
    if (s->next) s->next->prev = s->prev;
}

#define NV(NAME, VALUE, VLEN) {(uint8_t *)(NAME), (uint8_t *)(VALUE), sizeof(NAME) - 1, (VLEN), NGHTTP2_NV_FLAG_NONE}

static int submit_trailers_only(Session *self, int32_t id, int status, const char *message, size_t message_len) {
    char code[12];
    int n = snprintf(code, sizeof code, "%d", status);
    nghttp2_nv nva[] = {
        NV(":status", "200", 3),
        NV("content-type", "application/grpc", 16),
        NV("grpc-status", code, (size_t)n),
        NV("grpc-message", message, message_len),
    };
    return nghttp2_submit_response(self->session, id, nva, message_len ? 4 : 3, NULL);
}

/* The answer's DATA: each queued message as prefix + bytes; at the end of a finished queue, the trailer. */
static ssize_t read_answer(nghttp2_session *session, int32_t id, uint8_t *buf, size_t length,
                           uint32_t *flags, nghttp2_data_source *source, void *user_data) {
    Stream *s = source->ptr;
    size_t written = 0;
    Py_ssize_t queued = PyList_GET_SIZE(s->queue);
    while (written < length && s->q_index < queued) {
        PyObject *msg = PyList_GET_ITEM(s->queue, s->q_index);
        size_t size = (size_t)PyBytes_GET_SIZE(msg);
        if (s->q_offset < 5) {
            unsigned char prefix[5] = {0, (unsigned char)(size >> 24), (unsigned char)(size >> 16),
                                       (unsigned char)(size >> 8), (unsigned char)size};
            size_t n = 5 - s->q_offset;
            if (n > length - written) n = length - written;
            memcpy(buf + written, prefix + s->q_offset, n);
            written += n;
            s->q_offset += n;
            continue;
        }
        size_t n = size + 5 - s->q_offset;
        if (n > length - written) n = length - written;
        memcpy(buf + written, PyBytes_AS_STRING(msg) + (s->q_offset - 5), n);
        written += n;
        s->q_offset += n;
        if (s->q_offset == size + 5) {
            s->q_index++;
            s->q_offset = 0;
        }
    }
    if (s->q_index == queued) {
        if (queued) {  /* drop what was sent: a long stream must not keep every message */
            if (PyList_SetSlice(s->queue, 0, queued, NULL) < 0) {
                PyErr_Clear();
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
            }
            s->q_index = 0;
        }
        if (s->finished) {
            char code[12];
            int n = snprintf(code, sizeof code, "%d", s->status);
            Py_ssize_t mlen = s->status_message ? PyBytes_GET_SIZE(s->status_message) : 0;
            nghttp2_nv trailer[] = {
                NV("grpc-status", code, (size_t)n),
                NV("grpc-message", mlen ? PyBytes_AS_STRING(s->status_message) : "", (size_t)mlen),
            };
            *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
            if (nghttp2_submit_trailer(session, id, trailer, mlen ? 2 : 1) != 0)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        } else if (written == 0) {
            s->deferred = 1;
            return NGHTTP2_ERR_DEFERRED;
        }
    }
    return (ssize_t)written;
}

static int start_answer(Session *self, Stream *s) {
    nghttp2_nv nva[] = {NV(":status", "200", 3), NV("content-type", "application/grpc", 16)};
    nghttp2_data_provider provider = {.source = {.ptr = s}, .read_callback = read_answer};
    s->headers_sent = 1;
    return nghttp2_submit_response(self->session, s->id, nva, 2, &provider);
}

/* --- nghttp2's callbacks ----------------------------------------------------------------------- */

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    Session *self = user_data;
    Stream *s = PyMem_Calloc(1, sizeof(Stream));
    if (s == NULL) return NGHTTP2_ERR_CALLBACK_FAILURE;
    s->id = frame->hd.stream_id;
    s->next = self->streams;
    if (s->next) s->next->prev = s;
    self->streams = s;
    nghttp2_session_set_stream_user_data(session, s->id, s);
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) {
    Session *self = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    Stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s == NULL) return 0;
#define IS(LITERAL) (namelen == sizeof(LITERAL) - 1 && memcmp(name, LITERAL, namelen) == 0)
    if (IS(":path")) {
        PyObject *path = PyBytes_FromStringAndSize((const char *)value, (Py_ssize_t)valuelen);
        if (path == NULL) goto failed;
        PyObject *route = PyDict_GetItemWithError(self->routes, path);
        Py_DECREF(path);
        if (route == NULL && PyErr_Occurred()) goto failed;
        Py_XINCREF(route);
        Py_XSETREF(s->route, route);
    } else if (IS(":method")) {
        s->not_post = !(valuelen == 4 && memcmp(value, "POST", 4) == 0);
    } else if (IS("content-type")) {
        s->not_grpc = !(valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                        (valuelen == 16 || value[16] == '+' || value[16] == ';'));
    } else if (IS("grpc-timeout") || IS("grpc-encoding")) {
        PyObject *v = PyBytes_FromStringAndSize((const char *)value, (Py_ssize_t)valuelen);
        if (v == NULL) goto failed;
        if (IS("grpc-timeout")) Py_XSETREF(s->timeout, v);
        else Py_XSETREF(s->encoding, v);
    }
#undef IS
    return 0;
failed:
    self->callback_error = 1;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                         void *user_data) {
    Session *self = user_data;
    Stream *s = nghttp2_session_get_stream_user_data(session, id);
    if (s == NULL || s->too_large || s->extra || s->refused) return 0;
    while (len) {
        if (s->body == NULL) {
            size_t n = 5 - s->prefix_len < len ? 5 - s->prefix_len : len;
            memcpy(s->prefix + s->prefix_len, data, n);
            s->prefix_len += n;
            data += n;
            len -= n;
            if (s->prefix_len < 5) return 0;
            size_t need = ((size_t)s->prefix[1] << 24) | ((size_t)s->prefix[2] << 16) |
                          ((size_t)s->prefix[3] << 8) | s->prefix[4];
            if (need > self->max_message) {
                s->too_large = 1;
                return 0;
            }
            s->body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)need);
            if (s->body == NULL) {
                self->callback_error = 1;
                return NGHTTP2_ERR_CALLBACK_FAILURE;
            }
            s->body_need = need;
            continue;
        }
        if (s->body_len == s->body_need) {  /* a second message on a unary request */
            s->extra = 1;
            return 0;
        }
        size_t n = s->body_need - s->body_len < len ? s->body_need - s->body_len : len;
        memcpy(PyBytes_AS_STRING(s->body) + s->body_len, data, n);
        s->body_len += n;
        data += n;
        len -= n;
    }
    return 0;
}

/* A request that is not a gRPC call vkact serves, answered as soon as its headers are in (a streaming
 * client of an unknown method must not wait for its own end of stream). */
static int refuse(Session *self, Stream *s) {
    static const char unimplemented[] = "unknown method";
    s->refused = 1;
    Py_CLEAR(s->body);
    if (s->not_post || s->not_grpc) {
        nghttp2_nv nva[] = {NV(":status", s->not_post ? "405" : "415", 3)};
        return nghttp2_submit_response(self->session, s->id, nva, 1, NULL);
    }
    return submit_trailers_only(self, s->id, 12, unimplemented, sizeof unimplemented - 1);
}

/* A request stream the client has finished: handed to Python through the events list. */
static int request_complete(Session *self, Stream *s) {
    const char *problem = NULL;
    if (s->too_large) problem = "too-large";
    else if (s->extra) problem = "extra";
    else if (s->body == NULL || s->body_len != s->body_need) problem = "incomplete";
    PyObject *id = PyLong_FromLong(s->id);
    /* the last field: the problem's name, or for a compressed message its grpc-encoding (b"": none sent) */
    PyObject *last = problem ? PyUnicode_FromString(problem)
                   : s->prefix[0] == 0 ? Py_NewRef(Py_None)
                   : s->encoding ? Py_NewRef(s->encoding) : PyBytes_FromStringAndSize("", 0);
    PyObject *event = id && last ? PyTuple_Pack(5, id, s->route, problem ? Py_None : s->body,
                                                s->timeout ? s->timeout : Py_None, last) : NULL;
    Py_XDECREF(id);
    Py_XDECREF(last);
    if (event == NULL || PyList_Append(self->events, event) < 0) {
        Py_XDECREF(event);
        self->callback_error = 1;
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    Py_DECREF(event);
    Py_CLEAR(s->body);  /* Python holds the message now */
    s->dispatched = 1;
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    Session *self = user_data;
    if (frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) return 0;
    Stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s == NULL || s->dispatched || s->refused) return 0;
    int rv = 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
        (s->route == NULL || s->not_post || s->not_grpc))
        rv = refuse(self, s);
    else if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        rv = request_complete(self, s);
    return rv == NGHTTP2_ERR_CALLBACK_FAILURE || rv == 0 ? rv : 0;  /* a submit error: the stream is gone */
}

static int on_stream_close(nghttp2_session *session, int32_t id, uint32_t error_code, void *user_data) {
    Session *self = user_data;
    Stream *s = nghttp2_session_get_stream_user_data(session, id);
    if (s == NULL) return 0;
    nghttp2_session_set_stream_user_data(session, id, NULL);
    unlink_stream(self, s);
    int cancelled = s->dispatched && !s->finished;
    stream_free(s);
    if (cancelled && self->events != NULL) {
        PyObject *event = Py_BuildValue("(iOOOO)", id, Py_None, Py_None, Py_None, Py_None);
        if (event == NULL || PyList_Append(self->events, event) < 0) {
            Py_XDECREF(event);
            self->callback_error = 1;
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        Py_DECREF(event);
    }
    return 0;
}

/* --- the Session type -------------------------------------------------------------------------- */

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
    nghttp2_session_callbacks *callbacks;
    if (nghttp2_session_callbacks_new(&callbacks) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);
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
        stream_free(s);
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

static PyObject *Session_pending(Session *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    const uint8_t *chunk;
    ssize_t n = nghttp2_session_mem_send(self->session, &chunk);
    if (n < 0) return PyErr_Format(H2Error, "%s", nghttp2_strerror((int)n));
    if (n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    /* Most calls produce one chunk (a small answer's frames are serialised together); copy on. */
    size_t size = (size_t)n, capacity = size < 65536 ? 65536 : size * 2;
    char *buffer = PyMem_Malloc(capacity);
    if (buffer == NULL) return PyErr_NoMemory();
    memcpy(buffer, chunk, size);
    while ((n = nghttp2_session_mem_send(self->session, &chunk)) > 0) {
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

/* The stream to answer, or NULL (no exception) when it is gone: the client reset or the connection closed. */
static Stream *answerable(Session *self, int32_t id) {
    if (id <= 0) return NULL;
    Stream *s = nghttp2_session_get_stream_user_data(self->session, id);
    if (s == NULL || s->finished || !s->dispatched) return NULL;
    return s;
}

/* nghttp2's result as a Python exception (-1), or 0. */
static int h2_result(int rv) {
    if (rv == 0) return 0;
    PyErr_Format(H2Error, "%s", nghttp2_strerror(rv));
    return -1;
}

/* The data provider waits (DEFERRED) on an empty queue of an unfinished answer: wake it. */
static int wake(Session *self, Stream *s) {
    if (!s->deferred) return 0;
    s->deferred = 0;
    return nghttp2_session_resume_data(self->session, s->id);
}

static int queue_message(Session *self, Stream *s, PyObject *message) {
    if (s->queue == NULL && (s->queue = PyList_New(0)) == NULL) return -1;
    if (PyList_Append(s->queue, message) < 0) return -1;
    return h2_result(s->headers_sent ? wake(self, s) : start_answer(self, s));
}

static int finish(Session *self, Stream *s, int status, PyObject *message) {
    s->finished = 1;
    s->status = status;
    if (!s->headers_sent) {
        s->headers_sent = 1;
        return h2_result(submit_trailers_only(self, s->id, status, message ? PyBytes_AS_STRING(message) : "",
                                              message ? (size_t)PyBytes_GET_SIZE(message) : 0));
    }
    Py_XINCREF(message);
    Py_XSETREF(s->status_message, message);
    return h2_result(wake(self, s));
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

static PyObject *Session_get_open(Session *self, void *closure) {
    if (!ready(self)) return NULL;
    return PyBool_FromLong(nghttp2_session_want_read(self->session) || nghttp2_session_want_write(self->session));
}

static PyObject *Session_get_streams(Session *self, void *closure) {
    if (!ready(self)) return NULL;
    size_t n = 0;
    for (Stream *s = self->streams; s; s = s->next) n++;
    return PyLong_FromSize_t(n);
}

static PyMethodDef Session_methods[] = {
    {"receive", (PyCFunction)Session_receive, METH_O, "Feed bytes read from the socket; the finished requests."},
    {"pending", (PyCFunction)Session_pending, METH_NOARGS, "Bytes to write to the socket now."},
    {"send", (PyCFunction)Session_send, METH_VARARGS, "send(stream_id, message): queue one answer message."},
    {"finish", (PyCFunction)Session_finish, METH_VARARGS, "finish(stream_id, status, message=b''): end the answer."},
    {"reply", (PyCFunction)Session_reply, METH_VARARGS, "reply(stream_id, message): one message, then status 0."},
    {"goaway", (PyCFunction)Session_goaway, METH_NOARGS, "GOAWAY: no new streams; open ones run to their answers."},
    {NULL},
};

static PyGetSetDef Session_getset[] = {
    {"open", (getter)Session_get_open, NULL, "Whether the connection still has anything to read or write.", NULL},
    {"streams", (getter)Session_get_streams, NULL, "Request streams open now.", NULL},
    {NULL},
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
