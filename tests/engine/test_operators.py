"""Every operator on the real device against its float64 numpy reference, over every layout the
descriptors allow: packed, strided (padded input, column-major output), broadcast input, in place."""
from __future__ import annotations

import numpy as np
import pytest

from client.buffers import packed_strides
from tests.helpers import assert_matches, make_op, run

# Non-default parameters exercise the push constants; {} exercises DirectML's defaults.
PARAMS = {
    "SHRINK": [{}, {"Bias": 0.25, "Threshold": 0.75}],
    "CELU": [{}, {"Alpha": 0.3}],
    "SOFTSIGN": [{}],
    "SCALED_TANH": [{}, {"Alpha": 1.7159, "Beta": 0.6667}],
}
# FLOAT32 error bound per operator, in ulp of the correctly rounded result; FLOAT16 is always 1 ulp.
F32_ULP = {"SHRINK": 0, "SOFTSIGN": 2, "CELU": 4, "SCALED_TANH": 4}
CASES = [(kind, p) for kind, ps in PARAMS.items() for p in ps]
LAYOUTS = ["packed", "strided", "broadcast", "in_place"]


def max_ulp(kind: str, dtype: type) -> int:
    return F32_ULP[kind] if dtype is np.float32 else 1


def sample(rng: np.random.Generator, dims: int) -> tuple[int, ...]:
    sizes = tuple(int(s) for s in rng.integers(1, 5, dims))
    return sizes if max(sizes) > 1 else (3,) + sizes[1:]


def layout_case(layout: str, rng: np.random.Generator, sizes: tuple[int, ...], dtype: type):
    """(input array, input strides, output strides, in_place) for one layout."""
    x = (rng.standard_normal(sizes) * 3).astype(dtype)
    padded = packed_strides(tuple(s + 1 for s in sizes))          # every row padded by one element
    column_major = tuple(reversed(packed_strides(tuple(reversed(sizes)))))
    if layout == "packed":
        return x, None, None, False
    if layout == "strided":
        return x, padded, column_major, False
    if layout == "broadcast":
        zero = [d for d, s in enumerate(sizes) if s > 1][:: 2]       # broadcast every other real dim
        strides = tuple(0 if d in zero else st for d, st in enumerate(padded))
        index = tuple(slice(0, 1) if d in zero else slice(None) for d in range(len(sizes)))
        return np.broadcast_to(x[index], sizes).copy(), strides, None, False
    return x, padded, None, True


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dims", range(1, 9))
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("kind,params", CASES, ids=[f"{k}-{i}" for k, ps in PARAMS.items() for i in range(len(ps))])
def test_matches_reference(engine, kind, params, dtype, dims, layout):
    rng = np.random.default_rng([dims, LAYOUTS.index(layout), len(kind)])
    sizes = sample(rng, dims)
    x, strides, out_strides, in_place = layout_case(layout, rng, sizes, dtype)
    op = make_op(kind, dtype, sizes, strides, out_strides, **params)
    y = run(engine, op, x, in_place=in_place)
    assert_matches(y, op.reference(x), max_ulp(kind, dtype))


SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-7, -1e-7, 1e-4, -1e-4, 0.5, -0.5, 0.75,
            -0.75, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 87.5, -87.5, 100.0, -100.0, 1e30, -1e30, 3e38, -3e38]
F16_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 1e-5, -1e-5, 1e-3, -1e-3, 0.5, -0.5,
                0.75, -0.75, 1.0, -1.0, 3.0, -3.0, 11.0, -11.0, 100.0, -100.0, 65504.0, -65504.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("kind,params", CASES + [("CELU", {"Alpha": 0.01}), ("SCALED_TANH", {"Alpha": 2.0, "Beta": 10.0})])
