"""New graph programs' pipelines, built on a thread beside the device worker's job thread.

A graph of a structure the engine has not run needs its pipelines built first: on lavapipe about 110 ms a
softmax dispatch's (the driver compiles the shader then), seconds for a long chain. Built on the job thread,
they held every other request of the service for that long, and a client that varied its graphs' shapes
held them for good. Here the job thread parks the graph's job and goes on with the others; this thread
makes the program's ``GraphRun`` (engine_graph: its buffers, pipelines and sequence, nothing the job
thread touches; kp, as scripts/build-kp.sh patches it, builds each pipeline without the GIL, so the two
threads run at once), one program at a time, in the order they came. Its end wakes the job thread through
a pipe, which takes the run into its engine and hands the jobs that waited for it (jobs of one program
wait for one build) back to the HTTP side, which sends them again as any graph job.

On a CPU device the build is the driver's work on this thread (lavapipe compiles there): it runs where
and as the driver's own threads do, off the CPU the job thread is pinned to and at their niceness, so
that it yields to the requests. Where the driver makes a pipeline's machine code at its first dispatch
(lavapipe), this thread also runs the new graph once (``GraphRun.warm_up``, without the GIL), so that the
job thread's first run of it does not wait for that.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine
    from .engine_graph import GraphRun
    from .graph_program import GraphPlan


class GraphBuilds:
    def __init__(self, engine: Engine, cpus: frozenset[int] = frozenset(), nice: int = 0) -> None:
        """``cpus`` (empty: the process's) and ``nice``: where and how the build thread runs."""
        self._engine = engine
        self._cpus, self._nice = cpus, nice
        self._lock = threading.Condition()
        self._todo: deque[GraphPlan] = deque()                                   # under the lock
        self._built: list[tuple[GraphPlan, GraphRun | BaseException]] = []       # under the lock
        self._waiting: dict[str, list[Any]] = {}  # program key -> its parked jobs (the job thread's alone)
        self._stopping = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._thread: threading.Thread | None = None

    def fileno(self) -> int:
        """Readable once a build has ended: then call ``finished``."""
        return self._wake_read

    def pending(self) -> bool:
        """Whether jobs are parked (their builds under way, waiting, or ended and not yet taken)."""
        return bool(self._waiting)

    def ended(self) -> bool:
        """Whether a build has ended that ``finished`` has not given yet (no system call: the job thread
        asks before each job while builds are pending, so that a stream of jobs does not hold them)."""
        return bool(self._built)

    def park(self, plan: GraphPlan, job: Any) -> None:
        """Keep ``job`` until ``plan``'s program is built (its build is asked for once)."""
        key = plan.program.key
        if key in self._waiting:
            self._waiting[key].append(job)
            return
        if self._thread is None:  # first: a thread that fails to start leaves nothing asked for
            thread = threading.Thread(target=self._build_all, name="vkact-graph-build", daemon=True)
            thread.start()
            self._thread = thread
        self._waiting[key] = [job]
        with self._lock:
            self._todo.append(plan)
            self._lock.notify()

    def finished(self) -> list[tuple[GraphPlan, GraphRun | BaseException, list[Any]]]:
        """The builds that have ended since the last call: each plan, its run (or what its build
        raised) and the jobs that waited for it."""
        try:
            os.read(self._wake_read, 4096)
        except BlockingIOError:
            pass
        with self._lock:
            built, self._built = self._built, []
        return [(plan, run, self._waiting.pop(plan.program.key, [])) for plan, run in built]

    def close(self) -> list[Any]:
        """Stop the build under way at its next pipeline (a driver call cannot be cut short); the jobs
        still parked, whose answers no one will read. Runs built and not taken are destroyed here, on the
        engine's thread."""
        with self._lock:
            self._stopping = True
            self._todo.clear()
            self._lock.notify()
        if self._thread is not None:
            self._thread.join()
        left = []
        for _plan, run, jobs in self.finished():  # built, failed or stopped: their jobs are still unanswered
            left += jobs
            if not isinstance(run, BaseException):
                run.destroy()
        os.close(self._wake_read)
        os.close(self._wake_write)
        left += [job for jobs in self._waiting.values() for job in jobs]
        self._waiting.clear()
        return left

    def _build_all(self) -> None:
        from .cpu_placement import set_thread_cpus
        from .engine_graph import GraphRun

        if self._nice:
            os.nice(self._nice)  # this thread's alone (Linux)
        if self._cpus:
            set_thread_cpus(self._cpus)
        while True:
            with self._lock:
                while not self._todo and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                plan = self._todo.popleft()
            try:
                run: GraphRun | BaseException = GraphRun(self._engine, plan, lambda: self._stopping)
                if self._engine.tuning.first_dispatch_compiles and not self._stopping:
                    try:
                        run.warm_up(plan)
                    except BaseException:
                        run.destroy()
                        raise
            except BaseException as exc:  # noqa: BLE001 - the jobs that waited for it are told
                run = exc
            with self._lock:
                self._built.append((plan, run))
            os.write(self._wake_write, b"\0")
