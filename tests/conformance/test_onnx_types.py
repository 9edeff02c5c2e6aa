"""ONNX's types beyond FLOAT32/FLOAT16 against ONNX's reference evaluator and ONNX Runtime, on the
device's own 64-bit path (native where it reports shaderFloat64/shaderInt64, emulated elsewhere):
Shrink in all eleven types of its constraint, PRelu in int64, Hardmax in double. Both peers round
integers through floating point (the reference through float64, ONNX Runtime's Shrink through float32),
so the values stay where they are exact: |x| < 2^24 for ONNX Runtime, < 2^40 for the reference; the
extremes beyond are tests/engine/test_64bit.py's, against exact arithmetic. ONNX Runtime's double Shrink
rounds through float32 too (measured: -2.911722302304959 - 0 gives -2.911722183227539), so it judges
no double."""
from __future__ import annotations

import numpy as np
import pytest

from service.descriptors import DataType
from tests.helpers import assert_matches, run

from .peers import model_for, run_onnxruntime, run_reference
from .test_onnx import descriptor

SHRINK_TYPES = [np.float64, np.float32, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def served(engine, name: str, dtype) -> None:
    from service.operators import OPERATORS

    if OPERATORS[name].served_types(engine.kernel_features)[DataType.from_numpy(dtype)] is None:
        pytest.skip(f"{name} has no {np.dtype(dtype).name} kernel on {engine.device.name}")


def values(rng: np.random.Generator, dtype, n: int, bound: int) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        x = rng.integers(max(info.min, -bound), min(info.max, bound), n, endpoint=True)
        x[:6] = [0, 1, 2, 3, min(info.max, bound), max(info.min, -bound)]
        return x.astype(dt)
    x = rng.standard_normal(n) * 4
    x[:8] = [0.0, -0.0, 1.5, -1.5, 0.5, -0.5, np.inf, -np.inf]
    return x.astype(dt)


@pytest.mark.parametrize("bias,threshold", [(0.0, 0.5), (1.5, 1.5), (-2.25, 0.0), (0.5, -3.5), (100.75, 3.0)])
@pytest.mark.parametrize("dtype", SHRINK_TYPES, ids=lambda t: np.dtype(t).name)
def test_shrink_in_every_type(engine, dtype, bias, threshold):
    name = "DML_OPERATOR_ACTIVATION_SHRINK"
    served(engine, name, dtype)
    rng = np.random.default_rng([np.dtype(dtype).itemsize, int(bias * 4) % 97])
    op = descriptor(name, dtype, (4, 257), {"Bias": bias, "Threshold": threshold})
    model = model_for(op, np.dtype(dtype), [(4, 257)])
    ort = () if dtype is np.float64 else (run_onnxruntime,)
    for bound, peers in ((2**40, (run_reference,)), (2**23, (run_reference, *ort))):
        x = values(rng, dtype, 4 * 257, bound).reshape(4, 257)
        got = run(engine, op, x)
        keep = in_range(x, bias, threshold)
        for peer in peers:
            # float16: ONNX computes x -/+ bias in float16 itself, vkact in float32 rounded once to float16
            assert_matches(got[keep], peer(model, x)[keep], 1 if dtype is np.float16 else 0, flush_denormals=False)


def in_range(x: np.ndarray, bias: float, threshold: float) -> np.ndarray:
    """Where the peers are exact: integer results that the type holds (out of range, both peers cast a
    float to the type, which numpy leaves undefined; vkact wraps, as tests/engine checks exactly)."""
    if x.dtype.kind not in "iu":
        return np.ones(x.shape, bool)
    w = x.astype(np.float64)
    raw = np.where(w < -threshold, w + bias, np.where(w > threshold, w - bias, 0.0))
    info = np.iinfo(x.dtype)
    return (raw >= info.min) & (raw <= info.max)


def test_prelu_int64(engine):
    name = "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU"
    served(engine, name, np.int64)
    rng = np.random.default_rng(7)
    x, slope = values(rng, np.int64, 600, 2**20).reshape(20, 30), values(rng, np.int64, 600, 2**20).reshape(20, 30)
    op = descriptor(name, np.int64, (20, 30), {})
    model = model_for(op, np.dtype(np.int64), [x.shape, slope.shape])
    got = run(engine, op, x, slope)
    np.testing.assert_array_equal(got, run_reference(model, x, slope))
    np.testing.assert_array_equal(got, run_onnxruntime(model, x, slope))


def test_hardmax_double(engine):
    name = "DML_OPERATOR_ACTIVATION_HARDMAX1"
    served(engine, name, np.float64)
    rng = np.random.default_rng(13)
    x = 1.0 + rng.integers(0, 3, (16, 40)) * 2.0**-45   # maxima apart by less than float32 can tell
    x[3, 7] = np.nan
    op = descriptor(name, np.float64, x.shape, {"Axes": [1]})
    np.testing.assert_array_equal(run(engine, op, x), run_reference(model_for(op, np.dtype(np.float64), [x.shape]), x))


def ort_if_it_has_the_kernel(model, *arrays) -> np.ndarray | None:
    """ONNX Runtime's answer, or None where its CPU provider has no kernel for the type (it says so
    when the session is made: NOT_IMPLEMENTED)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

    try:
        return run_onnxruntime(model, *arrays)
    except OrtNotImplemented:
        return None


@pytest.mark.parametrize("name,dtype", [("DML_OPERATOR_ACTIVATION_RELU", t) for t in (np.int8, np.int16, np.int32, np.int64)]
                         + [("DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU", t) for t in (np.int32, np.int64, np.uint32, np.uint64)])
def test_relu_and_prelu_integers(engine, name, dtype):
    """ONNX Relu's and PRelu's integer types (PRelu's products kept within 2^40, where the peers are exact)."""
    served(engine, name, dtype)
    from service.operators import OPERATORS

    rng = np.random.default_rng(np.dtype(dtype).itemsize)
    arrays = [values(rng, dtype, 600, 2**20).reshape(20, 30) for _ in OPERATORS[name].input_fields]
    op = descriptor(name, dtype, (20, 30), {})
    model = model_for(op, np.dtype(dtype), [a.shape for a in arrays])
    got = run(engine, op, *arrays)
    np.testing.assert_array_equal(got, run_reference(model, *arrays))
    ort = ort_if_it_has_the_kernel(model, *arrays)
    if ort is not None:
        np.testing.assert_array_equal(got, ort)
