/* HTTP/1.1 requests of the inference routes, parsed in C: the hot path of vkact's HTTP port.
 *
 * uvicorn's httptools protocol calls into Python for every piece of a request (its start, the URL, each
 * header, the body, its end) and parses the URL again in Python. This module reads a connection's bytes
 * and hands Python one event per complete request that it fully understands; everything else stays
 * uvicorn's (service/http_native.py):
 *   events = session.receive(bytes) -> [(path: str, raw_path: bytes, headers: [(name, value)], body: bytes,
 *                                         keep_alive: bool), ...]
 *       names lower-cased (as ASGI wants them), values without leading blanks (as llhttp gives them);
 *   session.fallback   True once a request is not one it takes: from its first byte on, the connection's
 *                      bytes belong to the general parser; rest = session.rest() returns them (and empties
 *                      the buffer), and receive() takes nothing more;
 *   session.state      0: no partial request buffered; 1: a request's head is partial; 2: its body is;
 *   session.body_left  after receive(): 0, or the last event is a large request (a Content-Length over
 *                      max_body, up to max_large) whose body continues on the socket: its event's body is
 *                      what had arrived of it, body_left bytes are still to come, and the caller reads them
 *                      itself (service/http_body.py) before it feeds this session the bytes after them.
 * A request it takes: "POST <path> HTTP/1.1", the path /v1/execute or /v2/models/.../infer in plain
 * characters (no query, no percent-escapes), header lines of token names and printable values, exactly
 * one Content-Length of at most max_body bytes (max_large: see body_left), no Transfer-Encoding, Expect
 * or Upgrade, Connection absent or keep-alive or close, at most MAX_HEADERS headers in at most max_head
 * bytes. Anything else, a valid request or not, is the fallback's, so its answer (400, 413,
 * 100-continue, chunked...) stays as it was. After a request with Connection: close nothing more is read
 * (the connection closes after its answer). The buffer holds at most max_head + max_body bytes of a
 * partial request.
 *
 * A client sends one request over and over: a whole request whose head is byte for byte the previous
 * whole request's is not parsed again. Its event carries the previous event's path, raw_path and header
 * pairs (immutable objects: a new list of the same tuples), as a parse of the same bytes would make them
 * (and http_direct.Repeat then finds the same route by identity). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <structmember.h>
#include <string.h>

#define MAX_HEADERS 64
#define MAX_PATH 1024

typedef struct {
    PyObject_HEAD
    char *buf;
    size_t len, cap;      /* unparsed bytes */
    size_t scanned;       /* bytes of buf already searched for the head's end (none found) */
    size_t need;          /* a partial request's whole size, once its head was taken; else 0 */
    size_t max_head, max_body, max_large;
    Py_ssize_t body_left;  /* of the last event's body, still on the socket (see body_left above) */
    int fallback, closed, state;
    /* the last whole request taken: its head's bytes and what its event was made of */
    char *prev_head;
    size_t prev_len, prev_cap, prev_length;  /* head bytes; its Content-Length */
    PyObject *prev_path, *prev_raw, *prev_pairs;  /* str, bytes, tuple of (name, value) */
    int prev_keep_alive;
} Session;

enum { TAKEN, PARTIAL_HEAD, PARTIAL_BODY, NOT_OURS, FAILED };

static const char TCHAR[] = "!#$%&'*+-.^_`|~";

static int is_tchar(unsigned char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c && strchr(TCHAR, c)); }
static int is_path_char(unsigned char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '-' || c == '.' || c == '_' || c == '~' || c == '/'; }
static int is_blank(unsigned char c) { return c == ' ' || c == '\t'; }

static int name_is(const char *name, size_t len, const char *lower) {
    size_t n = strlen(lower);
    if (len != n) return 0;
    for (size_t i = 0; i < n; i++)
        if ((name[i] | 0x20) != lower[i]) return 0;
    return 1;
}

static int inference_path(const char *p, size_t n) {
    static const char v1[] = "/v1/execute", v2[] = "/v2/models/", infer[] = "/infer";
    if (n == sizeof v1 - 1 && memcmp(p, v1, n) == 0) return 1;
    return n > sizeof v2 - 1 + sizeof infer - 1 && memcmp(p, v2, sizeof v2 - 1) == 0 &&
           memcmp(p + n - (sizeof infer - 1), infer, sizeof infer - 1) == 0;
}

