"""The device worker process: it owns the Engine(s) and runs the jobs the HTTP side sends.

Started by ``service.worker.DeviceWorker`` (spawned, never forked); it reads framed messages from its
job pipe (``service.framing``), runs each job on views of its shared-memory slot (``service.slots``)
and answers on its reply pipe; what it does with each job is service.worker_engines'. kp is imported here
only, so the HTTP process never loads a Vulkan driver. A graph job whose program has no run yet is parked ("building": its place in the HTTP side's window goes
back) while service.graph_builds makes the run on a thread of its own; the job thread goes on with other
jobs. When the build's end wakes it, it takes the run and hands the parked jobs back ("built": the HTTP
side sends them again, as any graph job, into the window) or, when the build failed, answers them with its
error ("late").
"""
from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from . import framing
from .config import Settings
from .cpu_placement import BACK_AFTER_S, PROCESS_CPUS, LoadPlacement, set_thread_cpus, thread_ids
from .device_tuning import tuning_for
from .graph_builds import GraphBuilds
from .host_copy import Copier
from .slots import Mapping
from .vulkan_probe import choose, physical_devices
from .worker_engines import WorkerEngines

log = logging.getLogger("vkact.worker_process")
READ_AT_ONCE_S = 20e-6  # a read of a message already there: a system call, no wake-up


def _make_engine(make: Callable[[Settings], Any], config: Settings, cpus: frozenset[int], nice: int, inline: bool = False,
                 threads: set[int] | None = None) -> Any:
    """An Engine, made in a short-lived thread at niceness ``nice`` (``worker_nice`` on a CPU device,
    device_tuning) on ``cpus``: niceness and affinity
    are per thread on Linux and the threads a driver starts inherit both, so a CPU driver's threads
    (lavapipe's) yield to the HTTP process while this process's own thread, which takes jobs and
    submits them, keeps the default priority (measured, 8 clients of 1,024-element requests on 2
    cores: 1.5x the requests/s of a wholly niced worker). ``inline``: llvmpipe without a compute pool
    (LP_NUM_THREADS=0, read when its device is made), for one-workgroup dispatches. ``threads``, when
    given, is told the ids of the threads the driver started for it."""
    made: list[Any] = []

    def build() -> None:
        os.nice(nice)
        set_thread_cpus(cpus)
        saved = os.environ.get("LP_NUM_THREADS")
        if inline:
            os.environ["LP_NUM_THREADS"] = "0"
        before = thread_ids()
        try:
            made.append(make(config))
            if threads is not None:
                threads.update(thread_ids() - before - {threading.get_native_id()})
        except BaseException as exc:  # noqa: BLE001 - re-raised in the worker's thread
            made.append(exc)
        finally:
            if inline and saved is None:
                del os.environ["LP_NUM_THREADS"]
            elif inline:
                os.environ["LP_NUM_THREADS"] = saved

    thread = threading.Thread(target=build, name="vkact-engine-init")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    made[0].adopt()  # the worker's thread uses it from now on
    return made[0]


def _next_message(reader: framing.Reader, poller: select.poll, placement: LoadPlacement | None) -> tuple:
    """The next message, telling ``placement`` whether it was there at once and whether none came for
    a while. Near the event loop no system call is added to the blocking read (one request at a time
    pays for every one): a read that returns within READ_AT_ONCE_S found its message waiting, as one
    that blocked takes a wake-up at least."""
    if placement is None:
        return reader.next()
    if reader.has_message():
        placement.waited(False)
        return reader.next()
    if placement.away and not poller.poll(BACK_AFTER_S * 1000):
        placement.idle()
    started = time.perf_counter()
    msg = reader.next()
    placement.waited(time.perf_counter() - started > READ_AT_ONCE_S)
    return msg


def _next_beside_builds(reader: framing.Reader, either: select.poll, jobs_fd: int, builds: GraphBuilds,
                        placement: LoadPlacement | None, fd: int, engines: WorkerEngines) -> tuple | None:
    """``_next_message`` while graph jobs are parked: the next message, or None once builds that ended
    are handled (their messages sent). A build that has ended goes first, so that a stream of jobs does
    not hold it; the wait, when there is one, is timed for ``placement`` as ``_next_message`` times its
    read."""
    waited, ready = False, {}
    if not builds.ended() and not reader.has_message():
        started = time.perf_counter()
        ready = dict(either.poll(BACK_AFTER_S * 1000 if placement is not None and placement.away else None))
        waited = time.perf_counter() - started > READ_AT_ONCE_S
        if not ready and placement is not None:
            placement.idle()
    if builds.ended() or builds.fileno() in ready:  # (finished() drains the wake pipe)
        for kind, payload in engines.built_graphs():
            framing.send(fd, kind, payload)
    if not reader.has_message() and jobs_fd not in ready:
        return None
    if placement is not None:
        placement.waited(waited)
    return reader.next()


