/* A request stream as the client sends it: nghttp2's callbacks build each Stream (its route by :path,
 * its headers, its one message read straight into a bytes object) and hand a finished one to Python
 * through the events list of the receive() in progress. A streaming route's stream (route.bidi set)
 * hands over each message as it completes, then its end ("end"), so answers can go while the client
 * still sends. Each stream notes when the client last sent it anything: one that stalls is answered
 * and reset (reset_stalled), and one answered before the client finished it is reset once the answer
 * is out (on_frame_send), so no stream waits on a client for ever. */
#include "h2grpc.h"

#include <time.h>

double monotonic_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A partial message's bytes given up (or handed to Python): no longer the session's to count. */
static void release_body(Session *self, Stream *s) {
    self->buffered -= (Py_ssize_t)s->body_size;
    s->body_size = 0;
    Py_CLEAR(s->body);
}

void stream_free(Session *self, Stream *s) {
    release_body(self, s);
    self->answers -= (Py_ssize_t)s->unsent;  /* a reset or closed stream's answer is never sent */
    Py_XDECREF(s->route);
    Py_XDECREF(s->timeout);
    Py_XDECREF(s->encoding);
    Py_XDECREF(s->queue);
    Py_XDECREF(s->status_message);
    PyMem_Free(s);
}

static void unlink_stream(Session *self, Stream *s) {
    if (s->prev) s->prev->next = s->next;
    else self->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    if (--self->open_streams == 0) self->idle_since = monotonic_now();
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    Session *self = user_data;
    Stream *s = PyMem_Calloc(1, sizeof(Stream));
    if (s == NULL) return NGHTTP2_ERR_CALLBACK_FAILURE;
    s->id = frame->hd.stream_id;
    s->not_grpc = 1;  /* a request without content-type is not a gRPC call either (415) */
    s->last_recv = self->now;
    s->next = self->streams;
    if (s->next) s->next->prev = s;
    self->streams = s;
    self->open_streams++;
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
        s->bidi = 0;
        static PyObject *bidi_name;  /* interned once: no string made per request */
        if (route != NULL && bidi_name == NULL && (bidi_name = PyUnicode_InternFromString("bidi")) == NULL) goto failed;
        if (route != NULL) {
            PyObject *bidi = PyObject_GetAttr(route, bidi_name);
            if (bidi == NULL) PyErr_Clear();  /* a route without the attribute is unary */
            else {
                s->bidi = bidi != Py_None;
                Py_DECREF(bidi);
            }
        }
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

/* Room for `more` bytes beyond body_len: the body doubles (from 16 KiB) but never past the announced
 * length, within the session's room. 0, or -1 with the stream marked over_budget (its body dropped: a
 * MemoryError never leaves here, the client gets RESOURCE_EXHAUSTED). */
static int grow(Session *self, Stream *s, size_t more) {
    size_t want = s->body_len + more;
    if (want <= s->body_size) return 0;
    size_t size = s->body_size * 2 > want ? s->body_size * 2 : want;
    if (size < 16384) size = 16384;
    if (size > s->body_need) size = s->body_need;
    Py_ssize_t others = self->buffered - (Py_ssize_t)s->body_size;
    if (others + (Py_ssize_t)size > self->room) size = want;  /* no slack when the room is short */
    if (others + (Py_ssize_t)size > self->room ||
        (s->body == NULL ? (s->body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size)) == NULL
                         : _PyBytes_Resize(&s->body, (Py_ssize_t)size) < 0)) {
        PyErr_Clear();  /* a failed resize has freed the bytes and set body NULL */
        release_body(self, s);
        s->over_budget = 1;
        return -1;
    }
    self->buffered = others + (Py_ssize_t)size;
    s->body_size = size;
    return 0;
}

static int emit(Session *self, Stream *s, const char *problem);