/* The end of the head (the offset after its blank line) in buf; 0 when it has not arrived; BAD when its
 * bytes already show it is not one this module takes (another method, a control byte, a bare LF), so
 * that the general parser answers garbage as soon as it comes, as before. */
#define BAD ((size_t)-1)
static size_t head_end(Session *self) {
    static const char method[] = "POST /";
    size_t prefix = self->len < sizeof method - 1 ? self->len : sizeof method - 1;
    if (memcmp(self->buf, method, prefix) != 0) return BAD;
    const unsigned char *b = (const unsigned char *)self->buf;
    for (size_t i = self->scanned; i < self->len; i++) {
        unsigned char c = b[i];
        if (c == '\n') {
            if (i == 0 || b[i - 1] != '\r') return BAD;
            if (i >= 3 && b[i - 2] == '\n' && b[i - 3] == '\r') return i + 1;
        } else if (c != '\r' && c != '\t' && (c < 0x20 || c > 0x7e)) {
            return BAD;
        } else if (i > 0 && b[i - 1] == '\r' && c != '\n') {
            return BAD;
        }
    }
    self->scanned = self->len;
    return 0;
}

typedef struct { const char *name, *value; size_t name_len, value_len; } Header;

/* The event (path, raw_path, headers, body, keep_alive) of a request whose body is at p. */
static PyObject *event_of(PyObject *path, PyObject *raw, PyObject *pairs, const char *p, size_t body, int keep_alive) {
    Py_ssize_t n = PyTuple_GET_SIZE(pairs);
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, i);
        Py_INCREF(pair);
        PyList_SET_ITEM(list, i, pair);
    }
    return Py_BuildValue("(OONy#O)", path, raw, list, p, (Py_ssize_t)body, keep_alive ? Py_True : Py_False);
}

/* Keep a whole request's head (buf's first `end` bytes) and its event's parts for the next one. */
static int remember(Session *self, size_t end, PyObject *path, PyObject *raw, PyObject *pairs, size_t length, int keep_alive) {
    if (end > self->prev_cap) {
        char *grown = PyMem_Realloc(self->prev_head, end);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->prev_head = grown;
        self->prev_cap = end;
    }
    memcpy(self->prev_head, self->buf, end);
    self->prev_len = end;
    self->prev_length = length;
    self->prev_keep_alive = keep_alive;
    Py_INCREF(path);
    Py_INCREF(raw);
    Py_INCREF(pairs);
    Py_XSETREF(self->prev_path, path);
    Py_XSETREF(self->prev_raw, raw);
    Py_XSETREF(self->prev_pairs, pairs);
    return 0;
}

/* How much of the body (`length` bytes, after the head's `end`) the event takes, in *body: all of it, or for
 * a large one (over max_body) what has arrived, the rest the caller's (body_left); PARTIAL_BODY while an
 * ordinary one's is incomplete. A repeated head is no exception: the large request before it may have come
 * whole in one read, and its repeat must not be buffered whole (the buffer's bound, and the caller's
 * charging of a large body before reading it, hold for every large request). */
static int body_arrived(Session *self, size_t end, size_t length, size_t *body) {
    size_t held = self->len - end;
    *body = length < held ? length : held;
    if (*body < length && length <= self->max_body) {
        self->need = end + length;
        return PARTIAL_BODY;
    }
    return TAKEN;
}

