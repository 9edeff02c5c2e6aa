"""The Kompute engine: one kp Manager on one Vulkan device, a pipeline cache and a buffer pool.

Single-threaded by contract: kp holds the GIL for a whole ``eval`` and has no locks, so an Engine is
used by the one thread that created it (the service's device worker); calls from another thread raise.

Reuse: kp binds an Algorithm (pipeline + descriptor set) to fixed tensors, and tensors cannot grow. So
buffers live in slots of a few capacity buckets, each kernel variant gets one Algorithm per slot, and a
call changes only the push constants (element count, parameters); the kernels' grid-stride loops make
a fixed workgroup count serve any count up to the capacity. Slots are evicted least recently used once
the pool outgrows ``Settings.pool_bytes``.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Union

import kp
import numpy as np

from .buckets import bucket
from .config import Settings
from .errors import InvalidRequest
from .layout import Layout, coalesce
from .operators import OperatorDesc
from .shaders import ShaderCompiler, Variant, all_variants
from .vulkan_probe import PhysicalDevice, choose, physical_devices

UNIT_BYTES = 16          # the packed kernels move one 16-byte vector per invocation and step
PUSH_WORDS = 8           # count, rank, six parameters (the shaders' Push block)
META_WORDS = 8 * 4       # sizes + up to three tensors' strides (MAX_DIMS words each)

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]  # anything np.frombuffer reads


def _words(values: Sequence[int | float]) -> np.ndarray:
    """Push constants as uint32 words, floats bit-cast (kp 0.9 takes the push type from the spec array)."""
    out = np.zeros(PUSH_WORDS, np.uint32)
    for i, v in enumerate(values):
        out[i] = np.float32(v).view(np.uint32) if isinstance(v, float) else v
    return out


@dataclass
class EngineStats:
    pipelines_created: int = 0
    buffers_allocated: int = 0
    slots_evicted: int = 0
    dispatches: int = 0
    kernel_seconds: float = 0.0     # wall time of the device submission (upload, dispatch, download)
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass
class _Slot:
    """Buffers of one capacity: inputs, output and the strided kernels' layout table."""

    capacity: int
    tensors: dict[str, kp.Tensor] = field(default_factory=dict)
    views: dict[str, np.ndarray] = field(default_factory=dict)   # uint8 views of mapped memory


