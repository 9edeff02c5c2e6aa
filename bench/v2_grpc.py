"""The Open Inference Protocol over gRPC: vkact's gRPC port beside its HTTP ``/v2``, next to Seldon MLServer's
gRPC server on the same operator (``shrink``, ``bench/mlserver_model.py``), all on this machine in one run.

- **vkact gRPC**: ``ModelInfer`` with the input in ``raw_input_contents`` and the output read from
  ``raw_output_contents`` (what ``tritonclient.grpc`` sends and reads), and through system shared memory
  (each client registers a region of its own; the input is written there once, the output read back
  into numpy by every timed request).
- **vkact HTTP**: ``/v2`` with binary tensor data through ``tritonclient.http`` (bench/v2.py's client).
- **MLServer gRPC**: the two MLServers of bench/v2.py (parallel_workers 1, its default, and 0), gRPC on
  their own port with messages up to 64 MiB; MLServer answers raw contents to a raw request.

The gRPC clients are grpcio's own stubs (tritonclient's generated ``service_pb2_grpc``), one channel per
client, the request message built once: a timed call is the RPC plus ``np.frombuffer`` of the answer,
so what is measured is the server. Requests: 1,024 FLOAT32 elements (requests per second with 8 client
processes) and 2^22 (16 MiB in, 16 MiB out, sequential). Every target's answer is checked against numpy
before it is timed."""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import h2load_grpc as h2
from . import service as svc
from . import v2
from .timing import Samples, blocks

MODEL = v2.MODEL
SMALL, LARGE = svc.SMALL, svc.LARGE
CLIENTS = svc.CLIENTS
CONCURRENT_ROUNDS, CONCURRENT_EACH = 3, 400   # as bench/v2.py: 9,600 requests per target
LARGE_REPEAT = 5
TARGET_RATE = 3.0   # vkact gRPC requests/s with 8 clients, 1,024 elements, over MLServer gRPC's: at least this
H2_ROUNDS, H2_SECONDS = 3, 5.0   # h2load: per target and round, alternated (this VM drifts between minutes)
H2_TARGETS = ("vkact grpc", *("mlserver grpc", "mlserver-0 grpc"))   # raw contents (shared memory is per client)
CLIENT_CPU_CALLS = 500   # sequential grpcio calls whose CPU time gives the Python client's CPU per request
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]

LABELS = {
    "vkact grpc": "vkact gRPC, raw contents",
    "vkact grpc shm": "vkact gRPC, system shared memory (input and output)",
    "vkact http": "vkact `/v2` HTTP, binary (tritonclient.http)",
    "mlserver grpc": f"MLServer {v2.MLSERVER_VERSION} gRPC, raw contents, parallel_workers 1 (its default)",
    "mlserver-0 grpc": f"MLServer {v2.MLSERVER_VERSION} gRPC, raw contents, parallel_workers 0 (in-process)",
}
MLSERVER_KEYS = {"mlserver grpc": "mlserver json", "mlserver-0 grpc": "mlserver-0 json"}  # bench/v2.py's servers


@dataclass(frozen=True)
class Target:
    key: str       # a LABELS key
    address: str   # host:port (gRPC) or http://host:port (HTTP)


