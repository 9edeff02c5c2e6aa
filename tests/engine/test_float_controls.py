"""SignedZeroInfNanPreserve (service/spirv_float_controls.py): the modules the engine loads ask the
device's compiler to keep NaN, Inf and signed zeros where the device offers it. A CPU driver keeps them
either way, so these tests check the request itself: a valid module (spirv-val), the device's own
report, and (under VKACT_VALIDATION=1) the layer's check that the extension and the feature back it."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from service.config import Settings
from service.shaders import ShaderCompiler, Variant
from service.spirv_float_controls import CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE, preserve_nan

MODE = 4461


def _operands(spirv: bytes, opcode: int) -> list[list[int]]:
    """The operands of every instruction ``opcode`` in the module, in order."""
    words = np.frombuffer(spirv, "<u4")
    found, i = [], 5
    while i < len(words):
        count = int(words[i] >> 16)
        if int(words[i] & 0xFFFF) == opcode:
            found.append([int(w) for w in words[i + 1 : i + count]])
        i += count
    return found


def _modes(spirv: bytes) -> list[tuple[int, int]]:
    """(execution mode, its first operand) of every OpExecutionMode in the module."""
    return [(ops[1], ops[2] if len(ops) > 2 else -1) for ops in _operands(spirv, 16)]


def _capabilities(spirv: bytes) -> set[int]:
    return {ops[0] for ops in _operands(spirv, 17)}


@pytest.fixture(scope="module")
def compiler() -> ShaderCompiler:
    return ShaderCompiler(Settings())


@pytest.mark.parametrize("variant", [Variant("celu", "F32", "PACKED"), Variant("tanh", "F64", "STRIDED"),
                                     Variant("softmax", "F32", "PACKED", 1, "reduction", 1)], ids=str)
def test_the_mode_is_declared_for_each_width_and_the_module_stays_valid(variant: Variant, compiler: ShaderCompiler, tmp_path: Path) -> None:
    original = compiler.spirv(variant)
    assert (MODE, 32) not in _modes(original)
    patched = preserve_nan(original, (16, 32, 64))
    uses_doubles = 10 in _capabilities(original)
    assert uses_doubles == (variant.dtype == "F64")
    assert [m for m in _modes(patched) if m[0] == MODE] == [(MODE, 32)] + ([(MODE, 64)] if uses_doubles else [])
    assert CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE in _capabilities(patched)
    assert preserve_nan(patched, (16, 32, 64)) == patched            # once only
    only32 = preserve_nan(original, (32,))
    assert [m for m in _modes(only32) if m[0] == MODE] == [(MODE, 32)]
    assert preserve_nan(original, (16, 64)) == original               # no 32-bit guarantee: unchanged
    if shutil.which("spirv-val") is None:
        pytest.skip("no spirv-val (apt-get install spirv-tools)")
    path = tmp_path / "patched.spv"
    path.write_bytes(patched)
    proc = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_not_a_module_is_refused() -> None:
    with pytest.raises(ValueError):
        preserve_nan(b"\0" * 20, (32,))


def test_the_engine_asks_for_it_where_the_device_reports_it(engine) -> None:
    """The engine follows the device's report (lavapipe and SwiftShader report all three widths, an
    NVIDIA GPU too), and the modules it loads carry the mode; the operators then keep NaN (a device
    whose compiler assumed no NaN would give CELU(NaN) = -1 and SOFTSIGN(inf) = 0: an H200 did)."""
    device = engine.device
    assert engine.nan_preserving_widths == (device.nan_preserving_widths if 32 in device.nan_preserving_widths else ())
    if not engine.nan_preserving_widths:
        pytest.skip(f"{device.name} does not report shaderSignedZeroInfNanPreserveFloat32")
    spirv = engine.variant_spirv(Variant("celu", "F32", "PACKED"))
    assert (MODE, 32) in _modes(spirv)