class Engine:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings = settings or Settings()
        self.device: PhysicalDevice = choose(physical_devices(), settings.device)
        self._owner = threading.get_ident()
        self._mgr = kp.Manager(self.device.index)
        props = self._mgr.get_device_properties()
        self.max_workgroup_count = int(props["max_work_group_count"][0])
        self.memory = settings.memory if settings.memory != "auto" else ("device" if self.device.type == "discrete-gpu" else "host")
        self._tensor_type = kp.TensorTypes.host if self.memory == "host" else kp.TensorTypes.device
        # Units (16-byte vectors, or elements when strided) per invocation: lavapipe runs each SIMD
        # batch of a workgroup through the whole loop, so about four steps amortise the workgroup's
        # set-up without scattering its loads (measured: 9.5 GB/s against 7.9 at one step and 2.4 at
        # 64); a GPU wants one unit per invocation and as many groups as that takes.
        self.units_per_invocation = 4 if self.device.is_cpu else 1
        self.max_workgroups = min(settings.max_workgroups or self.max_workgroup_count, self.max_workgroup_count)
        # A binding may not exceed maxStorageBufferRange; the packed kernels read whole 16-byte
        # vectors, so a tensor leaves one vector of slack below it.
        self._max_binding = self.device.max_storage_buffer_range // UNIT_BYTES * UNIT_BYTES
        self.max_tensor_bytes = min(settings.max_tensor_bytes or self._max_binding, self._max_binding - UNIT_BYTES)
        self._compiler = ShaderCompiler(settings)
        self._spirv: dict[Variant, bytes] = {}
        self._slots: OrderedDict[int, _Slot] = OrderedDict()
        self._algorithms: dict[tuple[Variant, int, bool], kp.Algorithm] = {}
        self._pool_bytes = 0
        self._seq = self._mgr.sequence()
        self.stats = EngineStats()

    # -- set-up -------------------------------------------------------------------------------------

    def load_shaders(self) -> int:
        """Compile (or load from the cache) every registered variant; raises ShaderCompileError."""
        self._spirv.update(self._compiler.compile_all(all_variants()))
        return len(self._spirv)

    def close(self) -> None:
        """Free every Vulkan object; the engine cannot be used afterwards."""
        self._algorithms.clear()
        self._slots.clear()
        self._seq = None
        self._mgr.destroy()

    # -- execution ----------------------------------------------------------------------------------

    def execute(
        self,
        op: OperatorDesc,
        inputs: Sequence[Buffer],
        *,
        in_place: bool = False,
        out: Buffer | None = None,
    ) -> np.ndarray:
        """Run ``op`` on raw input buffers laid out as its input descriptors say.

        Returns the output buffer (OutputTensor.TotalTensorSizeInBytes bytes, uint8), written into
        ``out`` when given. Bytes of the output buffer that hold no element are zero, except in place,
        where they keep the input's bytes (the output is the input buffer).
        """
        if threading.get_ident() != self._owner:
            raise RuntimeError("an Engine is used only by the thread that created it (kp has no locks)")
        descs = op.inputs
        outd = op.output
        arrays = self._check_inputs(op, inputs, in_place)
        result = np.frombuffer(out, np.uint8) if out is not None else np.empty(outd.total_bytes, np.uint8)
        if result.nbytes != outd.total_bytes or result.flags.writeable is False:
            raise InvalidRequest(f"output buffer must be {outd.total_bytes} writable bytes", "OutputTensor")
        if outd.element_count == 0:
            result[:] = arrays[0][: result.nbytes] if in_place else 0
            return result

        layout = coalesce((*descs, outd))
        variant = Variant(op.shader, op.data_type.info.shader or "", layout.kind, len(descs))
        slot = self._slot(min(bucket(max(d.total_bytes for d in (*descs, outd)) + UNIT_BYTES), self._max_binding))
        algorithm = self._algorithm(variant, slot, in_place, op.data_type.info.size)

        names = [f"in{i}" for i in range(len(descs))]
        out_name = "in0" if in_place else "out"
        for name, data in zip(names, arrays):
            slot.views[name][: data.nbytes] = data
        if not in_place and not layout.packed:
            slot.views["out"][: outd.total_bytes] = 0  # gaps between strided elements must not leak old data
        push = _words([layout.count, len(layout.sizes), *op.shader_params()])
        if not layout.packed:
            words = layout.meta_words()
            slot.views["meta"].view(np.uint32)[: len(words)] = words

        uploads = [slot.tensors[n] for n in names] + ([] if layout.packed else [slot.tensors["meta"]])
        if not in_place and not layout.packed:
            uploads.append(slot.tensors["out"])
        started = time.perf_counter()
        self._run(algorithm, push, uploads, slot.tensors[out_name])
        self.stats.kernel_seconds += time.perf_counter() - started
        self.stats.dispatches += 1

        view = slot.views[out_name]
        if in_place:
            result[:] = view[: result.nbytes]
        else:
            span = outd.span_bytes()
            result[:span] = view[:span]
            result[span:] = 0
        self.stats.bytes_in += sum(a.nbytes for a in arrays)
        self.stats.bytes_out += result.nbytes
        return result

    def _run(self, algorithm: kp.Algorithm, push: np.ndarray, uploads: list[kp.Tensor], output: kp.Tensor) -> None:
        seq = self._seq
        seq.clear()
        if self.memory == "device":
            seq.record(kp.OpTensorSyncDevice(uploads))
        seq.record(kp.OpAlgoDispatch(algorithm, push))
        if self.memory == "device":
            seq.record(kp.OpTensorSyncLocal([output]))
        seq.eval()

    def _check_inputs(self, op: OperatorDesc, inputs: Sequence[Buffer], in_place: bool) -> list[np.ndarray]:
        if len(inputs) != len(op.input_fields):
            raise InvalidRequest(f"{op.type_name()} takes {len(op.input_fields)} input tensor(s), got {len(inputs)}")
        arrays = []
        for name, desc, data in zip(op.input_fields, op.inputs, inputs):
            array = np.frombuffer(data, np.uint8)
            if array.nbytes != desc.total_bytes:
                raise InvalidRequest(f"{name} data is {array.nbytes} bytes; its TotalTensorSizeInBytes is {desc.total_bytes}", name)
            arrays.append(array)
        op.check_execution(in_place, self.max_tensor_bytes)
        return arrays

    # -- pools --------------------------------------------------------------------------------------

    def _slot(self, capacity: int) -> _Slot:
        slot = self._slots.get(capacity)
        if slot is not None:
            self._slots.move_to_end(capacity)
            return slot
        while self._slots and self._pool_bytes + 3 * capacity > self.settings.pool_bytes:
            self._evict(next(iter(self._slots)))
        slot = self._slots[capacity] = _Slot(capacity)
        return slot

    def _tensor(self, slot: _Slot, name: str) -> kp.Tensor:
        tensor = slot.tensors.get(name)
        if tensor is None:
            size = META_WORDS * 4 if name == "meta" else slot.capacity
            tensor = self._mgr.tensor_t(np.zeros(size // 4, np.uint32), self._tensor_type)
            slot.tensors[name] = tensor
            slot.views[name] = tensor.data().view(np.uint8)
            self._pool_bytes += size
            self.stats.buffers_allocated += 1
        return tensor

    def _evict(self, capacity: int) -> None:
        slot = self._slots.pop(capacity)
        for key in [k for k in self._algorithms if k[1] == capacity]:
            self._algorithms.pop(key).destroy()
        for name, tensor in slot.tensors.items():
            self._pool_bytes -= META_WORDS * 4 if name == "meta" else slot.capacity
            tensor.destroy()
        self.stats.slots_evicted += 1

    def _algorithm(self, variant: Variant, slot: _Slot, in_place: bool, itemsize: int) -> kp.Algorithm:
        key = (variant, slot.capacity, in_place)
        algorithm = self._algorithms.get(key)
        if algorithm is not None:
            return algorithm
        spirv = self._spirv.get(variant)
        if spirv is None:
            spirv = self._spirv[variant] = self._compiler.spirv(variant)
        names = [f"in{i}" for i in range(variant.inputs)] + ["in0" if in_place else "out"]
        if variant.layout == "STRIDED":
            names.append("meta")
        tensors = [self._tensor(slot, n) for n in names]
        if variant.layout == "PACKED":
            units = slot.capacity // UNIT_BYTES
        else:
            units = slot.capacity // itemsize  # one element per invocation and step
        groups = max(1, min(-(-units // (self.settings.local_size * self.units_per_invocation)), self.max_workgroups))
        spec = np.array([self.settings.local_size], np.uint32)
        algorithm = self._mgr.algorithm(tensors, spirv, (groups, 1, 1), spec, _words([]))
        self._algorithms[key] = algorithm
        self.stats.pipelines_created += 1
        return algorithm