class Caller:
    """One client of one target, its request built once; a call returns the output as numpy."""

    def __init__(self, target: Target, x: np.ndarray) -> None:
        self.target, self.shape = target, list(x.shape)
        self._http = self._channel = self._region = None
        if target.key == "vkact http":
            self._http = v2.Caller(v2.Target("vkact binary", target.address, True), x)
            return
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._channel = grpc.insecure_channel(target.address, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        tensor = request.inputs.add(name="InputTensor", datatype="FP32", shape=self.shape)
        output = request.outputs.add(name="OutputTensor")
        if target.key.endswith("shm"):
            import tritonclient.utils.shared_memory as shm

            self._shm, self.nbytes = shm, x.nbytes
            self.name = f"bench_{uuid.uuid4().hex[:12]}"
            self._region = shm.create_shared_memory_region(self.name, f"/{self.name}", 2 * x.nbytes)
            shm.set_shared_memory_region(self._region, [x])
            self._stub.SystemSharedMemoryRegister(service_pb2.SystemSharedMemoryRegisterRequest(
                name=self.name, key=f"/{self.name}", offset=0, byte_size=2 * x.nbytes))
            tensor.parameters["shared_memory_region"].string_param = self.name
            tensor.parameters["shared_memory_byte_size"].int64_param = x.nbytes
            output.parameters["shared_memory_region"].string_param = self.name
            output.parameters["shared_memory_byte_size"].int64_param = x.nbytes
            output.parameters["shared_memory_offset"].int64_param = x.nbytes
        else:
            request.raw_input_contents.append(x.tobytes())
        self._request = request

    def __call__(self) -> np.ndarray:
        if self._http is not None:
            return self._http()
        response = self._stub.ModelInfer(self._request)
        if self._region is not None:
            return self._shm.get_contents_as_numpy(self._region, np.float32, self.shape, offset=self.nbytes)
        return np.frombuffer(response.raw_output_contents[0], np.float32)

    def wire(self) -> tuple[bytes, bytes]:
        """The request's serialized bytes and the serialized answer (as h2load sends and receives them)."""
        call = self._channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        request = self._request.SerializeToString()
        return request, call(request)

    def check(self, x: np.ndarray) -> None:
        np.testing.assert_array_equal(np.asarray(self()).reshape(-1), v2.reference(x).reshape(-1),
                                      err_msg=f"{self.target.key}: wrong SHRINK output")

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            return
        if self._region is not None:
            from tritonclient.grpc import service_pb2

            self._stub.SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(name=self.name))
            self._shm.destroy_shared_memory_region(self._region)
        self._channel.close()


@dataclass
class GrpcResult:
    device: dict[str, Any]
    mlserver: v2.MLServerEnv | None
    mlserver_reason: str | None
    rates: dict[str, svc.Rate]
    large: dict[str, Samples]
    tensor_bytes: int
    versions: dict[str, str]
    load: tuple[float, float]
    seconds: float
    h2: dict[str, svc.Rate]            # h2load's requests/s (latency not kept), the targets of H2_TARGETS
    h2_reason: str | None              # why there are none
    client_cpu_us: dict[str, float]    # each load generator's own CPU per request ("grpcio", "h2load")

    def fastest(self) -> str | None:
        keys = [k for k in MLSERVER_KEYS if k in self.rates]
        return max(keys, key=lambda k: self.rates[k].per_second) if keys else None

    def rate_ratio(self, key: str = "vkact grpc") -> float | None:
        against = self.fastest()
        return None if against is None else self.rates[key].per_second / self.rates[against].per_second

    def h2_ratio(self, key: str = "vkact grpc") -> float | None:
        keys = [k for k in MLSERVER_KEYS if k in self.h2]
        if key not in self.h2 or not keys:
            return None
        return self.h2[key].per_second / max(self.h2[k].per_second for k in keys)

    def large_ratio(self, key: str) -> float | None:
        keys = [k for k in MLSERVER_KEYS if k in self.large]
        if not keys:
            return None
        return min(self.large[k].median for k in keys) / self.large[key].median


@contextmanager
def _servers(env: v2.MLServerEnv | None) -> Iterator[tuple[svc.Server, dict[str, svc.Server], str | None]]:
    with svc.servers() as (vkact, _echo), v2._maybe_mlservers(env) as (mls, reason):
        yield vkact, {key: mls[json_key] for key, json_key in MLSERVER_KEYS.items() if json_key in mls}, reason


