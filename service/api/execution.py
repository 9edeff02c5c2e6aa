"""The execution path that /v1 and /v2 share: the request body, the device call with its timeout and
disconnect handling, and the metrics of one execution (vkact's own and Triton's per-model names)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
from fastapi import Request

from ..errors import InvalidRequest, PayloadTooLarge, Timeout
from ..operators import OperatorDesc
from ..worker import Result, copy_into


async def read_body(request: Request, limit: int) -> memoryview:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest(f"Content-Length must be an integer, got {declared!r}", "Content-Length")
        if int(declared) > limit:
            raise PayloadTooLarge(f"the body is {declared} bytes; this service accepts at most {limit}", "Content-Length")
    # Filled in place: np.empty maps its pages lazily as chunks arrive, where a zeroed bytearray, or
    # one grown chunk by chunk, would spend tens of milliseconds on the event loop for a large body.
    body = np.empty(int(declared) if declared is not None else 1 << 16, np.uint8)
    filled = 0
    async for chunk in request.stream():
        end = filled + len(chunk)
        if end > limit:
            raise PayloadTooLarge(f"the body exceeds {limit} bytes", "Content-Length")
        if end > body.nbytes:  # chunked transfer: grow geometrically
            body = np.concatenate((body[:filled], np.empty(max(end, 2 * body.nbytes) - filled, np.uint8)))
        body[filled:end] = np.frombuffer(chunk, np.uint8)
        filled = end
    return memoryview(body[:filled])


async def _until_disconnected(request: Request) -> None:
    # Only called once the body has been read: what remains on the channel is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_on_device(request: Request, op: OperatorDesc, buffers: Sequence[np.ndarray], in_place: bool = False) -> Result | None:
    """Run ``op`` on the device worker. None means the client left first (the caller answers 499):
    a job still queued then is dropped before it reaches the device. Busy (queue full) propagates;
    no answer within the request timeout is a Timeout (504)."""
    state = request.app.state
    settings = state.settings
    pending = state.metrics.triton.pending(op)
    pending.inc()
    try:
        job = asyncio.ensure_future(state.worker.run(op, buffers, in_place))
        gone = asyncio.ensure_future(_until_disconnected(request))
        done, _ = await asyncio.wait({job, gone}, timeout=settings.request_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if job not in done:
            job.cancel()
            if gone in done:
                state.metrics.triton.failure(op)
                return None
            raise Timeout(f"no answer from the device within {settings.request_timeout_s} s")
        return job.result()
    finally:
        pending.dec()


async def binary_frame(head: bytes, buffers: Sequence[np.ndarray]) -> memoryview:
    """A JSON header followed by tensor bytes (Triton's binary frame), built in one allocation; large
    copies run in a thread, so the event loop stays free."""
    frame = np.empty(len(head) + sum(b.nbytes for b in buffers), np.uint8)
    frame[: len(head)] = np.frombuffer(head, np.uint8)
    cursor = len(head)
    for b in buffers:
        await copy_into(frame[cursor : cursor + b.nbytes], b)
        cursor += b.nbytes
    return memoryview(frame)


def record_success(request: Request, op: OperatorDesc, started: float, result: Result, bytes_in: int, bytes_out: int) -> None:
    """The bookkeeping of one answered execution, whichever protocol carried it."""
    metrics = request.app.state.metrics
    name = op.type_name()
    elapsed = time.perf_counter() - started
    metrics.requests.labels(name, "200").inc()
    metrics.request_seconds.labels(name).observe(elapsed)
    metrics.queue_seconds.labels(name).observe(result.queue_seconds)
    metrics.kernel_seconds.labels(name).observe(result.kernel_seconds)
    metrics.bytes_in.labels(name).inc(bytes_in)
    metrics.bytes_out.labels(name).inc(bytes_out)
    metrics.triton.success(op, elapsed, result.queue_seconds, result.kernel_seconds)
