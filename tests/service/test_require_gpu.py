"""VKACT_REQUIRE_GPU (the gpu image sets it): where the chosen Vulkan device is not a GPU, the service
says so in one line and exits with status 2 before it serves; set to 0 it falls back and serves."""
from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest

from service.__main__ import NO_GPU
from service.vulkan_probe import PhysicalDevice, gpu_missing, physical_devices
from tests.service.conftest import ROOT, free_port, start_server, stop_server


def device(index: int, name: str, kind: str) -> PhysicalDevice:
    return PhysicalDevice(index, name, kind, 0, 0, "1.3.0", "", "", 1 << 27, 128, 4096)


LAVAPIPE = device(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "cpu")
GPU = device(1, "NVIDIA H100 80GB HBM3", "discrete-gpu")


def test_a_gpu_is_found_by_its_reported_type():
    assert gpu_missing([LAVAPIPE, GPU], "auto") is None
    assert gpu_missing([LAVAPIPE, GPU], "NVIDIA") is None
    assert gpu_missing([device(0, "Intel(R) UHD Graphics", "integrated-gpu")], "auto") is None


def test_no_gpu_is_said_with_what_there_is():
    only_cpu = gpu_missing([LAVAPIPE], "auto")
    assert only_cpu and "llvmpipe" in only_cpu and "cpu" in only_cpu and "\n" not in only_cpu
    # a GPU present but another device chosen is refused too: the service would run on the chosen one
    assert "llvmpipe" in (gpu_missing([LAVAPIPE, GPU], "0") or "")
    assert "no Vulkan device" in (gpu_missing([], "auto") or "")


def run_service(**env: str) -> subprocess.CompletedProcess:
    port = free_port()
    return subprocess.run([sys.executable, "-m", "service", "--port", str(port), "--grpc-port", str(free_port())],
                          cwd=ROOT, env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=60)


def test_without_a_gpu_the_service_exits_with_one_line():
    gpus = [d.name for d in physical_devices() if not d.is_cpu]
    if gpus:
        pytest.skip(f"this machine has a GPU ({', '.join(gpus)}): the service would start on it "
                    "(test_no_gpu_is_said_with_what_there_is covers the refusal without one)")
    proc = run_service(VKACT_REQUIRE_GPU="1")
    assert proc.returncode == NO_GPU == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no GPU Vulkan device" in lines[0] and "VKACT_REQUIRE_GPU=0" in lines[0]
    assert all(d.name in lines[0] for d in physical_devices())   # what there is instead (lavapipe, SwiftShader)
    assert proc.stdout == ""


def test_without_any_vulkan_driver_the_line_says_so():
    proc = run_service(VKACT_REQUIRE_GPU="true", VK_ICD_FILENAMES="/nonexistent/icd.json", VK_DRIVER_FILES="/nonexistent/icd.json")
    assert proc.returncode == NO_GPU
    assert "no Vulkan device found" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_told_to_fall_back_it_serves_from_the_cpu():
    server = start_server(supervised=True, require_gpu=0)
    try:
        x = np.linspace(-3, 3, 64, dtype=np.float32)
        body = {"inputs": [{"name": "InputTensor", "shape": [64], "datatype": "FP32", "data": x.tolist()}]}
        out = httpx.post(f"{server.url}/v2/models/relu/infer", json=body, timeout=30).json()["outputs"][0]
        np.testing.assert_array_equal(np.asarray(out["data"], np.float32), np.maximum(x, 0))
    finally:
        stop_server(server)
