"""One settings object, read from VKACT_* environment variables (and flags of ``python -m service``)."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VKACT_", frozen=True)

    # Device and engine
    device: str = Field("auto", description="'auto' (first discrete GPU, else first device, lavapipe on a CPU machine), an index, or part of a device name")
    memory: Literal["auto", "host", "device"] = Field("auto", description="kp tensor memory: host (zero copy; the auto choice on CPUs and integrated GPUs) or device (VRAM plus staging; auto on discrete GPUs)")
    slot_import: Literal["auto", "on", "off"] = Field("auto", description="auto: on a CPU device and on NVIDIA's driver on a discrete GPU (where measured), a large packed elementwise job's kernel runs on the request's shared-memory slot itself (its pages imported: VK_EXT_external_memory_host), not on copies; on: on any device that imports host memory, a GPU too (its kernel then reads and writes host memory across its bus: measure first, python -m bench.direct_replay); off: always on copies in the engine's buffers")
    local_size: int = Field(256, ge=32, le=1024, description="workgroup size of every kernel")
    max_workgroups: int = Field(0, ge=0, description="grid-stride cap on workgroups per dispatch; 0 picks one for the device type")
    pool_bytes: int = Field(2 << 30, ge=1 << 20, description="device memory the buffer pool may keep for reuse")
    max_tensor_bytes: int = Field(0, ge=0, description="largest tensor buffer; 0 means the device's maxStorageBufferRange")
    native_64bit: bool = Field(True, description="the native FLOAT64/INT64/UINT64 kernels where the device has shaderFloat64/shaderInt64; false: the kernels emulated in 32-bit words (and a 422 for FLOAT64 operators that have none), as on a device without them (the tests run both paths on one device)")
    glsl_dir: Path = ROOT / "glsl"
    spirv_cache: Path = ROOT / ".cache" / "spirv"
    glslang: str = "glslangValidator"
    generated_shader_cache: Path | None = Field(None, description="where generated shaders (fused graphs) and their SPIR-V go; default: generated/ under spirv_cache, or a directory under the system's temp dir where that is not writable (a read-only image)")

    # Service
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, description="HTTP worker processes (uvicorn)")
    worker_nice: int = Field(10, ge=0, le=19, description="scheduling niceness of the device driver's threads: on a CPU device (lavapipe) they must not starve the HTTP process's probes")
    pin_cpu: str = Field("auto", pattern=r"^(auto|off|[0-9]+)$", description="'auto' (on a CPU device with one HTTP process: the last allowed CPU), 'off', or a CPU number: the event loop, the device worker's job thread and its engine for one-workgroup dispatches share that CPU, the job thread and that engine moving to the other CPUs while requests queue up (see service/cpu_placement.py)")
    max_batch: int = Field(0, ge=0, le=64, description="queued requests of one descriptor run as one dispatch, up to this many (1: never; 0: the device's default, 8 on a CPU device, 32 on a GPU: service/device_tuning.py)")
    queue_size: int = Field(64, ge=1, description="requests waiting for the device before 503")
    max_body_bytes: int = Field(256 << 20, ge=1024)
    request_timeout_s: float = Field(60.0, gt=0)
    device_timeout_s: float = Field(120.0, gt=0, description="a job on the device longer than this means a hung device: the worker is killed and restarted")
    max_json_values: int = Field(5_000_000, ge=1024, description="values (numbers, strings, lists, ...) a request's JSON text, or an answer as JSON, may hold, counted before it is parsed or made: 413 beyond (each becomes a Python object of ~100 bytes at the peak; a 16 MiB FLOAT32 tensor, 2^22 values, fits; large tensors travel as binary data)")
    header_timeout_s: float = Field(10.0, gt=0, description="a connection must send a request's headers within this many seconds of opening (or of its request's first byte): else 408 and closed")
    body_timeout_s: float = Field(30.0, gt=0, description="a request's body may pause at most this many seconds between bytes while the service waits for it, and a client may take no byte of a large answer sent from its tensor slot this long: else the connection is closed")
    grpc_idle_timeout_s: float = Field(300.0, gt=0, description="a gRPC connection with no call open this long (PINGs do not count) is told GOAWAY and closed; its client reconnects for its next call")
    max_connections: int = Field(512, ge=1, description="open HTTP connections per HTTP process; a request on one beyond it gets 503 with Retry-After and the connection is closed (liveness probes excepted)")
    http_native: bool = Field(True, description="parse the HTTP port's inference requests in C (service/http_native.py); 0: uvicorn's httptools parser for every request")
    grpc_port: int = Field(8001, ge=0, le=65535, description="gRPC (Open Inference Protocol) port, served by every HTTP process; 0: no gRPC server (an ephemeral port would differ per process)")

    # Limits (see README, "Limits and failure behaviour")
    max_shm_regions: int = Field(1024, ge=1, description="system shared memory regions registered at once; one more is a 400")
    slot_bytes: int = Field(1 << 30, ge=1 << 20, description="shared memory (/dev/shm) the tensor slots of one HTTP process may hold; a request that needs more than this alone is a 413, one that finds it taken by requests in flight a 503")
    inflight_bytes: int = Field(0, ge=0, description="request bytes that all requests in flight in one HTTP process may hold at once: bodies as received and as inflated, gRPC messages, gRPC answers not yet read (0: VKACT_MAX_BODY_BYTES, room for one largest request); a request that needs more alone is a 413, one that finds it held by others a 503 with Retry-After, and a compressed body past the room left is inflated only to be counted")
    idle_release_s: float = Field(60.0, gt=0, description="tensor slots and the engine's buffers and pipelines unused for this long (up to twice) are freed")
    max_pipelines: int = Field(256, ge=8, description="compiled pipelines the engine keeps (least recently used out): bounds the device worker's memory over many distinct descriptors")
    worker_start_timeout_s: float = Field(120.0, gt=0, description="a device worker that has not reported ready this long after it started (a driver hung creating the device) is killed and started again")
    max_graph_nodes: int = Field(64, ge=1, le=4096, description="operator nodes one graph may have; a larger graph is a 422 naming Graph.Nodes")
    max_graph_models: int = Field(64, ge=0, le=4096, description="graph models loaded at once through /v2 and gRPC's model repository extension, per server (all its HTTP processes together; each process holds each model compiled); one more is a 400 naming the setting (unload one first); 0: no graph models")
    max_fused_shader_bytes: int = Field(256 << 10, ge=4096, description="generated GLSL one fused graph step may have; a group of elementwise nodes whose shader would be larger runs node by node (the plan says so)")
    graph_max_storage_buffers: int = Field(0, ge=0, description="storage buffers one generated graph step may bind; 0: the device's maxPerStageDescriptorStorageBuffers; a lower number forces a lower limit (4, the Vulkan minimum, at least). A fused group beyond it runs as smaller groups or node by node (the plan says so)")
    require_gpu: bool = Field(False, description="start only where the chosen Vulkan device is a GPU (the gpu image sets it): else say so in one line and exit with status 2, instead of serving from a CPU driver or not at all")

    @property
    def inflight_limit(self) -> int:
        return self.inflight_bytes or self.max_body_bytes

    @model_validator(mode="after")
    def _one_process_per_pinned_cpu(self) -> "Settings":
        if self.workers > 1 and self.pin_cpu not in ("auto", "off"):
            raise ValueError(f"pin_cpu {self.pin_cpu} with {self.workers} HTTP processes would put all of them on one CPU: use 'auto' or 'off'")
        return self

    @model_validator(mode="after")
    def _grpc_port_of_its_own(self) -> "Settings":
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(f"grpc_port {self.grpc_port} is the HTTP port too: give gRPC a port of its own (or 0 for none)")
        return self
