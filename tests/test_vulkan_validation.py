"""tests/vulkan_validation.py itself: with VKACT_VALIDATION=1 a test during which the Khronos layer reports
an error fails, whether the error comes from the test's process or from a process it starts, and a test
without one passes. Runs pytest in a subprocess on a file of such tests."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LAYER_MANIFEST = Path("/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json")
ROOT = Path(__file__).resolve().parent.parent

# A push-constant block of 256 bytes is beyond the 128 bytes every device but a few GPUs allows (the
# layer checks the device's own maxPushConstantsSize).
INNER = '''
import subprocess, sys
import numpy as np
import kp

BAD = """
import numpy as np, kp
from service.config import Settings
from service.shaders import ShaderCompiler, Variant
mgr = kp.Manager()
limit = mgr.get_device_properties()  # noqa: F841 - an instance and device, as the engine makes
t = mgr.tensor_t(np.zeros(64, np.uint32), kp.TensorTypes.host)
spirv = ShaderCompiler(Settings()).spirv(Variant("relu", "F32", "PACKED"))
mgr.algorithm([t, t], spirv, (1, 1, 1), np.array([64], np.uint32), np.zeros(64, np.uint32))
"""

def test_error_in_this_process():
    exec(BAD, {})

def test_error_in_a_child_process():
    subprocess.run([sys.executable, "-c", BAD], check=True)

def test_clean():
    mgr = kp.Manager()
    t = mgr.tensor_t(np.arange(4, dtype=np.uint32), kp.TensorTypes.host)
    assert list(t.data()) == [0, 1, 2, 3]
'''


@pytest.mark.skipif(not LAYER_MANIFEST.is_file(), reason="the Khronos validation layer is not installed")
def test_a_validation_error_fails_the_test_that_caused_it(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    env = {**os.environ, "VKACT_VALIDATION": "1", "PYTHONPATH": str(ROOT)}
    env.pop("VKACT_RUN_REPORT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.vulkan_validation",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "ERROR at teardown of test_error_in_this_process" in out, out
    assert "ERROR at teardown of test_error_in_a_child_process" in out, out
    assert "VUID-VkPushConstantRange-size-00298" in out, out
    assert "3 passed, 2 errors" in out, out   # test_clean passes, and no error spills onto it
