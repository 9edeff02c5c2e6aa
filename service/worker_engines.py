"""What the device worker does with each job (service/worker_process.py runs its loop): its engines
(on llvmpipe a second one for one-workgroup dispatches), job templates and their replayers, batches,
graph jobs (parked while service.graph_builds builds their programs, handed back when built), trim and
a slot's end. Used from the worker's job thread only, as the engines are.
"""
from __future__ import annotations

import logging
import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from . import framing
from .errors import VkactError
from .framing import Template
from .engine_graph import pipelines
from .graph_builds import GraphBuilds
from .limits import GRAPHS_CACHED, MAX_GRAPH_PIPELINES, OPS_CACHED
from .operators import OperatorDesc
from .slots import Mapping

log = logging.getLogger("vkact.worker_process")  # the worker's one log, as before the split


class WorkerEngines:
    """The worker's engines and what it keeps of its jobs: descriptors unpickled by their bytes, and
    the engine each runs on. On llvmpipe a second engine, made with LP_NUM_THREADS=0, takes the
    one-workgroup dispatches: its submit thread runs the workgroup itself, where the first engine's
    hands it to its compute pool (one broadcast wake-up for all of the pool's threads) and waits
    for it (measured: 23 us a 1,024-element dispatch against 56). Larger dispatches keep the pool."""

    def __init__(self, main, small=None, builds: GraphBuilds | None = None) -> None:
        self.main, self.small = main, small
        self._ops: OrderedDict[bytes, tuple[OperatorDesc, Any]] = OrderedDict()
        self._templates: dict[int, Template] = {}                  # by number (see service.jobs.TemplateIds)
        self._replays: dict[int, Callable[[], float | None]] = {}  # what a template's first job did, to redo
        self._pairs: dict[int, tuple[list[np.ndarray], np.ndarray]] = {}  # a template's views, for batches
        self._plans: OrderedDict[bytes, Any] = OrderedDict()       # GraphPlans by their pickled bytes
        self.builds = builds or GraphBuilds(main)   # new graph programs' pipelines, beside the job thread
        # runs built whose jobs were handed back and have not come again: taken into the engine by the first
        # of them (not before: a burst of other builds could push them out of its MAX_GRAPH_RUNS first), at
        # most MAX_GRAPH_PIPELINES pipelines of them, the oldest let go (its jobs build it again); by program key, with the
        # trim count when built (``trim`` lets go of those a whole idle period old: their jobs were dropped)
        self._built: OrderedDict[str, tuple[Any, Any, int]] = OrderedDict()
        self._trims = 0

    def load_shaders(self) -> int:
        if self.small is not None:
            self.small.load_shaders()
        return self.main.load_shaders()

    def close(self) -> None:
        self.builds.close()  # its thread uses the main engine: stopped first
        while self._built:
            self._built.popitem()[1][1].destroy()
        for engine in (self.small, self.main):
            if engine is not None:
                engine.close()

    def op(self, key: bytes) -> tuple[OperatorDesc, Any]:
        """The descriptor pickled as ``key`` and the engine that runs it alone."""
        found = self._ops.get(key)
        if found is None:
            op = pickle.loads(key)
            found = self._ops[key] = (op, self._engine_for(op))
            if len(self._ops) > OPS_CACHED:
                self._ops.popitem(last=False)
        return found

    def _engine_for(self, op: OperatorDesc) -> Any:
        if self.small is None:
            return self.main
        try:
            return self.small if self.main.dispatch_workgroups(op) == 1 else self.main
        except VkactError:  # not runnable: the main engine says why when it is run
            return self.main

    def define(self, tid: int, template: Template) -> None:
        self._templates[tid] = template
        self._replays.pop(tid, None)
        self._pairs.pop(tid, None)

    def go(self, mappings: dict[str, Mapping], job_id: int, tid: int) -> bytes:
        """Run a job of template ``tid`` with the bytes now in its slot; the reply, encoded. The first
        job of a template runs as any job does, and leaves a replayer: its checks, look-ups and views
        done once (perf sched in the service: the job thread's CPU per 1,024-element request, mostly
        cache misses after the HTTP side ran on the same CPU, 95 -> 68 us)."""
        replay = self._replays.get(tid)
        if replay is not None:
            try:
                seconds = replay()
            except Exception:  # noqa: BLE001 - run again below, which reports the error
                seconds = None
                del self._replays[tid]
            if seconds is not None:
                return framing.encode_compact("ok", job_id, seconds)
        template = self._templates.get(tid)
        if template is None:
            return framing.encode("done", [_unknown(job_id, tid)])
        reply = self._run_one(mappings, (job_id, *template))
        if reply[1] == "done":
            key, path, size, inputs, output, in_place = template
            op, engine = self.op(key)
            try:
                self._replays[tid] = (self._direct(engine, op, mappings[path].array, inputs, output, key)
                                      or engine.replayer(op, *_buffers(mappings, path, size, inputs, output), key, in_place))
            except VkactError:  # nothing to replay (an empty tensor dispatches nothing): it runs whole each time
                pass
        return framing.encode("done", [reply])

    @staticmethod
    def _direct(engine: Any, op: OperatorDesc, region: np.ndarray, inputs, output, key: bytes) -> Callable[[], float | None] | None:
        """A large job's replayer on the slot itself where the device imports it (engine_direct), else None;
        a failure there (kp's, the driver's) leaves the job to the copying replayer, the worker up."""
        try:
            return engine.direct_replayer(op, region, inputs, output, key)
        except Exception:  # noqa: BLE001 - the job has run and its answer is right: only its replays copy
            log.exception("a job's replayer on its slot failed; its replays copy")
            return None

    def batch(self, mappings: dict[str, Mapping], numbered: tuple[tuple[int, int], ...]) -> bytes:
        """The jobs of a "batch" message ((job id, template id) each; the HTTP side batches only equal
        keys) in one dispatch, on the engine that runs one of them alone: jobs of one workgroup each
        make a batch of at most max_batch workgroups, which the small-dispatch engine's submit thread
        runs sooner than the compute pool wakes (llvmpipe, 1,024-element SHRINK jobs: 2, 4, 8 in a
        batch 29, 35, 45 us on the main engine, 22, 27, 37 on the small one). The reply, encoded: "oks";
        if the batch fails, each job runs alone and answers for itself ("done")."""
        templates = [self._templates.get(tid) for _, tid in numbered]
        if None not in templates:
            try:
                key = templates[0][0]
                pairs = [self._pair(mappings, tid, template) for (_, tid), template in zip(numbered, templates)]
                op, engine = self.op(key)
                before = engine.stats.kernel_seconds
                engine.execute_batch(op, pairs, key)
                return framing.encode_oks(engine.stats.kernel_seconds - before, [job_id for job_id, _ in numbered])
            except Exception:  # noqa: BLE001 - each job is tried alone below and answers for itself
                log.exception("a batch of %d jobs failed; running them one by one", len(numbered))
        return framing.encode("done", [_unknown(job_id, tid) if template is None else self._run_one(mappings, (job_id, *template))
                                       for (job_id, tid), template in zip(numbered, templates)])

    def _pair(self, mappings: dict[str, Mapping], tid: int, template: Template) -> tuple[list[np.ndarray], np.ndarray]:
        """A template's input and output views, made once (as a replayer keeps its own): a slot goes
        back to request after request, so a batch repeats the templates of the jobs before it."""
        pair = self._pairs.get(tid)
        if pair is None:
            _, path, size, inputs, output, _ = template
            pair = self._pairs[tid] = _buffers(mappings, path, size, inputs, output)
        return pair

    def trim(self) -> None:
        """Free what the engines have not used since the last trim (idle_release_s apart)."""
        for key in [k for k, (_, _, trims) in self._built.items() if trims < self._trims]:
            self._built.pop(key)[1].destroy()
        self._trims += 1
        for engine in (self.main, self.small):
            if engine is not None:
                engine.trim()  # a replayer of a freed plan says so, and its job runs whole again

    def forget(self, mappings: dict[str, Mapping], path: str) -> None:
        """Unmap a slot that the HTTP side replaced, with the templates on it and their views."""
        for tid in [t for t, template in self._templates.items() if template[1] == path]:
            del self._templates[tid]
            self._replays.pop(tid, None)
            self._pairs.pop(tid, None)  # no view of the mapping may outlive it
        mapping = mappings.pop(path, None)
        if mapping is not None:
            for engine in (self.main, self.small):
                if engine is not None:
                    engine.release_region(mapping.array)  # its imported pages go before the mapping does
            mapping.close()

    def _run_one(self, mappings: dict[str, Mapping], job: tuple) -> tuple:
        job_id, key, path, size, inputs, output, in_place = job
        try:
            ins, out = _buffers(mappings, path, size, inputs, output)
            op, engine = self.op(key)
            before = engine.stats.kernel_seconds
            engine.execute(op, ins, in_place=in_place, out=out, key=key)
            return (job_id, "done", engine.stats.kernel_seconds - before, 1)
        except Exception as exc:  # noqa: BLE001 - reported to the request, the worker stays up
            return _failure(job_id, exc)

    def run_graph(self, mappings: dict[str, Mapping], job: tuple) -> tuple | None:
        """A graph job: its plan (compiled on the HTTP side) on the main engine, each output copied
        into its place in the slot. None: parked until its program's pipelines are built beside this
        thread (GraphBuilds); ``built_graphs`` hands it back then."""
        job_id, key, path, size, inputs, outputs = job
        try:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = pickle.loads(key)
                if len(self._plans) > GRAPHS_CACHED:
                    self._plans.popitem(last=False)
            else:
                self._plans.move_to_end(key)
            self.main.check_graph(plan)
            if plan.program.key not in self._built and not self.main.has_graph_run(plan):
                self.builds.park(plan, job)
                return None
            ins, _ = _buffers(mappings, path, size, inputs, (0, 0))
            before = self.main.stats.kernel_seconds
            built = self._built.pop(plan.program.key, None)  # taken into the engine (settled) here
            results = self.main.prepare_graph(plan, built[1] if built is not None else None).run(plan, ins)
            array = mappings[path].array
            for (offset, n), result in zip(outputs, results):
                array[offset : offset + n] = result
            return (job_id, "done", self.main.stats.kernel_seconds - before, 1)
        except Exception as exc:  # noqa: BLE001 - reported to the request, the worker stays up
            return _failure(job_id, exc)

    def built_graphs(self) -> list[tuple[str, list]]:
        """The messages for the parked graph jobs whose programs' builds have ended: each run kept for the
        first of its jobs to come again and their ids handed back ("built": sent again, each runs as any
        graph job, its time on the device counted from then), or the build's error as their replies
        ("late")."""
        messages: list[tuple[str, list]] = []
        handed: set[str] = set()
        for plan, run, jobs in self.builds.finished():
            if isinstance(run, BaseException):
                messages.append(("late", [_failure(job[0], run) for job in jobs]))
                continue
            old = self._built.pop(plan.program.key, None)
            if old is not None:
                old[1].destroy()
            self._built[plan.program.key] = (plan, run, self._trims)
            handed.add(plan.program.key)
            messages.append(("built", [job[0] for job in jobs]))
        # within the budget, the oldest let go first; never one handed back just now (its jobs are coming)
        while pipelines(run for _, run, _ in self._built.values()) > MAX_GRAPH_PIPELINES:
            oldest = next(iter(self._built))
            if oldest in handed:
                break
            self._built.pop(oldest)[1].destroy()
        return messages


def _failure(job_id: int, exc: BaseException) -> tuple:
    """A job's error reply: a VkactError as the request's error, anything else a device failure (logged)."""
    if isinstance(exc, VkactError):
        return (job_id, "error", type(exc).__name__, exc.message, exc.field)
    log.error("job %d failed", job_id, exc_info=exc)
    return (job_id, "error", "DeviceFailure", f"device failure: {exc}", None)


def _unknown(job_id: int, tid: int) -> tuple:
    """The reply to a job naming a template never sent (or sent to a worker before this one): a bug,
    not the request's."""
    log.error("job %d names template %d, which this worker was never given", job_id, tid)
    return (job_id, "error", "DeviceFailure", "device failure: the job's template is unknown", None)


def _buffers(mappings: dict[str, Mapping], path: str, size: int, inputs, output: tuple[int, int]) -> tuple[list[np.ndarray], np.ndarray]:
    """A job's input and output bytes: views of its slot, mapped on first use."""
    mapping = mappings.get(path)
    if mapping is None:
        mapping = mappings[path] = Mapping(path, size, False)
    array = mapping.array
    return [array[o : o + n] for o, n in inputs], array[output[0] : output[0] + output[1]]
