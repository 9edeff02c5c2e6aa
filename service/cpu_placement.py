"""Where the threads of one small request run, on a CPU device (Linux).

A 1,024-element request passes through the HTTP process's event loop, the device worker's job
thread and lavapipe's submit thread (Mesa always starts one for it; on the engine for one-workgroup
dispatches that thread also runs the workgroup: see worker_process.py). Each hand-off between threads on
different CPUs is an inter-processor wake-up, and on a virtual machine waking an idle vCPU costs tens
of microseconds: a 1,024-element dispatch takes 52 us through lavapipe with its threads free and
17.5 us with them on one CPU (measured on the 2-vCPU CI machine). So with ``pin_cpu`` the event
loop, the job thread and the small-dispatch engine's threads share one CPU while requests come one at
a time, and the job thread and that engine's threads move to the other CPUs while they queue up
(LoadPlacement); the threads of the engine for larger dispatches stay free, so large kernels keep
every CPU.

Only Linux has per-thread affinity through ``os.sched_setaffinity``; elsewhere nothing is pinned.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("vkact.cpu")


def allowed_cpus() -> frozenset[int]:
    """The CPUs the calling thread may run on (its cgroup's cpuset, taskset), or empty where unknown."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset()


# This process's CPUs before anything here pinned a thread (the device worker is given its parent's,
# since a worker restarted by a pinned event loop would inherit that loop's one CPU).
PROCESS_CPUS = allowed_cpus()


def choose_cpu(pin_cpu: str, workers: int) -> int | None:
    """The CPU for the latency path under the ``pin_cpu`` setting: 'off', 'auto' (the last allowed
    CPU, away from CPU 0 where most device interrupts land; none with one CPU or several HTTP
    processes, which would crowd onto it), or a CPU number."""
    if pin_cpu == "off" or len(PROCESS_CPUS) < 2:
        return None
    if pin_cpu == "auto":
        return max(PROCESS_CPUS) if workers == 1 else None
    cpu = int(pin_cpu)
    if cpu not in PROCESS_CPUS:
        log.warning("pin_cpu %d is not among this process's CPUs %s: nothing is pinned", cpu, sorted(PROCESS_CPUS))
        return None
    return cpu


def set_thread_cpus(cpus: frozenset[int] | set[int]) -> bool:
    """Let the calling thread run on ``cpus`` only; the threads it starts from now on inherit that."""
    if not cpus:
        return False
    try:
        os.sched_setaffinity(0, cpus)  # pid 0: the calling thread, not the whole process
        return True
    except OSError as exc:  # a sandbox or cpuset may refuse it: the service runs unpinned
        log.warning("could not set a thread's CPUs to %s: %s", sorted(cpus), exc)
        return False


def unpinned_executor() -> ThreadPoolExecutor:
    """asyncio's default executor (large copies, off the event loop) for a pinned loop: its threads
    would inherit the loop's single CPU, so each first spreads itself over all of the process's."""
    return ThreadPoolExecutor(thread_name_prefix="vkact-io", initializer=set_thread_cpus, initargs=(PROCESS_CPUS,))


def thread_ids() -> frozenset[int]:
    """The native ids of this process's threads (Linux /proc), or empty where unknown."""
    try:
        return frozenset(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return frozenset()


# Back-to-back messages (one already waiting when the job thread finished the last) in a row, less
# those it had to wait for, before the job thread moves away from the event loop's CPU; and how long
# the pipe stays empty before it comes back (no load left).
AWAY_AFTER = 16
BACK_AFTER_S = 0.01


class LoadPlacement:
    """The device worker's job thread and its small-dispatch engine's threads on the event loop's CPU
    while requests come one at a time (the hand-offs between them stay on one CPU: see above), and on
    the service's other CPUs while they queue up. Pinned together, the event loop and the job thread
    share one CPU, so the service answers at most one CPU's worth of requests however many clients
    wait: measured on llvmpipe (2-vCPU machine, 8 connections of 1,024-element SHRINK, rounds
    alternated, load average 7-12), gRPC 5,551-6,258 -> 8,036-8,268 req/s and /v2 HTTP 1,219-4,824
    -> 4,533-5,746 with the job thread on the other CPU, while one request at a time answers faster on
    one CPU (wrk p50 178-259 us against 282-293). The job thread tells which case it is in by its pipe:
    messages already waiting when it finishes one mean a queue (``waited(False)``), and the pipe empty
    for BACK_AFTER_S means the load has gone (``idle``).

    ``niced``: the threads among them that run at niceness ``nice`` (a CPU driver's, see
    worker_process._make_engine), so that they yield to the event loop beside them. Away from it they
    would yield to whatever else runs there: measured, with other processes busy on the other CPU, 32
    to 6,140 gRPC req/s niced against 1,543 to 4,310 staying pinned and 2,040 to 9,066 at niceness 0
    (alternated 4 s rounds, load average 11). They go away at niceness 0, and where
    a process may not lower a niceness (no CAP_SYS_NICE) nothing goes away."""

    def __init__(self, near: int, far: frozenset[int], threads: frozenset[int], niced: frozenset[int] = frozenset(),
                 nice: int = 0) -> None:
        self.near, self.far, self.threads = frozenset({near}), far, threads
        self.niced, self.nice = (niced, nice) if nice > 0 else (frozenset(), 0)
        self.away = False
        self.stays = False  # the niced threads could not be given niceness 0: never away
        self._score = 0
        self.moves = 0

    def waited(self, blocked: bool) -> None:
        """A message was there at once (``blocked`` False) or after a wait."""
        if self.away or self.stays:
            return
        self._score = max(0, self._score - 1) if blocked else self._score + 1
        if self._score >= AWAY_AFTER:
            self._move(True)

    def idle(self) -> None:
        """The pipe stayed empty for BACK_AFTER_S while away."""
        if self.away:
            self._move(False)

    def _move(self, away: bool) -> None:
        if not self._renice(0 if away else self.nice):
            self.stays, self._score = True, 0
            self._renice(self.nice)
            return
        cpus = self.far if away else self.near
        for tid in self.threads:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # a driver thread that has ended, or a sandbox that refuses: stays where it is
                pass
        self.away, self._score = away, 0
        self.moves += 1

    def _renice(self, nice: int) -> bool:
        for tid in self.niced:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except PermissionError:
                return False
            except OSError:  # a thread that has ended
                pass
        return True
