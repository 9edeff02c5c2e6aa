"""Per-device choices of the engine and the device worker, each tied to where it was measured.

Everything tuned so far was measured on llvmpipe (lavapipe) on a 2-core machine. Those figures hold
where they were measured and nowhere else: llvmpipe gets its measured paths, another CPU driver
(SwiftShader) the CPU facts that do not depend on the driver (its workgroups run on threads that share
the cores with the HTTP process), and a GPU what a GPU needs (device-local memory behind staging on a
discrete one, one unit per invocation, as many workgroups as the work takes, larger batches, no CPU
pinning or niceness).
"""
from __future__ import annotations

from dataclasses import dataclass

from .vulkan_probe import PhysicalDevice

# llvmpipe ends every loop of a shader invocation once its loops have run 65535 iterations in all
# (LP_MAX_TGSI_LOOP_ITERATIONS), silently; reductions keep each invocation within this many.
LLVMPIPE_LOOP_BUDGET = 32768
# The llvmpipe reduction kernels take this many element steps per loop iteration (UNROLL in
# glsl/common/reduction.glsl) to stay within the budget on long rows.
LLVMPIPE_UNROLL = 4
# Units (16-byte vectors, or elements when strided) per invocation on llvmpipe: it runs each SIMD batch
# of a workgroup through the whole loop, so more steps amortise the workgroup's and the invocation's
# set-up (its push constants, a fused graph's parameter words, each read lane by lane). Measured on
# llvmpipe (LLVM 15, 2 cores), packed FLOAT32 kernels against 4 steps in alternated rounds, 2^16 to
# 2^24 elements: 16 steps took 0.87-0.93 of the time (SOFTPLUS 0.87, SIGMOID 0.89-0.91, RELU 0.91-0.93;
# 32: within 0.02 of 16; 64: worse than 16), the fused 4-node exp/tanh chain 0.88 of its CPU time; an
# earlier build measured 1 step at 0.83 of 4's throughput. Strided kernels: even (0.99-1.03).
LLVMPIPE_UNITS_PER_INVOCATION = 16
# Queued requests of one descriptor that run as one dispatch (Settings.max_batch 0, the default): on a
# CPU driver each batched job's elements cost as much as alone, the batch saves one submission and
# one message per job, and 8 was where 8 clients stopped gaining (measured on llvmpipe). A GPU runs a
# batch's extra elements almost for free next to a submission, so it takes larger batches; 32 is a
# default reasoned from that, not measured yet (the first GPU runs, on an NVIDIA H200, measured kernels, not
# batching: bench/RESULTS.md): VKACT_MAX_BATCH overrides it.
CPU_MAX_BATCH = 8
GPU_MAX_BATCH = 32
# Microseconds a finished submission's fence is polled before kp blocks in vkWaitForFences (kp patch 9,
# KP_FENCE_SPIN_US: one value per process, read at its first wait). Measured on an NVIDIA H100 (driver
# 580.159.04, Firecracker VM; bench/native/vk_submit.c, 300 submissions of a 2^16-word dispatch): the
# blocking wait returned 45 us after the submission, polling 14 (an empty command buffer: 30 and 9), as
# fast as PyTorch's launch and synchronize (15). The GIL is held through kp's eval either way, so the poll
# costs the worker nothing but a core during the wait; 1 ms covers a dispatch of 2^27 elements there.
# On llvmpipe a poll of 30 us made /v1 slower (0.808 against 0.770 ms): its queue thread needs the core.
NVIDIA_FENCE_SPIN_US = 1000
# The smallest job whose kernel runs on its request's shared-memory slot itself (engine_direct: the slot's
# pages imported, VK_EXT_external_memory_host) instead of on copies in the engine's buffers, on a CPU device,
# whose memory is the host's: the copies are all the import saves there. Measured on llvmpipe (2 cores, a
# SHRINK replay on a slot against the copying replay, 10 alternated rounds): 0.87 of the time at 16 KiB,
# 0.85 at 256 KiB, 0.79 at 1 MiB, 0.47 at 4 MiB, 0.61 at 16 MiB. Each job shape on each slot gets a
# pipeline of its own (1-3.5 ms to make there, 1 MiB of JIT code), so small jobs, which save tens of us,
# keep the shared pipelines.
CPU_SLOT_IMPORT_BYTES = 1 << 20
# The same on NVIDIA's driver on a discrete GPU, where the kernel on the slot reads and writes host memory
# across the bus and the copying path copies into staging memory, then into device memory, and back. Measured
# on an H200 (driver 580.159.04; bench.direct_replay, SHRINK on FLOAT32, 10 alternated rounds of 5): 0.21 of
# the copying replay's time at 1 MiB (0.056 against 0.272 ms), 0.21 at 4 MiB, 0.17 at 16 MiB (0.49 against
# 2.82), 0.10 at 64 MiB (1.8 against 17.6). Below 1 MiB, other drivers and integrated GPUs: unmeasured, copied.
NVIDIA_SLOT_IMPORT_BYTES = 1 << 20


