"""Integer tensors (DirectML from feature level 5_1): SHRINK in all six 8/16/32-bit types,
PARAMETERIZED_RELU and RELU_GRAD in the signed ones; exact results, wrapping as ONNX's reference."""
from __future__ import annotations

import numpy as np
import pytest

from client.buffers import packed_strides
from service.descriptors import FeatureLevel
from service.errors import DescriptorError
from service.operators import descriptor_error, parse_operator
from tests.engine.test_operators import sample
from tests.helpers import make_op, run, tensor

SIGNED = [np.int8, np.int16, np.int32]
UNSIGNED = [np.uint8, np.uint16, np.uint32]
# (Bias, Threshold): fractions both ways, negative values, beyond every type's range.
SHRINK_PARAMS = [(0.0, 0.5), (1.5, 2.0), (-2.5, 0.0), (0.25, -3.25), (300.5, 100.0), (-70000.75, 1e10), (2.0**33, -1e10), (1e10, 7.0)]


def integers(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Uniform over the whole type, with the edges and small values mixed in."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=np.int64, endpoint=True)
    flat = x.reshape(-1)
    edges = [info.min, info.max, 0, 1, -1, 2, -2, 3, -3, 100, -100, 101]
    flat[: min(len(edges), flat.size)] = edges[: flat.size]
    flat[len(edges):: 3] = rng.integers(-8, 9, flat[len(edges):: 3].shape)
    return np.clip(x, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("layout", ["packed", "strided", "broadcast", "in_place"])
@pytest.mark.parametrize("bias,threshold", SHRINK_PARAMS)
@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED, ids=lambda d: np.dtype(d).name)
def test_shrink(engine, dtype, bias, threshold, layout):
    rng = np.random.default_rng([int(abs(bias)) % 1000, len(layout), np.dtype(dtype).itemsize])
    x, strides = shrink_layout(layout, rng, lambda sizes: integers(rng, dtype, sizes))
    op = make_op("SHRINK", dtype, x.shape, strides, Bias=bias, Threshold=threshold)
    np.testing.assert_array_equal(run(engine, op, x, in_place=layout == "in_place"), op.reference(x))


def shrink_layout(layout: str, rng: np.random.Generator, values) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """(input, input strides) of Shrink's layout cases: packed 1031 elements, strided (rows padded by
    one element; in place too), broadcast (zero stride in the outer dimension); ``values(sizes)``."""
    sizes = sample(rng, 3) if layout != "packed" else (1031,)
    x = values(sizes)
    if layout in ("strided", "in_place"):
        return x, packed_strides(tuple(s + 1 for s in sizes))
    if layout == "broadcast":
        return np.broadcast_to(x[:1], sizes).copy(), (0,) + packed_strides(sizes[1:])
    return x, None


@pytest.mark.parametrize(
    "dtype,values,bias,threshold,expected",
    [
        (np.uint8, [3, 0, 255], 5.5, 0.5, [254, 0, 249]),                     # 3 - 5.5 = -2.5 -> -2 -> 254
        (np.int8, [-128, 127, 0], 1.5, 0.5, [-126, 125, 0]),                 # -126.5 -> -126, 125.5 -> 125
        (np.int8, [100, -100], 100.0, 10.0, [0, 0]),
        (np.int16, [32767], -1.0, 0.0, [-32768]),                             # 32767 + 1 wraps
        (np.uint32, [4294967295, 1], 0.25, 0.0, [4294967294, 0]),            # trunc(0.75) = 0
        (np.int32, [-2147483648, 2147483647], 0.5, 0.0, [-2147483647, 2147483646]),
        (np.int16, [5, -5, 0], 2.0**-52, 0.0, [4, -4, 0]),                    # exact: 5 - 2^-52 truncates to 4
    ],
)
def test_shrink_edges(engine, dtype, values, bias, threshold, expected):
    x = np.array(values, dtype)
    op = make_op("SHRINK", dtype, x.shape, Bias=bias, Threshold=threshold)
    got = run(engine, op, x)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, op.reference(x))
    np.testing.assert_array_equal(got, np.array(expected, dtype))


@pytest.mark.parametrize("dtype", SIGNED, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind,second", [("PARAMETERIZED_RELU", "SlopeTensor"), ("RELU_GRAD", "InputGradientTensor")])
def test_two_input_integers(engine, kind, second, dtype):
    rng = np.random.default_rng(np.dtype(dtype).itemsize)
    x, y = integers(rng, dtype, (7, 9)), integers(rng, dtype, (7, 9))
    op = parse_operator({"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(dtype, x.shape), second: tensor(dtype, x.shape)})
    got = run(engine, op, x, y)
    np.testing.assert_array_equal(got, op.reference(x, y))
    if kind == "PARAMETERIZED_RELU":
        info = np.iinfo(dtype)
        edge = run(engine, op.model_copy(update={"InputTensor": op.inputs[0].like(Sizes=(2,)), "SlopeTensor": op.inputs[1].like(Sizes=(2,)), "OutputTensor": op.output.like(Sizes=(2,))}),
                   np.array([info.min, -3], dtype), np.array([-1, 5], dtype))
        np.testing.assert_array_equal(edge, np.array([info.min, -15], dtype))  # -1 * min wraps to min


@pytest.mark.parametrize("layout", ["packed", "strided", "broadcast", "in_place"])
@pytest.mark.parametrize("dtype", SIGNED, ids=lambda d: np.dtype(d).name)
def test_relu_integers(engine, dtype, layout):
    """RELU takes INT8/16/32 from 5_1 (DirectML): max(0, x) exactly."""
    rng = np.random.default_rng([np.dtype(dtype).itemsize, len(layout)])
    x, strides = shrink_layout(layout, rng, lambda sizes: integers(rng, dtype, sizes))
    op = make_op("RELU", dtype, x.shape, strides)
    np.testing.assert_array_equal(run(engine, op, x, in_place=layout == "in_place"), np.maximum(x, 0))


@pytest.mark.parametrize("dtype", [np.uint32], ids=["uint32"])
def test_prelu_unsigned_is_the_input(engine, dtype):
    """ONNX PRelu's uint32: never negative, so x whatever the slope."""
    x = np.array([0, 1, 2**31, 2**32 - 1], dtype)
    op = parse_operator({"Type": "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU", "InputTensor": tensor(dtype, x.shape), "SlopeTensor": tensor(dtype, x.shape)})
    np.testing.assert_array_equal(run(engine, op, x, x[::-1].copy()), x)


def test_integer_types_arrive_at_5_1():
    op = make_op("SHRINK", np.uint16, (1, 1, 2, 2))
    op.check_feature_level(FeatureLevel.FL_5_1)
    with pytest.raises(DescriptorError) as info:
        op.check_feature_level(FeatureLevel.FL_5_0)
    assert info.value.field == "InputTensor.DataType"


@pytest.mark.parametrize("kind,dtype", [("CELU", np.int32), ("CELU", np.int64), ("PARAMETERIZED_RELU", np.uint8)])
def test_types_without_support_get_a_clear_error(kind, dtype):
    body = {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(dtype, (4,))}
    if kind == "PARAMETERIZED_RELU":
        body["SlopeTensor"] = tensor(dtype, (4,))
    with pytest.raises(Exception) as info:
        parse_operator(body)
    err = descriptor_error(info.value)
    assert err.field == "InputTensor.DataType"
    assert "does not support" in err.message, err.message
