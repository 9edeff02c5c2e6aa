"""service/native/h1http.c, the C parser of the HTTP port's inference requests, against httptools (llhttp,
uvicorn's parser) as the oracle: what it takes it reads as httptools does; what it does not take it
leaves whole, from the request's first byte, to httptools."""
from __future__ import annotations

import httptools
import pytest

from service.native import h1http

# Driver-independent (test-portability.sh leaves them to make test): a parser against httptools, no device
pytestmark = pytest.mark.driver_independent

MAX_HEAD, MAX_BODY = 16384, 65536


def session() -> h1http.Session:
    return h1http.Session(MAX_HEAD, MAX_BODY)


def oracle(raw: bytes) -> list[tuple[bytes, list[tuple[bytes, bytes]], bytes, bool]]:
    """The requests httptools reads in ``raw``: (URL, headers lower-cased, body, keep-alive)."""
    found: list = []

    class Callbacks:
        def on_message_begin(self) -> None:
            self.url, self.headers, self.body = b"", [], b""

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name.lower(), value))

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            found.append((self.url, self.headers, self.body, parser.should_keep_alive()))

    parser = httptools.HttpRequestParser(Callbacks())
    parser.feed_data(raw)
    return found


def request(path: bytes = b"/v2/models/relu/infer", body: bytes = b'{"inputs": []}', extra: bytes = b"") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: vkact\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


TAKEN = [
    request(),
    request(b"/v1/execute", b"x" * 1000),
    request(b"/v2/models/relu/versions/1/infer", b"", b"Connection: keep-alive\r\n"),
    request(body=b"\x00\xff" * 2048, extra=b"Inference-Header-Content-Length: 12\r\nX-Request-ID:   spaced value \t \r\n"),
    request(extra=b"CONNECTION: Close\r\n"),
    request(body=b"b" * MAX_BODY),
]


@pytest.mark.parametrize("raw", TAKEN, ids=range(len(TAKEN)))
def test_taken_requests_read_as_httptools_reads_them(raw):
    events = session().receive(raw)
    assert [(raw_path, headers, body, keep_alive) for _, raw_path, headers, body, keep_alive in events] == oracle(raw)
    assert events[0][0] == events[0][1].decode()


def test_every_split_of_pipelined_requests_gives_the_same_events():
    raw = request() + request(b"/v1/execute", b"abc") + request(body=b"0123456789")
    whole = session().receive(raw)
    assert len(whole) == 3
    for cut in range(1, len(raw)):
        s = session()
        first = s.receive(raw[:cut])
        assert s.state in (0, 1, 2) and not s.fallback
        assert first + s.receive(raw[cut:]) == whole, cut
        assert s.state == 0


def test_the_state_says_what_is_partial():
    s = session()
    assert s.receive(b"POST /v1/exec") == [] and s.state == 1
    assert s.receive(b"ute HTTP/1.1\r\nContent-Length: 4\r\n\r\nab") == [] and s.state == 2
    assert len(s.receive(b"cd")) == 1 and s.state == 0


NOT_TAKEN = {
    "another method": b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
    "another route": request(b"/v2/repository/index"),
    "a query": request(b"/v1/execute?x=1"),
    "a percent-escape": request(b"/v2/models/re%6Cu/infer"),
    "HTTP/1.0": request().replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "chunked": b"POST /v1/execute HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "no length": b"POST /v1/execute HTTP/1.1\r\nHost: x\r\n\r\n",
    "two lengths": request(extra=b"Content-Length: 14\r\n"),
    "a signed length": request().replace(b"Content-Length: 14", b"Content-Length: +14"),
    "Expect": request(extra=b"Expect: 100-continue\r\n"),
    "Upgrade": request(extra=b"Connection: Upgrade\r\nUpgrade: websocket\r\n"),
    "another Connection": request(extra=b"Connection: keep-alive, TE\r\n"),
    "a body over the bound": request(body=b"b" * (MAX_BODY + 1)),
    "a folded header": request(extra=b"X-A: 1\r\n folded\r\n"),
    "a space before the colon": request(extra=b"X-A : 1\r\n"),
    "a control byte": request(extra=b"X-A: \x01\r\n"),
    "obs-text": request(extra=b"X-A: caf\xe9\r\n"),
    "a bare LF": request().replace(b"\r\nHost", b"\nHost"),
    "a bare CR": request().replace(b"\r\nHost", b"\rHost"),
    "too many headers": request(extra=b"".join(b"X-%d: v\r\n" % i for i in range(70))),
    "a head over the bound": request(extra=b"X-Long: " + b"v" * MAX_HEAD + b"\r\n"),
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
}


