"""Execution, whichever front-end asked: the call to the device worker with its timeout and the client's
departure (``watched``: operators' and graphs' alike), and the bookkeeping of one answered execution (vkact's own metrics and Triton's per-model
statistics, counted here once for every protocol)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..errors import Timeout
from ..operators import OperatorDesc
from ..jobs import LARGE, Repeatable, Result, Source
from .metrics import ModelStats

T = TypeVar("T")

if TYPE_CHECKING:
    from ..api.runtime import Runtime


def execute(
    state: Runtime, op: OperatorDesc, buffers: Sequence[np.ndarray | Source], in_place: bool = False, key: bytes | None = None,
    departure: Callable[[], Awaitable[object]] | None = None,
) -> Awaitable[Result | None]:
    """Run ``op`` on the device worker, whichever protocol asked (await it). None means the client left
    while the job was queued (the caller answers 499): the job is dropped before it reaches the device.
    Busy (queue full) propagates; no answer within the request timeout is a Timeout (504) (see
    ``watched``). Not a coroutine itself: it hands back ``watched``'s, one coroutine frame less per
    request (0.3-0.5 us with the device stubbed)."""
    worker = state.worker
    assert worker is not None
    return watched(state, worker.run(op, buffers, in_place, key, state.metrics.triton.pending(op).add), buffers, departure, op)


async def watched(
    state: Runtime, job: Awaitable[T], buffers: Sequence[np.ndarray | Source], departure: Callable[[], Awaitable[object]] | None,
    counted: OperatorDesc | ModelStats | None,
) -> T | None:
    """Await ``job`` (a device worker's ``run`` or ``run_graph`` on ``buffers``) under the request
    timeout (Timeout, 504) and the client's departure (None: the caller answers 499; ``counted``, the
    model's Triton statistics, counts a failure), for operators and graphs alike.

    The caller's task awaits the worker; the timeout and the client's departure cancel it (the worker
    frees the job's slot once neither the device nor a copy thread can touch it: worker._submit,
    slots.write_in_thread). ``departure()`` returns when the client has gone (HTTP: the disconnect
    message; gRPC needs none, grpcio cancels the handler's task itself). A job that goes straight to
    an idle device is not watched for departure (that needs a task of its own, a large share of a small
    request's cost): once on the device it runs to the end either way."""
    worker = state.worker
    assert worker is not None
    deadlines = state.deadlines
    loop = asyncio.get_running_loop()  # once: each look-up is a getpid() system call on Python 3.11
    task = asyncio.current_task(loop)
    assert task is not None
    stopped: list[str] = []   # why this request's task was cancelled, by us
    finished = False

    def stop(reason: str = "timeout") -> None:
        if not finished and not stopped:
            stopped.append(reason)
            task.cancel()

    deadline = deadlines.add(stop, loop)
    watcher = None
    if departure is not None and (not worker.idle or sum(b.nbytes for b in buffers) > LARGE):
        watcher = asyncio.ensure_future(departure())
        watcher.add_done_callback(lambda w: w.cancelled() or w.exception() is not None or stop("gone"))
    try:
        return await job
    except asyncio.CancelledError:
        if not stopped or task.uncancel() > 0:  # not ours, or cancelled for another reason too
            raise
        if stopped[0] == "gone":
            if counted is not None:
                state.metrics.triton.failure(counted)
            return None
        raise _timeout(state) from None
    finally:
        finished = True
        deadlines.done(deadline)
        if watcher is not None:
            watcher.cancel()


def startable(state: Runtime) -> bool:
    """Whether ``start`` may send a job now (the device worker idle): where it may not, the caller need not
    prepare one for it."""
    return state.worker is not None and state.worker.idle


def start(state: Runtime, rep: Repeatable, tensors: memoryview, answer: Callable[[Result | None, BaseException | None], None],
          loop: asyncio.AbstractEventLoop) -> bool:
    """``execute`` without a coroutine, where nothing must wait: ``rep``'s job on ``tensors`` handed to the
    device worker now (``DeviceWorker.submit_repeat``: the worker idle, small inputs copied here) and ``answer(result, None)``
    called from ``loop`` with its Result, or ``answer(None, exc)`` with what ``execute`` would have
    raised (Timeout after the request timeout, the worker's errors); False, and nothing done, where the
    job cannot go at once: the caller awaits ``execute``. The client's departure is not watched, as
    ``watched`` does not watch a job that goes straight to an idle device; Busy (no slot) propagates.
    Like ``submit_repeat`` it raises only before the job is sent: what follows the send cannot fail."""
    job = state.worker.submit_repeat(rep, tensors)  # type: ignore[union-attr]
    if job is None:
        return False
    worker, deadlines, future = state.worker, state.deadlines, job.future
    deadline = deadlines.add(future.cancel, loop)  # cancelled: the worker frees the slot when it is done with it

    def done(_: asyncio.Future) -> None:
        job.on_done = None  # job -> done -> job: a cycle that would hold the request (its body, its connection) until a GC pass
        deadlines.done(deadline)
        if future.cancelled():
            answer(None, _timeout(state))
        elif (exc := future.exception()) is not None:
            answer(None, exc)
        else:
            answer(worker.result(job, *future.result()), None)  # type: ignore[union-attr]

    future.add_done_callback(done)  # what completes the future otherwise (a timeout, a lost worker, an error)
    job.on_done = done  # the device's answer: DeviceWorker calls it at once
    return True


def _timeout(state: Runtime) -> Timeout:
    return Timeout(f"no answer from the device within {state.deadlines.seconds} s")


def record_success(state: Runtime, op: OperatorDesc, started: float, result: Result, bytes_in: int, bytes_out: int) -> None:
    """The bookkeeping of one answered execution, whichever protocol carried it."""
    metrics = state.metrics
    elapsed = time.perf_counter() - started
    metrics.operator(op.type_name()).record(elapsed, result.queue_seconds, result.kernel_seconds, bytes_in, bytes_out)
    metrics.triton.success(op, elapsed, result.queue_seconds, result.kernel_seconds)
