"""Which path each device type takes (service/device_tuning.py): llvmpipe its measured ones, another CPU
driver the driver-independent CPU facts, a GPU the GPU defaults. Devices are described, not opened."""
from __future__ import annotations

import dataclasses
import os

import pytest

from service.device_tuning import (CPU_MAX_BATCH, CPU_SLOT_IMPORT_BYTES, GPU_MAX_BATCH, LLVMPIPE_LOOP_BUDGET, LLVMPIPE_UNITS_PER_INVOCATION,
                                   LLVMPIPE_UNROLL, NVIDIA_FENCE_SPIN_US, NVIDIA_SLOT_IMPORT_BYTES, slot_import_bytes, tuning_for, workgroup_size)
from service.vulkan_probe import PhysicalDevice

BASE = PhysicalDevice(index=0, name="", type="cpu", vendor_id=0, device_id=0, api_version="1.3.0", driver_name="",
                      driver_info="", max_storage_buffer_range=1 << 27, max_push_constants_size=128,
                      max_memory_allocation_count=4096, subgroup_size=32, subgroup_operations=0xFF)
LLVMPIPE = dataclasses.replace(BASE, name="llvmpipe (LLVM 15.0.6, 256 bits)", driver_name="llvmpipe", subgroup_size=8)
SWIFTSHADER = dataclasses.replace(BASE, name="SwiftShader Device (Subzero)", driver_name="SwiftShader driver", subgroup_size=4)
DISCRETE = dataclasses.replace(BASE, name="NVIDIA GeForce RTX 4090", type="discrete-gpu", driver_name="NVIDIA")
INTEGRATED = dataclasses.replace(BASE, name="Intel(R) UHD Graphics 770", type="integrated-gpu", driver_name="Intel open-source Mesa driver")


def test_llvmpipe_takes_every_path_measured_on_it():
    t = tuning_for(LLVMPIPE)
    assert t.memory == "host" and t.units_per_invocation == LLVMPIPE_UNITS_PER_INVOCATION == 16 and t.cpu_workgroups
    assert t.loop_budget == LLVMPIPE_LOOP_BUDGET and t.reduction_unroll == LLVMPIPE_UNROLL
    assert t.small_dispatch_engine and t.pin_cpu and t.nice_driver_threads
    assert t.max_batch == CPU_MAX_BATCH == 8
    assert t.fence_spin_us == 0  # its queue thread needs the core the poll would take


def test_another_cpu_driver_gets_the_cpu_facts_but_none_of_llvmpipes_own():
    t = tuning_for(SWIFTSHADER)
    assert t.memory == "host" and t.cpu_workgroups and t.pin_cpu and t.nice_driver_threads
    assert t.units_per_invocation == 1 and t.loop_budget is None and t.reduction_unroll == 1
    assert not t.small_dispatch_engine
    assert t.max_batch == CPU_MAX_BATCH


@pytest.mark.parametrize("device, memory", [(DISCRETE, "device"), (INTEGRATED, "host")], ids=["discrete", "integrated"])
def test_a_gpu_gets_the_gpu_defaults(device, memory):
    t = tuning_for(device)
    assert t.memory == memory       # staging in front of VRAM on a discrete GPU; one memory on an integrated one
    assert t.units_per_invocation == 1 and not t.cpu_workgroups and t.loop_budget is None and t.reduction_unroll == 1
    assert not (t.small_dispatch_engine or t.pin_cpu or t.nice_driver_threads)
    assert t.max_batch == GPU_MAX_BATCH > CPU_MAX_BATCH  # larger batches: a GPU's extra elements are nearly free
    # the fence polled first only on the driver where polling was measured to answer sooner
    assert t.fence_spin_us == (NVIDIA_FENCE_SPIN_US if device.driver_name == "NVIDIA" else 0)


