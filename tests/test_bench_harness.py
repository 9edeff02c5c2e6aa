"""The Triton comparison's and the profile's own logic, without any server: the Triton model's formula
against the operator's float64 reference, the model file it is served from, the profile's stage rules,
the Lua string quoting of the wrk script, and the canned server that gives tritonclient's ceiling. (The runs themselves are `make bench`'s: Triton is a bench
peer, never a test dependency.)"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from bench import profile, triton, triton_server, wrk
from service.operators.shrink import Shrink


def test_reference_is_shrink_with_the_models_parameters() -> None:
    x = np.concatenate([np.linspace(-3, 3, 4001, dtype=np.float32), np.float32([-0.5, 0.5, -0.0, 0.0])])
    want = Shrink.model_construct(Bias=triton_server.BIAS, Threshold=triton_server.THRESHOLD).reference(x.astype(np.float64))
    np.testing.assert_array_equal(triton.reference(x), want.astype(np.float32))


def test_triton_model_file_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model.py written for Triton's Python backend, run with a stand-in for pb_utils."""
    import sys
    import types

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name, self.array = name, array

        def as_numpy(self) -> np.ndarray:
            return self.array

    utils = types.ModuleType("triton_python_backend_utils")
    utils.Tensor = Tensor
    utils.InferenceResponse = lambda tensors: tensors
    utils.get_input_tensor_by_name = lambda request, name: request[name]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    ast.parse(triton_server.TRITON_MODEL)
    scope: dict = {}
    exec(compile(triton_server.TRITON_MODEL, "model.py", "exec"), scope)
    x = np.random.default_rng(3).standard_normal(1024, dtype=np.float32) * np.float32(2)
    (out,), = scope["TritonPythonModel"]().execute([{"InputTensor": Tensor("InputTensor", x)}])
    assert out.name == "OutputTensor" and out.array.dtype == np.float32
    np.testing.assert_array_equal(out.array, triton.reference(x))


def test_model_repository_layout(tmp_path) -> None:
    triton_server.write_repository(tmp_path)
    config = (tmp_path / "shrink" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "TYPE_FP32" in config
    assert '"InputTensor"' in config and '"OutputTensor"' in config
    assert (tmp_path / "shrink" / "1" / "model.py").read_text() == triton_server.TRITON_MODEL


@pytest.mark.parametrize(("frames", "stage"), [
    # the deepest frame a rule names decides, not the route above it
    (["Runner.run (asyncio/runners.py:118)", "answer (api/hot_routes.py:74)", "RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:463)"],
     "answer: headers and socket write"),
    (["Runner.run (asyncio/runners.py:118)", "infer (api/v2/routes.py:318)", "run_on_device (api/execution.py:116)",
      "DeviceWorker._submit (worker.py:200)", "write (framing.py:40)"], "hand-off: the job to the worker"),
    (["Runner.run (asyncio/runners.py:118)", "RequestIdMiddleware.__call__ (api/v2/routes.py:65)", "uuid4 (uuid.py:723)"],
     "routing and middleware"),
    (["Runner.run (asyncio/runners.py:118)", "answer (api/hot_routes.py:74)", "send_whole (api/execution.py:140)"],
     "answer: headers and socket write"),
    (["Runner.run (asyncio/runners.py:118)", "WorkerLifecycle._watch (worker_lifecycle.py:100)"],
     "hand-off: the worker's answer back"),
    (["Runner.run (asyncio/runners.py:118)", "WorkerReplies._on_message (worker_replies.py:60)", "WorkerReplies._done (worker_replies.py:140)"],
     "hand-off: the worker's answer back"),
    (["Runner.run (asyncio/runners.py:118)"], "event loop"),
    (["Runner.run (asyncio/runners.py:118)", "Server.main_loop (uvicorn/server.py:20)"], "other"),
])
def test_profile_stage_rules(frames: list[str], stage: str) -> None:
    rules = [(name, re.compile(p)) for name, p in profile.HTTP_STAGES]
    assert profile._stage(frames, rules).startswith(stage)


def test_worker_stage_rules() -> None:
    rules = [(name, re.compile(p)) for name, p in profile.WORKER_STAGES]
    root = ["worker_main (worker_process.py:200)", "WorkerEngines.go (worker_engines.py:110)"]
    assert profile._stage([*root, "Engine.execute (engine.py:300)", "_Plan.run (engine_plan.py:38)"], rules).startswith("dispatch")
    assert profile._stage([*root, "Engine.execute (engine.py:300)", "DispatchGeometry.dispatch_shape (dispatch_geometry.py:100)"],
                          rules).startswith("engine")
    assert profile._stage([*root, "Reader.next (framing.py:70)", "Reader._fill (framing.py:80)"], rules).startswith("receive")
    assert profile._stage([*root, "write (framing.py:40)"], rules).startswith("answer")


@pytest.mark.parametrize("dso,library", [
    ("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", "Python interpreter"),
    ("[kernel.kallsyms]", "kernel"),
    ("/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so", "lavapipe"),
    ("/tmp/perf-1234.map", "lavapipe"),
    ("/usr/lib/x86_64-linux-gnu/libnghttp2.so.14.24.1", "vkact native"),
    ("/x/site-packages/something_else.so", "other (something_else.so)"),
])
def test_perf_library_categories(dso: str, library: str) -> None:
    assert profile._library(dso).startswith(library)


def test_lua_quoting_keeps_any_byte_out_of_the_syntax() -> None:
    quoted = wrk._lua('a"b\\c\nd/e f:1')
    assert quoted.startswith('"') and quoted.endswith('"')
    inner = quoted[1:-1]
    assert '"' not in inner.replace('\\034', '') and "\n" not in inner
    # Lua's decimal escapes give the characters back
    assert re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1))), inner) == 'a"b\\c\nd/e f:1'


def test_canned_server_replays_its_answer_whatever_is_asked(tmp_path: Path) -> None:
    """bench.canned, tritonclient's ceiling in the Triton bench: every request on a connection, with a
    body of any size (or none), gets the file's bytes back whole."""
    import socket

    from bench import service as svc

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    (tmp_path / "answer.http").write_bytes(answer)
    server = svc._launch("canned", "bench.canned", "--answer", str(tmp_path / "answer.http"))
    try:
        svc._wait_ready(server, "/")
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            big = bytes(3 << 20)
            conn.sendall(b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(big) + big
                         + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            got = b""
            while len(got) < 2 * len(answer):
                chunk = conn.recv(1 << 16)
                assert chunk, "the canned server closed the connection"
                got += chunk
        assert got == 2 * answer
    finally:
        svc._stop(server)
