"""Where the threads of one small request run, on a CPU device (Linux).

A 1,024-element request passes through the HTTP process's event loop, the device worker's job
thread and lavapipe's submit thread (Mesa always starts one for it; on the engine for one-workgroup
dispatches that thread also runs the workgroup: see worker_process.py). Each hand-off between threads on
different CPUs is an inter-processor wake-up, and on a virtual machine waking an idle vCPU costs tens
of microseconds: a 1,024-element dispatch takes 52 us through lavapipe with its threads free and
17.5 us with them on one CPU (measured on the 2-vCPU CI machine). So with ``pin_cpu`` the event
loop, the job thread and the small-dispatch engine's threads share one CPU; the threads of the
engine for larger dispatches stay free, so large kernels keep every CPU.

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
