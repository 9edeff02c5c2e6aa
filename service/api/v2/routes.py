"""/v2: the Open Inference Protocol (KServe v2) with Triton's extensions (binary tensor data, system
shared memory, model repository, model configuration), so tritonclient, perf_analyzer and KServe
clients talk to vkact as to Triton. Each operator is a model (see dataplane.models); an inference is parsed
(v2.codec, v2.encoding), run through the data plane as /v1 is (dataplane.execution) and answered (v2.outputs).
A graph loaded through the repository (api.repository, dataplane.graph_models) is a model too, inferred
by v2.graph_infer. This module is the inference and /v2's X-Request-ID; health, metadata, readiness,
configuration and the model repository are v2.control's routes."""
from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from collections.abc import Iterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH, CodecError, frame_parts

from ...errors import VkactError
from ...operators import OperatorDesc
from ...shared_memory import Region, SharedMemoryRegistry
from ...dataplane import descriptor_key, ready_device
from ..execution import FrameResponse, answered, binary_frame, frame_headers, count_against, request_body, run_on_device, within_budget
from ..chunked_body import ChunkInput, Chunks
from ..header_cache import HeaderCache
from ..runtime import Runtime, device_worker, runtime
from ...limits import INLINE_BYTES
from ..json_text import check_answer_values, in_json_thread
from .codec import InferenceRequest, build_operator, decode_inputs, json_inputs, json_length, padded, parse_frame
from .encoding import choose_encoding, compress
from ...dataplane.models import MODELS, find_model
from ...jobs import LARGE, Result
from .outputs import OutputPlan, encode_response, output_bytes, plan_outputs

router = APIRouter(prefix="/v2", tags=["v2"])



