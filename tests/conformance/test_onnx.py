"""vkact against ONNX Runtime (CPU) and ONNX's reference evaluator on the same inputs, and ONNX's own
node test cases replayed through DirectML descriptors."""
from __future__ import annotations

import warnings
from functools import cache

import numpy as np
import pytest
from onnx.backend.test.case.node import collect_testcases

from service.operators import OPERATORS, OperatorDesc, parse_operator
from tests.engine.test_operators import PARAMS
from tests.helpers import run, tensor

from .onnx_map import NO_COUNTERPART, NODE_TESTS, ONNX, REFERENCE_LOG_FLOOR
from .peers import model_for, run_onnxruntime, run_reference

MAPPED = sorted(t for t in ONNX if t in OPERATORS)
EXTREMES = [0.0, -0.0, 1e-7, -1e-7, 1e-3, -1e-3, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 80.0, -80.0,
            1e4, -1e4, 6e4, -6e4, np.inf, -np.inf, np.nan]


def test_every_operator_has_an_onnx_counterpart_or_is_listed_without_one():
    for name in OPERATORS:
        assert (name in ONNX) != (name in NO_COUNTERPART), name


def assert_close(got: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_allclose(got[finite].astype(np.float64), expected[finite].astype(np.float64), rtol=rtol, atol=atol)


def descriptor(name: str, dtype, shape, params: dict) -> OperatorDesc:
    op = OPERATORS[name]
    body = {"Type": name, **{f: tensor(dtype, shape) for f in op.input_fields}, **params, **ONNX[name].fixed}
    return parse_operator(body)


def param_sets(name: str) -> list[dict]:
    kind = name.removeprefix("DML_OPERATOR_ACTIVATION_")
    sets = PARAMS.get(kind, [{}])
    return [p for p in sets if not set(p) & set(ONNX[name].fixed)] or [{}]


# float16: ONNX's reference evaluator computes in float16 itself (several roundings), hence 4 ulp.
TOLERANCE = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float16): (4e-3, 1e-4)}


@pytest.mark.parametrize("shape", [(64,), (2, 3, 4), (1, 3, 5, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", MAPPED, ids=lambda n: n.removeprefix("DML_OPERATOR_ACTIVATION_"))
def test_against_onnxruntime_and_the_reference_evaluator(engine, name, dtype, shape):
    if ONNX[name].two_d:
        shape = (int(np.prod(shape[:-1])), shape[-1])
    rng = np.random.default_rng(len(name) * 7 + len(shape))
    arrays = []
    for _ in OPERATORS[name].input_fields:
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        flat = x.reshape(-1)
        flat[: len(EXTREMES)] = np.array(EXTREMES, np.float64)[: flat.size].astype(dtype)
        arrays.append(x)
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    at_infinity = np.zeros(shape, bool)
    if ONNX[name].limits_at_infinity:
        at_infinity = np.logical_or.reduce([np.isinf(a) for a in arrays])
    for params in param_sets(name):
        op = descriptor(name, dtype, shape, params)
        got = run(engine, op, *arrays)
        model = model_for(op, np.dtype(dtype), [a.shape for a in arrays])
        if dtype is np.float16 and ONNX[name].reference_float16_in_float32:
            wide = model_for(op, np.dtype(np.float32), [a.shape for a in arrays])
            peers = [run_reference(wide, *(a.astype(np.float32) for a in arrays)).astype(np.float16)]
        else:
            peers = [run_reference(model, *arrays)]
        for expected in peers:
            keep = ~at_infinity
            if ONNX[name].log_of_softmax:
                keep &= ~(expected < REFERENCE_LOG_FLOOR)
            assert_close(got[keep], expected[keep], rtol, atol)
        if dtype is np.float32 or ONNX[name].ort_float16:
            keep = ~at_infinity
            if ONNX[name].ort_skips_nan:  # rows (along the reduced last axis) holding NaN
                keep &= ~np.broadcast_to(np.isnan(arrays[0]).any(axis=-1, keepdims=True), shape)
            assert_close(got[keep], run_onnxruntime(model, *arrays)[keep], rtol, atol)
        assert_close(got[at_infinity], op.reference(*arrays)[at_infinity], 0, 0)


@cache
def node_cases() -> dict:
    with warnings.catch_warnings():  # ONNX's generators of other operators' cases warn about casts
        warnings.simplefilter("ignore", RuntimeWarning)
        return {case.name: case for case in collect_testcases(None)}


def broadcast_strides(target: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides that view an array of ``shape`` as ``target`` (numpy's right-aligned broadcast)."""
    strides, step = [0] * len(target), 1
    for i in range(1, len(shape) + 1):
        size = shape[-i]
        strides[-i] = 0 if size == 1 else step
        step *= size
    return tuple(strides)


NODE_CASES = [(name, case) for name in MAPPED for case in (ONNX[name].node_tests or NODE_TESTS[ONNX[name].op_type])]


@pytest.mark.parametrize("name,case_name", NODE_CASES, ids=[c for _, c in NODE_CASES])
def test_onnx_node_examples(engine, name, case_name):
    case = node_cases()[case_name]
    node = case.model.graph.node[0]
    spec = ONNX[name]
    inputs, outputs = case.data_sets[0]
    inputs = [np.asarray(a) for a in inputs]
    expected = np.asarray(outputs[0])
    attrs = {a.name: a.f for a in node.attribute}
    params = {dml: attrs[onnx_name] for onnx_name, dml in spec.attributes.items() if onnx_name in attrs}
    op_cls = OPERATORS[name]
    shape = inputs[0].shape
    if spec.axis and "Axes" in op_cls.model_fields:  # ONNX's integer axis, -1 by default
        params["Axes"] = [next((a.i for a in node.attribute if a.name == "axis"), -1) % len(shape)]
    body = {"Type": name, op_cls.input_fields[0]: tensor(inputs[0].dtype, shape), **params, **spec.fixed}
    arrays = [inputs[0]]
    for field, extra in zip(op_cls.input_fields[1:], inputs[1:]):
        body[field] = tensor(extra.dtype, shape, broadcast_strides(shape, extra.shape))
        arrays.append(np.broadcast_to(extra, shape).copy())
    op = parse_operator(body)
    assert_close(run(engine, op, *arrays), expected.astype(inputs[0].dtype), 1e-5, 1e-6)