def worker_main(jobs: Connection, replies: Connection, settings: dict, cpu: int | None = None,
                cpus: frozenset[int] = frozenset()) -> None:
    """The device worker: it reads ``jobs`` and answers on ``replies`` (one pipe each way); ``cpu`` is
    the HTTP side's choice for the small-request path (see cpu_placement: taken on a CPU device under
    'auto'), ``cpus`` all of the service's CPUs."""
    from .engine import Engine  # kp is imported here, in the worker process only

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = Settings(**settings)
    cpus = cpus or PROCESS_CPUS
    set_thread_cpus(cpus)  # a worker restarted by a pinned event loop starts on that loop's CPU only
    tuning = tuning_for(choose(physical_devices(), config.device))  # before the driver starts threads
    nice = config.worker_nice if tuning.nice_driver_threads else 0
    # The large copies' helper thread, made here: at the job thread's niceness (a niced helper that took a
    # chunk and then got no CPU held the job thread up: host_copy), shared by both engines (one job thread).
    copier = Copier()
    engine = _make_engine(partial(Engine, copier=copier), config, cpus, nice)
    device = engine.device
    if cpu is not None and config.pin_cpu == "auto" and not tuning.pin_cpu:
        cpu = None  # 'auto' pins on a CPU device only (measured there; a GPU's driver threads are its own)
    if cpu is not None and not set_thread_cpus({cpu}):
        cpu = None
    small = None
    small_threads: set[int] = set()
    if tuning.small_dispatch_engine:
        small = _make_engine(partial(Engine, copier=copier), config, frozenset({cpu}) if cpu is not None else cpus, nice, inline=True,
                             threads=small_threads)
    placement = None
    if cpu is not None and cpus - {cpu}:  # pinned: away from the event loop's CPU while requests queue up
        copier.place(frozenset(cpus - {cpu}))  # the large copies' helper beside the job thread, never on its CPU
        placement = LoadPlacement(cpu, frozenset(cpus - {cpu}), frozenset({threading.get_native_id(), *small_threads}),
                                  frozenset(small_threads), nice)
    # a graph's builds: the driver's work, where and as its threads run (off the job thread's pinned CPU)
    engines = WorkerEngines(engine, small, GraphBuilds(engine, frozenset(cpus - {cpu}) if cpu is not None and cpus - {cpu} else cpus, nice))
    variants = engines.load_shaders()
    fd = replies.fileno()
    framing.send(fd, "ready", {
        "device": device.as_dict(),
        "memory": engine.memory,
        "max_tensor_bytes": engine.max_tensor_bytes,
        "features_enabled": sorted(engine.features_enabled),   # what the patched kp enabled
        "kernel_features": sorted(engine.kernel_features),     # what the kernels use (VKACT_NATIVE_64BIT)
        "nan_preserving_widths": list(engine.nan_preserving_widths),  # SignedZeroInfNanPreserve (spirv_float_controls)
        "max_workgroup_count": engine.max_workgroup_count,
        "local_size": engine.local_size,
        "shader_variants": variants,
        "pid": os.getpid(),
        "pinned_cpu": cpu,
        "small_dispatch_engine": small is not None,
        "max_batch": config.max_batch or tuning.max_batch,
        "slot_import_bytes": engine.slot_import_bytes,   # jobs from this size run on their slot's pages (engine_direct)
    })
    mappings: dict[str, Mapping] = {}
    reader = framing.Reader(jobs.fileno())
    poller = select.poll()
    poller.register(jobs.fileno(), select.POLLIN)
    builds = engines.builds
    either = select.poll()  # while a graph builds: a job, or the build's end
    either.register(jobs.fileno(), select.POLLIN)
    either.register(builds.fileno(), select.POLLIN)
    try:
        while True:
            try:
                msg = _next_message(reader, poller, placement) if not builds.pending() else \
                    _next_beside_builds(reader, either, jobs.fileno(), builds, placement, fd, engines)
            except EOFError:  # the HTTP process is gone
                break
            if msg is None:  # a build's end, handled
                continue
            if msg[0] == "stop":
                break
            if msg[0] == "go":
                framing.write(fd, engines.go(mappings, msg[1], msg[2]))
            elif msg[0] == "batch":
                framing.write(fd, engines.batch(mappings, msg[1]))
            elif msg[0] == "template":
                engines.define(msg[1], msg[2])
            elif msg[0] == "forget":
                engines.forget(mappings, msg[1])
            elif msg[0] == "trim":
                engines.trim()
            elif msg[0] == "graph":
                reply = engines.run_graph(mappings, msg[1])
                if reply is None:  # parked while its pipelines build: its place in the window goes back
                    framing.send(fd, "building", msg[1][0])
                else:
                    framing.send(fd, "done", [reply])
            else:  # the HTTP side sends no other kind: a bug there, not a reason to stop
                log.error("unknown message %r from the HTTP process", msg[0])
    finally:  # the build thread stopped before the engines go, however the loop ended
        engines.close()
        copier.close()  # made here for both engines, closed here
