"""The engine's device memory: buffers in slots of a few capacity buckets, and the pipelines bound to them.

kp binds an Algorithm (pipeline + descriptor set) to fixed tensors, and tensors cannot grow. So buffers
live in one slot per capacity bucket, made on first use, and each kernel variant gets one Algorithm per
slot. Both are kept least recently used first: slots until their buffers outgrow ``pool_bytes``, pipelines
until there are ``max_pipelines`` (each is a compiled pipeline: on llvmpipe, JIT code in this process).

What was recorded against a slot or a pipeline is the engine's (its plans, their replayers): whenever
one goes, the pool tells it through ``forget`` (None: a slot went, so any plan may be stale; else the
pipeline destroyed), before the Vulkan objects are destroyed.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import kp
import numpy as np

from .dispatch_geometry import META_WORDS
from .engine_plan import EngineStats, _Slot

Forget = Callable[[kp.Algorithm | None], None]


class BufferPool:
    def __init__(self, mgr: kp.Manager, tensor_type: kp.TensorTypes, pool_bytes: int, max_pipelines: int,
                 stats: EngineStats, forget: Forget) -> None:
        self._mgr = mgr
        self._tensor_type = tensor_type
        self._limit_bytes = pool_bytes
        self._max_pipelines = max_pipelines
        self._stats = stats
        self._forget = forget
        self.slots: OrderedDict[int, _Slot] = OrderedDict()
        # (variant, capacity, in_place[, groups]): with its workgroups; least recently used first
        self.pipelines: OrderedDict[tuple, tuple[kp.Algorithm, int]] = OrderedDict()
        self.bytes = 0   # of every slot's buffers
        self.epoch = 0   # counts trims: a slot (a graph run, a direct run) not used since the last one is idle

    def slot(self, capacity: int) -> _Slot:
        """The slot of ``capacity``, made (evicting the least recently used) where there is none."""
        slot = self.slots.get(capacity)
        if slot is not None:
            self.touch(slot)
            return slot
        while self.slots and self.bytes + 3 * capacity > self._limit_bytes:
            self._evict(next(iter(self.slots)))
        slot = self.slots[capacity] = _Slot(capacity, self.epoch)
        return slot

    def touch(self, slot: _Slot) -> None:
        """``slot`` is in use: the last to evict, and not idle at the next trim."""
        self.slots.move_to_end(slot.capacity)
        slot.used = self.epoch

    def tensor(self, slot: _Slot, name: str) -> kp.Tensor:
        """``slot``'s buffer ``name`` (in0, in1, out: its capacity; meta: the strided kernels' table)."""
        tensor = slot.tensors.get(name)
        if tensor is None:
            size = META_WORDS * 4 if name == "meta" else slot.capacity
            tensor = self._mgr.tensor_t(np.zeros(size // 4, np.uint32), self._tensor_type)
            slot.tensors[name] = tensor
            slot.views[name] = tensor.data().view(np.uint8)
            self.bytes += size
            self._stats.buffers_allocated += 1
        return tensor

    def pipeline(self, key: tuple, make: Callable[[], tuple[kp.Algorithm, int]]) -> tuple[kp.Algorithm, int]:
        """The pipeline kept under ``key`` (whose second item is its slot's capacity), else ``make()``'s,
        kept once the least recently used have made room for it."""
        cached = self.pipelines.get(key)
        if cached is not None:
            self.pipelines.move_to_end(key)
            return cached
        while len(self.pipelines) >= self._max_pipelines:
            self._drop_pipeline(next(iter(self.pipelines)))
        made = self.pipelines[key] = make()
        self._stats.pipelines_created += 1
        return made

    def trim(self) -> int:
        """Free the buffers (and pipelines) of slots unused since the last trim and begin a new epoch.
        Returns the slots freed."""
        idle = [capacity for capacity, slot in self.slots.items() if slot.used < self.epoch]
        for capacity in idle:
            self._evict(capacity)
        self.epoch += 1
        return len(idle)

    def clear(self) -> None:
        """Let go of every slot and pipeline, destroyed with the manager (Engine.close)."""
        self.pipelines.clear()
        self.slots.clear()

    def _evict(self, capacity: int) -> None:
        slot = self.slots.pop(capacity)
        self._forget(None)  # a plan or a replayer may use this slot
        for key in [k for k in self.pipelines if k[1] == capacity]:
            self.pipelines.pop(key)[0].destroy()
            self._stats.pipelines_destroyed += 1
        for name, tensor in slot.tensors.items():
            self.bytes -= META_WORDS * 4 if name == "meta" else slot.capacity
            tensor.destroy()
        self._stats.slots_evicted += 1

    def _drop_pipeline(self, key: tuple) -> None:
        algorithm = self.pipelines.pop(key)[0]
        self._forget(algorithm)
        algorithm.destroy()
        self._stats.pipelines_destroyed += 1
