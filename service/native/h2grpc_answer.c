/* A stream's answer: HEADERS, then each queued message as DATA (the 5-byte prefix added here), then
 * the grpc-status trailer once finished; or one trailers-only HEADERS for an error before any message.
 * The data provider copies from the queue and defers while it is empty and the answer unfinished. */
#include "h2grpc.h"

/* grpc-message's length within MAX_STATUS_MESSAGE, cut before a %XX it would split. */
static size_t capped(const char *message, size_t len) {
    if (len <= MAX_STATUS_MESSAGE) return len;
    size_t n = MAX_STATUS_MESSAGE;
    if (message[n - 1] == '%') n -= 1;
    else if (message[n - 2] == '%') n -= 2;
    return n;
}

int submit_trailers_only(Session *self, int32_t id, int status, const char *message, size_t message_len) {
    message_len = capped(message, message_len);
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
        s->unsent -= n;  /* handed to nghttp2's frame buffer (one frame at a time), no longer queued */
        ((Session *)user_data)->answers -= (Py_ssize_t)n;
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
            const char *message = s->status_message ? PyBytes_AS_STRING(s->status_message) : "";
            size_t mlen = capped(message, s->status_message ? (size_t)PyBytes_GET_SIZE(s->status_message) : 0);
            nghttp2_nv trailer[] = {
                NV("grpc-status", code, (size_t)n),
                NV("grpc-message", message, mlen),
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

/* The stream to answer, or NULL (no exception) when it is gone: the client reset or the connection closed. */
Stream *answerable(Session *self, int32_t id) {
    if (id <= 0) return NULL;
    Stream *s = nghttp2_session_get_stream_user_data(self->session, id);
    if (s == NULL || s->finished || !s->dispatched) return NULL;
    return s;
}

/* nghttp2's result as a Python exception (-1), or 0. */
int h2_result(int rv) {
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

int queue_message(Session *self, Stream *s, PyObject *message) {
    if (s->queue == NULL && (s->queue = PyList_New(0)) == NULL) return -1;
    if (PyList_Append(s->queue, message) < 0) return -1;
    s->unsent += (size_t)PyBytes_GET_SIZE(message);
    self->answers += PyBytes_GET_SIZE(message);
    return h2_result(s->headers_sent ? wake(self, s) : start_answer(self, s));
}

int finish(Session *self, Stream *s, int status, PyObject *message) {
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