/* A streaming route's message, complete: handed to Python, the stream ready for the next one. */
static int message_complete(Session *self, Stream *s) {
    if (emit(self, s, NULL) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    s->prefix_len = 0;
    s->body_len = s->body_need = 0;
    return 0;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                         void *user_data) {
    Session *self = user_data;
    Stream *s = nghttp2_session_get_stream_user_data(session, id);
    if (s == NULL) return 0;
    s->last_recv = self->now;  /* bytes dropped below are the client's progress too */
    if (s->too_large || s->extra || s->refused || s->over_budget || (s->bidi && s->finished)) return 0;
    while (len) {
        if (s->prefix_len < 5) {
            size_t n = 5 - s->prefix_len < len ? 5 - s->prefix_len : len;
            memcpy(s->prefix + s->prefix_len, data, n);
            s->prefix_len += n;
            data += n;
            len -= n;
            if (s->prefix_len < 5) return 0;
            s->body_need = ((size_t)s->prefix[1] << 24) | ((size_t)s->prefix[2] << 16) |
                           ((size_t)s->prefix[3] << 8) | s->prefix[4];
            if (s->body_need > self->max_message) {
                s->too_large = 1;  /* a streaming call is answered now, not at the end of a stream that may never end */
                return s->bidi && emit(self, s, "too-large") < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
            }
            if (s->bidi && s->body_need == 0 && message_complete(self, s) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
            continue;
        }
        if (s->body_len == s->body_need) {  /* a second message on a unary request */
            s->extra = 1;
            return 0;
        }
        size_t n = s->body_need - s->body_len < len ? s->body_need - s->body_len : len;
        if (grow(self, s, n) < 0) return s->bidi && emit(self, s, "over-budget") < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
        memcpy(PyBytes_AS_STRING(s->body) + s->body_len, data, n);
        s->body_len += n;
        data += n;
        len -= n;
        if (s->bidi && s->body_len == s->body_need && message_complete(self, s) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    return 0;
}

/* A request that is not a gRPC call vkact serves, answered as soon as its headers are in (a streaming
 * client of an unknown method must not wait for its own end of stream). */
static int refuse(Session *self, Stream *s) {
    static const char unimplemented[] = "unknown method";
    s->refused = 1;
    release_body(self, s);
    if (s->not_post || s->not_grpc) {
        nghttp2_nv nva[] = {NV(":status", s->not_post ? "405" : "415", 3)};
        return nghttp2_submit_response(self->session, s->id, nva, 1, NULL);
    }
    return submit_trailers_only(self, s->id, 12, unimplemented, sizeof unimplemented - 1);
}

/* The stream's message (problem NULL) or its problem's name handed to Python through the events
 * list: 0, or -1 with callback_error set. */
static int emit(Session *self, Stream *s, const char *problem) {
    if (self->events == NULL) {  /* only receive() feeds nghttp2: never without its list */
        PyErr_SetString(PyExc_RuntimeError, "h2grpc: a request event outside receive()");
        self->callback_error = 1;
        return -1;
    }
    if (problem == NULL && s->body == NULL && (s->body = PyBytes_FromStringAndSize("", 0)) == NULL) {  /* an empty message */
        self->callback_error = 1;
        return -1;
    }
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
        return -1;
    }
    Py_DECREF(event);
    release_body(self, s);  /* Python holds the message now */
    s->dispatched = 1;
    return 0;
}

/* A request stream the client has finished: its one message (a streaming route's: its end, "end"), or
 * what is wrong with it. */
static int request_complete(Session *self, Stream *s) {
    const char *problem = NULL;
    if (s->too_large) problem = "too-large";
    else if (s->over_budget) problem = "over-budget";
    else if (s->extra) problem = "extra";
    else if (s->bidi ? s->prefix_len != 0 : s->prefix_len < 5 || s->body_len != s->body_need) problem = "incomplete";
    else if (s->bidi) problem = "end";
    return emit(self, s, problem) < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    Session *self = user_data;
    if (frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) return 0;
    Stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s == NULL) return 0;
    s->last_recv = self->now;  /* a header block (CONTINUATIONs included) or an empty DATA: whole now */
    if ((s->dispatched && !s->bidi) || s->refused || (s->bidi && s->finished)) return 0;
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
    stream_free(self, s);
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

/* A HEADERS frame nghttp2 will not send (a header block over its limit, ...) would leave its call open
 * forever, the client waiting on a status that never comes: reset the stream instead. */
static int on_frame_not_send(nghttp2_session *session, const nghttp2_frame *frame, int error, void *user_data) {
    if (frame->hd.type != NGHTTP2_HEADERS || error == NGHTTP2_ERR_STREAM_CLOSED || error == NGHTTP2_ERR_STREAM_CLOSING)
        return 0;
    if (nghttp2_session_find_stream(session, frame->hd.stream_id) == NULL) return 0;
    int rv = nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_INTERNAL_ERROR);
    return rv == 0 || nghttp2_is_fatal(rv) == 0 ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* An answer complete (END_STREAM sent) on a stream the client has not finished (a refused call, an error
 * before the end of the request, a stalled one): RST_STREAM NO_ERROR (RFC 9113 8.1) stops its upload
 * and closes it. nghttp2 leaves it half-closed, taking and discarding whatever the client sends. */
static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) || !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    if (nghttp2_session_get_stream_remote_close(session, frame->hd.stream_id) != 0) return 0;  /* closed, or gone */
    int rv = nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    return rv == 0 || nghttp2_is_fatal(rv) == 0 ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* Whether `s` waits on its client's bytes: a request not yet whole (headers, message, end of stream), or
 * a streaming call's message begun. A streaming call between messages may rest as long as it likes. */
static int waits_on_client(Session *self, Stream *s) {
    if (s->stalled || nghttp2_session_get_stream_remote_close(self->session, s->id) != 0) return 0;
    return !(s->bidi && !s->finished && s->prefix_len == 0);
}

/* Each stream that has waited on its client `limit` seconds or more without a byte: answered with `status`
 * and `message` (bytes, or NULL; after the answer's queued messages if it has begun), its partial message
 * given up, what the client still sends dropped, and reset once the answer is out (on_frame_send). Their
 * ids are appended to `ids`; *next_due: seconds until the next waiting stream reaches `limit`, or -1.
 * 0, or -1 with a Python exception (H2Error: nghttp2 failed). */
int reset_stalled(Session *self, double limit, int status, PyObject *message, PyObject *ids, double *next_due) {
    double now = monotonic_now();
    *next_due = -1.0;
    for (Stream *s = self->streams; s; s = s->next) {
        if (!waits_on_client(self, s)) continue;
        double due = s->last_recv + limit - now;
        if (due > 0) {
            if (*next_due < 0 || due < *next_due) *next_due = due;
            continue;
        }
        PyObject *id = PyLong_FromLong(s->id);
        if (id == NULL || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            return -1;
        }
        Py_DECREF(id);
        s->stalled = 1;
        s->refused = 1;  /* what the client sends from now on is dropped */
        release_body(self, s);
        int rv = 0;
        if (!s->headers_sent) {
            s->headers_sent = s->finished = 1;
            s->status = status;
            rv = submit_trailers_only(self, s->id, status, message ? PyBytes_AS_STRING(message) : "",
                                      message ? (size_t)PyBytes_GET_SIZE(message) : 0);
        } else if (!s->finished && finish(self, s, status, message) < 0) {
            return -1;
        }
        if (rv != 0 && nghttp2_is_fatal(rv)) return h2_result(rv);
    }
    return 0;
}

void set_request_callbacks(nghttp2_session_callbacks *callbacks) {
    nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, on_frame_send);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(callbacks, on_frame_not_send);
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);
}