@dataclass(frozen=True)
class Tuning:
    memory: str                     # Settings.memory 'auto': 'host' (zero copy) or 'device' (staging)
    units_per_invocation: int       # elementwise kernels' units per invocation
    cpu_workgroups: bool            # reductions: few workgroups per core (a CPU pays per workgroup)
    loop_budget: int | None         # loop iterations an invocation may run (llvmpipe), else unbounded
    reduction_unroll: int           # Variant.unroll of the reduction kernels
    small_dispatch_engine: bool     # a second llvmpipe engine without its compute pool (worker_process)
    pin_cpu: bool                   # pin_cpu 'auto' pins the latency path (cpu_placement)
    nice_driver_threads: bool       # the driver's threads run at worker_nice
    max_batch: int                  # Settings.max_batch 0: queued jobs of one descriptor per dispatch
    fence_spin_us: int              # KP_FENCE_SPIN_US where the environment does not set it (0: block at once)
    slot_import_bytes: int | None   # jobs from this many bytes run on their slot's imported pages; None: never
    first_dispatch_compiles: bool   # a pipeline's machine code is made at its first dispatch (llvmpipe): the
                                    # graph build thread runs a new graph once (graph_builds), off the job thread


def tuning_for(device: PhysicalDevice) -> Tuning:
    llvmpipe = device.driver_name == "llvmpipe"
    cpu = device.is_cpu
    return Tuning(
        memory="device" if device.type == "discrete-gpu" else "host",   # a CPU or shared-memory GPU has one memory
        units_per_invocation=LLVMPIPE_UNITS_PER_INVOCATION if llvmpipe else 1,
        cpu_workgroups=cpu,
        loop_budget=LLVMPIPE_LOOP_BUDGET if llvmpipe else None,
        reduction_unroll=LLVMPIPE_UNROLL if llvmpipe else 1,
        small_dispatch_engine=llvmpipe,
        pin_cpu=cpu,
        nice_driver_threads=cpu,
        max_batch=CPU_MAX_BATCH if cpu else GPU_MAX_BATCH,
        fence_spin_us=NVIDIA_FENCE_SPIN_US if device.driver_name == "NVIDIA" else 0,
        slot_import_bytes=_measured_slot_import_bytes(device) if device.host_import_alignment else None,
        # measured on llvmpipe (Mesa 22.3, 2-core machine): a new 60-node graph's first run 4.2 s, its second 12.5 ms
        first_dispatch_compiles=llvmpipe,
    )


def _measured_slot_import_bytes(device: PhysicalDevice) -> int | None:
    """Where the slot path was measured to gain: every CPU device, NVIDIA's driver on a discrete GPU."""
    if device.is_cpu:
        return CPU_SLOT_IMPORT_BYTES
    if device.driver_name == "NVIDIA" and device.type == "discrete-gpu":
        return NVIDIA_SLOT_IMPORT_BYTES
    return None


def slot_import_bytes(tuning: Tuning, device: PhysicalDevice, mode: str) -> int | None:
    """The smallest job whose kernel runs on its slot's imported pages under Settings.slot_import ``mode``:
    the device's tuning ('auto'), any device that imports host memory ('on': a GPU at the CPU's size, for
    measuring it: bench.direct_replay), or never ('off')."""
    if mode == "auto":
        return tuning.slot_import_bytes
    if mode == "on" and device.host_import_alignment:
        return tuning.slot_import_bytes or CPU_SLOT_IMPORT_BYTES
    return None


def workgroup_size(wanted: int, max_invocations: int, max_size_x: int) -> int:
    """The kernels' workgroup size: ``wanted`` (Settings.local_size) within the device's
    maxComputeWorkGroupInvocations and maxComputeWorkGroupSize[0] (the spec guarantees 128), rounded
    down to a power of two so that every subgroup is full (the reductions' shuffles read every lane)."""
    size = max(1, min(wanted, max_invocations, max_size_x))
    return 1 << (size.bit_length() - 1)