def _h2load(targets: list[Target], x: np.ndarray, rounds: int, log: Callable[[str], None]
            ) -> tuple[dict[str, svc.Rate], str | None, dict[str, float]]:
    """Each target's requests/s from h2load (bench/h2load_grpc.py), the targets alternated over
    ``rounds``, every answer checked; and the CPU per request of a grpcio client against h2load's."""
    wires = {}
    for t in targets:  # the exact bytes h2load sends, answered correctly through a grpcio channel first
        call = Caller(t, x)
        try:
            request, answer = call.wire()
            from tritonclient.grpc import service_pb2

            out = service_pb2.ModelInferResponse.FromString(answer).raw_output_contents[0]
            np.testing.assert_array_equal(np.frombuffer(out, np.float32), v2.reference(x), err_msg=f"{t.key}: wrong SHRINK output")
            wires[t.key] = (request, len(answer))
            if t.key == "vkact grpc":
                for _ in range(50):
                    call()
                cpu = time.process_time()
                for _ in range(CLIENT_CPU_CALLS):
                    call()
                grpcio_cpu_us = (time.process_time() - cpu) / CLIENT_CPU_CALLS * 1e6
        finally:
            call.close()
    rates: dict[str, svc.Rate] = {}
    cpu_s = 0.0
    log(f"grpc: h2load, {CLIENTS} connections of one stream, {rounds} x {H2_SECONDS:g} s per target")
    try:
        for _ in range(rounds):
            for t in targets:
                done = h2.run(t.address, wires[t.key][0], wires[t.key][1], CLIENTS, H2_SECONDS)
                rate = rates.setdefault(t.key, svc.Rate())
                rate.requests += done.requests
                rate.seconds += done.seconds
                cpu_s += done.cpu_seconds
    except h2.Unavailable as exc:
        log(f"grpc: h2load skipped: {exc}")
        return {}, str(exc), {"grpcio": grpcio_cpu_us}
    total = sum(r.requests for r in rates.values())
    return rates, None, {"grpcio": grpcio_cpu_us, "h2load": cpu_s / total * 1e6}


def run(log: Callable[[str], None] = print, rounds: int = CONCURRENT_ROUNDS, each: int = CONCURRENT_EACH,
        large_repeat: int = LARGE_REPEAT, h2_rounds: int = H2_ROUNDS) -> GrpcResult:
    import grpc
    import httpx

    started, load = time.perf_counter(), os.getloadavg()[0]
    reason: str | None = None
    try:
        env: v2.MLServerEnv | None = v2.mlserver_env(log)
    except (v2.Unavailable, OSError) as exc:
        env, reason = None, str(exc)
    rng = np.random.default_rng(2025)
    small_x, large_x = rng.standard_normal(SMALL, dtype=np.float32), rng.standard_normal(LARGE, dtype=np.float32)
    with _servers(env) as (vkact, mls, ml_reason):
        reason = reason or ml_reason
        if reason:
            log(f"grpc: MLServer not available: {reason}")
        device = httpx.get(vkact.url + "/v1/device", timeout=30).json()
        targets = [Target("vkact grpc", vkact.grpc), Target("vkact grpc shm", vkact.grpc), Target("vkact http", vkact.url)]
        targets += [Target(key, ml.grpc) for key, ml in mls.items()]
        for t in targets:  # every answer checked once, small and large, before anything is timed
            for x in (small_x, large_x):
                call = Caller(t, x)
                try:
                    call.check(x)
                finally:
                    call.close()
        log(f"grpc: {CLIENTS} concurrent clients, {rounds * CLIENTS * each} requests per target")
        phases = [(t, each) for _ in range(rounds) for t in targets]
        rates = svc.run_load_clients(v2.load_client, (Caller, phases, small_x), [t.key for t, _ in phases], "bench-grpc-client")
        h2_rates, h2_reason, client_cpu = _h2load([t for t in targets if t.key in H2_TARGETS], small_x, h2_rounds, log)
        log(f"grpc: 16 MiB ({LARGE} elements), {large_repeat} sequential requests per target")
        large_calls = [(t.key, Caller(t, large_x)) for t in targets]
        try:
            large = blocks(large_calls, 1, large_repeat)
        finally:
            for _, call in large_calls:
                call.close()
    import importlib.metadata as m

    versions = {n: m.version(n) for n in ("grpcio", "protobuf", "tritonclient")}
    versions["grpcio (runtime)"] = grpc.__version__
    return GrpcResult(device, env, reason, rates, large, 2 * large_x.nbytes, versions, (load, os.getloadavg()[0]),
                      time.perf_counter() - started, h2_rates, h2_reason, client_cpu)


