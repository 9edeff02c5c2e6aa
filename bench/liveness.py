"""Liveness under load: how long ``GET /health/live`` takes while the service is idle, while one 64 MiB
request is read, computed and answered, while gzip bombs and JSON texts of millions of values
arrive eight at a time, and while 32 gzip bombs of 1 MB (1 GiB inflated) arrive at once (the case of
issue 19: each inflates within the budget of bytes in flight, service/inflight.py). The tests assert that probes are answered (tests/service/test_load.py,
test_bombs.py); the latency is a figure, measured here.

The load comes from other processes (spawned), so the probing process's GIL measures only the probe.
Probes go one at a time on one keep-alive connection, PROBE_GAP_S apart, until the load is done.
"""
from __future__ import annotations

import gzip
import multiprocessing as mp
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH, encode_frame

from .timing import Samples

PROBE_GAP_S = 0.01
IDLE_PROBES = 200
BIG_ELEMENTS = 16 << 20        # 64 MiB of FLOAT32
BOMBS_AT_ONCE, BOMB_ROUNDS = 8, 3
BURST = 32                     # gzip bombs sent at once
BURST_BOMB_BYTES = 1 << 30     # what each inflates to: ~1 MB of gzip


def _values_text(count: int) -> bytes:
    data = ",".join(["-2,-1,0,1,2"] * (count // 5))
    return b'{"inputs":[{"name":"InputTensor","shape":[%d],"datatype":"FP32","data":[%s]}]}' % (count // 5 * 5, data.encode())


def _big_request(url: str) -> None:
    x = np.random.default_rng(7).standard_normal(BIG_ELEMENTS, dtype=np.float32)
    header = {"Operator": {"Type": "DML_OPERATOR_ACTIVATION_CELU", "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [BIG_ELEMENTS]}},
              "Inputs": {"InputTensor": {"binary_data_size": x.nbytes}}}
    parts, n = encode_frame(header, [x.tobytes()])
    with httpx.Client(timeout=600) as client:
        response = client.post(f"{url}/v1/execute", content=b"".join(parts), headers={HEADER_LENGTH: str(n), "Content-Type": BINARY_CONTENT_TYPE})
    assert response.status_code == 200, response.text[:300]


def _bombs(url: str, body_limit: int) -> None:
    kinds = [(gzip.compress(b" " * (body_limit + 1), 9), 413),        # inflates past the body limit
             (gzip.compress(_values_text(8_000_000), 9), 413),         # 8 million values
             (gzip.compress(_values_text(1_000_000), 9), 200)]         # 1 million values: parsed and run

    def post(kind: tuple[bytes, int]) -> None:
        with httpx.Client(timeout=600) as client:
            response = client.post(f"{url}/v2/models/relu/infer", content=kind[0], headers={"Content-Encoding": "gzip"})
        assert response.status_code == kind[1], response.text[:300]

    with ThreadPoolExecutor(BOMBS_AT_ONCE) as pool:
        list(pool.map(post, kinds * BOMB_ROUNDS))


def _gzip_bomb(size: int) -> bytes:
    """gzip of ``size`` spaces, made a block at a time (the whole never held)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (16 << 20)
    return b"".join([*(packer.compress(block) for _ in range(size // len(block))), packer.flush()])


def _burst(url: str, bomb: bytes) -> None:
    def post(_: int) -> None:
        with httpx.Client(timeout=600) as client:
            response = client.post(f"{url}/v2/models/relu/infer", content=bomb, headers={"Content-Encoding": "gzip"})
        assert response.status_code == 413, response.text[:300]

    with ThreadPoolExecutor(BURST) as pool:
        list(pool.map(post, range(BURST)))


def _probe(probe: httpx.Client, until: Callable[[], bool]) -> Samples:
    samples = Samples()
    while not until():
        started = time.perf_counter()
        assert probe.get("/health/live").status_code == 200
        samples.seconds.append(time.perf_counter() - started)
        time.sleep(PROBE_GAP_S)
    return samples


def _under(probe: httpx.Client, target: Callable[..., None], *args: object) -> Samples:
    process = mp.get_context("spawn").Process(target=target, args=args)
    process.start()
    samples = _probe(probe, lambda: not process.is_alive())
    process.join()
    assert process.exitcode == 0, f"{target.__name__} failed ({process.exitcode})"
    return samples


def run(url: str, body_limit: int, log: Callable[[str], None] = print) -> dict[str, Samples]:
    """Probe latencies by condition: idle, one 64 MiB request, bombs, a burst of bombs."""
    with httpx.Client(base_url=url, timeout=30) as probe:
        probe.get("/health/live")
        log(f"service: liveness, idle ({IDLE_PROBES} probes)")
        count = iter(range(IDLE_PROBES + 1))
        results = {"idle": _probe(probe, lambda: next(count) == IDLE_PROBES)}
        log(f"service: liveness during a {BIG_ELEMENTS * 4 >> 20} MiB request")
        results["64 MiB request"] = _under(probe, _big_request, url)
        log(f"service: liveness during {BOMB_ROUNDS * 3} gzip bombs and large JSON texts, {BOMBS_AT_ONCE} at a time")
        results["gzip bombs, 8 at a time"] = _under(probe, _bombs, url, body_limit)
        log(f"service: liveness during {BURST} gzip bombs at once, {BURST_BOMB_BYTES >> 30} GiB inflated each")
        bomb = _gzip_bomb(BURST_BOMB_BYTES)  # made before the probes start: their figure is the service's
        results[f"{BURST} gzip bombs at once"] = _under(probe, _burst, url, bomb)
    return results
