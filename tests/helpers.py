"""Shared test helpers: descriptors from arrays, running an operator on arrays, ulp comparison."""
from __future__ import annotations

import os
import pickle
from functools import lru_cache
from typing import Any

import numpy as np

from client.buffers import to_buffer, view
from client.json_values import BFLOAT16
from service.descriptors import DataType
from service.engine import Engine
from service.operators import OperatorDesc, parse_operator
from service.vulkan_probe import PhysicalDevice, choose, physical_devices

def tensor(dtype: Any, sizes: tuple[int, ...], strides: tuple[int, ...] | None = None, **extra: Any) -> dict:
    desc = {"DataType": DataType.from_numpy(dtype).value, "Sizes": list(sizes), **extra}
    if strides is not None:
        desc["Strides"] = list(strides)
    return desc


def any_op(op_type: str, dtype: Any, sizes: tuple[int, ...]) -> OperatorDesc:
    """A descriptor of any registered operator with every input tensor of ``sizes`` and default fields."""
    from service.operators import OPERATORS

    fields = OPERATORS[op_type].input_fields
    return parse_operator({"Type": op_type, **{name: tensor(dtype, sizes) for name in fields}})


def make_op(kind: str, dtype: Any, sizes: tuple[int, ...], strides=None, out_strides=None, **params: Any) -> OperatorDesc:
    """An operator descriptor for ``kind`` ('SHRINK', 'CELU', ...) on tensors of ``sizes``."""
    body = {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(dtype, sizes, strides), **params}
    if out_strides is not None:
        body["OutputTensor"] = tensor(dtype, sizes, out_strides)
    return parse_operator(body)


def run(engine: Engine, op: OperatorDesc, *arrays: np.ndarray, in_place: bool = False, keyed: bool = False) -> np.ndarray:
    """Lay ``arrays`` out as the input descriptors say, execute, and read the output tensor back;
    ``keyed``: through the engine's plan cache, keyed as the device worker keys it."""
    buffers = [to_buffer(a, d.Strides, d.total_bytes) for a, d in zip(arrays, op.inputs)]
    out = engine.execute(op, buffers, in_place=in_place, key=pickle.dumps(op) if keyed else None)
    assert out.nbytes == op.output.total_bytes
    return np.array(view(out, arrays[0].dtype, op.output.Sizes, op.output.strides))


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between same-dtype float arrays; +0 and -0 are 0 apart, NaN vs NaN 0,
    NaN vs a number the maximum."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    bits = 8 * a.itemsize
    ints = {16: np.int16, 32: np.int32, 64: np.int64}[bits]
    magnitude = (1 << (bits - 1)) - 1

    def ordered(x: np.ndarray) -> np.ndarray:  # monotonic integer image of the floats
        i = x.view(ints).astype(np.int64)
        return np.where(i < 0, -(i & magnitude), i)

    d = np.abs(ordered(a) - ordered(b))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return np.where(nan_a & nan_b, 0, np.where(nan_a | nan_b, np.iinfo(np.int64).max, d))


def assert_matches(actual: np.ndarray, reference: np.ndarray, max_ulp: int, flush_denormals: bool = True) -> None:
    """``actual`` within ``max_ulp`` of ``reference``. FLOAT32 and BFLOAT16 results below float32's
    smallest normal may also be flushed to zero, as D3D12 may flush fp32 denormals (BFLOAT16 is computed
    in float32 and has its exponent range; an H200 flushed GELU's -1.3e-39 where lavapipe keeps it)."""
    assert actual.shape == reference.shape and actual.dtype == reference.dtype
    if actual.dtype.kind in "iu":  # integer results are exact
        np.testing.assert_array_equal(actual, reference)
        return
    dist = ulp_distance(actual, reference)
    if flush_denormals and actual.dtype in (np.float32, BFLOAT16):
        tiny = np.finfo(np.float32).tiny
        below = lambda x: np.abs(x.astype(np.float32)) < tiny  # noqa: E731
        dist = np.where(below(reference) & below(actual), 0, dist)
    worst = int(np.argmax(dist)) if dist.size else 0
    assert dist.size == 0 or dist.max() <= max_ulp, (
        f"{int(dist.max())} ulp at flat index {worst}: got {actual.reshape(-1)[worst]!r}, "
        f"reference {reference.reshape(-1)[worst]!r}"
    )


@lru_cache(maxsize=1)
def service_device() -> PhysicalDevice:
    """The Vulkan device the tests' engines and services open (VKACT_DEVICE, else 'auto')."""
    return choose(physical_devices(), os.environ.get("VKACT_DEVICE", "auto"))


def elements_beyond_the_device(itemsize: int) -> int:
    """A tensor length whose buffer is just past the device's maxStorageBufferRange (lavapipe's is
    128 MiB, SwiftShader's 1 GiB, a GPU's up to 4 GiB): what no kernel can bind."""
    return service_device().max_storage_buffer_range // itemsize + 4