/* The request at the start of buf: TAKEN (*event set, *size its bytes), partial, NOT_OURS or FAILED. */
static int parse(Session *self, PyObject **event, size_t *size) {
    if (self->len == 0) return PARTIAL_HEAD;
    if (self->need && self->len < self->need) return PARTIAL_BODY;
    size_t end = head_end(self);
    if (end == BAD) return NOT_OURS;
    if (end == 0) return self->len >= self->max_head ? NOT_OURS : PARTIAL_HEAD;
    if (end > self->max_head) return NOT_OURS;
    if (end == self->prev_len && memcmp(self->buf, self->prev_head, end) == 0) {  /* the previous request's head again */
        size_t length = self->prev_length, body;
        if (body_arrived(self, end, length, &body) == PARTIAL_BODY) return PARTIAL_BODY;
        *event = event_of(self->prev_path, self->prev_raw, self->prev_pairs, self->buf + end, body, self->prev_keep_alive);
        if (*event == NULL) return FAILED;
        self->body_left = (Py_ssize_t)(length - body);
        *size = end + body;
        return TAKEN;
    }
    const char *p = self->buf, *stop = self->buf + end - 2;  /* stop: the blank line's CRLF */
    if (end < 32 || memcmp(p, "POST /", 6) != 0) return NOT_OURS;  /* shorter: no Content-Length */
    const char *path = p + 5, *q = path;
    while (q < stop && is_path_char((unsigned char)*q)) q++;
    size_t path_len = (size_t)(q - path);
    if (path_len > MAX_PATH || stop - q < 11 || memcmp(q, " HTTP/1.1\r\n", 11) != 0 || !inference_path(path, path_len)) return NOT_OURS;
    q += 11;
    Header headers[MAX_HEADERS];
    size_t count = 0, length = 0;
    int keep_alive = 1, have_length = 0;
    while (q < stop) {
        const char *name = q;
        while (q < stop && is_tchar((unsigned char)*q)) q++;
        if (q == name || q == stop || *q != ':' || count == MAX_HEADERS) return NOT_OURS;
        size_t name_len = (size_t)(q - name);
        q++;
        while (q < stop && is_blank((unsigned char)*q)) q++;
        const char *value = q;
        while (q < stop && (is_blank((unsigned char)*q) || (*q >= 0x21 && *q <= 0x7e))) q++;
        if (q + 2 > stop || q[0] != '\r' || q[1] != '\n') return NOT_OURS;  /* a control byte, bare LF or obs-text */
        size_t raw_len = (size_t)(q - value), value_len = raw_len;  /* the value as llhttp gives it; its meaning without trailing blanks */
        while (value_len > 0 && is_blank((unsigned char)value[value_len - 1])) value_len--;
        q += 2;
        if (name_is(name, name_len, "content-length")) {
            if (have_length || value_len == 0 || value_len > 18) return NOT_OURS;
            for (size_t i = 0; i < value_len; i++) {
                if (value[i] < '0' || value[i] > '9') return NOT_OURS;
                length = length * 10 + (size_t)(value[i] - '0');
            }
            have_length = 1;
        } else if (name_is(name, name_len, "transfer-encoding") || name_is(name, name_len, "expect") ||
                   name_is(name, name_len, "upgrade")) {
            return NOT_OURS;
        } else if (name_is(name, name_len, "connection")) {
            if (name_is(value, value_len, "close")) keep_alive = 0;
            else if (!name_is(value, value_len, "keep-alive")) return NOT_OURS;
        }
        headers[count++] = (Header){name, value, name_len, raw_len};
    }
    if (!have_length || length > (length > self->max_body ? self->max_large : self->max_body)) return NOT_OURS;
    size_t body;
    if (body_arrived(self, end, length, &body) == PARTIAL_BODY) return PARTIAL_BODY;
    PyObject *pairs = PyTuple_New((Py_ssize_t)count);
    if (pairs == NULL) return FAILED;
    for (size_t i = 0; i < count; i++) {
        /* a new object, filled here: one made from the bytes may be a shared one (a 1-byte name's singleton) */
        PyObject *name = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)headers[i].name_len);
        if (name != NULL) {
            char *lower = PyBytes_AS_STRING(name);
            for (size_t j = 0; j < headers[i].name_len; j++)
                lower[j] = headers[i].name[j] >= 'A' && headers[i].name[j] <= 'Z' ? headers[i].name[j] | 0x20 : headers[i].name[j];
        }
        PyObject *pair = name ? Py_BuildValue("(Ny#)", name, headers[i].value, (Py_ssize_t)headers[i].value_len) : NULL;
        if (pair == NULL) {
            Py_DECREF(pairs);
            return FAILED;
        }
        PyTuple_SET_ITEM(pairs, (Py_ssize_t)i, pair);
    }
    PyObject *path_str = PyUnicode_FromStringAndSize(path, (Py_ssize_t)path_len);
    PyObject *raw = PyBytes_FromStringAndSize(path, (Py_ssize_t)path_len);
    *event = path_str && raw ? event_of(path_str, raw, pairs, p + end, body, keep_alive) : NULL;
    /* a request whose body came whole has its head kept for the next one (not a large one handed over at its head) */
    if (*event != NULL && body == length && remember(self, end, path_str, raw, pairs, length, keep_alive) < 0) Py_CLEAR(*event);
    Py_XDECREF(path_str);
    Py_XDECREF(raw);
    Py_DECREF(pairs);
    if (*event == NULL) return FAILED;
    self->body_left = (Py_ssize_t)(length - body);  /* the rest of a large body: the caller's to read */
    *size = end + body;
    return TAKEN;
}

