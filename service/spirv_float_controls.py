"""Ask a device's shader compiler to keep NaN, Inf and signed zeros: SPIR-V's SignedZeroInfNanPreserve.

Without that execution mode a Vulkan compiler may assume that no float is NaN or Inf (SPV_KHR_float_controls;
core in SPIR-V 1.4 / Vulkan 1.2). NVIDIA's does, measured on an H200 (driver 580.159.04): CELU(NaN)
came out -1, TANH(NaN) 1 or 0, SOFTSIGN(inf) 0 (isinf folded away). lavapipe and SwiftShader keep IEEE
behaviour either way. The engine adds the mode to every module it loads (the operators' variants and
the graph compiler's generated shaders alike) where the device reports
shaderSignedZeroInfNanPreserveFloat32 (and Float64 for a module that uses doubles) and has
VK_KHR_shader_float_controls, which it then enables (vulkan_probe.PhysicalDevice.nan_preserving_widths).

It is added to the binary rather than declared in the GLSL: glslang output is the same for every
device (the SPIR-V cache and the images' prebuilt modules stay device-independent), and the generated
graph shaders need no device knowledge on the HTTP side.
"""
from __future__ import annotations

import array
import sys

_MAGIC = 0x07230203
_OP_CAPABILITY, _OP_EXTENSION, _OP_EXT_INST_IMPORT, _OP_MEMORY_MODEL = 17, 10, 11, 14
_OP_ENTRY_POINT, _OP_EXECUTION_MODE, _OP_FUNCTION = 15, 16, 54
CAPABILITY_FLOAT64 = 10
CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE = 4466
EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE = 4461
EXTENSION = "SPV_KHR_float_controls"


def _words(spirv: bytes) -> array.array:
    words = array.array("I", spirv)
    if sys.byteorder != "little":
        words.byteswap()
    return words


def _string_words(text: str) -> list[int]:
    raw = text.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return [int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4)]


def _instruction(opcode: int, operands: list[int]) -> list[int]:
    return [(len(operands) + 1) << 16 | opcode, *operands]


def preserve_nan(spirv: bytes, widths: tuple[int, ...]) -> bytes:
    """``spirv`` with SignedZeroInfNanPreserve declared for 32-bit floats and, where the module declares
    Float64, for 64-bit ones: only for the widths in ``widths`` (the device's; a module that uses doubles
    on a device that keeps NaN in 32-bit floats only gets the 32-bit mode). Unchanged if 32 is not in
    ``widths`` or the module declares the capability already."""
    words = _words(spirv)
    if len(words) < 5 or words[0] != _MAGIC:
        raise ValueError("not a SPIR-V module")
    if 32 not in widths:
        return spirv
    capabilities: set[int] = set()
    extensions: set[str] = set()
    last_capability = last_extension = last_mode = entry_end = None
    entries: list[int] = []
    i = 5
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise ValueError("malformed SPIR-V: an instruction of 0 words")
        if opcode == _OP_CAPABILITY:
            capabilities.add(words[i + 1])
            last_capability = i + count
        elif opcode == _OP_EXTENSION:
            extensions.add(spirv[4 * (i + 1):4 * (i + count)].split(b"\0", 1)[0].decode(errors="replace"))
            last_extension = i + count
        elif opcode == _OP_ENTRY_POINT:
            entries.append(words[i + 2])
            entry_end = i + count
        elif opcode == _OP_EXECUTION_MODE:
            last_mode = i + count
        elif opcode == _OP_FUNCTION:
            break
        i += count
    if CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE in capabilities:
        return spirv
    if last_capability is None or entry_end is None:
        raise ValueError("malformed SPIR-V: no OpCapability or OpEntryPoint")
    mode_widths = [32] + ([64] if CAPABILITY_FLOAT64 in capabilities and 64 in widths else [])
    modes = [w for entry in entries for width in mode_widths
             for w in _instruction(_OP_EXECUTION_MODE, [entry, EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE, width])]
    out = list(words)
    # Inserted back to front, so the earlier positions stay valid: modes after the last execution mode
    # (or the entry points), the extension after the last one (or the capabilities), the capability last.
    out[last_mode or entry_end:last_mode or entry_end] = modes
    if EXTENSION not in extensions:
        at = last_extension or last_capability
        out[at:at] = _instruction(_OP_EXTENSION, _string_words(EXTENSION))
    out[last_capability:last_capability] = _instruction(_OP_CAPABILITY, [CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE])
    result = array.array("I", out)
    if sys.byteorder != "little":
        result.byteswap()
    return result.tobytes()
