"""Triton Inference Server as a bench peer: its environment, its model repository, the server itself.

PyPI's ``nvidia-pytriton`` wheel ships ``tritonserver`` (C++ HTTP and gRPC front-ends) with the Python
backend and one backend stub per Python version; on Debian 12 it starts without a GPU. The bench keeps
it in a virtual environment of its own (``~/.cache/vkact/triton``, shared by the clones on this
machine; ``VKACT_BENCH_TRITON_VENV`` moves it), made on the first run with pip, with the stub of that
environment's Python copied beside ``libtriton_python.so`` (where the backend looks for it).

The model is what a Triton user writes for a custom operator: a Python-backend ``model.py`` doing
SHRINK in numpy, FLOAT32, Bias 0.5 and Threshold 0.5 (``TRITON_MODEL``, written into a temporary model
repository with its ``config.pbtxt``). Its input and output have vkact's names, so that both servers
are sent the very same bytes.

Triton is a bench peer, never a test dependency: whatever fails here raises ``Unavailable`` with the
reason, and the bench reports it and goes on."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from . import service as svc
from .v2 import Unavailable as V2Unavailable
from .v2 import _stop_group, _tail, make_venv

PYTRITON_VERSION = "0.7.0"   # ships tritonserver 2.51 (r24.10)
REQUIREMENTS = [f"nvidia-pytriton=={PYTRITON_VERSION}"]   # pulls numpy < 2 for the model's stub
VENV = Path(os.environ.get("VKACT_BENCH_TRITON_VENV", Path.home() / ".cache" / "vkact" / "triton"))
INSTALL_TIMEOUT_S = 900
READY_TIMEOUT_S = 120
MODEL = "shrink"
BIAS, THRESHOLD = 0.5, 0.5

TRITON_MODEL = f'''"""SHRINK (Bias {BIAS}, Threshold {THRESHOLD}) in numpy, FLOAT32: a custom operator as a Triton user serves it."""
import numpy as np
import triton_python_backend_utils as pb_utils

BIAS, THRESHOLD = np.float32({BIAS}), np.float32({THRESHOLD})
ZERO = np.float32(0)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "InputTensor").as_numpy()
            y = np.where(x < -THRESHOLD, x + BIAS, np.where(x > THRESHOLD, x - BIAS, ZERO)).astype(np.float32, copy=False)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OutputTensor", y)]))
        return responses
'''

TRITON_CONFIG = f'''name: "{MODEL}"
backend: "python"
max_batch_size: 0
input [ {{ name: "InputTensor", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OutputTensor", data_type: TYPE_FP32, dims: [ -1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
'''


class Unavailable(Exception):
    """Triton cannot be measured here; the message says why."""


@dataclass
class TritonEnv:
    venv: Path
    version: str                 # tritonserver's own, from its metadata once it runs ("?" before)
    install_seconds: float | None  # None: the cached environment was used

    @property
    def root(self) -> Path:
        return _site(self.venv) / "pytriton" / "tritonserver"

    @property
    def executable(self) -> Path:
        return self.root / "bin" / "tritonserver"


def _site(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise Unavailable(f"no site-packages in {venv}")
    return found[0]


def _libpython_dir() -> str:
    """Where this interpreter's libpython lives: the stub links libpython3.X, and must get the one of the
    environment's Python (the venv's is this one), not another 3.X's."""
    import sysconfig

    return str(sysconfig.get_config_var("LIBDIR") or "")


def _runtime_env(venv: Path) -> dict[str, str]:
    """tritonserver's environment: its bundled libraries (the wheel's ``nvidia_pytriton.libs``), this
    Python's libpython, and the venv's ``bin`` first on PATH. The stub's embedded interpreter ignores
    PYTHONPATH; it finds its prefix from the ``python3`` it finds on PATH, so with the venv's first it
    reads the venv's pyvenv.cfg and imports the venv's numpy (< 2, which the 2.51 stub needs: with
    numpy 2 every output comes back empty), not the base interpreter's (as pytriton itself starts it)."""
    site = _site(venv)
    libs = [str(p) for p in (site / "nvidia_pytriton.libs", site / "pytriton" / "tritonserver" / "external_libs") if p.is_dir()]
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("VKACT_", "PYTHON", "LD_", "VIRTUAL_ENV"))}
    return {**keep, "LD_LIBRARY_PATH": ":".join([*libs, _libpython_dir()]),
            "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def _install_stub(venv: Path) -> None:
    """The backend stub built for the venv's Python, beside libtriton_python.so."""
    root = _site(venv) / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise Unavailable(f"the wheel has no Python-backend stub for Python {version}")
    target = root / "backends" / "python" / "triton_python_backend_stub"
    shutil.copy2(stub, target)
    target.chmod(0o755)


def environment(log: Callable[[str], None] = print) -> TritonEnv:
    """The cached environment, or a new one (``python -m venv`` with this interpreter, then pip); raises
    Unavailable with the reason when it cannot be made. A lock keeps two benches on this machine from
    building it at once."""
    venv = VENV
    stamp = venv / ".vkact-bench-stamp"
    wanted = "\n".join([*REQUIREMENTS, sys.version.split()[0]]) + "\n"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == wanted:
            return TritonEnv(venv, "?", None)
        log(f"triton: creating its environment in {venv} ({', '.join(REQUIREMENTS)}) ...")
        started = time.perf_counter()
        try:
            make_venv(venv, REQUIREMENTS, INSTALL_TIMEOUT_S)
            _install_stub(venv)
        except (V2Unavailable, Unavailable, OSError) as exc:
            shutil.rmtree(venv, ignore_errors=True)
            raise Unavailable(str(exc)) from None
        stamp.write_text(wanted)
    seconds = time.perf_counter() - started
    log(f"triton: environment ready in {seconds:.0f} s")
    return TritonEnv(venv, "?", seconds)


def write_repository(folder: Path) -> None:
    model = folder / MODEL
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(TRITON_MODEL)
    (model / "config.pbtxt").write_text(TRITON_CONFIG)


@contextmanager
def server(env: TritonEnv) -> Iterator[svc.Server]:
    """``tritonserver`` on a temporary model repository, HTTP and gRPC on free loopback ports (metrics
    off), ready when the model is; stopped (with its stub) on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="vkact-bench-triton-"))
    proc = None
    try:
        write_repository(folder / "models")
        port, grpc_port = svc.free_port(), svc.free_port()
        argv = [str(env.executable), f"--model-repository={folder / 'models'}",
                f"--backend-directory={env.root / 'backends'}",
                "--http-address=127.0.0.1", f"--http-port={port}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
                "--allow-metrics=false", "--allow-gpu-metrics=false", "--log-verbose=0", "--log-info=false",
                "--model-control-mode=none", "--exit-on-error=true", "--strict-readiness=true", "--exit-timeout-secs=2"]
        log = folder / "triton.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=folder, env=_runtime_env(env.venv), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        found = svc.Server("triton", f"http://127.0.0.1:{port}", proc, log, f"127.0.0.1:{grpc_port}")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise Unavailable(f"tritonserver exited ({proc.returncode}): {_tail(log.read_text(errors='replace'), 8)}")
            try:
                if httpx.get(f"{found.url}/v2/models/{MODEL}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(f"tritonserver not ready within {READY_TIMEOUT_S} s: {_tail(log.read_text(errors='replace'), 8)}")
            time.sleep(0.2)
        if env.version == "?":
            env.version = json.loads(httpx.get(f"{found.url}/v2", timeout=10).text).get("version", "?")
        yield found
    finally:
        if proc is not None:
            _stop_group(proc)
        shutil.rmtree(folder, ignore_errors=True)
