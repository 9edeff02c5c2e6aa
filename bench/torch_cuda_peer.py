"""PyTorch on CUDA as the peer of vkact's kernels on an NVIDIA GPU: torch.nn.functional's implementation of
the same operator at DirectML's default parameters, and the device's own device-to-device copy.

Same measuring rules as bench/vulkan_peers.py: the input is already on the device, the timed call
launches the kernel and waits for it (``torch.cuda.synchronize``, as vkact's ``Sequence.eval`` waits
for its fence), the output of the last call is checked against vkact's float64 reference (max ulp).
Importable without torch: ``status()`` says why there is no peer (no torch, no CUDA device)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from service.operators import OperatorDesc, short_name

from .vulkan_peers import Bound

DEVICE = "cuda"   # "cpu" runs the same code on PyTorch's CPU kernels (a check of this module where no GPU is)
SOFTMAX_FAMILY = {"softmax": "softmax", "softmax1": "softmax", "log_softmax": "log_softmax", "log_softmax1": "log_softmax"}


def status() -> tuple[Any | None, str]:
    """(torch, its version and device) where CUDA runs, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "not installed"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__}: no CUDA device"
    return torch, f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}"


def _functional(torch: Any, op: OperatorDesc) -> Callable[[Any], Any] | None:
    """torch.nn.functional's operator with DirectML's parameters, or None where it has none (or none
    with the same parameters: its hardsigmoid's slope is 1/6, DirectML's 0.2)."""
    F = torch.nn.functional
    name = short_name(type(op))
    p = {f: float(getattr(op, f)) for f in op.scalar_fields()}
    table: dict[str, Callable[[Any], Any]] = {
        "celu": lambda t: F.celu(t, p["Alpha"]),
        "elu": lambda t: F.elu(t, p["Alpha"]),
        "gelu": F.gelu,                                       # erf form, as DirectML's
        "leaky_relu": lambda t: F.leaky_relu(t, p["Alpha"]),
        "relu": F.relu,
        "sigmoid": torch.sigmoid,
        "softsign": F.softsign,
        "tanh": torch.tanh,
        "swish": F.silu,                                      # SigmoidInputScale 1
        "scaled_elu": F.selu,                                 # DirectML's Alpha and Gamma are SELU's
        "thresholded_relu": lambda t: F.threshold(t, p["Alpha"], 0.0),
    }
    if name == "shrink" and p["Bias"] == 0.0:
        return lambda t: F.hardshrink(t, p["Threshold"])
    if name == "shrink" and p["Bias"] == p["Threshold"]:
        return lambda t: F.softshrink(t, p["Threshold"])
    if name == "hard_swish" and np.float32(p["Alpha"]) == np.float32(1 / 6) and p["Beta"] == 0.5:
        return F.hardswish
    if name in ("softplus", "parametric_softplus"):
        beta = p.get("Steepness", p.get("Beta", 1.0))
        alpha = p.get("Alpha", 1.0)
        if alpha == 1.0:
            return lambda t: F.softplus(t, beta)
        return None
    if name in SOFTMAX_FAMILY:
        f = getattr(F, SOFTMAX_FAMILY[name])
        return lambda t: f(t, dim=-1)   # the bench's reductions run over the last of 2 dimensions
    return table.get(name)


def _wait(torch: Any) -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def bind(torch: Any, op: OperatorDesc, x: np.ndarray) -> Bound | None:
    """The operator on ``x`` (copied to the device once, shaped as op's input), or None without a peer."""
    f = _functional(torch, op)
    if f is None or len(op.inputs) != 1:
        return None
    t = torch.from_numpy(x).to(DEVICE).reshape(tuple(op.inputs[0].Sizes))
    last: list[Any] = [None]

    def run() -> None:
        last[0] = f(t)
        _wait(torch)

    def output() -> np.ndarray:
        return last[0].reshape(-1).cpu().numpy()

    return Bound(run=run, output=output)


def device_copy(torch: Any, nbytes: int) -> Callable[[], None]:
    """One device-to-device copy of ``nbytes`` between two CUDA buffers (``Tensor.copy_``), waited for."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=DEVICE)
    dst = torch.empty_like(src)

    def run() -> None:
        dst.copy_(src)
        _wait(torch)

    return run
