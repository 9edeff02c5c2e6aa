"""What scripts/gpu-run.sh reports of the device before it measures: every Vulkan device with the
tuning vkact picks for it (service/device_tuning.py), its memory types and heaps (which memory
'device' and 'host' modes get), kp's view, the engine's choices, and torch's CUDA device."""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json

from service import vulkan_probe as vp
from service.device_tuning import tuning_for

MEMORY_FLAGS = {1: "DEVICE_LOCAL", 2: "HOST_VISIBLE", 4: "HOST_COHERENT", 8: "HOST_CACHED", 16: "LAZILY_ALLOCATED", 32: "PROTECTED"}


class _MemoryType(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint32), ("heap", ctypes.c_uint32)]


class _MemoryHeap(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("flags", ctypes.c_uint32)]


class _MemoryProps(ctypes.Structure):
    _fields_ = [("type_count", ctypes.c_uint32), ("types", _MemoryType * 32),
                ("heap_count", ctypes.c_uint32), ("heaps", _MemoryHeap * 16)]


def memory() -> None:
    vk = ctypes.CDLL(ctypes.util.find_library("vulkan") or "libvulkan.so.1")
    app = vp._AppInfo(vp._STYPE_APPLICATION_INFO, None, b"vkact-facts", 0, b"vkact", 0, vp._API_1_1)
    info = vp._InstanceInfo(vp._STYPE_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        print("memory: vkCreateInstance failed")
        return
    try:
        count = ctypes.c_uint32()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        for i, handle in enumerate(handles[: count.value]):
            props = _MemoryProps()
            vk.vkGetPhysicalDeviceMemoryProperties(ctypes.c_void_p(handle), ctypes.byref(props))
            for h in range(props.heap_count):
                heap = props.heaps[h]
                print(f"  device {i} heap {h}: {heap.size / 2**30:.1f} GiB{' DEVICE_LOCAL' if heap.flags & 1 else ''}")
            for t in range(props.type_count):
                mt = props.types[t]
                names = "|".join(n for bit, n in MEMORY_FLAGS.items() if mt.flags & bit) or "-"
                print(f"  device {i} type {t}: heap {mt.heap} {names}")
    finally:
        vk.vkDestroyInstance(instance, None)


def main() -> None:
    for d in vp.physical_devices():
        print(json.dumps(dataclasses.asdict(d)))
        print("  tuning:", tuning_for(d))
    memory()
    import kp

    print("kp:", kp.Manager().get_device_properties())
    from service.engine import Engine

    e = Engine()
    print(f"engine: {e.device.name} memory={e.memory} local_size={e.local_size} units/invocation={e.units_per_invocation} "
          f"max_tensor_bytes={e.max_tensor_bytes} features={sorted(e.kernel_features)}")
    e.close()
    try:
        import torch
    except ImportError:
        print("torch: not installed")
        return
    print("torch:", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")


if __name__ == "__main__":
    main()