def section(device_name: str, machine: str, r: GrpcResult, targets: bool = True) -> str:
    """``targets``: on the device the target was set for (llvmpipe), its verdict; elsewhere figures only."""
    from datetime import datetime, timezone

    v = r.versions
    ml = "not available: " + (r.mlserver_reason or "?") if r.mlserver is None else (
        f"{r.mlserver.versions.get('mlserver', '?')} (bench/v2.py's two servers), gRPC up to 64 MiB messages")
    lines = [f"<!-- grpc: {device_name} -->", f"## {device_name}: Open Inference Protocol over gRPC against MLServer's gRPC", ""]
    lines += [f"- **{k}:** {val}" for k, val in [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{machine}; 1-minute load average {r.load[0]:.1f} at the start, {r.load[1]:.1f} at the end"),
        ("Device", f"{r.device['name']}; tensors in {r.device['memory']} memory"),
        ("vkact", "one process (HTTP and gRPC on one event loop; gRPC over its own HTTP/2 transport in C, libnghttp2), its device worker in its own process; `shrink`, defaults"),
        ("MLServer", ml),
        ("Clients", f"grpcio {v['grpcio']} stubs (tritonclient {v['tritonclient']}'s generated modules, protobuf "
                    f"{v['protobuf']}), one channel per client, the request built once, the output decoded to numpy "
                    f"in every timed request; HTTP: tritonclient.http; {CLIENTS} client processes for requests/s"),
        ("CPUs", f"{os.cpu_count()}, shared by the clients and every server"),
        ("Runtime", f"{r.seconds:.1f} s"),
    ]]
    n = next(iter(r.rates.values())).requests
    head = ["target", f"requests/s, {CLIENTS} clients", "p50 / p99 ms under load", "req/s vs the faster MLServer gRPC",
            "16 MiB: seconds per request", "16 MiB tensor MB/s", "16 MiB vs the faster MLServer gRPC"]
    lines += ["", f"### 1,024 FLOAT32 elements ({n:,} requests per target) and 16 MiB (2^22 elements in and out)", "",
              v2._row(head), v2._row(["---"] * len(head))]
    for key, rate in r.rates.items():
        big = r.large[key]
        ratio, big_ratio = r.rate_ratio(key), r.large_ratio(key)
        lines.append(v2._row([
            LABELS[key], f"{rate.per_second:.0f}", f"{v2._ms(rate.latency.median)} / {v2._ms(rate.latency.percentile(99))}",
            "—" if ratio is None or key in MLSERVER_KEYS else (f"**{ratio:.2f}**" if key == "vkact grpc" else f"{ratio:.2f}"),
            f"{big.median:.3f}", f"{r.tensor_bytes / big.median / 1e6:.0f}",
            "—" if big_ratio is None or key in MLSERVER_KEYS else f"{big_ratio:.2f}"]))
    cpu = r.client_cpu_us
    lines += ["", f"### 1,024 FLOAT32 elements through h2load ({CLIENTS} connections, one stream each, a C load generator)", ""]
    if r.h2:
        lines += [f"The same request bytes on every connection, every answer checked by its bytes (bench/h2load_grpc.py). "
                  f"Load generator CPU per request: grpcio client {cpu['grpcio']:.0f} µs, h2load {cpu['h2load']:.0f} µs.", "",
                  v2._row(["target", "requests/s", "vs the faster MLServer gRPC"]), v2._row(["---"] * 3)]
        for key, rate in r.h2.items():
            ratio = r.h2_ratio(key)
            lines.append(v2._row([LABELS[key], f"{rate.per_second:.0f}",
                                  "—" if ratio is None or key in MLSERVER_KEYS else f"**{ratio:.2f}**"]))
    else:
        lines.append(f"Not measured: {r.h2_reason}. grpcio client CPU per request: {cpu['grpcio']:.0f} µs.")
    ratio, how = (r.h2_ratio(), "h2load") if r.h2 else (r.rate_ratio(), "grpcio clients")
    if targets:
        lines += ["", f"**Target:** vkact gRPC requests/s with {CLIENTS} concurrent clients, 1,024 elements, ≥ {TARGET_RATE:g}× "
                      f"MLServer gRPC's (the faster of its two settings; {how}): {v2._verdict(ratio, TARGET_RATE)}"]
    lines += ["", "<!-- end grpc -->", ""]
    return "\n".join(lines)
