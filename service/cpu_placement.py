"""Where the threads of one small request run, on a CPU device (Linux).

A 1,024-element request passes through six threads in turn: the HTTP process's event loop, the
device worker's job thread, and three of lavapipe's (its submit thread, which Mesa always starts
for it, and the compute pool's, woken two at a time). Each hand-off between threads on different
CPUs is an inter-processor wake-up, and on a virtual machine waking an idle vCPU costs tens of
microseconds: one 1,024-element dispatch takes 52 us through lavapipe with its threads free and
17.5 us with them on one CPU (measured on the 2-vCPU CI machine). So with ``pin_cpu`` the event
loop and the job thread share one CPU, and the driver's threads join them while dispatches are a
single workgroup (which one thread runs anyway); a dispatch of more workgroups spreads them over
every CPU again, so large kernels keep their parallelism.

Only Linux has per-thread affinity through ``os.sched_setaffinity``; elsewhere nothing is pinned.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("vkact.cpu")


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its cgroup's cpuset, taskset), or empty where unknown."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


def choose_cpu(pin_cpu: str, workers: int) -> int | None:
    """The CPU for the latency path under the ``pin_cpu`` setting: 'off', 'auto' (the last allowed
    CPU, away from CPU 0 where most device interrupts land; none with one CPU or several HTTP
    processes, which would crowd onto it), or a CPU number."""
    cpus = allowed_cpus()
    if pin_cpu == "off" or len(cpus) < 2:
        return None
    if pin_cpu == "auto":
        return max(cpus) if workers == 1 else None
    cpu = int(pin_cpu)
    if cpu not in cpus:
        log.warning("pin_cpu %d is not among this process's CPUs %s: nothing is pinned", cpu, sorted(cpus))
        return None
    return cpu


def pin_this_thread(cpu: int) -> bool:
    """Keep the calling thread on ``cpu`` (threads it starts from now on inherit it)."""
    try:
        os.sched_setaffinity(0, {cpu})  # pid 0: the calling thread, not the whole process
        return True
    except OSError as exc:  # a sandbox or cpuset may refuse it: the service runs unpinned
        log.warning("could not pin a thread to CPU %d: %s", cpu, exc)
        return False


def unpinned_executor() -> ThreadPoolExecutor:
    """asyncio's default executor (large copies, off the event loop) for a pinned loop: its threads
    would inherit the loop's single CPU, so each first spreads itself over every allowed CPU."""
    cpus = allowed_cpus()
    return ThreadPoolExecutor(thread_name_prefix="vkact-io", initializer=lambda: cpus and os.sched_setaffinity(0, cpus))


class DriverThreads:
    """Every thread of the device worker process but the job thread (they are the driver's: the
    worker starts none of its own), kept on the job thread's CPU for one-workgroup dispatches and
    spread over all allowed CPUs for larger ones. Threads are listed afresh at each change, so one
    the driver starts later is placed too."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self._all = allowed_cpus()
        self._job = threading.get_native_id()
        self.narrow: bool | None = None  # unknown until the first dispatch
        self.changes = 0

    def fit(self, workgroups: int) -> None:
        """Place the driver's threads for a dispatch of ``workgroups`` (a no-op while that keeps them
        where they are: two system calls per thread on a change, none otherwise)."""
        narrow = workgroups <= 1
        if narrow == self.narrow:
            return
        self.narrow = narrow
        self.changes += 1
        cpus = {self.cpu} if narrow else self._all
        for tid in self.threads():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # the thread has exited since the listing
                pass

    def threads(self) -> list[int]:
        return [int(t) for t in os.listdir("/proc/self/task") if int(t) != self._job]
