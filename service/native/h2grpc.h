/* h2grpc's shared parts: a connection's Session (the Python type, h2grpc.c), its request streams
 * (h2grpc_request.c: what the client sends, through nghttp2's callbacks) and their answers
 * (h2grpc_answer.c: messages and the grpc-status trailer). See h2grpc.c for the Python interface. */
#ifndef VKACT_H2GRPC_H
#define VKACT_H2GRPC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <nghttp2/nghttp2.h>
#include <string.h>

extern PyObject *H2Error;

typedef struct Stream {
    struct Stream *prev, *next;  /* the session's open streams: freed with it (nghttp2_session_del calls no callback) */
    int32_t id;
    PyObject *route;           /* new ref: the routes dict's value for :path; NULL: unknown path */
    PyObject *timeout;         /* grpc-timeout's value (bytes) or NULL */
    PyObject *encoding;        /* grpc-encoding's value (bytes) or NULL */
    int not_post, not_grpc;    /* not_grpc until a content-type of application/grpc[+...;...] comes */
    /* the request's body: the 5-byte prefix, then the message into a bytes object that grows as DATA
     * arrives (never to what the prefix announces before the bytes come: five bytes reserve nothing) */
    unsigned char prefix[5];
    size_t prefix_len;
    PyObject *body;            /* bytes of body_size, the first body_len of them received */
    size_t body_len, body_size, body_need;
    int too_large, extra;      /* over max_message; bytes after the first message */
    int over_budget;           /* growing it would pass the session's room, or the allocation failed */
    int dispatched;            /* handed to Python: its close before an answer is a cancellation */
    int refused;               /* answered here when its headers came (not a call vkact serves) */
    int bidi;                  /* its route streams requests (route.bidi): each message is an event as
                                * it completes, and the end of the request stream one more */
    /* the answer: messages queued by send(), then the trailer once finished */
    PyObject *queue;           /* list of bytes */
    Py_ssize_t q_index;        /* the message being sent */
    size_t q_offset;           /* its bytes sent, the 5-byte prefix counted */
    size_t unsent;             /* the queue's message bytes not yet handed to nghttp2 (in Session.answers) */
    int headers_sent, finished, deferred;
    int status;
    PyObject *status_message;  /* bytes, percent-encoded by the caller */
    double last_recv;          /* when the client last sent this stream anything (monotonic seconds) */
    int stalled;               /* answered by reset_stalled: never reported again */
} Stream;

typedef struct {
    PyObject_HEAD
    nghttp2_session *session;
    PyObject *routes;          /* dict: :path bytes -> route object */
    PyObject *events;          /* list being filled by the receive() in progress */
    Stream *streams;           /* open streams, linked */
    size_t max_message;
    Py_ssize_t buffered;       /* bytes the partial messages of all streams hold (their bodies' sizes) */
    Py_ssize_t room;           /* the most they may hold at once: set by Python (the process's budget) */
    Py_ssize_t answers;        /* answer message bytes queued and not yet handed to nghttp2 (all streams) */
    int callback_error;        /* a Python error inside a callback: receive() raises it */
    Py_ssize_t open_streams;   /* the streams list's length */
    double idle_since;         /* when the last stream closed, or the session began (monotonic seconds) */
    double now;                /* the time of the receive() in progress: its streams' last_recv */
} Session;

/* grpc-message bytes sent at most (cut, never inside a %XX): grpc-core refuses metadata over 8-16 KiB, and
 * nghttp2 drops a header block over 64 KiB; the Python side already elides the client's input. */
#define MAX_STATUS_MESSAGE 4096

#define NV(NAME, VALUE, VLEN) {(uint8_t *)(NAME), (uint8_t *)(VALUE), sizeof(NAME) - 1, (VLEN), NGHTTP2_NV_FLAG_NONE}

/* h2grpc_request.c */
double monotonic_now(void);
void set_request_callbacks(nghttp2_session_callbacks *callbacks);
void stream_free(Session *self, Stream *s);
int reset_stalled(Session *self, double limit, int status, PyObject *message, PyObject *ids, double *next_due);

/* h2grpc_answer.c */
int submit_trailers_only(Session *self, int32_t id, int status, const char *message, size_t message_len);
Stream *answerable(Session *self, int32_t id);
int h2_result(int rv);
int queue_message(Session *self, Stream *s, PyObject *message);
int finish(Session *self, Stream *s, int status, PyObject *message);

#endif
