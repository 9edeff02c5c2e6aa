"""How an operator's dispatch is shaped on one device: its kernel variant, push constants, layout table and
workgroup count, and the buffer capacity it runs on.

Arithmetic over the device's facts (``vulkan_probe``), its tuning (``device_tuning``) and the settings:
nothing here makes a Vulkan object. ``Engine`` is a ``DispatchGeometry`` and creates the pipelines and
buffers it names; a graph run (``engine_graph``) and the device worker (which routes a job by its
workgroup count) ask it too.

Two kernel contracts (``OperatorDesc.kind``): elementwise kernels walk a coalesced ``Layout``;
reductions (the softmax family, glsl/common/reduction.glsl) walk a ``RowLayout``: rows of reduced
elements, with the lanes per row and the workgroup count chosen per call (``_row_split``), since a
CPU driver pays for every empty workgroup; their Algorithms are cached per workgroup count too.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from .buckets import bucket
from .config import Settings
from .descriptors import packed_strides
from .descriptors.datatypes import KERNEL_FEATURES
from .device_tuning import Tuning, workgroup_size
from .errors import UnsupportedOnDevice
from .layout import RowLayout, coalesce, row_layout
from .operators import OperatorDesc
from .operators.numerics import flush_subnormal
from .operators.reduction import ReductionDesc
from .shaders import Variant
from .vulkan_probe import PhysicalDevice

UNIT_BYTES = 16          # the packed kernels move one 16-byte vector per invocation and step
PUSH_WORDS = 16          # count, rank, 14 parameter words (the shaders' Push block, elementwise.glsl)
META_WORDS = 8 * 4       # sizes + up to three tensors' strides (MAX_DIMS words each)
# Reductions on a GPU give rows at least this long a whole workgroup (one subgroup per row leaves too
# few warps in flight for a few long rows); a CPU driver never does: lavapipe runs a barrier as a
# coroutine switch of every SIMD batch of the workgroup (measured: 0.02 of the copy ceiling on 1,024-
# element rows against 0.6 with one subgroup per row).
WORKGROUP_ROW_LEN = 4096
# A CPU driver runs workgroups on its threads (one per core), each workgroup's subgroups one after the
# other, and pays for each workgroup's set-up (about 5 us on lavapipe, empty or not): reductions get at
# most this many workgroups per core there, the grid-stride loop the rest (16,384 rows of 1,024: 0.39
# of the copy ceiling at 8 groups against 0.35 at 512).
CPU_GROUPS_PER_CORE = 4
# On a CPU, rows at least this long get a whole workgroup each when a subgroup per row would leave
# cores idle (fewer workgroups than cores): one barrier per row is then cheap.
CPU_WORKGROUP_ROW_LEN = 1 << 18


def push_words(values: Sequence[int | float | np.float64 | np.int64 | np.uint64], length: int = PUSH_WORDS) -> np.ndarray:
    """Push constants as uint32 words, floats bit-cast (kp 0.9 takes the push type from the spec array).
    A Python float is a float32 word, a Python int a uint32 word; a numpy float64, int64 or uint64 takes
    two words, low first, at an even index (glsl/common/dtype.glsl's contract: PARAM_F64(i) and friends).
    Subnormal float32 values go as signed zeros: some devices flush them in arithmetic (lavapipe does),
    others do not, and every device should compute what the reference does (OperatorDesc.reference)."""
    out = np.zeros(length, np.uint32)
    i = 0
    for v in values:
        if isinstance(v, (np.float64, np.int64, np.uint64)):
            if i % 2:
                raise ValueError(f"a 64-bit push constant must start at an even word, not word {i} (pad with a 0)")
            out[i : i + 2] = np.array([v]).view(np.uint32)
            i += 2
            continue
        out[i] = np.float32(flush_subnormal(v)).view(np.uint32) if isinstance(v, float) else v
        i += 1
    return out


class DispatchGeometry:
    """The shape of every dispatch on one device (see the module's docstring). Its limits are set once
    from the device's properties (``kp.Manager.get_device_properties``); a benchmark may vary
    ``units_per_invocation`` afterwards (bench.gpu_tuning), and every later shape follows."""

    def __init__(self, device: PhysicalDevice, tuning: Tuning, settings: Settings, props: Mapping) -> None:
        self.device = device
        self.tuning = tuning
        self.max_workgroup_count = int(props["max_work_group_count"][0])
        # The patched kp enables the KERNEL_FEATURES the device reports (scripts/build-kp.sh); the
        # native 64-bit kernels use them unless Settings.native_64bit turns them off.
        self.features_enabled = frozenset(f for f in KERNEL_FEATURES if f in self.device.features)
        self.kernel_features = self.features_enabled if settings.native_64bit else frozenset()
        # Settings.local_size within the device's workgroup limits (kernels specialise on it).
        self.local_size = workgroup_size(settings.local_size, int(props["max_work_group_invocations"]), int(props["max_work_group_size"][0]))
        # Units (16-byte vectors, or elements when strided) per invocation: 4 on llvmpipe (measured,
        # device_tuning); a GPU wants one unit per invocation and as many groups as that takes.
        self.units_per_invocation = self.tuning.units_per_invocation
        self.reduction_unroll = self.tuning.reduction_unroll
        self.max_workgroups = min(settings.max_workgroups or self.max_workgroup_count, self.max_workgroup_count)
        self.max_reduction_workgroups = (
            min(self.max_workgroups, CPU_GROUPS_PER_CORE * (os.cpu_count() or 1)) if self.tuning.cpu_workgroups else self.max_workgroups
        )
        # A binding may not exceed maxStorageBufferRange; the packed kernels read whole 16-byte
        # vectors, so a tensor leaves one vector of slack below it.
        self._max_binding = self.device.max_storage_buffer_range // UNIT_BYTES * UNIT_BYTES
        self.max_tensor_bytes = min(settings.max_tensor_bytes or self._max_binding, self._max_binding - UNIT_BYTES)

    def dispatch_shape(self, op: OperatorDesc) -> tuple[Variant, np.ndarray, list[int] | None, bool, int | None]:
        """``op``'s kernel variant, push constants, meta table (strided layouts), whether its output has
        gaps to clear, and its workgroup count (None for elementwise kernels: the buffers' capacity
        decides, see ``workgroups``)."""
        if isinstance(op, ReductionDesc):
            return self._reduction(op)
        layout = coalesce((*op.inputs, op.output))
        variant = Variant(op.kernel(), op.shader_dtype(self.kernel_features), layout.kind, len(op.inputs))
        push = push_words([layout.count, len(layout.sizes), *op.shader_params()])
        return variant, push, None if layout.packed else layout.meta_words(), not layout.packed, None

    def dispatch_workgroups(self, op: OperatorDesc) -> int:
        """The workgroup count of ``op``'s dispatch (what ``prepare(op).workgroups`` says), worked out
        without creating anything: the device worker picks an engine by it."""
        if isinstance(op, ReductionDesc):
            return self._reduction(op)[4]
        unit = UNIT_BYTES if coalesce((*op.inputs, op.output)).packed else op.data_type.info.size
        return self.workgroups(self._capacity(op) // unit)

    def _capacity(self, op: OperatorDesc) -> int:
        """The buffer slot an execution of ``op`` uses: its largest tensor's size bucket, plus the packed
        kernels' one vector of slack."""
        return min(bucket(max(d.total_bytes for d in (*op.inputs, op.output)) + UNIT_BYTES), self._max_binding)

    def workgroups(self, units: int) -> int:
        """Workgroups of an elementwise dispatch over ``units`` (16-byte units, or elements when
        strided): enough to cover them at units_per_invocation each, within max_workgroups."""
        return max(1, min(-(-units // (self.local_size * self.units_per_invocation)), self.max_workgroups))

    def _reduction(self, op: ReductionDesc) -> tuple[Variant, np.ndarray, list[int] | None, bool, int]:
        """A reduction's variant, push constants, meta table (strided layouts), whether the output
        must be cleared first (it has gaps), and workgroup count."""
        if not self.device.subgroup_reductions:
            raise UnsupportedOnDevice(f"{op.type_name()} needs subgroup shuffles in compute shaders; {self.device.name} lacks them", "Type")
        rl = row_layout((*op.inputs, op.output), op.reduced_axes())
        variant = Variant(op.kernel(), op.shader_dtype(self.kernel_features), rl.kind, len(op.inputs), op.kind, self.reduction_unroll)
        cluster, groups = self._row_split(rl, op.data_type.info.size)
        push = push_words([rl.rows, rl.row_len, cluster, rl.row_stride, len(rl.outer), len(rl.inner)])
        clear = op.output.strides != packed_strides(op.output.Sizes)
        return variant, push, None if rl.packed else rl.meta_words(), clear, groups

    def _row_split(self, rl: RowLayout, itemsize: int) -> tuple[int, int]:
        """(lanes per row, workgroups) of a reduction. Lanes per row is a power of two up to the
        subgroup size, about two loads (16-byte units when packed) per lane, or 1 when neighbouring
        rows are neighbours in memory; 0 is a whole workgroup per row (long rows on a GPU, or on a
        CPU long rows too few to keep every core busy). The workgroups cover the rows once, rounded up
        to three significant bits (so that few pipelines serve all row counts) and capped by
        ``max_workgroups`` (fewer on a CPU); the kernel's grid-stride loop does the rest. On llvmpipe
        every invocation stays within its loop budget (device_tuning); a row too long for that is refused."""
        subgroup, local, unroll = self.device.subgroup_size, self.local_size, self.reduction_unroll
        per_item = UNIT_BYTES // itemsize if rl.packed else 1        # elements per loop step
        items = -(-rl.row_len // per_item)
        loose = 2 * (per_item - 1) if rl.packed else 0                # elements before and after the units

        inner_index = len(rl.inner) + 1 if len(rl.inner) > 1 else 0   # strided index loops, per element
        outer_index = len(rl.outer) + 1                                  # and per row

        def iterations(lanes: int) -> int:
            """Loop iterations of one invocation per row: two sweeps (each with its remainder, loose
            elements, exits and the strided index loops), the butterfly, the workgroup's fold."""
            mine = -(-items // lanes)
            sweep = -(-mine // unroll) + unroll + -(-loose // lanes) + 3
            sweep += mine * per_item if unroll == 1 and rl.packed else 0   # the rolled unit loop
            sweep += mine * inner_index + outer_index if not rl.packed else 0
            fold = -(-local // max(subgroup, 1)) if lanes == local else 0
            return 2 * sweep + 8 + fold

        if rl.rows_contiguous and rl.rows >= 8 * subgroup:
            cluster = 1
        else:
            cluster = min(1 << (-(-items // 2) - 1).bit_length(), subgroup)
        budget = self.tuning.loop_budget
        if self.tuning.cpu_workgroups:
            idle = -(-rl.rows // (local // cluster)) < (os.cpu_count() or 1)
            whole = (budget is not None and iterations(cluster) > budget // 2) or (idle and rl.row_len >= CPU_WORKGROUP_ROW_LEN)
        else:
            whole = rl.row_len >= WORKGROUP_ROW_LEN
        lanes = local if whole else cluster
        groups = -(-rl.rows // (local // lanes))
        step = 1 << max(groups.bit_length() - 3, 0)
        groups = min(-(-groups // step) * step, self.max_reduction_workgroups)
        if budget is not None:
            per_row = iterations(lanes)
            rows_per_invocation = budget // per_row
            needed = -(-rl.rows // (rows_per_invocation * (local // lanes))) if rows_per_invocation else 0
            if not rows_per_invocation or needed > self.max_workgroups:
                raise UnsupportedOnDevice(
                    f"rows of {rl.row_len} elements, {rl.rows} of them, are beyond what {self.device.driver_name} "
                    f"runs in one dispatch (its loops stop after 65535 iterations per invocation)", "InputTensor.Sizes")
            groups = max(groups, needed)
        return (0 if whole else cluster), max(1, groups)
