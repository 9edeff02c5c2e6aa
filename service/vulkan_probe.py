"""What kp does not expose about the Vulkan devices: type (CPU or GPU), driver, and the buffer limits.

kp 0.9's ``list_devices`` returns names and workgroup limits only. This module asks the Vulkan loader
directly (ctypes, vkGetPhysicalDeviceProperties2 with VkPhysicalDeviceDriverProperties) through a
throwaway instance; devices come in the loader's enumeration order, the one kp's Manager indexes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import asdict, dataclass

DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}

_STYPE_APPLICATION_INFO = 0
_STYPE_INSTANCE_CREATE_INFO = 1
_STYPE_PHYSICAL_DEVICE_PROPERTIES_2 = 1000059001
_STYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES = 1000196000
_STYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES = 1000094000
_STYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES = 1000197000
_STYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES = 1000178002
#: The device extension that lets a shader declare SignedZeroInfNanPreserve (core in Vulkan 1.2; kp's
#: instance asks for 1.1, so the engine enables it by name).
FLOAT_CONTROLS_EXTENSION = "VK_KHR_shader_float_controls"
_API_1_1 = (1 << 22) | (1 << 12)
#: The device extension that imports host memory (a shared-memory slot) as a buffer's memory.
HOST_IMPORT_EXTENSION = "VK_EXT_external_memory_host"

# VkPhysicalDeviceFeatures: 55 VkBool32 members (Vulkan 1.0 ABI); the index of the ones vkact reads.
_FEATURE_COUNT = 55
FEATURE_INDEX = {"shaderFloat64": 39, "shaderInt64": 40, "shaderInt16": 41}

# Offsets in VkPhysicalDeviceProperties (Vulkan 1.x, stable ABI); VkPhysicalDeviceLimits starts at 296
# (after deviceName[256] at 20 and pipelineCacheUUID[16], 8-aligned). In the limits: 11 uint32 (0-43),
# then the 8-byte VkDeviceSize bufferImageGranularity (48) and sparseAddressSpaceSize (56), then
# maxBoundDescriptorSets (64) and the per-stage descriptor counts: samplers, uniform buffers, storage buffers.
_LIMITS = 296
_MAX_STORAGE_BUFFER_RANGE = _LIMITS + 28
_MAX_PUSH_CONSTANTS_SIZE = _LIMITS + 32
_MAX_MEMORY_ALLOCATION_COUNT = _LIMITS + 36
_MAX_PER_STAGE_STORAGE_BUFFERS = _LIMITS + 76
#: What every Vulkan device allows (the spec's required minimum of maxPerStageDescriptorStorageBuffers).
MIN_PER_STAGE_STORAGE_BUFFERS = 4


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class _DriverProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("driverID", ctypes.c_uint32),
                ("driverName", ctypes.c_char * 256), ("driverInfo", ctypes.c_char * 256),
                ("conformanceVersion", ctypes.c_uint8 * 4)]


class _SubgroupProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("subgroupSize", ctypes.c_uint32),
                ("supportedStages", ctypes.c_uint32), ("supportedOperations", ctypes.c_uint32),
                ("quadOperationsInAllStages", ctypes.c_uint32)]


class _FloatControlsProps(ctypes.Structure):
    # two VkShaderFloatControlsIndependence, then 15 VkBool32 of which the first three are read here
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("denormBehaviorIndependence", ctypes.c_uint32),
                ("roundingModeIndependence", ctypes.c_uint32), ("preserve16", ctypes.c_uint32),
                ("preserve32", ctypes.c_uint32), ("preserve64", ctypes.c_uint32), ("rest", ctypes.c_uint32 * 12)]


class _HostImportProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("minImportedHostPointerAlignment", ctypes.c_uint64)]


class _ExtensionProps(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]


#: VkSubgroupFeatureFlagBits that the reduction kernels use (basic, shuffle), in the compute stage.
SUBGROUP_BASIC, SUBGROUP_SHUFFLE = 0x1, 0x10
_STAGE_COMPUTE = 0x20


class _Props2(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("properties", ctypes.c_uint8 * 1024)]


@dataclass(frozen=True)
class PhysicalDevice:
    index: int
    name: str
    type: str                  # DEVICE_TYPES value
    vendor_id: int
    device_id: int
    api_version: str
    driver_name: str
    driver_info: str
    max_storage_buffer_range: int
    max_push_constants_size: int
    max_memory_allocation_count: int
    max_per_stage_storage_buffers: int = MIN_PER_STAGE_STORAGE_BUFFERS  # storage buffers one shader may bind
    subgroup_size: int = 0             # VkPhysicalDeviceSubgroupProperties (Vulkan 1.1); 0 if unknown
    subgroup_operations: int = 0       # its supportedOperations, if the compute stage supports subgroups
    features: tuple[str, ...] = ()     # the VkPhysicalDeviceFeatures in FEATURE_INDEX that it reports
    # Float widths (16, 32, 64) whose NaN, Inf and signed zero a shader may ask the compiler to keep
    # (VkPhysicalDeviceFloatControlsProperties.shaderSignedZeroInfNanPreserveFloatN, read only where the
    # device has VK_KHR_shader_float_controls). Without that request a compiler may assume no NaN or Inf
    # (NVIDIA's does: CELU(NaN) came out -1, isinf was folded away).
    nan_preserving_widths: tuple[int, ...] = ()
    # VkPhysicalDeviceExternalMemoryHostPropertiesEXT.minImportedHostPointerAlignment where the device has
    # HOST_IMPORT_EXTENSION (an imported range's address and size are multiples of it); 0 where it has not.
    host_import_alignment: int = 0

    @property
    def preserves_nan(self) -> bool:
        """Kernels may declare SignedZeroInfNanPreserve for 32-bit floats (the engine then enables
        FLOAT_CONTROLS_EXTENSION and adds the mode to every module it loads: spirv_float_controls)."""
        return 32 in self.nan_preserving_widths

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    @property
    def subgroup_reductions(self) -> bool:
        """Compute shaders may use the subgroup operations of the reduction kernels (shuffles)."""
        wanted = SUBGROUP_BASIC | SUBGROUP_SHUFFLE
        return self.subgroup_size > 0 and self.subgroup_operations & wanted == wanted

    def as_dict(self) -> dict:
        return asdict(self)


def _version(v: int) -> str:
    return f"{(v >> 22) & 0x7f}.{(v >> 12) & 0x3ff}.{v & 0xfff}"


def physical_devices() -> list[PhysicalDevice]:
    """Every Vulkan device the loader sees; [] when there is no loader or no driver."""
    lib = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
    try:
        vk = ctypes.CDLL(lib)
    except OSError:
        return []
    app = _AppInfo(_STYPE_APPLICATION_INFO, None, b"vkact-probe", 0, b"vkact", 0, _API_1_1)
    info = _InstanceInfo(_STYPE_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        return [_describe(vk, i, handle) for i, handle in enumerate(handles[: count.value])]
    finally:
        vk.vkDestroyInstance(instance, None)


def _device_extensions(vk: ctypes.CDLL, handle: int) -> set[str]:
    count = ctypes.c_uint32()
    if vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(handle), None, ctypes.byref(count), None) != 0:
        return set()
    props = (_ExtensionProps * count.value)()
    if vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(handle), None, ctypes.byref(count), props) != 0:
        return set()
    return {p.extensionName.decode(errors="replace") for p in props[: count.value]}


def _describe(vk: ctypes.CDLL, index: int, handle: int) -> PhysicalDevice:
    extensions = _device_extensions(vk, handle)
    host_import = _HostImportProps(_STYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES, None)
    has_host_import = HOST_IMPORT_EXTENSION in extensions
    float_controls = _FloatControlsProps(_STYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES,
                                         ctypes.cast(ctypes.pointer(host_import), ctypes.c_void_p) if has_host_import else None)
    has_float_controls = FLOAT_CONTROLS_EXTENSION in extensions
    chained = float_controls if has_float_controls else host_import if has_host_import else None
    subgroup = _SubgroupProps(_STYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                              None if chained is None else ctypes.cast(ctypes.pointer(chained), ctypes.c_void_p))
    driver = _DriverProps(_STYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, ctypes.cast(ctypes.pointer(subgroup), ctypes.c_void_p))
    props = _Props2(_STYPE_PHYSICAL_DEVICE_PROPERTIES_2, ctypes.cast(ctypes.pointer(driver), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceProperties2(ctypes.c_void_p(handle), ctypes.byref(props))
    raw = bytes(props.properties)
    features = (ctypes.c_uint32 * _FEATURE_COUNT)()
    vk.vkGetPhysicalDeviceFeatures(ctypes.c_void_p(handle), ctypes.byref(features))

    def u32(offset: int) -> int:
        return int.from_bytes(raw[offset : offset + 4], "little")

    return PhysicalDevice(
        index=index,
        name=raw[20:276].split(b"\0", 1)[0].decode(errors="replace"),
        type=DEVICE_TYPES.get(u32(16), "other"),
        vendor_id=u32(8),
        device_id=u32(12),
        api_version=_version(u32(0)),
        driver_name=driver.driverName.decode(errors="replace"),
        driver_info=driver.driverInfo.decode(errors="replace"),
        max_storage_buffer_range=u32(_MAX_STORAGE_BUFFER_RANGE),
        max_push_constants_size=u32(_MAX_PUSH_CONSTANTS_SIZE),
        max_memory_allocation_count=u32(_MAX_MEMORY_ALLOCATION_COUNT),
        max_per_stage_storage_buffers=u32(_MAX_PER_STAGE_STORAGE_BUFFERS),
        subgroup_size=subgroup.subgroupSize,
        subgroup_operations=subgroup.supportedOperations if subgroup.supportedStages & _STAGE_COMPUTE else 0,
        features=tuple(name for name, i in FEATURE_INDEX.items() if features[i]),
        nan_preserving_widths=tuple(w for w, on in ((16, float_controls.preserve16), (32, float_controls.preserve32),
                                                     (64, float_controls.preserve64)) if has_float_controls and on),
        host_import_alignment=int(host_import.minImportedHostPointerAlignment) if has_host_import else 0,
    )


def choose(devices: list[PhysicalDevice], wanted: str) -> PhysicalDevice:
    """'auto': the first discrete GPU, else the first GPU, else the first device; or an index; or a name part."""
    if not devices:
        raise LookupError("no Vulkan device found (is a Vulkan driver installed? lavapipe: mesa-vulkan-drivers)")
    if wanted == "auto":
        for kinds in (("discrete-gpu",), ("integrated-gpu", "virtual-gpu")):
            for d in devices:
                if d.type in kinds:
                    return d
        return devices[0]
    if wanted.isdigit():
        i = int(wanted)
        if i < len(devices):
            return devices[i]
        raise LookupError(f"device index {i} out of range: {len(devices)} Vulkan device(s)")
    for d in devices:
        if wanted.lower() in d.name.lower():
            return d
    raise LookupError(f"no Vulkan device named like {wanted!r}; found: {', '.join(d.name for d in devices)}")


def gpu_missing(devices: list[PhysicalDevice], wanted: str) -> str | None:
    """Why ``wanted`` does not give a GPU among ``devices`` (one line), or None when it does: a
    device's reported type decides, not its driver's name."""
    try:
        device = choose(devices, wanted)
    except LookupError as e:
        return str(e)
    if device.type in ("discrete-gpu", "integrated-gpu", "virtual-gpu"):
        return None
    return f"the Vulkan device chosen ({wanted!r}) is {device.name}, a {device.type} device, not a GPU; found: " + ", ".join(
        f"{d.name} ({d.type})" for d in devices)


if __name__ == "__main__":
    for d in physical_devices():
        print(d.as_dict())