def test_special_values(engine, kind, params, dtype):
    x = np.array(SPECIALS if dtype is np.float32 else F16_SPECIALS, dtype)
    op = make_op(kind, dtype, x.shape, **params)
    assert_matches(run(engine, op, x), op.reference(x), max_ulp(kind, dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_golden_values(engine, dtype):
    """Hand-checked values of the cases the formulas get wrong when written naively."""
    def act(kind, values, **params):
        x = np.array(values, dtype)
        return run(engine, make_op(kind, dtype, x.shape, **params), x).astype(np.float64).tolist()

    assert act("SOFTSIGN", [np.inf, -np.inf, 1.0, -3.0]) == [1.0, -1.0, 0.5, -0.75]
    assert act("CELU", [-100.0, -np.inf, 2.0], Alpha=0.01) == pytest.approx([-0.01, -0.01, 2.0], rel=1e-3)
    assert act("SCALED_TANH", [100.0, -100.0, 0.0], Alpha=2.0, Beta=10.0) == [2.0, -2.0, 0.0]
    assert np.signbit(act("SOFTSIGN", [-0.0])[0]) and np.signbit(act("SCALED_TANH", [-0.0])[0])
    assert np.isnan(act("SCALED_TANH", [np.nan])[0]) and np.isnan(act("CELU", [np.nan])[0])
    assert act("SHRINK", [np.nan]) == [0.0]  # every comparison with NaN is false, as in ONNX Shrink


@pytest.mark.parametrize("bias,expected", [(0.0, [-2, 0, 0, 0, 2]), (1.5, [-0.5, 0, 0, 0, 0.5])], ids=["hard", "soft"])
def test_onnx_shrink_examples(engine, bias, expected):
    """onnx/backend/test/case/node/shrink.py: export_hard_shrink and export_soft_shrink (lambd 1.5)."""
    x = np.arange(-2.0, 2.1, dtype=np.float32)
    y = run(engine, make_op("SHRINK", np.float32, x.shape, Bias=bias, Threshold=1.5), x)
    np.testing.assert_array_equal(y, np.array(expected, np.float32))


def test_shrink_with_a_negative_threshold_follows_onnx_order(engine):
    """With Threshold -1, x < 1 and x > -1 both hold on (-1, 1); ONNX tests x < -lambd first, so
    everything below 1 gets x + Bias and only x >= 1 gets x - Bias."""
    x = np.array([-2.0, -0.5, 0.0, 0.5, 2.0], np.float32)
    op = make_op("SHRINK", np.float32, x.shape, Bias=10.0, Threshold=-1.0)
    y = run(engine, op, x)
    np.testing.assert_array_equal(y, [8.0, 9.5, 10.0, 10.5, -8.0])
    np.testing.assert_array_equal(op.reference(x), y)


def test_parameters_are_directml_floats(engine):
    """Threshold 0.1 is float32(0.1) > 0.1 on the device, and so in the reference: x = float32(0.1) is not above it."""
    x = np.array([0.1, 0.2], np.float32)
    op = make_op("SHRINK", np.float32, x.shape, Threshold=0.1)
    np.testing.assert_array_equal(run(engine, op, x), op.reference(x))
    np.testing.assert_array_equal(op.reference(x), [0.0, np.float32(0.2) - np.float32(0.0)])


@pytest.mark.parametrize("sizes", [(0,), (2, 0, 3), (1,), (1, 1, 1, 1, 1, 1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_empty_and_single_element(engine, sizes, dtype):
    x = np.full(sizes, -2.5, dtype)
    op = make_op("CELU", dtype, sizes)
    assert op.output.total_bytes == (0 if 0 in sizes else 4)
    y = run(engine, op, x)
    assert y.shape == sizes
    assert_matches(y, op.reference(x), 1)


def test_more_elements_than_65535_workgroups_cover(engine):
    """2^24 + 3 elements: more than 65535 groups of 256 invocations can cover one each."""
    n = (1 << 24) + 3
    x = np.random.default_rng(7).standard_normal(n, dtype=np.float32) * 2
    op = make_op("SHRINK", np.float32, (n,))
    assert_matches(run(engine, op, x), op.reference(x), 0)


def test_strided_kernel_beyond_one_pass(engine):
    """The strided kernel (one element per invocation and step) over 2^24 + 4 elements, each input
    element read twice through a zero stride: the grid-stride loop must take several steps."""
    rows = (1 << 23) + 2
    base = np.random.default_rng(8).standard_normal(rows, dtype=np.float32)
    x = np.repeat(base[:, None], 2, axis=1)
    op = make_op("SOFTSIGN", np.float32, (rows, 2), (1, 0))
    assert_matches(run(engine, op, x), op.reference(x), 2)
