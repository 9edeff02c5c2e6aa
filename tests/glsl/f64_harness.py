"""Runs a double-precision GLSL function on the Vulkan device (kp) over numpy float64 arrays, and
the correctly rounded mpmath references to judge it in ulp.

The function comes from glsl/common/f64math.glsl (or another include): f64math_probe.comp is compiled
with -DFN=<name> and applied elementwise. The shader uses Float64: it runs on the engine's device
(Settings.device) where that reports shaderFloat64, which the patched kp then enables (``device``).
"""
from __future__ import annotations

import functools
import subprocess
import tempfile
from pathlib import Path

import mpmath
import numpy as np

from bench.accuracy import to_double
from service.config import Settings

PROBE = Path(__file__).with_name("f64math_probe.comp")
WORKGROUP = 64


@functools.lru_cache(maxsize=None)
def spirv(fn: str, two_args: bool = False, include: str = "") -> bytes:
    """The probe compiled for ``fn``, once per process, in a directory of its own: test runs go side by
    side (scripts/test-portability.sh), and a shared output path would be one run's half-written file."""
    settings = Settings()
    defines = [f"-DFN={fn}"] + (["-DTWO_ARGS"] if two_args else []) + ([f'-DEXTRA_INCLUDE="{include}"'] if include else [])
    with tempfile.TemporaryDirectory(prefix="vkact-f64probe-") as tmp:
        out = Path(tmp) / "probe.spv"
        cmd = [settings.glslang, "-V", "--target-env", "vulkan1.1", f"-I{settings.glsl_dir}", *defines, str(PROBE), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return out.read_bytes()


@functools.lru_cache(maxsize=1)
def device():
    """The device the engine would choose (vulkan_probe's view of it: its features)."""
    from service.vulkan_probe import choose, physical_devices
    return choose(physical_devices(), Settings().device)


@functools.lru_cache(maxsize=1)
def manager():
    import kp
    return kp.Manager(device().index)


def run(fn: str, x: np.ndarray, p: np.ndarray | None = None, include: str = "") -> np.ndarray:
    """fn(x) (or fn(x, p)) elementwise on the device, as float64."""
    import kp
    mgr = manager()
    x = np.ascontiguousarray(x, dtype=np.float64).ravel()
    n = x.size
    pad = max(n, 1)
    par = np.zeros(pad) if p is None else np.broadcast_to(np.asarray(p, np.float64), x.shape).ravel()
    tin = mgr.tensor_t(np.resize(x, pad).view(np.uint32).copy(), kp.TensorTypes.host)
    tpar = mgr.tensor_t(np.resize(par, pad).view(np.uint32).copy(), kp.TensorTypes.host)
    tout = mgr.tensor_t(np.zeros(2 * pad, np.uint32), kp.TensorTypes.host)
    groups = min(max(1, -(-n // WORKGROUP)), 4096)
    algo = mgr.algorithm([tin, tpar, tout], spirv(fn, p is not None, include), (groups, 1, 1),
                         np.array([], np.uint32), np.array([n], np.uint32))
    mgr.sequence().eval(kp.OpAlgoDispatch(algo, np.array([n], np.uint32)))
    y = tout.data().copy().view(np.float64)[:n]
    for t in (algo, tin, tpar, tout):
        t.destroy()
    return y


def rounded(f, x: np.ndarray, *params: float, dps: int = 60) -> np.ndarray:
    """f(mpf(x), *params) at ``dps`` digits, rounded to the nearest double, elementwise (NaN where f
    raises or gives a complex or NaN value)."""
    out = np.empty(np.shape(x), np.float64)
    with mpmath.workdps(dps):
        for i, v in enumerate(np.ravel(x)):
            out.flat[i] = to_double(f(mpmath.mpf(float(v)), *map(mpmath.mpf, params)))
    return out
