"""Operators with two input tensors (PARAMETERIZED_RELU, RELU_GRAD) on the device against the
reference: packed, strided, the second input broadcast through zero strides, in place."""
from __future__ import annotations

import numpy as np
import pytest

from client.buffers import packed_strides
from service.errors import DescriptorError
from service.operators import parse_operator
from tests.engine.test_operators import sample
from tests.helpers import assert_matches, run, tensor

OPS = {"PARAMETERIZED_RELU": "SlopeTensor", "RELU_GRAD": "InputGradientTensor"}
OUTPUT = {"PARAMETERIZED_RELU": "OutputTensor", "RELU_GRAD": "OutputGradientTensor"}


def make(kind: str, dtype, sizes, strides=None, second_strides=None, out_strides=None):
    body = {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(dtype, sizes, strides), OPS[kind]: tensor(dtype, sizes, second_strides)}
    if out_strides is not None:
        body[OUTPUT[kind]] = tensor(dtype, sizes, out_strides)
    return parse_operator(body)


# RELU_GRAD has no in-place execution (test_relu_grad_refuses_in_place checks the refusal).
KIND_LAYOUTS = [(k, lay) for k in OPS for lay in ("packed", "strided", "broadcast", "in_place") if (k, lay) != ("RELU_GRAD", "in_place")]


@pytest.mark.parametrize("dims", range(1, 9))
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("kind,layout", KIND_LAYOUTS)
def test_matches_reference(engine, kind, layout, dtype, dims):
    rng = np.random.default_rng([dims, len(layout), len(kind)])
    sizes = sample(rng, dims)
    x = (rng.standard_normal(sizes) * 3).astype(dtype)
    y = (rng.standard_normal(sizes) * 3).astype(dtype)
    padded = packed_strides(tuple(s + 1 for s in sizes))
    strides = second = out = None
    if layout == "strided":
        strides, second, out = padded, tuple(reversed(packed_strides(tuple(reversed(sizes))))), padded
    elif layout == "broadcast":  # the second input varies along the innermost real dimension only
        keep = max(d for d, s in enumerate(sizes) if s > 1)
        second = tuple(1 if d == keep else 0 for d in range(dims))
        index = tuple(slice(None) if d == keep else slice(0, 1) for d in range(dims))
        y = np.broadcast_to(y[index], sizes).copy()
    op = make(kind, dtype, sizes, strides, second, out)
    got = run(engine, op, x, y, in_place=layout == "in_place")
    assert_matches(got, op.reference(x, y), 0)  # one product at most: exact in either type


def test_onnx_prelu_broadcast_example(engine):
    """onnx/backend/test/case/node/prelu.py export_prelu_broadcast: x (3, 4, 5), slope (5,)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    slope = rng.standard_normal(5).astype(np.float32)
    op = make("PARAMETERIZED_RELU", np.float32, (3, 4, 5), None, (0, 0, 1))
    expected = np.clip(x, 0, np.inf) + np.clip(x, -np.inf, 0) * slope
    np.testing.assert_array_equal(run(engine, op, x, np.broadcast_to(slope, x.shape).copy()), expected)


def test_special_values(engine):
    x = np.array([np.nan, -0.0, 0.0, -np.inf, np.inf, -2.0, 2.0], np.float32)
    s = np.full_like(x, 0.25)
    prelu = make("PARAMETERIZED_RELU", np.float32, x.shape)
    got = run(engine, prelu, x, s)
    assert_matches(got, prelu.reference(x, s), 0)
    assert np.signbit(got[1]) and got[3] == -np.inf
    grad = make("RELU_GRAD", np.float32, x.shape)
    np.testing.assert_array_equal(run(engine, grad, x, s), [0, 0, 0, 0, 0.25, 0, 0.25])


def test_relu_grad_refuses_in_place(engine):
    op = make("RELU_GRAD", np.float32, (4,))
    with pytest.raises(DescriptorError) as info:
        engine.execute(op, [np.zeros(16, np.uint8)] * 2, in_place=True)
    assert info.value.field == "InPlace"


def test_all_tensors_share_sizes_and_type():
    with pytest.raises(Exception) as info:
        parse_operator({"Type": "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU", "InputTensor": tensor(np.float32, (2, 3)), "SlopeTensor": tensor(np.float32, (3,))})
    assert "SlopeTensor.DimensionCount" in str(info.value)
    with pytest.raises(Exception) as info:
        parse_operator({"Type": "DML_OPERATOR_ACTIVATION_RELU_GRAD", "InputTensor": tensor(np.float32, (3,)), "InputGradientTensor": tensor(np.float16, (3,))})
    assert "InputGradientTensor.DataType" in str(info.value)
