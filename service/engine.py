"""The Kompute engine: one kp Manager on one Vulkan device, a pipeline cache and a buffer pool.

Single-threaded by contract: kp holds the GIL for a whole ``eval`` and has no locks, so an Engine is
used by the one thread that created it (the service's device worker); calls from another thread raise.

Reuse: buffers live in slots of a few capacity buckets with one pipeline per kernel variant and slot
(``engine_pool``), and a call changes only the push constants (element count, parameters); the kernels'
grid-stride loops make a fixed workgroup count serve any count up to the capacity. What an execution
recorded on them (its plan, a replayer) is dropped with them.

What each dispatch looks like (variant, push constants, workgroups, capacity) is ``DispatchGeometry``'s
arithmetic, which an Engine is; one execution's checked plan and its copies are ``engine_plan``'s.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Union

import kp
import numpy as np

from .config import Settings
from .device_tuning import slot_import_bytes, tuning_for
from .dispatch_geometry import UNIT_BYTES, DispatchGeometry, push_words
from .engine_direct import DirectRuns
from .engine_graph import GraphRun, GraphRuns
from .engine_pool import BufferPool
from .engine_plan import EngineStats, Prepared, _Plan, _Slot
from .errors import InvalidRequest, UnsupportedOnDevice
from .graph_program import GraphPlan
from .host_copy import Copier
from .limits import MAX_PLANS
from .operators import OperatorDesc
from .shaders import ShaderCompiler, Variant, all_variants
from .spirv_float_controls import preserve_nan
from .vulkan_probe import FLOAT_CONTROLS_EXTENSION, HOST_IMPORT_EXTENSION, choose, physical_devices

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]  # anything np.frombuffer reads


class Engine(DispatchGeometry):
    def __init__(self, settings: Settings | None = None, copier: Copier | None = None) -> None:
        self.settings = settings = settings or Settings()
        device = choose(physical_devices(), settings.device)
        self._owner = threading.get_ident()
        # SignedZeroInfNanPreserve where the device offers it (spirv_float_controls: a compiler may
        # otherwise assume no NaN or Inf); its extension must be enabled for a module to declare it.
        self.nan_preserving_widths = device.nan_preserving_widths if device.preserves_nan else ()
        tuning = tuning_for(device)
        # kp reads KP_FENCE_SPIN_US once per process, at its first wait: the device's default goes in first
        if tuning.fence_spin_us and "KP_FENCE_SPIN_US" not in os.environ:
            os.environ["KP_FENCE_SPIN_US"] = str(tuning.fence_spin_us)
        # jobs from slot_import_bytes run on their slot's own pages where the device imports host memory
        self.slot_import_bytes = slot_import_bytes(tuning, device, settings.slot_import)
        extensions = [FLOAT_CONTROLS_EXTENSION] if self.nan_preserving_widths else []
        self._mgr = kp.Manager(device.index, [], extensions + ([HOST_IMPORT_EXTENSION] if self.slot_import_bytes else []))
        # self.device, self.tuning and the dispatch limits
        DispatchGeometry.__init__(self, device, tuning, settings, self._mgr.get_device_properties())
        self.memory = settings.memory if settings.memory != "auto" else self.tuning.memory
        self._tensor_type = kp.TensorTypes.host if self.memory == "host" else kp.TensorTypes.device
        self._compiler = ShaderCompiler(settings)
        self._spirv: dict[Variant, bytes] = {}
        self.stats = EngineStats()
        self.pool = BufferPool(self._mgr, self._tensor_type, settings.pool_bytes, settings.max_pipelines, self.stats, self._forget_plans)
        self._seq = self._mgr.sequence()
        self._plans: OrderedDict[tuple[Hashable, bool], _Plan] = OrderedDict()
        self._generation = 0  # counts the times plans were dropped: replayers made before may be stale
        self._batched: OrderedDict[tuple[Hashable, int], OperatorDesc] = OrderedDict()  # (key, jobs): descriptor end to end
        self.graph_runs = GraphRuns()
        # large copies on two threads (host_copy): the caller's Copier (the device worker's, its helper made at
        # the job thread's niceness), else one whose helper starts here, with this thread's CPUs and niceness
        self._copier = copier or Copier()
        self._owns_copier = copier is None  # a copier given is its maker's to close (the device worker's)
        # runs on slots' own pages (engine_direct): a pipeline each, up to a quarter of max_pipelines more
        self._direct = DirectRuns(self._mgr, self.device.host_import_alignment, max(1, settings.max_pipelines // 4)) if self.slot_import_bytes else None

    # -- set-up -------------------------------------------------------------------------------------

    def adopt(self) -> None:
        """Make the calling thread the engine's one user (the thread that made it hands it over)."""
        self._owner = threading.get_ident()

    def load_shaders(self) -> int:
        """Compile (or load from the cache) every registered variant; raises ShaderCompileError."""
        self._spirv.update((v, self._device_module(spirv)) for v, spirv in self._compiler.compile_all(all_variants()).items())
        return len(self._spirv)

    def close(self) -> None:
        """Free every Vulkan object; the engine cannot be used afterwards."""
        self._plans.clear()
        self._generation += 1
        self.graph_runs.clear()
        if self._direct is not None:
            self._direct.close()
        self.pool.clear()
        self._seq = None
        self._mgr.destroy()
        if self._owns_copier:
            self._copier.close()

    # -- execution ----------------------------------------------------------------------------------

    def execute(
        self,
        op: OperatorDesc,
        inputs: Sequence[Buffer],
        *,
        in_place: bool = False,
        out: Buffer | None = None,
        key: Hashable | None = None,
    ) -> np.ndarray:
        """Run ``op`` on raw input buffers laid out as its input descriptors say.

        Returns the output buffer (OutputTensor.TotalTensorSizeInBytes bytes, uint8), written into
        ``out`` when given. Bytes of the output buffer that hold no element are zero, except in place,
        where they keep the input's bytes (the output is the input buffer).

        ``key`` names ``op`` for the plan cache: the same key must always come with an equal ``op``
        (the device worker passes the descriptor's pickled bytes). A keyed call replays a command
        buffer recorded on its first run, skipping the layout, push constants and recording.
        """
        self._check_thread()
        arrays = self._check_inputs(op, inputs)
        outd = op.output
        result = self._check_output(op, out if out is not None else np.empty(outd.total_bytes, np.uint8))
        if outd.element_count == 0:
            op.check_execution(in_place, self.max_tensor_bytes)
            result[:] = arrays[0][: result.nbytes] if in_place else 0
            return result

        self._plan(op, in_place, key).run(arrays, result)
        return result

    def execute_graph(self, plan: GraphPlan, inputs: Sequence[Buffer]) -> list[np.ndarray]:
        """Run a compiled graph (``GraphCompiler.compile``) on its input buffers, one per graph input
        in index order (each TotalTensorSizeInBytes bytes, laid out as its descriptor says). Returns
        the graph outputs' buffers in index order (uint8, bytes that hold no element zero). Every
        dispatch goes in one command buffer; a plan of the same structure as an earlier one (other
        scalars) reuses its buffers and pipelines."""
        self._check_thread()
        self.check_graph(plan)
        return self.prepare_graph(plan).run(plan, inputs)

    def check_graph(self, plan: GraphPlan) -> None:
        """Raise what this device refuses in ``plan``'s nodes (UnsupportedOnDevice, naming the node)."""
        for n, op in enumerate(plan.graph.operators):
            try:
                op.check_execution(False, self.max_tensor_bytes)
            except UnsupportedOnDevice as exc:
                raise UnsupportedOnDevice(exc.message, f"Graph.Nodes[{n}].Operator.{exc.field}") from None

    def prepare_graph(self, plan: GraphPlan, built: GraphRun | None = None) -> GraphRun:
        """The buffers, pipelines and command buffer that ``execute_graph(plan, ...)`` runs, created on
        first use and kept per program: what a benchmark times (``GraphRun.kernels``). ``built``: the run
        of ``plan`` made on another thread (``GraphRun(engine, plan)`` is safe there, see engine_graph),
        taken in here when the program has none yet."""
        self._check_thread()
        return self.graph_runs.take(self, plan, built)

    def has_graph_run(self, plan: GraphPlan) -> bool:
        """Whether ``plan``'s program has its run (buffers, pipelines) here: no build before it runs."""
        return plan.program.key in self.graph_runs

    def replayer(self, op: OperatorDesc, inputs: Sequence[Buffer], out: Buffer, key: Hashable, in_place: bool = False) -> Callable[[], float | None]:
        """``execute(op, inputs, out=out, key=key, in_place=in_place)`` to repeat on the same buffers
        (new bytes in them each time), with its checks and look-ups done once: the device worker
        replays a repeated request this way. The call returns the dispatch's seconds, or None without
        running once any plan was dropped since it was made, its own or another's (a pipeline or a slot
        let go): run ``execute`` again, and make a new one."""
        arrays = self._check_inputs(op, inputs)
        result = self._check_output(op, out)
        plan = self._plans.get((key, in_place))
        if plan is None:
            raise InvalidRequest("no plan to replay: execute this keyed operator first")
        generation = self._generation
        slot, pool = plan.prepared.slot, self.pool
        run = plan.bound(arrays, result)

        def replay() -> float | None:
            self._check_thread()
            if self._generation != generation:
                return None
            slot.used = pool.epoch
            return run()

        return replay

    def direct_replayer(self, op: OperatorDesc, region: np.ndarray, inputs: Sequence[tuple[int, int]], output: tuple[int, int],
                        key: Hashable) -> Callable[[], float | None] | None:
        """A replayer (as ``replayer`` makes) of the job whose tensors lie in ``region``, a shared-memory
        slot's whole mapping, at the (offset, bytes) ranges given: its kernel runs on the slot's own pages
        (engine_direct), nothing copied. None where that does not apply: the device does not import host
        memory (or ``slot_import`` is off), the job is smaller than ``slot_import_bytes``, or it is not one
        packed elementwise dispatch on whole 16-byte units, or a tensor has bytes past its last element (the
        copying path zeroes an output's; on the slot they would keep what an earlier request left there), or
        the device will not import the mapping or bind a range where it lies. ``op`` must have run (``execute``) first:
        its checks are not repeated here. Before the region is unmapped, ``release_region`` it."""
        if self._direct is None or max(n for _, n in (*inputs, output)) < self.slot_import_bytes:
            return None
        variant, push, meta, clear, groups = self.dispatch_shape(op)
        if meta is not None or clear or groups is not None or variant.layout != "PACKED":
            return None
        if any(d.total_bytes != d.span_bytes() for d in (*op.inputs, op.output)):
            return None
        if [n for _, n in inputs] != [d.total_bytes for d in op.inputs] or output[1] != op.output.total_bytes:
            raise InvalidRequest("the ranges do not hold the operator's tensors")

        def make(views: list[kp.Tensor]) -> tuple[kp.Algorithm, kp.Sequence]:
            units = max(view.size() for view in views) * 4 // UNIT_BYTES
            spec = np.array([self.local_size], np.uint32)
            algorithm = self._mgr.algorithm(views, self.variant_spirv(variant), (self.workgroups(units), 1, 1), spec, push_words([]))
            try:
                seq = self._mgr.sequence()
                seq.record(kp.OpAlgoDispatch(algorithm, push))
                seq.record(kp.OpTensorSyncLocal([views[-1]]))  # the barrier that makes the writes visible to the host
            except BaseException:
                algorithm.destroy()
                raise
            return algorithm, seq

        found = self._direct.run_for(region, inputs, output, key, make)
        return None if found is None else self._direct.replayer(*found, self.pool, self.stats, self._check_thread)

    def release_region(self, region: np.ndarray) -> None:
        """Destroy what ``direct_replayer`` made on the mapping ``region`` (its replayers then return
        None): the caller is about to unmap it."""
        self._check_thread()
        if self._direct is not None:
            self._direct.release(region)

    def execute_batch(self, op: OperatorDesc, jobs: Sequence[tuple[Sequence[Buffer], Buffer]], key: Hashable) -> None:
        """Run ``op`` once over several executions of it, each ``(inputs, out)``: their inputs end to
        end in one dispatch (``op`` must be concatenable), each output written into its ``out``. ``key``
        names ``op`` as in ``execute``."""
        n = len(jobs)
        batched = self._batched.get((key, n))
        if batched is None:
            if not op.concatenable:
                raise InvalidRequest(f"{op.type_name()} with these tensors cannot run as one batch")
            batched = self._batched[(key, n)] = op.concatenated(n)
            while len(self._batched) > MAX_PLANS:
                self._batched.popitem(last=False)
        inputs = [np.concatenate([np.frombuffer(ins[i], np.uint8) for ins, _ in jobs]) for i in range(len(op.inputs))]
        result = self.execute(batched, inputs, key=("batch", key, n))
        step = op.output.total_bytes
        for i, (_, out) in enumerate(jobs):
            np.frombuffer(out, np.uint8)[:] = result[i * step : (i + 1) * step]

    def _plan(self, op: OperatorDesc, in_place: bool, key: Hashable | None) -> _Plan:
        """What one execution of ``op`` needs, checked; cached (with its recorded command buffer)
        under ``key`` until a slot is evicted."""
        if key is not None:
            plan = self._plans.get((key, in_place))
            if plan is not None:
                self._plans.move_to_end((key, in_place))
                self.pool.touch(plan.prepared.slot)
                return plan
        op.check_execution(in_place, self.max_tensor_bytes)
        prepared = self.prepare(op, in_place)
        slot = prepared.slot
        names = [f"in{i}" for i in range(len(op.inputs))]
        out_name = "in0" if in_place else "out"
        uploads = [slot.tensors[n] for n in names] + ([] if prepared.meta is None else [slot.tensors["meta"]])
        if prepared.clear:
            uploads.append(slot.tensors["out"])
        output = slot.tensors[out_name]
        if key is None:
            dispatch = partial(self._run, prepared.algorithm, prepared.push, uploads, output)
        else:
            dispatch = self._record(prepared.algorithm, prepared.push, uploads, output, self._mgr.sequence()).eval
        views, out_bytes = slot.views, op.output.total_bytes
        plan = _Plan(
            prepared, dispatch, self.stats, self._copier,
            inputs=[views[n][: desc.total_bytes] for n, desc in zip(names, op.inputs)],
            result=views[out_name][: out_bytes if in_place else op.output.span_bytes()],
            cleared=views["out"][:out_bytes] if prepared.clear else None,
            meta=None if prepared.meta is None else views["meta"].view(np.uint32)[: len(prepared.meta)],
        )
        if key is not None:
            self._plans[(key, in_place)] = plan
            while len(self._plans) > MAX_PLANS:
                self._plans.popitem(last=False)
        return plan

    def prepare(self, op: OperatorDesc, in_place: bool = False) -> Prepared:
        """The pipeline, buffers and push constants that ``execute(op, ...)`` dispatches, created on
        first use and cached: what a benchmark times, without the copies around it."""
        variant, push, meta, clear, groups = self.dispatch_shape(op)
        slot = self.pool.slot(self._capacity(op))
        algorithm, groups = self._algorithm(variant, slot, in_place, op.data_type.info.size, groups)
        return Prepared(algorithm, push, slot, meta, clear and not in_place, groups)

    def variant_spirv(self, variant: Variant) -> bytes:
        spirv = self._spirv.get(variant)
        if spirv is None:
            spirv = self._spirv[variant] = self._device_module(self._compiler.spirv(variant))
        return spirv

    def _device_module(self, spirv: bytes) -> bytes:
        """The module as this device runs it: with SignedZeroInfNanPreserve where it keeps NaN."""
        return preserve_nan(spirv, self.nan_preserving_widths) if self.nan_preserving_widths else spirv

    def algorithm(self, tensors: list[kp.Tensor], spirv: bytes, groups: int, push_count: int) -> kp.Algorithm:
        """Another kernel on the engine's device and buffers (the benchmark's copy shader)."""
        spec = np.array([self.local_size], np.uint32)
        return self._mgr.algorithm(tensors, self._device_module(spirv), (groups, 1, 1), spec, np.zeros(push_count, np.uint32))

    def sequence(self) -> kp.Sequence:
        return self._mgr.sequence()

    def _run(self, algorithm: kp.Algorithm, push: np.ndarray, uploads: list[kp.Tensor], output: kp.Tensor) -> None:
        self._seq.clear()
        self._record(algorithm, push, uploads, output, self._seq).eval()

    def _record(self, algorithm: kp.Algorithm, push: np.ndarray, uploads: list[kp.Tensor], output: kp.Tensor, seq: kp.Sequence) -> kp.Sequence:
        """Record one execution into ``seq``: uploads (device memory), the dispatch, the download. The
        download is recorded in host memory too: kp (as build-kp.sh patches it) records there the
        barrier that makes the shader's writes visible to the host, which reads the mapped buffer."""
        if self.memory == "device":
            seq.record(kp.OpTensorSyncDevice(uploads))
        seq.record(kp.OpAlgoDispatch(algorithm, push))
        seq.record(kp.OpTensorSyncLocal([output]))
        return seq

    def _check_thread(self) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError("an Engine is used only by the thread that created it (kp has no locks)")

    def _check_output(self, op: OperatorDesc, out: Buffer) -> np.ndarray:
        result = np.frombuffer(out, np.uint8)
        if result.nbytes != op.output.total_bytes or result.flags.writeable is False:
            raise InvalidRequest(f"output buffer must be {op.output.total_bytes} writable bytes", "OutputTensor")
        return result

    def _check_inputs(self, op: OperatorDesc, inputs: Sequence[Buffer]) -> list[np.ndarray]:
        if len(inputs) != len(op.input_fields):
            raise InvalidRequest(f"{op.type_name()} takes {len(op.input_fields)} input tensor(s), got {len(inputs)}")
        arrays = []
        for name, desc, data in zip(op.input_fields, op.inputs, inputs):
            array = np.frombuffer(data, np.uint8)
            if array.nbytes != desc.total_bytes:
                raise InvalidRequest(f"{name} data is {array.nbytes} bytes; its TotalTensorSizeInBytes is {desc.total_bytes}", name)
            arrays.append(array)
        return arrays

    # -- pools --------------------------------------------------------------------------------------

    def trim(self) -> int:
        """Free the buffers (and pipelines) of slots unused since the last trim, with the graph runs and
        direct runs unused as long: the device worker calls this every idle_release_s, so idle memory goes
        back within two periods. Returns slots freed."""
        self._check_thread()
        epoch = self.pool.epoch
        self.graph_runs.trim(epoch)
        if self._direct is not None:
            self._direct.trim(epoch)
        return self.pool.trim()

    def _forget_plans(self, algorithm: kp.Algorithm | None) -> None:
        """The pool is letting ``algorithm`` go (None: a slot, which any plan may use): drop the plans
        that dispatch it; every replayer made so far then returns None (its caller executes and makes a
        new one)."""
        if algorithm is None:
            self._plans.clear()
        else:
            for plan_key in [k for k, plan in self._plans.items() if plan.prepared.algorithm is algorithm]:
                del self._plans[plan_key]
        self._generation += 1

    def _algorithm(self, variant: Variant, slot: _Slot, in_place: bool, itemsize: int, groups: int | None = None) -> tuple[kp.Algorithm, int]:
        """The pipeline of ``variant`` on ``slot``'s buffers and its workgroup count. Elementwise kernels
        (groups None) get the count that covers the slot; reductions say theirs, which is part of the key."""
        key = (variant, slot.capacity, in_place) if groups is None else (variant, slot.capacity, in_place, groups)

        def make() -> tuple[kp.Algorithm, int]:
            spirv = self.variant_spirv(variant)
            names = [f"in{i}" for i in range(variant.inputs)] + ["in0" if in_place else "out"]
            if variant.layout == "STRIDED":
                names.append("meta")
            tensors = [self.pool.tensor(slot, n) for n in names]
            # elementwise: enough groups to cover the slot
            count = groups if groups is not None else self.workgroups(slot.capacity // (UNIT_BYTES if variant.layout == "PACKED" else itemsize))
            spec = np.array([self.local_size], np.uint32)
            return self._mgr.algorithm(tensors, spirv, (count, 1, 1), spec, push_words([])), count

        return self.pool.pipeline(key, make)
