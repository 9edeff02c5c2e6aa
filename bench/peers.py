"""CPU peers and the host's memory limit: float32 versions of each operator in numpy, and in torch and
onnxruntime where they are importable (nothing is installed for the benchmark's sake).

A peer binds an operator to an input array and returns a zero-argument callable that computes the
output (returned, so the benchmark can check it against vkact's once)."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from service.operators import OperatorDesc, short_name

Compute = Callable[[], Any]
f32 = np.float32


def host_memcpy(nbytes: int) -> Compute:
    """One single-threaded copy of ``nbytes`` between two buffers already faulted in."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    return lambda: np.copyto(dst, src)


def _numpy(op: OperatorDesc, x: np.ndarray) -> Compute | None:
    # float32 scalars keep every intermediate in float32, as the kernels compute (op.formula is float64).
    name = short_name(type(op))
    if name == "shrink":
        b, t = f32(op.Bias), f32(op.Threshold)
        return lambda: np.where(x > t, x - b, np.where(x < -t, x + b, f32(0)))
    if name == "celu":
        a, inv = f32(op.Alpha), f32(1.0 / op.Alpha)
        return lambda: np.maximum(x, f32(0)) + np.minimum(f32(0), a * np.expm1(x * inv))
    if name == "softsign":
        return lambda: x / (f32(1) + np.abs(x))
    if name == "scaled_tanh":
        a, b = f32(op.Alpha), f32(op.Beta)
        return lambda: a * np.tanh(b * x)
    return None


def _torch(op: OperatorDesc, x: np.ndarray) -> Compute | None:
    import torch

    t = torch.from_numpy(x)  # shares x's memory: no copy is timed
    name = short_name(type(op))
    if name == "shrink":
        b, th = op.Bias, op.Threshold
        return lambda: torch.where(t > th, t - b, torch.where(t < -th, t + b, torch.zeros((), dtype=t.dtype)))
    if name == "celu":
        return lambda: torch.celu(t, op.Alpha)
    if name == "softsign":
        return lambda: torch.nn.functional.softsign(t)
    if name == "scaled_tanh":
        return lambda: op.Alpha * torch.tanh(op.Beta * t)
    return None


def _onnxruntime(op: OperatorDesc, x: np.ndarray) -> Compute | None:
    import onnxruntime
    from onnx import TensorProto, helper

    name = short_name(type(op))
    scalars: list[Any] = []
    if name == "shrink":
        nodes = [helper.make_node("Shrink", ["X"], ["Y"], bias=op.Bias, lambd=op.Threshold)]
    elif name == "celu":
        nodes = [helper.make_node("Celu", ["X"], ["Y"], alpha=op.Alpha)]
    elif name == "softsign":
        nodes = [helper.make_node("Softsign", ["X"], ["Y"])]
    elif name == "scaled_tanh":  # no ONNX operator since opset 10: Alpha * Tanh(Beta * X)
        scalars = [helper.make_tensor("alpha", TensorProto.FLOAT, [], [op.Alpha]), helper.make_tensor("beta", TensorProto.FLOAT, [], [op.Beta])]
        nodes = [
            helper.make_node("Mul", ["X", "beta"], ["bx"]),
            helper.make_node("Tanh", ["bx"], ["t"]),
            helper.make_node("Mul", ["t", "alpha"], ["Y"]),
        ]
    else:
        return None
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, list(x.shape)) for v in ("X", "Y")]
    graph = helper.make_graph(nodes, name, [io[0]], [io[1]], initializer=scalars)
    # IR 8 / opset 17: old enough for any onnxruntime that has all four operators.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"X": x})[0]


@dataclass(frozen=True)
class Peer:
    name: str
    modules: tuple[str, ...]       # all must import for the peer to run
    bind: Callable[[OperatorDesc, np.ndarray], Compute | None]

    def version(self) -> str | None:
        """The first module's version, or None when a module is missing."""
        try:
            loaded: list[ModuleType] = [importlib.import_module(m) for m in self.modules]
        except ImportError:
            return None
        return str(getattr(loaded[0], "__version__", "?"))


PEERS = (
    Peer("numpy", ("numpy",), _numpy),
    Peer("torch", ("torch",), _torch),
    Peer("onnxruntime", ("onnxruntime", "onnx"), _onnxruntime),
)