@pytest.mark.parametrize("device", [LLVMPIPE, SWIFTSHADER, DISCRETE, INTEGRATED], ids=["llvmpipe", "swiftshader", "discrete", "integrated"])
@pytest.mark.parametrize("alignment", [0, 4096], ids=["no import", "imports"])
def test_jobs_run_on_their_slots_pages_where_measured_to_gain(device, alignment):
    """A CPU device's memory is the host's: the import saves the copies there (measured on llvmpipe). On
    NVIDIA's driver on a discrete GPU it saves the staging copies and transfers (measured on an H200). Other
    GPUs copy: unmeasured. Without the import nobody does."""
    t = tuning_for(dataclasses.replace(device, host_import_alignment=alignment))
    measured = CPU_SLOT_IMPORT_BYTES if device.is_cpu else NVIDIA_SLOT_IMPORT_BYTES if device is DISCRETE else None
    assert t.slot_import_bytes == (measured if alignment else None)
    # VKACT_SLOT_IMPORT: auto as above; on wherever the device imports host memory (a GPU too); off never
    described = dataclasses.replace(device, host_import_alignment=alignment)
    assert slot_import_bytes(t, described, "auto") == t.slot_import_bytes
    assert slot_import_bytes(t, described, "on") == ((measured or CPU_SLOT_IMPORT_BYTES) if alignment else None)
    own = dataclasses.replace(t, slot_import_bytes=3 << 20)  # 'on' keeps a device's own size where it has one
    assert slot_import_bytes(own, described, "on") == (3 << 20 if alignment else None)
    assert slot_import_bytes(t, described, "off") is None


@pytest.mark.parametrize("wanted, invocations, size_x, expected", [
    (256, 1024, 1024, 256),      # lavapipe, SwiftShader and most GPUs
    (256, 128, 1024, 128),       # the spec's minimum maxComputeWorkGroupInvocations
    (1024, 1024, 512, 512),      # maxComputeWorkGroupSize[0] below the invocations
    (96, 1024, 1024, 64),        # full subgroups: a power of two
])
def test_workgroup_size_within_the_device_limits(wanted, invocations, size_x, expected):
    assert workgroup_size(wanted, invocations, size_x) == expected


def test_the_engine_follows_the_tuning_of_its_device(engine):
    t = tuning_for(engine.device)
    assert engine.tuning == t
    assert (engine.units_per_invocation, engine.reduction_unroll) == (t.units_per_invocation, t.reduction_unroll)
    assert engine.local_size <= engine._mgr.get_device_properties()["max_work_group_invocations"]


def test_the_engine_sets_its_devices_fence_poll_unless_the_environment_does(monkeypatch):
    """kp reads KP_FENCE_SPIN_US once per process: the engine puts its device's default there before its
    first wait, and never overrides what an operator set. The engine writes os.environ itself: each case
    runs on a copy of it, so that no value is left behind (one left would reach every service this process
    spawns later, its device workers polling each fence for up to 1 ms on lavapipe)."""
    import service.engine as engine_module

    before = os.environ.get("KP_FENCE_SPIN_US")

    class Stop(Exception):
        pass

    seen = {}

    def manager(*args, **kwargs):
        seen["spin"] = os.environ.get("KP_FENCE_SPIN_US")
        raise Stop

    monkeypatch.setattr(engine_module.kp, "Manager", manager)
    for device, preset, expected in [(DISCRETE, None, str(NVIDIA_FENCE_SPIN_US)), (DISCRETE, "0", "0"), (LLVMPIPE, None, None)]:
        env = {k: v for k, v in os.environ.items() if k != "KP_FENCE_SPIN_US"}
        if preset is not None:
            env["KP_FENCE_SPIN_US"] = preset
        monkeypatch.setattr(os, "environ", env)
        monkeypatch.setattr(engine_module, "choose", lambda devices, wanted, device=device: device)
        with pytest.raises(Stop):
            engine_module.Engine()
        assert seen["spin"] == expected, (device.name, preset)
    monkeypatch.undo()
    assert os.environ.get("KP_FENCE_SPIN_US") == before
