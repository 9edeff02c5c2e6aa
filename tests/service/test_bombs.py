"""Bodies that cost far more than their size: gzip bombs, JSON texts of millions of values. They are
refused before the bytes or objects are made (413), what is parsed is parsed off the event loop, and
liveness probes sent while the bombs are processed are answered (waited for generously: no latency is
asserted here, the benchmark measures it: bench/service.py, bench/liveness.py)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.service.conftest import ROOT, Server, start_server, stop_server

# Driver-independent (test-portability.sh leaves them to make test): bodies refused before they are parsed or run
pytestmark = pytest.mark.driver_independent

BODY_LIMIT = 128 << 20
# A probe must be answered, however busy the machine; how fast is the benchmark's figure. 3 s (a Kubernetes
# probe's default timeoutSeconds is 1) failed with 32 gRPC bombs at load 8-14 on 2 cores: probes took up
# to 4-7 s while the event loop, sampled every 10 ms, sat in a plain response write, starved of CPU and of
# the GIL beside the inflating threads, never held by the service.
PROBE_TIMEOUT_S = 120
SENDING = "VKACT_TEST_SENDING"  # env of a probe_while sender: a file it creates as its requests start to go
BOMBS_AT_ONCE = 8


def values_text(count: int) -> bytes:
    """A /v2 request for RELU on ``count`` FP32 values, as JSON text (the values cycle through -2..2)."""
    data = ",".join(["-2,-1,0,1,2"] * (count // 5))
    return b'{"inputs":[{"name":"InputTensor","shape":[%d],"datatype":"FP32","data":[%s]}]}' % (count // 5 * 5, data.encode())


def bombs() -> dict[str, tuple[bytes, int]]:
    """Each bomb's gzip body and the status it must get."""
    return {
        "inflates past the body limit": (gzip.compress(b" " * (BODY_LIMIT + 1), 9), 413),
        "8 million values": (gzip.compress(values_text(8_000_000), 9), 413),
        "1 million values": (gzip.compress(values_text(1_000_000), 9), 200),
    }


def send_bombs(url: str, rounds: int) -> None:
    """Run in a process of its own (the probing test's GIL stays free): ``rounds`` x every bomb,
    BOMBS_AT_ONCE at a time; prints each answer's (name, status)."""
    kinds = bombs()
    jobs = [name for _ in range(rounds) for name in kinds]

    def post(name: str) -> tuple[str, int]:
        with httpx.Client(timeout=120) as client:
            response = client.post(f"{url}/v2/models/relu/infer", content=kinds[name][0], headers={"Content-Encoding": "gzip"})
            if response.status_code == 200:
                assert np.array_equal(response.json()["outputs"][0]["data"][:5], [0, 0, 0, 1, 2])
            return name, response.status_code

    with ThreadPoolExecutor(BOMBS_AT_ONCE) as pool:
        sending()
        print(json.dumps(list(pool.map(post, jobs))))


@pytest.fixture(scope="module")
def bombed() -> Server:
    server = start_server(max_body_bytes=BODY_LIMIT)
    yield server
    stop_server(server)


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def test_json_of_millions_of_values_is_refused_before_it_is_parsed(bombed):
    """A 16 MB text of 8 million numbers would make ~900 MB of Python objects: 413, compressed to a few
    kilobytes or not, and the HTTP process's peak memory grows by far less than that."""
    before = peak_rss(bombed.process.pid)
    text = values_text(8_000_000)
    with bombed.client() as http:
        for headers, body in (({"Content-Encoding": "gzip"}, gzip.compress(text, 9)), ({}, text)):
            response = http.post("/v2/models/relu/infer", content=body, headers=headers)
            assert response.status_code == 413 and "VKACT_MAX_JSON_VALUES" in response.json()["error"], response.text[:300]
        v1 = {"Operator": {"Type": "DML_OPERATOR_ACTIVATION_RELU", "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [8_000_000]}}}
        response = http.post("/v1/execute", content=json.dumps(v1).encode()[:-1] + b',"Inputs":{"InputTensor":[' + b"0," * 7_999_999 + b"0]}}")
        assert response.status_code == 413 and response.json()["field"] is None, response.text[:300]
    grown = peak_rss(bombed.process.pid) - before
    assert grown < 300 << 20, f"the HTTP process's peak memory grew by {grown >> 20} MiB"


def test_an_answer_of_millions_of_values_as_json_is_refused_before_the_device_runs(bombed):
    """20 MB of binary FLOAT32 asking for its answer as JSON would make as many Python objects as the
    request bombs above: 413 naming the way out, and the same tensor with a binary answer is computed."""
    x = np.linspace(-2, 2, 5_000_004, dtype=np.float32)
    header = {"Operator": {"Type": "DML_OPERATOR_ACTIVATION_RELU", "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [x.size]}},
              "Inputs": {"InputTensor": {"binary_data_size": x.nbytes}}}
    v2 = {"inputs": [{"name": "InputTensor", "shape": [x.size], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}]}
    with bombed.client() as http:
        for path, head, field in (("/v1/execute", {**header, "ResponseEncoding": "json"}, "ResponseEncoding"), ("/v2/models/relu/infer", v2, "outputs")):
            text = json.dumps(head).encode()
            response = http.post(path, content=text + x.tobytes(), headers={"Inference-Header-Content-Length": str(len(text))})
            assert response.status_code == 413 and "VKACT_MAX_JSON_VALUES" in response.json()["error"], response.text[:300]
            assert field in response.text
        text = json.dumps(header).encode()
        response = http.post("/v1/execute", content=text + x.tobytes(), headers={"Inference-Header-Content-Length": str(len(text))})
        n = int(response.headers["Inference-Header-Content-Length"])
        np.testing.assert_array_equal(np.frombuffer(response.content[n:], np.float32), np.maximum(x, 0))


def sending() -> None:
    """Said by a sender that probe_while runs, as its requests start to go (its set-up, making the bombs,
    is over: probes answered before then prove nothing)."""
    path = os.environ.get(SENDING)
    if path:
        open(path, "w").close()


def probe_while(url: str, code: str) -> tuple[list, int]:
    """Run ``code`` (Python that calls ``sending()`` and prints its answers as JSON) in a process of its
    own, so this one's GIL stays free, probing liveness until it ends. Returns its answers and how many
    probes were sent after it started sending, each answered live (within PROBE_TIMEOUT_S: generous)."""
    with tempfile.TemporaryDirectory() as tmp:
        flag = os.path.join(tmp, "sending")
        loader = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                                  env={**os.environ, "OPENBLAS_NUM_THREADS": "1", SENDING: flag})
        probes = 0
        with httpx.Client(base_url=url, timeout=PROBE_TIMEOUT_S) as probe:
            while loader.poll() is None:
                during = os.path.exists(flag)
                assert probe.get("/health/live").json() == {"live": True}  # httpx raises past the probe's timeout
                probes += during
                assert probes < 100_000
            out, _ = loader.communicate()
    assert loader.returncode == 0
    return json.loads(out), probes


def test_liveness_answers_while_bombs_are_processed(bombed):
    rounds = 3
    answers, probes = probe_while(bombed.url, f"from tests.service.test_bombs import send_bombs; send_bombs({bombed.url!r}, {rounds})")
    expected = {name: status for name, (_, status) in bombs().items()}
    assert len(answers) == rounds * len(expected) and all(status == expected[name] for name, status in answers), answers
    assert probes >= 1, "no probe answered while the bombs were processed"
    assert httpx.get(f"{bombed.url}/v2/health/ready").status_code == 200
