"""What the device worker's messages do to the jobs on it, on the HTTP side: answered (their futures set,
each execution counted), failed with the request's error, or, for graph jobs parked while their
program's pipelines built, handed back to the head of the queue to be sent again.
``service.worker.DeviceWorker`` is this with the queue's other end: the requests, their batching and
the messages that send them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable

from .config import Settings
from .errors import DeviceFailure, VkactError
from .jobs import Job
from .operators import OperatorDesc
from .worker_lifecycle import WorkerLifecycle

log = logging.getLogger("vkact.worker")


class WorkerReplies(WorkerLifecycle):
    """The worker's replies to the jobs on it. Use from the event loop only."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._queue: deque[Job] = deque()            # jobs waiting for the window (sent by _pump)
        self._resent_ahead = 0                       # graph jobs back from a build at the queue's head, in order
        self._answers: list[Job] = []  # lone jobs done whose on_done _on_message calls after its pump
        #: told (operator type, jobs, kernel seconds) for each dispatch the device answers: an execution
        self.on_execution: Callable[[type[OperatorDesc], int, float], None] | None = None

    @abstractmethod
    def _pump(self) -> None:
        """Send queued jobs while the window has room: called once a read's messages are handled."""

    def _on_message(self) -> None:
        """The worker's messages that one read brings (the descriptor is readable: it does not block)."""
        assert self._replies is not None and self._reader is not None
        try:
            messages = self._reader.ready()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._replies.fileno())
            return
        try:
            for msg in messages:
                self._handle(msg)
            self._pump()  # the answers gave room back (or the worker is ready): the next batches leave now
        finally:  # whatever raised above, the jobs done are answered (as their futures' callbacks would be)
            answers, self._answers = self._answers, []
            for job in answers:  # after the pump: the queue's next batch is on the device while these are written
                try:
                    job.on_done(job.future)  # type: ignore[misc]
                except Exception:  # noqa: BLE001 - as the loop logs a done callback's error: the others still answered
                    log.exception("answering job %d failed", job.id)

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            self._on_ready(msg[1])
            return
        if kind == "late":  # parked graph jobs whose build failed: their places went back at "building"
            self._built_at = time.perf_counter()
            self._answer(msg[1])
            return
        if kind == "built":  # parked graph jobs whose program is built: sent again, first in the queue
            self._built_at = time.perf_counter()
            self._requeue(msg[1])
            return
        self._inflight_batches -= 1
        self._window.release()
        if kind == "building":  # a graph job held while its pipelines build beside the job thread
            job = self._inflight.get(msg[1])
            if job is not None:
                job.parked_at = time.perf_counter()
            return
        if kind == "ok":  # a replayed job alone (id, kernel seconds): the bulk of the replies
            self._done(msg[1], msg[2])
            return
        # "oks": (kernel seconds, ids) of the jobs of one dispatch; "done": a reply per job, each
        # (id, "done", kernel seconds, batch size) or (id, "error", ...)
        if kind == "oks":
            self._answer([(job_id, "done", msg[1], len(msg[2])) for job_id in msg[2]])
        else:
            self._answer(msg[1])

    def _requeue(self, job_ids: list[int]) -> None:
        """Parked graph jobs back at the head of the queue, behind those back from earlier builds and in
        their order (first built, first sent again): the pump that follows this read sends them into the
        window as any graph job (each timed on the device from then, interleaved with the others)."""
        for job_id in job_ids:
            job = self._inflight.pop(job_id, None)
            if job is None:
                continue
            job.parked_at = None
            if job.future.done():  # the client left while its pipelines built
                job.release()
            else:
                self._queue.insert(self._resent_ahead, job)
                self._resent_ahead += 1

    def _answer(self, replies: list[tuple]) -> None:
        """Each reply's job answered: (id, "done", kernel seconds, batch size) or (id, "error", ...)."""
        executions: list[tuple[type[OperatorDesc], int, float]] = []  # (operator, batch size, kernel seconds)
        for reply in replies:
            job = self._inflight.pop(reply[0], None)
            if job is None:
                continue
            if reply[1] == "done" and job.op is not None:  # a graph's execution: its data plane counts it
                executions.append((type(job.op), reply[3], reply[2]))
            if job.future.done():  # the client left while the device worked
                job.release()
            elif reply[1] == "done":
                job.future.set_result((reply[2], reply[3]))
            else:
                _, _, cls, message, fieldname = reply
                job.release()
                job.future.set_exception(_error(cls, message, fieldname))
        if executions and self.on_execution is not None:  # whether or not each job's client stayed
            # the jobs of one dispatch each report its size: one execution; jobs run alone (a batch
            # that failed is retried one by one) report 1 each
            for op, size, seconds in executions[:1] if executions[0][1] > 1 else executions:
                self.on_execution(op, size, seconds)

    def _done(self, job_id: int, kernel_seconds: float) -> None:
        """``_handle``'s "ok": one job done in a dispatch of its own. Its future is set first; the
        execution is counted after the callbacks that the future has scheduled (the direct HTTP path
        writes its answer from one), so that the count is not on the answer's path."""
        job = self._inflight.pop(job_id, None)
        if job is None:
            return
        future = job.future
        if future.done():  # the client left while the device worked
            job.release()
        elif job.on_done is not None:  # answered by _on_message, after its pump, not from a loop turn later
            future.remove_done_callback(job.on_done)
            future.set_result((kernel_seconds, 1))
            self._answers.append(job)
        else:
            future.set_result((kernel_seconds, 1))
        if job.op is not None and self.on_execution is not None:  # not a graph's job: its data plane counts those
            loop = self._loop
            assert loop is not None
            loop.call_soon(self.on_execution, type(job.op), 1, kernel_seconds)


def _error(cls: str, message: str, fieldname: str | None) -> VkactError:
    from . import errors

    kind = getattr(errors, cls, None)
    if isinstance(kind, type) and issubclass(kind, VkactError):
        err = kind.__new__(kind)
        VkactError.__init__(err, message, fieldname)
        return err
    return DeviceFailure(message, fieldname)
