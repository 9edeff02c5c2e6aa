"""Choosing a device by name or index (Settings.device) when the loader sees two drivers, lavapipe and
SwiftShader: the engine opens the device it chose (kp's Manager indexes the same enumeration as
vulkan_probe) and computes on it. Runs in a subprocess: the loader reads VK_ICD_FILENAMES once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SWIFTSHADER = Path("/usr/lib/chromium/vk_swiftshader_icd.json")
LAVAPIPE = sorted(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json"))
ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, sys
import numpy as np
from service.config import Settings
from service.engine import Engine
from service.vulkan_probe import physical_devices
from tests.helpers import make_op, run

out = {"devices": [d.name for d in physical_devices()], "opened": {}}
for wanted in sys.argv[1:]:
    engine = Engine(Settings(device=wanted))
    try:
        x = np.linspace(-3, 3, 1000, dtype=np.float32)
        op = make_op("SOFTSIGN", np.float32, x.shape)
        y = run(engine, op, x)
        out["opened"][wanted] = {
            "chosen": engine.device.name,
            "kp": engine._mgr.get_device_properties()["device_name"],
            "error": float(np.max(np.abs(y - op.reference(x)))),
        }
    finally:
        engine.close()
print(json.dumps(out))
'''


@pytest.mark.skipif(not (SWIFTSHADER.is_file() and LAVAPIPE), reason="needs lavapipe and SwiftShader (chromium-common)")
def test_a_device_by_name_or_index_among_two_drivers():
    icds = f"{LAVAPIPE[0]}:{SWIFTSHADER}"
    env = {**os.environ, "VK_ICD_FILENAMES": icds, "VK_DRIVER_FILES": icds, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    env.pop("VKACT_DEVICE", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, "llvmpipe", "swiftshader", "0", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    devices = out["devices"]
    assert len(devices) == 2 and any("llvmpipe" in d for d in devices) and any("SwiftShader" in d for d in devices)
    opened = out["opened"]
    assert "llvmpipe" in opened["llvmpipe"]["chosen"] and "SwiftShader" in opened["swiftshader"]["chosen"]
    assert [opened["0"]["chosen"], opened["1"]["chosen"]] == devices
    for choice in opened.values():
        assert choice["kp"] == choice["chosen"]     # kp opened the device the probe chose
        assert choice["error"] < 1e-6
