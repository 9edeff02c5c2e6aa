"""The direct HTTP/1.1 path (service/http_direct.py): a repeated binary inference h1http parsed is answered
without ASGI, byte for byte as the route answers it (the protocol's ``direct_app`` unset: the route on
uvicorn's cycle), with the route's guarantees: statistics, the error handlers' answers counted against
the model, X-Request-ID, pipelining order with reading paused, Connection: close, the client's departure
cancelling its job. In-process: the protocol on a recording transport, the device worker stubbed (the
numerics over the real worker are test_http_native's)."""
from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from client.codec import HEADER_LENGTH
from service.api import create_app
from service.dataplane.deadlines import Deadlines
from service.errors import Busy
from service.http_direct import DirectCycle
from service.http_native import NativeHttpProtocol
from service.operators import parse_operator
from tests.service.helpers import binary_request, request_body
from tests.service.test_hot_routes import EchoWorker


class Transport(asyncio.Transport):
    """What the protocol writes, and whether it paused reading or closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = self.paused = False

    def write(self, data) -> None:
        self.written += data

    def writelines(self, parts) -> None:
        for part in parts:
            self.written += part

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


x = np.linspace(-2, 2, 12, dtype=np.float32)
V2_HEAD = json.dumps({"inputs": [{"name": "InputTensor", "shape": [12], "datatype": "FP32", "parameters": {"binary_data_size": 48}}],
                      "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}).encode()
V1_BODY, V1_HEADERS = binary_request(request_body("IDENTITY", x), x.view(np.uint8))


def http(path: str, body: bytes, headers: dict) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: vkact", *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


V2 = http("/v2/models/identity/infer", V2_HEAD + x.tobytes(), {HEADER_LENGTH: len(V2_HEAD)})
V1 = http("/v1/execute", V1_BODY, V1_HEADERS)


def answers(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    out = []
    while data:
        head, _, rest = bytes(data).partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        n = int(headers["content-length"])
        out.append((int(lines[0].split()[1]), headers, rest[:n]))
        data = rest[n:]
    return out


class Harness:
    def __init__(self, worker=None, access_log: bool = False) -> None:
        self.app = create_app()
        self.app.runtime.worker = worker or EchoWorker()
        self.config = Config(self.app, access_log=access_log, log_config=None)  # uvicorn leaves logging as it is
        self.config.load()

    def connect(self, direct: bool = True) -> tuple[NativeHttpProtocol, Transport]:
        proto = NativeHttpProtocol(config=self.config, server_state=ServerState(), app_state={})
        transport = Transport()
        proto.connection_made(transport)
        if not direct:
            proto.direct_app = None  # every request on the route, as before the direct path
        return proto, transport

    def stats(self, model: str = "identity"):
        return self.app.runtime.metrics.triton.model(model)


async def settle(proto: NativeHttpProtocol) -> None:
    """Until the protocol's tasks are done and gone from its set. uvicorn discards a task from a done
    callback, a loop turn after it ends, and Python 3.12's gather returns without a loop turn when every
    task is done already: without the sleep a task that ended in this turn stays in the set and the loop
    never turns again (a hang)."""
    while proto.tasks:
        await asyncio.gather(*proto.tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the discards of the tasks just ended run first


def test_settle_returns_once_the_protocols_tasks_have_ended_and_left_its_set(monkeypatch):
    """A task that ended in this very loop turn, its discard still to come, as the connection's last
    answer can leave it: settle must let the discard run (under 3.12 a gather alone spins on it). The
    gather here is 3.12's on every version: of tasks all done, it is done at once (3.11's turns the loop
    first, which hid the hang: without this the test passed under 3.11 with or without the fix)."""
    gathered = 0
    real = asyncio.gather

    def gather(*tasks, **kwargs):
        nonlocal gathered
        gathered += 1
        assert gathered < 100, "settle gathers over and over without a loop turn"
        if tasks and all(task.done() for task in tasks):
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)  # settle reads no result
            return done
        return real(*tasks, **kwargs)

    async def nothing() -> None:
        pass

    class Ended:  # a request cycle whose task ends at its first step
        def run_asgi(self, app):
            return nothing()

    async def run():
        proto, _ = Harness().connect()
        HttpToolsProtocol._start_asgi_task(proto, Ended(), None)  # uvicorn's way: the discard a done callback
        await asyncio.sleep(0)  # the task's step runs, then this one: its discard comes after
        (task,) = proto.tasks
        ended_not_discarded = task.done()
        monkeypatch.setattr(asyncio, "gather", gather)
        await settle(proto)
        return ended_not_discarded, proto.tasks

    ended_not_discarded, left = asyncio.run(run())
    assert ended_not_discarded and not left


def comparable(answer):
    status, headers, body = answer
    assert len(headers.pop("x-request-id", "x" * 32)) == 32  # a fresh UUID4's hex on /v2
    return status, headers, body


@pytest.mark.parametrize("request_bytes", [V2, V1], ids=["v2", "v1"])
def test_repeated_requests_take_the_direct_path_and_answer_as_the_route(request_bytes):
    async def run():
        harness = Harness()
        written, kinds = {}, []
        for direct in (True, False):
            proto, transport = harness.connect(direct)
            for _ in range(3):
                proto.data_received(request_bytes)
                await settle(proto)
                kinds.append((direct, type(proto.cycle) is DirectCycle))  # answered on it (not handed to the route)
            written[direct] = [comparable(a) for a in answers(transport.written)]
        return harness, written, kinds

    harness, written, kinds = asyncio.run(run())
    # the first request parses the header (the route); the repeats are direct, and only with it on
    assert kinds == [(True, False), (True, True), (True, True), (False, False), (False, False), (False, False)]
    assert written[True] == written[False]
    for status, _, body in written[True]:
        assert status == 200 and body.endswith(x.tobytes())
    assert harness.stats().nv_inference_request_success == 6


def test_pipelined_direct_requests_are_answered_in_order_with_reading_paused():
    seen = []

    class Recording(EchoWorker):
        async def run(self, op, buffers, in_place, key=None, waiting=None):
            seen.append(bytes(buffers[0]))
            await asyncio.sleep(0.01)
            return await super().run(op, buffers, in_place, key, waiting)

    async def run():
        harness = Harness(Recording())
        proto, transport = harness.connect()
        proto.data_received(V2)
        await settle(proto)  # the header is cached now
        tensors = [np.full(12, i, np.float32) for i in range(4)]
        raw = b"".join(http("/v2/models/identity/infer", V2_HEAD + t.tobytes(), {HEADER_LENGTH: len(V2_HEAD)}) for t in tensors)
        proto.data_received(raw + http("/v1/execute", V1_BODY, {**V1_HEADERS, "Connection": "close"}))
        paused = transport.paused and len(proto.pipeline) == 4
        while not transport.closed:
            await settle(proto)
            await asyncio.sleep(0)
        return transport, tensors, paused

    transport, tensors, paused = asyncio.run(run())
    assert paused
    got = answers(transport.written)
    assert [status for status, _, _ in got] == [200] * 6
    assert [body[-48:] for _, _, body in got[1:5]] == [t.tobytes() for t in tensors]
    assert got[5][2].endswith(x.tobytes()) and got[5][1]["connection"] == "close"
    assert seen[1:5] == [t.tobytes() for t in tensors]


class Failing(EchoWorker):
    """EchoWorker until ``fail`` is set: then each job raises it (an exception) or hangs that many seconds."""

    def __init__(self) -> None:
        self.fail: Exception | float | None = None
        self.runs = 0

    async def run(self, op, buffers, in_place, key=None, waiting=None):
        self.runs += 1
        if isinstance(self.fail, Exception):
            raise self.fail
        if self.fail is not None:
            await asyncio.sleep(self.fail)
        return await super().run(op, buffers, in_place, key, waiting)


async def second_answer(harness: Harness, worker: Failing, request: bytes, fail: Exception | float, direct: bool = True):
    """The answer to ``request`` repeated on a new connection, its job failing with ``fail``; and whether
    it was on the direct path when it was read."""
    proto, transport = harness.connect(direct)
    worker.fail = None
    proto.data_received(request)
    await settle(proto)
    worker.fail = fail
    proto.data_received(request)
    taken = type(proto.cycle) is DirectCycle
    await settle(proto)
    return taken, comparable(answers(transport.written)[1])


def test_an_error_on_the_direct_path_is_the_error_handlers_answer_counted_against_the_model():
    async def run():
        worker = Failing()
        harness = Harness(worker)
        busy = Busy("the device queue is full; retry shortly")
        got = {direct: await second_answer(harness, worker, V2, busy, direct) for direct in (True, False)}
        return harness, got, worker.runs

    harness, got, runs = asyncio.run(run())
    assert got[True][0] and not got[False][0]
    assert runs == 4  # the direct path's failed job is answered, not run again on the route
    assert got[True][1] == got[False][1]
    status, headers, body = got[True][1]
    assert status == 503 and headers["retry-after"] == "1" and "queue is full" in json.loads(body)["error"]
    assert harness.stats().nv_inference_request_failure == 2


def test_a_timeout_on_the_direct_path_is_504():
    async def run():
        worker = Failing()
        harness = Harness(worker)
        harness.app.runtime.deadlines = Deadlines(0.05)
        return harness, await second_answer(harness, worker, V1, 60.0), worker.runs

    harness, (taken, (status, _, body)), runs = asyncio.run(run())
    assert taken and runs == 2
    assert status == 504 and json.loads(body)["error"]
    assert harness.stats().nv_inference_request_failure == 1


def test_a_v1_header_whose_first_job_failed_is_answered_directly_once_one_succeeds():
    """/v1 caches a binary header before its job runs and builds the answer's head with the first answer:
    the direct path may meet the header before any answer was built."""
    async def run():
        worker = Failing()
        harness = Harness(worker)
        harness.app.runtime.deadlines = Deadlines(0.05)
        proto, transport = harness.connect()
        worker.fail = 60.0
        proto.data_received(V1)
        await settle(proto)
        worker.fail = None
        proto.data_received(V1)
        await settle(proto)
        return type(proto.cycle) is DirectCycle, answers(transport.written)

    direct, got = asyncio.run(run())
    assert direct
    assert [status for status, _, _ in got] == [504, 200]
    assert got[1][2].endswith(x.tobytes()) and json.loads(got[1][2][: int(got[1][1][HEADER_LENGTH.lower()])])["Operator"]


def test_a_departing_client_cancels_its_queued_job_and_gets_no_answer():
    started, cancelled = [], []

    class Queued(EchoWorker):
        idle = False  # jobs queue: their requests watch for the client's departure

        async def run(self, op, buffers, in_place, key=None, waiting=None):
            if len(started) < 1:
                started.append(1)
                return await super().run(op, buffers, in_place, key, waiting)
            started.append(1)
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(1)
                raise

    async def run():
        harness = Harness(Queued())
        proto, transport = harness.connect()
        proto.data_received(V2)
        await settle(proto)
        before = len(transport.written)
        proto.data_received(V2)
        direct_taken = type(proto.cycle) is DirectCycle
        for _ in range(5):
            await asyncio.sleep(0)
        proto.connection_lost(None)
        await asyncio.wait_for(settle(proto), 10)
        return harness, direct_taken, len(transport.written) - before

    harness, direct_taken, written_after = asyncio.run(run())
    assert direct_taken and started == [1, 1] and cancelled == [1]
    assert written_after == 0
    assert harness.stats().nv_inference_request_failure == 1  # counted as the route counts a departure


@pytest.mark.parametrize("extra", [{"X-Request-ID": "caller-7"}, {"Accept-Encoding": "gzip"}, {"X-Forwarded-For": "10.0.0.1"}],
                         ids=["request id", "compressed answer", "forwarded"])
def test_requests_the_direct_path_leaves_to_the_route(extra):
    async def run():
        harness = Harness()
        proto, transport = harness.connect()
        body = V2_HEAD + x.tobytes()
        request = http("/v2/models/identity/infer", body, {HEADER_LENGTH: len(V2_HEAD), **extra})
        kinds = []
        for _ in range(2):
            proto.data_received(request)
            await settle(proto)
            kinds.append(type(proto.cycle) is DirectCycle)
        return kinds, answers(transport.written)

    kinds, got = asyncio.run(run())
    assert kinds == [False, False]
    assert [status for status, _, _ in got] == [200, 200]
    if "X-Request-ID" in extra:
        assert got[1][1]["x-request-id"] == "caller-7"
    if "Accept-Encoding" in extra:
        assert got[1][1]["content-encoding"] == "gzip"


def test_with_the_access_log_on_every_request_is_logged_on_uvicorns_cycle():
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    async def run():
        harness = Harness(access_log=True)
        access = logging.getLogger("uvicorn.access")
        handler, level = Lines(), access.level
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        try:
            proto, transport = harness.connect()
            kinds = []
            for _ in range(2):
                proto.data_received(V2)
                await settle(proto)
                kinds.append(type(proto.cycle) is DirectCycle)
        finally:
            access.removeHandler(handler)
            access.setLevel(level)
        return kinds, answers(transport.written)

    kinds, got = asyncio.run(run())
    assert kinds == [False, False] and [status for status, _, _ in got] == [200, 200]
    assert sum("/v2/models/identity/infer" in line for line in lines) == 2


def test_a_repeated_header_length_is_read_as_the_route_reads_it():
    """Two Inference-Header-Content-Length headers, a wrong one first: the first counts, on the direct path
    as on the route (a 400), though the second would split the body as a cached header."""
    async def run():
        got = {}
        for direct in (True, False):
            harness = Harness()
            proto, transport = harness.connect(direct)
            proto.data_received(V2)
            await settle(proto)
            body = V2_HEAD + x.tobytes()
            head = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: vkact\r\n%s: 3\r\n%s: %d\r\nContent-Length: %d\r\n\r\n"
                    % (HEADER_LENGTH.encode(), HEADER_LENGTH.encode(), len(V2_HEAD), len(body)))
            proto.data_received(head + body)
            await settle(proto)
            got[direct] = comparable(answers(transport.written)[1])
        return got

    got = asyncio.run(run())
    assert got[True] == got[False] and got[True][0] == 400 and json.loads(got[True][2])["error"]


def test_a_connection_whose_requests_change_is_answered_for_each_as_it_is():
    """The direct path keeps a connection's previous route and /v1 look-up (http_direct.Repeat): a request
    that differs from the previous one only in its JSON header (of the same length: another operator) or
    its tensor, or that adds a header the route must see, is answered for what it is."""
    def v1(kind: str, data: np.ndarray, **extra) -> bytes:
        body, headers = binary_request(request_body(kind, data), data.view(np.uint8))
        return http("/v1/execute", body, {**headers, **extra})

    relu, gelu = v1("RELU", x), v1("GELU", x)
    assert len(relu) == len(gelu) and relu != gelu
    y = (x * 3).astype(np.float32)
    sequence = [relu, relu, gelu, gelu, relu, v1("RELU", y), v1("RELU", y, **{"X-Request-ID": "caller-7"}), relu, V2, V2, relu]

    async def run():
        harness = Harness()
        proto, transport = harness.connect()
        kinds = []
        for request in sequence:
            proto.data_received(request)
            await settle(proto)
            kinds.append(type(proto.cycle) is DirectCycle)
        return harness, kinds, answers(transport.written)

    harness, kinds, got = asyncio.run(run())
    # first sight of each header: the route; the request with X-Request-ID: the route (direct_route leaves it there)
    assert kinds == [False, True, False, True, True, True, False, True, False, True, True]
    assert [status for status, _, _ in got] == [200] * len(sequence)
    tails = [x, x, x, x, x, y, y, x, x, x, x]
    for (_, headers, body), tail in zip(got, tails):
        assert body.endswith(tail.tobytes())  # the echo worker answers the input: this request's, not the previous one's
    metrics = harness.app.runtime.metrics
    relu_name, gelu_name = (parse_operator(request_body(k, x)).type_name() for k in ("RELU", "GELU"))
    assert metrics.operator(relu_name).ok == 7 and metrics.operator(gelu_name).ok == 2