static int append(Session *self, const char *data, size_t n) {
    if (n == 0) return 0;
    if (self->len + n > self->cap) {
        size_t cap = self->cap ? self->cap : 4096;
        while (cap < self->len + n) cap *= 2;
        char *grown = PyMem_Realloc(self->buf, cap);
        if (grown == NULL) return -1;
        self->buf = grown;
        self->cap = cap;
    }
    memcpy(self->buf + self->len, data, n);
    self->len += n;
    return 0;
}

static void consume(Session *self, size_t n) {
    memmove(self->buf, self->buf + n, self->len - n);
    self->len -= n;
    self->scanned = 0;
    self->need = 0;
}

static int Session_init(Session *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"max_head", "max_body", "max_large", NULL};
    Py_ssize_t max_head, max_body, max_large = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nn|n", keywords, &max_head, &max_body, &max_large)) return -1;
    if (max_head < 64 || max_body < 0 || max_head > (1 << 24) || max_body > (1 << 30) || max_large < 0 || max_large > ((Py_ssize_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "64 <= max_head <= 2**24, 0 <= max_body <= 2**30 and 0 <= max_large <= 2**40");
        return -1;
    }
    self->max_head = (size_t)max_head;
    self->max_body = (size_t)max_body;
    self->max_large = (size_t)max_large;  /* at most max_body: no large requests */
    return 0;
}

static void Session_dealloc(Session *self) {
    PyMem_Free(self->buf);
    PyMem_Free(self->prev_head);
    Py_XDECREF(self->prev_path);
    Py_XDECREF(self->prev_raw);
    Py_XDECREF(self->prev_pairs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Session_receive(Session *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *events = PyList_New(0);
    self->body_left = 0;
    if (events == NULL || self->closed) {
        PyBuffer_Release(&data);
        return events;
    }
    int rc = append(self, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    if (rc < 0) {
        Py_DECREF(events);
        return PyErr_NoMemory();
    }
    if (self->fallback) return events;  /* the bytes wait for rest() */
    size_t taken = 0;
    for (;;) {
        PyObject *event = NULL;
        size_t size = 0;
        int found = parse(self, &event, &size);
        if (found == FAILED) {
            Py_DECREF(events);
            return NULL;
        }
        if (found == NOT_OURS) self->fallback = 1;
        if (found != TAKEN) {
            self->state = found == PARTIAL_HEAD ? (self->len ? 1 : 0) : found == PARTIAL_BODY ? 2 : 0;
            break;
        }
        taken++;
        int appended = PyList_Append(events, event);
        int close = PyTuple_GET_ITEM(event, 4) == Py_False;
        Py_DECREF(event);
        consume(self, size);
        if (appended < 0) {
            Py_DECREF(events);
            return NULL;
        }
        if (close) {  /* nothing after it is read: the connection closes once it is answered */
            self->closed = 1;
            self->len = 0;
            self->state = 0;
            break;
        }
        if (self->body_left) {  /* the caller reads the rest of its body: nothing buffered after it */
            self->state = 0;
            break;
        }
    }
    return events;
}

static PyObject *Session_rest(Session *self, PyObject *unused) {
    PyObject *rest = PyBytes_FromStringAndSize(self->buf, (Py_ssize_t)self->len);
    if (rest != NULL) {
        self->len = 0;
        self->scanned = self->need = 0;
        self->state = 0;
    }
    return rest;
}

static PyMethodDef Session_methods[] = {
    {"receive", (PyCFunction)Session_receive, METH_O, "Feed bytes read from the socket; the complete requests taken."},
    {"rest", (PyCFunction)Session_rest, METH_NOARGS, "The bytes buffered and not taken (the fallback's), emptying the buffer."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Session_members[] = {
    {"fallback", T_INT, offsetof(Session, fallback), READONLY, "A request it does not take has begun: rest() is the general parser's."},
    {"state", T_INT, offsetof(Session, state), READONLY, "0: nothing partial buffered; 1: a partial head; 2: a partial body."},
    {"body_left", T_PYSSIZET, offsetof(Session, body_left), READONLY, "The bytes of the last event's (large) body still to come; 0: none."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "service.native._h1http.Session",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One HTTP/1.1 connection's parser for the inference routes.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Session_init,
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_methods = Session_methods,
    .tp_members = Session_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_h1http", .m_doc = "HTTP/1.1 inference requests, parsed in C.", .m_size = -1,
};

PyMODINIT_FUNC PyInit__h1http(void) {
    if (PyType_Ready(&SessionType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Session", (PyObject *)&SessionType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