class RequestIdMiddleware:
    """X-Request-ID on /v2: the caller's, or a new one, is returned on every response (errors included)
    and is the inference response's ``id`` when the body gives none."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v2" or path.startswith("/v2/")):
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id_of(scope: Scope) -> bytes:
    """The X-Request-ID a /v2 response carries: the caller's when valid (kept in the scope's state as
    ``client_request_id``), else a new random one (a UUID4's 32 hex digits, without a UUID object)."""
    given = b""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            given = value
    valid = 0 < len(given) <= 200 and given.isascii() and given.decode().isprintable()
    scope.setdefault("state", {})["client_request_id"] = given.decode() if valid else None
    if valid:
        return given
    return _fresh_id()


_ID_POOL = 256  # request ids' random bytes drawn at once: os.urandom is a getrandom(2) syscall a call


def _fresh_ids() -> Iterator[bytes]:
    """UUID4s' 32 hex digits, from the same random bytes as uuid4 (os.urandom), drawn for 256 at a time."""
    while True:
        pool = bytearray(os.urandom(16 * _ID_POOL))
        for start in range(0, len(pool), 16):
            fresh = pool[start : start + 16]
            fresh[6] = fresh[6] & 0x0F | 0x40  # version 4
            fresh[8] = fresh[8] & 0x3F | 0x80  # RFC 4122 variant
            yield fresh.hex().encode()


def fresh_request_id() -> bytes:
    """A new X-Request-ID (see request_id_of)."""
    return _fresh_id()


def _new_pool() -> None:  # at import, and in a forked child: never the parent's ids again
    global _fresh_id
    _fresh_id = _fresh_ids().__next__


_new_pool()
os.register_at_fork(after_in_child=_new_pool)


# -- inference ----------------------------------------------------------------------------------------


class Regions:
    """The shared memory regions one request uses, each opened once and closed when the request ends."""

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._stack: ExitStack | None = None  # made with the first region: most requests use none
        self._opened: dict[str, Region] = {}

    def __call__(self, name: str) -> Region:
        if name not in self._opened:
            if self._stack is None:
                self._stack = ExitStack()
            self._opened[name] = self._stack.enter_context(self._registry.use(name))
        return self._opened[name]

    def __enter__(self) -> Regions:
        return self

    def __exit__(self, *exc: object) -> None:
        self._opened.clear()
        if self._stack is not None:
            self._stack.close()


@dataclass
class _Parsed:
    """What a repeated binary request's JSON header decides (see header_cache): no shared memory, every
    input binary; ``head``: the response's JSON header when it carries no id."""

    req: InferenceRequest
    op: OperatorDesc
    key: bytes
    binary: list[tuple[int, int]]  # (offset, size) of each input after the header, in descriptor order
    plans: list[OutputPlan]
    head: bytes | None = None
    frame_headers: list[tuple[bytes, bytes]] | None = None  # the response's HTTP headers with ``head``, uncompressed
    in_place = False  # an inference never runs in place (/v1 may: its Parsed says)

    @staticmethod
    def of(req: InferenceRequest, op: OperatorDesc, plans: list[OutputPlan]) -> _Parsed | None:
        where, offset = {}, 0
        for tensor in req.inputs:
            params = tensor.parameters or {}
            if tensor.data is not None or "shared_memory_region" in params or "binary_data_size" not in params:
                return None
            where[tensor.name] = (offset, params["binary_data_size"])
            offset += params["binary_data_size"]
        if any(plan.region is not None for plan in plans):
            return None
        return _Parsed(req, op, descriptor_key(op), [where[name] for name in op.input_fields], plans)

    def buffers(self, tail: memoryview) -> list[np.ndarray]:
        return [padded(tail[o : o + n], desc.total_bytes) for (o, n), desc in zip(self.binary, self.op.inputs)]

    def spans(self) -> list[tuple[int, int, int]]:
        """Where ``buffers`` cuts the tail: (offset, bytes, the buffer's bytes, zero-padded) of each input."""
        return [(o, n, desc.total_bytes) for (o, n), desc in zip(self.binary, self.op.inputs)]

    def output(self, result: Result) -> np.ndarray:
        """A repeated request's output bytes in ``result``'s slot; the response's HTTP headers with ``head``
        (which every frame of this header shares: one length) built the first time."""
        return np.frombuffer(self.output_view(result), np.uint8)

    def output_view(self, result: Result) -> memoryview:
        """``output`` as a memoryview (no numpy: the direct HTTP path copies it into its answer)."""
        assert self.head is not None
        data = result.output[: output_bytes(self.op)]
        if self.frame_headers is None:
            length = len(self.head)
            self.frame_headers = [(b"vary", b"Accept-Encoding"), *frame_headers(length, length + data.nbytes)]
        return data

    def sources(self, body: Chunks, start: int) -> list[ChunkInput]:
        """As buffers, from a body still in its chunks (the tail from ``start``): copied straight into the slot."""
        return [body.source(start + o, n, desc.total_bytes) for (o, n), desc in zip(self.binary, self.op.inputs)]


def repeated(state: Runtime, model: str, version: str | None, header_length: str, body: memoryview) -> tuple[_Parsed, memoryview] | None:
    """A repeated binary request whose answer is its header's cached frame (no id, no shared memory, no
    compression asked: the caller checks those headers), small (output at most LARGE bytes): its parse and
    its tensor bytes, for the direct HTTP path (service/http_direct.py). None for any other request, which
    _infer decides (every error included)."""
    try:
        raw, tail = frame_parts(body, header_length)
    except CodecError:
        return None
    parsed = _seen(state, model, version, raw, len(tail))
    if parsed is None or output_bytes(parsed.op) > LARGE:
        return None
    return parsed, tail


def repeated_large(state: Runtime, model: str, version: str | None, raw: bytes, tail_bytes: int) -> _Parsed | None:
    """``repeated`` for a large body whose JSON header (``raw``) has been read and whose ``tail_bytes`` of
    tensors are still on the socket (service/http_body.py): its cached parse, where its tensors lie in
    the body in the descriptor's order, back to back (each read straight into its place in the slot);
    any output size. None: _infer decides."""
    parsed = _seen(state, model, version, raw, tail_bytes)
    if parsed is None:
        return None
    cursor = 0
    for offset, size in parsed.binary:
        if offset != cursor:
            return None
        cursor += size
    return parsed if cursor == tail_bytes else None


def _seen(state: Runtime, model: str, version: str | None, raw: bytes | memoryview, tail_bytes: int) -> _Parsed | None:
    """The cached parse of a binary request's JSON header ``raw`` answered from its cached frame (``head``)."""
    if model not in MODELS:  # a graph model, or unknown
        return None
    try:
        model_class = find_model(model, version)
        max_tensor_bytes = ready_device(state.worker)["max_tensor_bytes"]
    except VkactError:
        return None
    cache: HeaderCache[_Parsed] = state.v2_headers
    parsed = cache.get(cache.key(raw, model_class, tail_bytes, max_tensor_bytes))
    return parsed if parsed is not None and parsed.head is not None else None


def _parse(body: memoryview, header_length: str | None, model: type[OperatorDesc], max_tensor_bytes: int,
           max_json_values: int) -> tuple[InferenceRequest, memoryview, OperatorDesc]:
    req, tail = parse_frame(body, header_length, model, max_json_values)
    return req, tail, build_operator(model, req, max_tensor_bytes)


@within_budget
async def _infer(request: Request, model: str, version: str | None) -> Response:
    started = time.perf_counter()
    model_class = find_model(model, version)
    count_against(request, model_class.type_name())  # failures from here on count against the model
    state = runtime(request)
    worker = device_worker(request)
    max_tensor_bytes = ready_device(worker)["max_tensor_bytes"]
    limit = state.settings.max_body_bytes
    headers = request.headers
    header_length = headers.get(HEADER_LENGTH)
    framed = header_length is not None and header_length != "0"  # a JSON header + binary tensors, maybe repeated
    body = await request_body(request, limit, chunks=framed)
    cache: HeaderCache[_Parsed] = state.v2_headers
    key = parsed = None
    if framed:
        if isinstance(body, Chunks) and header_length.isdigit() and int(header_length) <= body.nbytes:
            raw, tail = body.head(int(header_length)), body  # tail: the chunks from the header's length on
        else:
            body = await body.joined() if isinstance(body, Chunks) else body
            raw, tail = frame_parts(body, header_length)
        key = cache.key(raw, model_class, body.nbytes - len(raw), max_tensor_bytes)
        parsed = cache.get(key)
        if parsed is None and isinstance(body, Chunks):  # a header not seen before: parsed from the body whole
            body = await body.joined()
            raw, tail = frame_parts(body, header_length)
    large = json_length(body, header_length) > INLINE_BYTES  # parsed and decoded in a thread: the loop stays free
    if parsed is not None:
        req, op = parsed.req, parsed.op
    else:
        args = (body, header_length, model_class, max_tensor_bytes, state.settings.max_json_values)
        req, tail, op = await in_json_thread(_parse, *args) if large else _parse(*args)
    request_id = req.id if req.id is not None else getattr(request.state, "client_request_id", None)

    with Regions(state.shared_memory) as region:
        if parsed is not None:
            plans = parsed.plans
            buffers = parsed.sources(tail, len(raw)) if isinstance(tail, Chunks) else parsed.buffers(tail)
        else:
            # JSON data of a large text is decoded in a JSON thread; regions are read by decode_inputs
            decoded = await in_json_thread(json_inputs, op, req) if large else None
            buffers = await decode_inputs(op, req, tail, region, decoded)
            plans = plan_outputs(op, req, region)
            if any(not plan.binary and plan.region is None for plan in plans):
                check_answer_values(output_bytes(op) // op.output.DataType.info.size, state.settings.max_json_values,
                                    "outputs", "ask for binary_data_output")
            if key is not None and (parsed := _Parsed.of(req, op, plans)) is not None:
                cache.put(key, parsed)
        bytes_in = sum(b.nbytes for b in buffers)
        coding = choose_encoding(request.headers.get("accept-encoding"))
        result = await run_on_device(request, op, buffers, key=parsed.key if parsed is not None else None)
        del buffers
        if result is None:  # the client left
            return Response(status_code=499)
        held = None  # the result, when its slot is sent as it is (released once written)
        try:
            repeated = parsed is not None and parsed.head is not None and request_id is None
            if repeated:
                data = parsed.output(result)
                header_length = len(parsed.head)
                if coding is None and data.nbytes > LARGE:  # to the socket from the slot: no frame copied
                    held = result
                    response = FrameResponse((parsed.head, data), parsed.frame_headers, result, state.settings.body_timeout_s)
                    return answered(response, request, op, started, result, bytes_in, op.output.total_bytes)
                content = await binary_frame(parsed.head, [data])
            else:
                content, header_length = await encode_response(model, op, req, request_id, plans, result, region)
                if parsed is not None and request_id is None and header_length is not None and all(p.binary for p in plans):
                    parsed.head = bytes(content[:header_length])
        finally:
            if held is None:
                result.release()

    if repeated and coding is None:  # the headers of this header's frames, built once
        return answered(FrameResponse(content, parsed.frame_headers), request, op, started, result, bytes_in, op.output.total_bytes)
    headers = {"Vary": "Accept-Encoding"}
    media_type = "application/json"
    if header_length is not None:
        headers[HEADER_LENGTH] = str(header_length)  # the uncompressed JSON's length, as Triton sends it
        media_type = BINARY_CONTENT_TYPE
    if coding is not None:
        content = await compress(content, coding)
        headers["Content-Encoding"] = coding
    return answered(Response(content, media_type=media_type, headers=headers), request, op, started, result, bytes_in, op.output.total_bytes)


@router.post("/models/{model}/infer", summary="Run the operator, or the graph model")
async def infer(request: Request, model: str) -> Response:
    if model not in MODELS and runtime(request).graphs.has(model):
        return await _infer_graph(request, model, None)
    return await _infer(request, model, None)


@router.post("/models/{model}/versions/{version}/infer", summary="Run the operator, or the graph model (one version)")
async def infer_version(request: Request, model: str, version: str) -> Response:
    if model not in MODELS and runtime(request).graphs.has(model):
        return await _infer_graph(request, model, version)
    return await _infer(request, model, version)


async def _infer_graph(request: Request, model: str, version: str | None) -> Response:
    from .graph_infer import infer_graph  # imports this module's Regions

    return await infer_graph(request, await runtime(request).graphs.find(model, version))
