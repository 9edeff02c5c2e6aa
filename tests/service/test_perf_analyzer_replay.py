"""perf_analyzer's requests with ``-i http --shared-memory system``, replayed byte for byte as its C++ client
(libcurl) sends them: each answer checked as that client reads it, with no download (the real perf_analyzer,
which needs glibc 2.38, runs in test_perf_analyzer.py where scripts/perf-analyzer.sh can prepare it).

Reconstructed from perf_analyzer's source (model_parser.cc, load_manager.cc, inference_profiler.cc) and
Triton's C++ HTTP client (http_client.cc): model metadata and configuration, both unregisters (errors
ignored), one region per output named after it (``--output-shared-memory-size``, 100 KB by default), one
per input named ``<input>_<stream>_<step>``, server metadata, the inferences with every tensor in shared
memory, the unregisters at exit. Every answer is checked as the C++ client reads it: a non-200 stops
perf_analyzer, and an output carrying ``parameters`` is read as binary and needs ``binary_data_size``.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from tests.service.test_v2 import reference

MODEL = "elu"
INPUT, OUTPUT = "InputTensor", "OutputTensor"
OUTPUT_REGION_BYTES = 100 * 1024  # perf_analyzer's --output-shared-memory-size default
SHAPE = [4, 16]                   # --shape InputTensor:4,16

# libcurl's headers on the C++ client's POSTs: its own User-Agent, curl's default form Content-Type
# (the client sets none), and an empty Expect (it disables 100-continue).
CURL_HEADERS = {"User-Agent": "libcurl-agent/1.0", "Accept": "*/*", "Content-Type": "application/x-www-form-urlencoded"}


def post(http: httpx.Client, path: str, body: bytes = b"", **headers: str) -> httpx.Response:
    return http.post(path, content=body, headers={**CURL_HEADERS, **headers})


def compact(value: object) -> bytes:
    """JSON as TritonJson (rapidjson's Writer) writes it: no spaces."""
    return json.dumps(value, separators=(",", ":")).encode()


class PosixRegion:
    """A POSIX shared memory object as perf_analyzer creates it (shm_open + ftruncate + mmap). Its key is
    '/<region>' in perf_analyzer; here a suffix keeps parallel test runs on one machine apart."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self.key = f"/{name}_{uuid.uuid4().hex[:8]}"
        self.handle = shm.create_shared_memory_region(name, self.key, size)


@pytest.fixture
def regions() -> Iterator[dict[str, PosixRegion]]:
    made: dict[str, PosixRegion] = {}
    yield made
    for region in made.values():
        shm.destroy_shared_memory_region(region.handle)


def start_up(http: httpx.Client, regions: dict[str, PosixRegion]) -> None:
    """perf_analyzer's requests before its first inference."""
    metadata = http.get(f"/v2/models/{MODEL}")
    assert metadata.status_code == 200
    assert [t["name"] for t in metadata.json()["inputs"]] == [INPUT] and [t["name"] for t in metadata.json()["outputs"]] == [OUTPUT]
    config = http.get(f"/v2/models/{MODEL}/config")
    assert config.status_code == 200 and isinstance(config.json()["max_batch_size"], int)  # read with GetInt: must be an integer
    assert [t["name"] for t in config.json()["input"]] == [INPUT]
    # Both unregisters: perf_analyzer ignores their errors, Triton answers 200 with an empty body.
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        answer = post(http, f"/v2/{kind}/unregister")
        assert answer.status_code == 200 and answer.content == b""
    input_bytes = int(np.prod(SHAPE)) * 4
    for name, size in ((OUTPUT, OUTPUT_REGION_BYTES), (f"{INPUT}_0_0", input_bytes)):
        region = regions[name] = PosixRegion(name, size)
        answer = post(http, f"/v2/systemsharedmemory/region/{name}/register", compact({"key": region.key, "offset": 0, "byte_size": size}))
        assert answer.status_code == 200, answer.text
    server = http.get("/v2")
    assert server.status_code == 200 and isinstance(server.json()["extensions"], list)


def infer_body() -> bytes:
    """The C++ client's request JSON for shared memory tensors: no data, no binary bytes after it
    (shared_memory_offset is sent only when it is not 0)."""
    return compact({
        "inputs": [{"name": INPUT, "shape": SHAPE, "datatype": "FP32",
                    "parameters": {"shared_memory_region": f"{INPUT}_0_0", "shared_memory_byte_size": int(np.prod(SHAPE)) * 4}}],
        "outputs": [{"name": OUTPUT, "parameters": {"shared_memory_region": OUTPUT, "shared_memory_byte_size": OUTPUT_REGION_BYTES}}],
    })


def read_as_the_cpp_client(response: httpx.Response) -> dict:
    """InferResultHttp: the JSON header is the whole body without Inference-Header-Content-Length; an
    output with ``parameters`` is a binary one and must give binary_data_size."""
    assert response.status_code == 200, response.text
    length = response.headers.get("inference-header-content-length")
    head = json.loads(response.content if length is None else response.content[: int(length)])
    for output in head["outputs"]:
        if "parameters" in output:
            assert isinstance(output["parameters"].get("binary_data_size"), int), f"perf_analyzer stops on {output}"
    return head


def test_perf_analyzer_shared_memory_sequence(http, regions):
    start_up(http, regions)
    rng = np.random.default_rng(13)
    for step in range(3):  # a few measurement requests, each with new input data
        x = rng.standard_normal(SHAPE).astype(np.float32)
        shm.set_shared_memory_region(regions[f"{INPUT}_0_0"].handle, [x])
        body = infer_body()
        response = post(http, f"/v2/models/{MODEL}/infer", body, **{"Inference-Header-Content-Length": str(len(body))})
        head = read_as_the_cpp_client(response)
        assert head["model_name"] == MODEL
        assert head["outputs"] == [{"name": OUTPUT, "datatype": "FP32", "shape": SHAPE}]  # exactly Triton's answer
        y = shm.get_contents_as_numpy(regions[OUTPUT].handle, np.float32, SHAPE)
        np.testing.assert_allclose(y, reference(MODEL, {INPUT: x}), rtol=1e-6, atol=1e-7)
    # At exit: both unregisters again, after which the regions are gone.
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        assert post(http, f"/v2/{kind}/unregister").status_code == 200
    assert http.get("/v2/systemsharedmemory/status").json() == []
    assert http.get("/v2/cudasharedmemory/status").json() == []


def test_perf_analyzer_statistics_around_a_window(http, regions):
    """perf_analyzer reads the model's statistics before and after each measurement window when GET /v2
    lists 'statistics', with rapidjson's unchecked GetUint64 on every count and ns, and takes the version
    whose queue count grew; compute counts must be equal."""
    start_up(http, regions)
    assert "statistics" in http.get("/v2").json()["extensions"]

    def stats() -> dict:
        answer = http.get(f"/v2/models/{MODEL}/stats")
        assert answer.status_code == 200, answer.text
        (entry,) = [s for s in answer.json()["model_stats"] if s["name"] == MODEL]
        assert isinstance(entry["version"], str) and int(entry["version"]) >= 0  # std::stoll
        for key in ("inference_count", "execution_count"):
            assert isinstance(entry[key], int) and entry[key] >= 0
        for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"):
            assert all(isinstance(entry["inference_stats"][key][f], int) for f in ("count", "ns")), key
        return entry

    before = stats()
    shm.set_shared_memory_region(regions[f"{INPUT}_0_0"].handle, [np.ones(SHAPE, np.float32)])
    window = 4
    for _ in range(window):
        body = infer_body()
        read_as_the_cpp_client(post(http, f"/v2/models/{MODEL}/infer", body, **{"Inference-Header-Content-Length": str(len(body))}))
    after = stats()
    grown = {k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"] for k in ("success", "queue", "compute_input", "compute_infer", "compute_output")}
    assert grown == dict.fromkeys(grown, window)
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        assert post(http, f"/v2/{kind}/unregister").status_code == 200


def test_cuda_shared_memory_as_a_server_without_gpus(http):
    """Triton built without GPU support: no regions, registration refused with 400, unregister succeeds."""
    assert http.get("/v2/cudasharedmemory/status").json() == []
    unknown = http.get("/v2/cudasharedmemory/region/gpu0/status")
    assert unknown.status_code == 404 and "gpu0" in unknown.json()["error"]
    body = compact({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64})
    refused = post(http, "/v2/cudasharedmemory/region/gpu0/register", body)
    assert refused.status_code == 400
    assert "GPUs not supported" in refused.json()["error"] and "systemsharedmemory" in refused.json()["error"]
    assert http.get("/v2/cudasharedmemory/status").json() == []
    assert post(http, "/v2/cudasharedmemory/region/gpu0/unregister").status_code == 200