@pytest.mark.parametrize("raw", NOT_TAKEN.values(), ids=NOT_TAKEN.keys())
def test_requests_it_does_not_take_go_whole_to_the_fallback(raw):
    taken = request(b"/v1/execute", b"first")
    s = session()
    events = s.receive(taken + raw)
    assert [e[1] for e in events] == [b"/v1/execute"] and s.fallback
    assert s.rest() == raw  # from its first byte, nothing consumed
    assert s.receive(request()) == [] and s.rest() == request()  # the connection is the fallback's from then on


def test_garbage_falls_back_before_the_head_ends():
    """httptools answers 400 at the first bad byte: the fallback must see it as soon as it comes."""
    for partial in (b"GET", b"POST /v1/execute HTTP/1.1\r\nX-A: \x00", b"POST /v1/execute\n", b"PUT /"):
        s = session()
        s.receive(partial)
        assert s.fallback and s.rest() == partial, partial


def test_nothing_after_connection_close_is_read():
    s = session()
    events = s.receive(request(extra=b"Connection: close\r\n") + request(b"/v1/execute"))
    assert len(events) == 1 and events[0][4] is False
    assert s.receive(request()) == [] and s.state == 0 and not s.fallback


def test_a_partial_request_holds_at_most_its_head_and_body_bound():
    s = session()
    head = b"POST /v1/execute HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % MAX_BODY
    s.receive(head)
    for _ in range(MAX_BODY // 4096 - 1):
        assert s.receive(b"b" * 4096) == [] and s.state == 2
    events = s.receive(b"b" * 4096 + b"POST /v1/exe")
    assert len(events) == 1 and len(events[0][3]) == MAX_BODY and s.state == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        h1http.Session(10, 10)
    with pytest.raises(ValueError):
        h1http.Session(MAX_HEAD, -1)


def test_a_one_letter_header_name_leaves_the_shared_bytes_alone():
    """Found by the fuzz target: lower-casing a name in place changed CPython's shared 1-byte object b"L"
    (every b"L" of the process read b"l" after it)."""
    events = session().receive(b"POST /v1/execute HTTP/1.1\r\nL: X\r\nContent-Length: 0\r\n\r\n")
    assert events[0][2][0] == (b"l", b"X")
    assert bytes([ord("L")]) == b"L" and bytes([ord("X")]) == b"X"


MAX_LARGE = 1 << 20


def large_session() -> h1http.Session:
    return h1http.Session(MAX_HEAD, MAX_BODY, MAX_LARGE)


def test_a_large_request_is_handed_over_at_its_head_with_what_came_of_its_body():
    """A Content-Length over max_body (up to max_large): its event comes as soon as its head is complete,
    its body what had arrived, body_left the rest; the bytes after it (the caller reads the body itself)
    are the next request's."""
    body = bytes(range(256)) * 1024  # 256 KiB
    raw = request(body=body, extra=b"Inference-Header-Content-Length: 12\r\n")
    head = raw[: len(raw) - len(body)]
    [(url, headers, _, keep_alive)] = oracle(raw)
    for got in (0, 1, 5000):  # body bytes that came with the head's last byte
        s = large_session()
        assert s.receive(head[:-1]) == [] and s.body_left == 0
        (event,) = s.receive(raw[len(head) - 1 : len(head) + got])
        assert event[3] == body[:got] and s.body_left == len(body) - got and s.state == 0 and not s.fallback
        assert (event[1], event[2], event[4]) == (url, headers, keep_alive)
        assert len(s.receive(request(b"/v1/execute"))) == 1 and s.body_left == 0  # the next request, read as ever


def test_requests_before_a_large_one_come_first_and_a_whole_one_is_an_ordinary_event():
    big = request(b"/v1/execute", b"z" * (MAX_BODY + 10))
    s = large_session()
    events = s.receive(request() + big[:-3])
    assert [len(e[3]) for e in events] == [14, MAX_BODY + 7] and s.body_left == 3
    s = large_session()
    events = s.receive(request() + big + request())  # the large body came whole: nothing left to read
    assert [len(e[3]) for e in events] == [14, MAX_BODY + 10, 14] and s.body_left == 0
    assert events == [(p.decode(), p, h, b, k) for (p, h, b, k) in oracle(request() + big + request())]


def test_a_large_request_with_connection_close_ends_the_reading_and_one_over_max_large_falls_back():
    s = large_session()
    events = s.receive(request(body=b"c" * (MAX_BODY + 1), extra=b"Connection: close\r\n")[:-1])
    assert len(events) == 1 and events[0][4] is False and s.body_left == 1
    assert s.receive(request()) == []  # nothing after Connection: close
    over = request(body=b"d" * (MAX_LARGE + 1))
    s = large_session()
    assert s.receive(over[:200]) == [] and s.fallback and s.rest() == over[:200]
    s = session()  # without max_large: a body over max_body is the fallback's, as before
    assert s.receive(request(body=b"e" * (MAX_BODY + 1))[:300]) == [] and s.fallback


def test_a_repeated_head_gives_what_a_fresh_parse_gives():
    """A request whose head repeats the previous whole request's byte for byte takes that request's path,
    raw path and header pairs (the same objects) without a parse: its event must equal a fresh session's
    parse of its bytes, across every split, with other requests (another head, Connection: close, a
    different Content-Length, a large one) between the repeats."""
    first = request(b"/v1/execute", b"a" * 100, b"Inference-Header-Content-Length: 4\r\n")
    again = request(b"/v1/execute", b"b" * 100, b"Inference-Header-Content-Length: 4\r\n")  # same head, other body
    other = request(b"/v1/execute", b"c" * 101, b"Inference-Header-Content-Length: 4\r\n")  # one length byte differs
    close = request(b"/v1/execute", b"d" * 100, b"Inference-Header-Content-Length: 4\r\nConnection: close\r\n")
    raw = first + again + again + other + first + again + close + again
    fresh = [e for part in (first, again, again, other, first, again, close) for e in session().receive(part)]
    assert [e[3] for e in fresh] == [b"a" * 100, b"b" * 100, b"b" * 100, b"c" * 101, b"a" * 100, b"b" * 100, b"d" * 100]
    for cut in range(0, len(raw), 7):
        s = session()
        events = s.receive(raw[:cut]) + s.receive(raw[cut:])
        assert events == fresh, cut  # nothing after Connection: close is read
        assert [keep for *_, keep in events] == [True] * 6 + [False]
        assert events[2][2] is not events[1][2] and events[2][2] == events[1][2]  # a new list: the caller may change it
        if cut == 0:
            assert events[2][0] is events[1][0] and events[2][2][0] is events[1][2][0]  # the previous pairs, kept


def test_a_repeat_after_a_large_request_is_parsed_again():
    """A large request (handed over at its head) is not kept: the next whole request's head is compared
    with the last whole one's, and a head equal to the large one's is a large request again."""
    s = h1http.Session(MAX_HEAD, 64, 1024)
    small, large = request(body=b"s" * 10), request(body=b"L" * 500)
    events = s.receive(small + large[:200])
    assert [len(e[3]) for e in events] == [10, 500 - s.body_left] and s.body_left > 0
    s2 = h1http.Session(MAX_HEAD, 64, 1024)
    assert s2.receive(small + small) == session().receive(small) * 2
    s3 = h1http.Session(MAX_HEAD, 64, 1024)
    got = s3.receive(small + large[:200])
    assert len(got) == 2 and s3.body_left == len(large) - 200 and got[1][3] == large[len(large) - 500 : 200]
    assert s3.receive(small) == session().receive(small)  # the whole request after it, parsed against the small one's head


def test_a_large_request_that_came_whole_and_is_repeated_is_handed_over_at_its_head_again():
    """Found by the fuzz target: a large request whose body came in the same read as its head is an ordinary
    event and its head is kept; its repeat (same head, its body still coming) waited in the buffer for the
    whole body (past the buffer's bound, and uncharged by the caller) where a fresh parse hands it over at its
    head with body_left: the events depended on how the bytes were split."""
    s = h1http.Session(MAX_HEAD, 64, 1024)
    large = request(body=b"L" * 500, extra=b"Inference-Header-Content-Length: 2\r\n")
    head = len(large) - 500
    (whole,) = s.receive(large)
    assert whole[3] == b"L" * 500 and s.body_left == 0
    (again,) = s.receive(large[: head + 7])
    assert again[3] == b"L" * 7 and s.body_left == 493 and s.state == 0 and not s.fallback
    assert [again] == h1http.Session(MAX_HEAD, 64, 1024).receive(large[: head + 7])  # as a fresh parse
    assert s.receive(request()) == session().receive(request())  # the bytes after its body: the next request
