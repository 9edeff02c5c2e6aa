"""A device worker process's life, seen from the HTTP process: its start, its ready report, the watchdog
over a hung device, memory given back when idle, its close, and its death: the jobs it held failed and
another started after a delay (restart_backoff). ``service.worker.DeviceWorker`` is this with the jobs
that the worker runs; the child's own side is ``service.worker_process``.

What belongs to one worker process is here: its pipes and their framing, the jobs on it (a death fails
them), the in-flight window they hold, the job templates it knows, the slots both sides map.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from . import framing
from .config import Settings
from .cpu_placement import PROCESS_CPUS, choose_cpu, set_thread_cpus, unpinned_executor
from .errors import WorkerLost
from .jobs import Job, TemplateIds, Window
from .limits import IN_FLIGHT
from .restart_backoff import STABLE_S, RestartBackoff
from .slots import SlotPool
from .worker_process import worker_main

log = logging.getLogger("vkact.worker")
# A dead worker is started again after this delay, doubling with each death in a row of one that had not
# served STABLE_S since its ready report (restart_backoff); a worker starts in 1-1.5 s on lavapipe here.
FIRST_RESTART_DELAY_S, MAX_RESTART_DELAY_S = 0.2, 5.0
WATCH_INTERVAL_S = 1.0  # how often the HTTP side looks for a job stuck on the device


def longest_wait(jobs: Iterable[Job], built_at: float, now: float) -> tuple[float, str]:
    """What the watchdog weighs against device_timeout_s: the longest a job has been on the device, or a
    graph program's build has run (the worker builds one at a time, in order: the build under way began
    at the last one's end, ``built_at``, or when the oldest parked job came if later; a job parked behind
    other builds is not hung), in seconds, and which of the two it is."""
    on_device = [job.started_at for job in jobs if job.parked_at is None]
    parked = [job.parked_at for job in jobs if job.parked_at is not None]
    running = now - min(on_device) if on_device else 0.0
    building = now - max(min(parked), built_at) if parked else 0.0
    if running >= building:
        return running, "a job has been on the device"
    return building, "a graph's pipelines have been building"


class WorkerLifecycle(ABC):
    """One device worker process's life on the HTTP side. Use from the event loop only; a subclass
    reads the worker's messages (``_on_message``, called when the replies' pipe is readable)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.info: dict[str, Any] | None = None      # the worker's ready report (device, limits)
        self.restarts = 0
        self._inflight: dict[int, Job] = {}          # jobs on the worker, by id
        self._inflight_batches = 0                   # the messages that carried them, each a place in the window
        self._built_at = 0.0                         # perf_counter time of the worker's last graph build's end ("built", "late")
        self._window = Window(IN_FLIGHT)
        self._pool = SlotPool(settings.queue_size + IN_FLIGHT, self._forget, settings.slot_bytes)
        self._trimmed_at = time.monotonic()
        self._templates = TemplateIds()
        self._proc: mp.process.BaseProcess | None = None
        self._jobs: Connection | None = None         # this side's ends of the two pipes (see start)
        self._replies: Connection | None = None
        self._reader: framing.Reader | None = None
        self._writer: framing.Writer | None = None    # every message to the worker, in order, never blocking
        self._ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # kept: each get_running_loop() is a getpid() on 3.11
        self._watchdog: asyncio.TimerHandle | None = None
        self._restart: asyncio.TimerHandle | None = None  # the start of the next worker, after a death
        self._closing = False
        self._started_at = 0.0                      # monotonic time of the worker's start
        self._ready_at: float | None = None          # and of its ready report, None until it came
        self._backoff = RestartBackoff(FIRST_RESTART_DELAY_S, MAX_RESTART_DELAY_S)
        self.pinned_cpu: int | None = None           # the event loop's CPU, when pinned

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self) -> None:
        """Start a worker process; it is ready when its report comes (``wait_ready``)."""
        ctx = mp.get_context("spawn")  # never fork a process that may hold Vulkan state or threads
        # One pipe each way, not one socket pair both ways: on a socket pair, this side's read of a reply
        # woke the worker's job thread, blocked reading the same socket, for nothing (the write-space wake
        # of a unix stream socket); and a pipe's write and read cost less than a socket's (two processes
        # on one CPU, a 21-byte job and its reply: 3.0 us a round trip against 4.6). bench/RESULTS.md
        # ("The device hop after v1lat's profile") has what it changed in the service.
        jobs_in, self._jobs = ctx.Pipe(duplex=False)
        self._replies, replies_out = ctx.Pipe(duplex=False)
        self._reader = framing.Reader(self._replies.fileno())
        self._templates = TemplateIds()  # a new worker knows none
        cpu = choose_cpu(self.settings.pin_cpu, self.settings.workers)
        self._proc = ctx.Process(target=worker_main, args=(jobs_in, replies_out, self.settings.model_dump(), cpu, PROCESS_CPUS),
                                 name="vkact-device", daemon=True)
        self._proc.start()
        self._started_at = time.monotonic()
        self._ready_at = None
        jobs_in.close()
        replies_out.close()
        loop = self._loop = asyncio.get_running_loop()
        self._writer = framing.Writer(self._jobs.fileno(), loop)
        loop.add_reader(self._replies.fileno(), self._on_message)
        loop.add_reader(self._proc.sentinel, self._on_exit)
        if self._watchdog is None:
            self._watchdog = loop.call_later(WATCH_INTERVAL_S, self._watch)

    def _watch(self) -> None:
        """Kill a worker whose oldest job has been on the device for longer than device_timeout_s: a
        hung device or driver must not hold the service. Its jobs fail, readiness drops until the
        restarted worker reports, and the queue moves again (Kubernetes stops routing here meanwhile).
        A worker still starting after worker_start_timeout_s is killed the same way."""
        if self._closing:
            return
        self._watchdog = asyncio.get_running_loop().call_later(WATCH_INTERVAL_S, self._watch)
        if time.monotonic() - self._trimmed_at >= self.settings.idle_release_s:
            self._trim()
        if self._proc is None or not self._proc.is_alive():
            return
        if not self._ready.is_set():  # still starting: a driver may hang in device creation too
            starting = time.monotonic() - self._started_at
            if starting > self.settings.worker_start_timeout_s:
                log.error("the device worker has not reported ready in %.0f s (worker_start_timeout_s %g): killing it", starting, self.settings.worker_start_timeout_s)
                self._proc.kill()
            return
        if not self._inflight:
            return
        seconds, what = longest_wait(self._inflight.values(), self._built_at, time.perf_counter())
        if seconds > self.settings.device_timeout_s:
            log.error("%s for %.0f s (device_timeout_s %g): killing the device worker", what, seconds, self.settings.device_timeout_s)
            self._proc.kill()  # _on_exit fails its jobs and starts another

    def _trim(self) -> None:
        """Return idle memory: this side's unused slots, and (told by a message) the engine's buffers."""
        self._trimmed_at = time.monotonic()
        removed = self._pool.trim()
        if removed:
            log.info("removed %d idle tensor slot(s)", removed)
        if self._writer is not None and self._ready.is_set():
            try:
                self._writer.send("trim")
            except OSError:
                pass

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def close(self) -> None:
        self._closing = True
        if self._watchdog:
            self._watchdog.cancel()
        if self._restart:  # closed while a dead worker's restart waits: none is started after
            self._restart.cancel()
        loop = asyncio.get_running_loop()
        if self._proc is not None:
            loop.remove_reader(self._proc.sentinel)
            if self._replies is not None and self._writer is not None:
                loop.remove_reader(self._replies.fileno())
                try:
                    self._writer.send("stop")  # after whatever still waits to be written
                except OSError:
                    pass
            await asyncio.get_running_loop().run_in_executor(None, self._proc.join, 5)
            if self._proc.is_alive():
                self._proc.kill()
        if self._writer is not None:
            self._writer.close()
        self._pool.close()

    def _forget(self, path: str) -> None:
        self._templates.drop_slot(path)
        if self._writer is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._writer.send("forget", path)
            except OSError:
                pass

    @abstractmethod
    def _on_message(self) -> None:
        """Read the worker's messages: the replies' pipe is readable (its subclass's, which knows the jobs)."""

    def _on_ready(self, info: dict[str, Any]) -> None:
        """The worker's ready report: its device, limits and the CPU of its job thread."""
        self.info = info
        self._pin_loop(info["pinned_cpu"])
        self._ready_at = time.monotonic()
        self._ready.set()
        log.info("device worker ready: %s", info["device"]["name"])

    def _pin_loop(self, cpu: int | None) -> None:
        """Put the event loop on the CPU of the worker's job thread (see cpu_placement), once."""
        if cpu is None or self.pinned_cpu == cpu:
            return
        loop = asyncio.get_running_loop()
        if self.pinned_cpu is None:
            loop.set_default_executor(unpinned_executor())
        if set_thread_cpus({cpu}):
            self.pinned_cpu = cpu
            log.info("event loop and device job thread on CPU %d", cpu)

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._proc is not None and self._replies is not None and self._writer is not None
        loop.remove_reader(self._proc.sentinel)
        loop.remove_reader(self._replies.fileno())
        self._writer.close()  # what waited for the dead worker is not for the next one
        # its sentinel is readable once it has exited, but exitcode stays None until it is reaped
        self._proc.join(0.1)
        code = self._proc.exitcode
        self._ready.clear()
        for job in self._inflight.values():
            job.release()
            if not job.future.done():
                job.future.set_exception(WorkerLost(f"the device worker exited (code {code}) while running this request; it is restarting, retry"))
        for _ in range(self._inflight_batches):
            self._window.release()
        self._inflight.clear()
        self._inflight_batches = 0
        if self._closing:
            return
        self.restarts += 1
        delay = self._backoff.after_death(None if self._ready_at is None else time.monotonic() - self._ready_at, STABLE_S)
        log.error("device worker exited with code %s; restarting in %.1f s (restart %d)", code, delay, self.restarts)
        self._restart = loop.call_later(delay, self.start)
