"""Every operator on the real device against its float64 numpy reference, over every layout the
descriptors allow: packed, strided (padded input, column-major output), broadcast input, in place."""
from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from client.buffers import packed_strides
from service.descriptors import FeatureLevel
from service.errors import DescriptorError
from tests.helpers import assert_matches, make_op, run

# Non-default parameters exercise the push constants; {} exercises DirectML's defaults.
PARAMS = {
    "SHRINK": [{}, {"Bias": 0.25, "Threshold": 0.75}],
    "CELU": [{}, {"Alpha": 0.3}],
    "SOFTSIGN": [{}],
    "SCALED_TANH": [{}, {"Alpha": 1.7159, "Beta": 0.6667}],
    "ELU": [{}, {"Alpha": 0.5}],
    "GELU": [{}],
    "HARD_SIGMOID": [{}, {"Alpha": 0.7, "Beta": -0.2}],
    "HARD_SWISH": [{}, {"Alpha": 0.3, "Beta": 0.25}],
    "IDENTITY": [{}],
    "LEAKY_RELU": [{}, {"Alpha": 0.2}],
    "LINEAR": [{}, {"Alpha": 1.7, "Beta": -2.3}],
    "PARAMETRIC_SOFTPLUS": [{}, {"Alpha": 2.5, "Beta": 1.7}],
    "RELU": [{}],
    "SCALED_ELU": [{}, {"Alpha": 1.5, "Gamma": 0.7}],
    "SIGMOID": [{}],
    "SOFTPLUS": [{}, {"Steepness": 1.7}],
    "SWISH": [{}, {"SigmoidInputScale": 1.7}],
    "TANH": [{}],
    "THRESHOLDED_RELU": [{}, {"Alpha": -0.5}],
}
# FLOAT32 error bound per operator, in ulp of the correctly rounded result; FLOAT16 is always 1 ulp.
# For the newer operators, the bound that the error analysis gives (the shaders and numerics.glsl
# say where each rounding is); sweeps of 1.5e7 inputs over [-30, 30], the tails and the extremes
# reach it, or stay one below (ELU, SCALED_ELU, TANH: 1, 2, 2):
# - 0: a comparison, a select or one correctly rounded product (LEAKY_RELU: Alpha * x).
# - 1: one rounding after an exact product (LINEAR, HARD_SIGMOID: numerics.glsl mul_add_f).
# - 2: HARD_SWISH (x times that); ELU (Alpha * expm1_f).
# - 3: SCALED_ELU (the host-rounded Gamma * Alpha, expm1_f, a product); SIGMOID (exp, 1 + e, a
#   division); TANH (tanh_f: expm1_f, a sum and a division).
# - 4: SOFTPLUS and PARAMETRIC_SOFTPLUS (exp, log1p, the host-rounded 1 / Steepness or Alpha); SWISH
#   (exp, x * e, 1 + e, a division); GELU (exp(-x^2 / 2), the erfc-type polynomial with unfused fma,
#   a division, a product; it holds into the tail, down to the underflow at x = -13.2).
F32_ULP = {"SHRINK": 0, "SOFTSIGN": 2, "CELU": 4, "SCALED_TANH": 4,
           "ELU": 2, "GELU": 4, "HARD_SIGMOID": 1, "HARD_SWISH": 2, "IDENTITY": 0, "LEAKY_RELU": 0, "LINEAR": 1,
           "PARAMETRIC_SOFTPLUS": 4, "RELU": 0, "SCALED_ELU": 3, "SIGMOID": 3, "SOFTPLUS": 4, "SWISH": 4,
           "TANH": 3, "THRESHOLDED_RELU": 0}
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
    if in_place and not op.in_place:  # SWISH, HARD_SWISH: DirectMLSchema.h does not flag them in place
        with pytest.raises(DescriptorError):
            run(engine, op, x, in_place=True)
        return
    y = run(engine, op, x, in_place=in_place)
    assert_matches(y, op.reference(x), max_ulp(kind, dtype))


SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-7, -1e-7, 1e-4, -1e-4, 0.5, -0.5, 0.75,
            -0.75, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 87.5, -87.5, 100.0, -100.0, 1e30, -1e30, 3e38, -3e38,
            # kinks and tails of the newer operators: HARD_SIGMOID's at +-2.5, GELU's tail down to its
            # underflow (-13.2), SWISH's x * exp(x), normal down to -91.8 where exp(x) is not
            1e-20, -1e-20, 2.5, -2.5, -5.0, -13.0, -13.5, -89.0, -91.0]
F16_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 1e-5, -1e-5, 1e-3, -1e-3, 0.5, -0.5,
                0.75, -0.75, 1.0, -1.0, 3.0, -3.0, 11.0, -11.0, 100.0, -100.0, 65504.0, -65504.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("kind,params", CASES + [
    ("CELU", {"Alpha": 0.01}), ("SCALED_TANH", {"Alpha": 2.0, "Beta": 10.0}),
    ("SOFTPLUS", {"Steepness": 7.3}), ("SOFTPLUS", {"Steepness": 0.3}), ("SOFTPLUS", {"Steepness": -2.0}),
    ("PARAMETRIC_SOFTPLUS", {"Alpha": 0.3, "Beta": -0.6}), ("PARAMETRIC_SOFTPLUS", {"Alpha": 1e30, "Beta": 1.0}),
    ("SWISH", {"SigmoidInputScale": -0.45}), ("SWISH", {"SigmoidInputScale": 0.0}),
    ("HARD_SWISH", {"Alpha": -0.3, "Beta": 0.25}), ("HARD_SIGMOID", {"Alpha": -4.0, "Beta": 0.0}),
    ("LINEAR", {"Alpha": -3.0, "Beta": 1e-3}), ("LEAKY_RELU", {"Alpha": -2.0}), ("ELU", {"Alpha": -1.5}),
    ("THRESHOLDED_RELU", {"Alpha": 1e30}), ("SCALED_ELU", {"Alpha": 0.1, "Gamma": 20.0}),
])
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

    # The newer operators: exact values, kinks and limits (x * 0 at an infinite x would be NaN).
    assert act("SIGMOID", [0.0, np.inf, -np.inf, -200.0]) == [0.5, 1.0, 0.0, 0.0]
    assert act("HARD_SIGMOID", [-2.5, 0.0, 2.5, -np.inf, np.inf]) == [0.0, 0.5, 1.0, 0.0, 1.0]
    assert act("HARD_SIGMOID", [-1.0, 1.0], Alpha=0.25, Beta=0.25) == [0.0, 0.5]
    assert act("HARD_SWISH", [-3.0, 3.0, -np.inf, np.inf, 0.0]) == [0.0, 3.0, 0.0, np.inf, 0.0]
    assert act("THRESHOLDED_RELU", [1.0, 1.5, -2.0, np.nan, np.inf]) == [0.0, 1.5, 0.0, 0.0, np.inf]  # x > Alpha
    assert act("THRESHOLDED_RELU", [0.5, 0.75], Alpha=0.5) == [0.0, 0.75]
    assert act("ELU", [-np.inf, 0.0, 2.0], Alpha=0.5) == [-0.5, 0.0, 2.0]
    assert act("SCALED_ELU", [-np.inf, 0.0, 1.0], Alpha=2.0, Gamma=0.5) == [-1.0, 0.0, 0.5]
    assert act("GELU", [0.0, np.inf, -np.inf, -30.0]) == [0.0, np.inf, 0.0, 0.0]
    assert act("GELU", [1.0, -1.0]) == pytest.approx([0.8413447460685429, -0.15865525393145707], rel=1e-3)
    assert act("SWISH", [0.0, np.inf, -np.inf, -200.0]) == [0.0, np.inf, 0.0, 0.0]
    assert act("SWISH", [np.inf, -np.inf], SigmoidInputScale=-1.0) == [0.0, -np.inf]
    assert act("SOFTPLUS", [np.inf, -np.inf, -200.0]) == [np.inf, 0.0, 0.0]
    assert act("SOFTPLUS", [0.0], Steepness=2.0) == pytest.approx([np.log(2.0) / 2], rel=1e-3)
    assert act("PARAMETRIC_SOFTPLUS", [0.0, np.inf], Alpha=3.0, Beta=2.0) == pytest.approx([3 * np.log(2.0), np.inf], rel=1e-3)
    assert act("TANH", [np.inf, -np.inf, 0.0]) == [1.0, -1.0, 0.0]
    assert act("RELU", [-np.inf, -1.0, 2.0, np.inf]) == [0.0, 0.0, 2.0, np.inf]
    assert act("LEAKY_RELU", [-2.0, 0.0, 3.0], Alpha=0.5) == [-1.0, 0.0, 3.0]
    assert act("LINEAR", [1.0, -1.0, np.inf]) == [1.0, -1.0, np.inf]
    assert act("LINEAR", [2.0, -np.inf], Alpha=-0.5, Beta=1.0) == [0.0, np.inf]
    assert act("IDENTITY", [-0.0, 65504.0, -np.inf]) == [0.0, 65504.0, -np.inf]
    # signed zeros as in the numpy references: ELU and LEAKY_RELU keep -0 (x >= 0), RELU gives
    # np.maximum(-0.0, 0.0) = +0, GELU and TANH keep the sign
    assert all(np.signbit(act(kind, [-0.0])[0]) for kind in ("ELU", "LEAKY_RELU", "GELU", "TANH", "IDENTITY"))
    assert not np.signbit(act("RELU", [-0.0])[0])
    # NaN propagates everywhere but THRESHOLDED_RELU (above) and SHRINK
    for kind in ("ELU", "GELU", "HARD_SIGMOID", "HARD_SWISH", "IDENTITY", "LEAKY_RELU", "LINEAR",
                 "PARAMETRIC_SOFTPLUS", "RELU", "SCALED_ELU", "SIGMOID", "SOFTPLUS", "SWISH", "TANH"):
        assert np.isnan(act(kind, [np.nan])[0]), kind


def test_softplus_steepness_rules():
    """Steepness 0 divides by 0; DirectML requires Steepness >= 1 before feature level 6_4."""
    with pytest.raises(ValidationError) as info:
        make_op("SOFTPLUS", np.float32, (1, 1, 1, 4), Steepness=0.0)
    assert "Steepness" in str(info.value)
    op = make_op("SOFTPLUS", np.float32, (1, 1, 1, 4), Steepness=0.5)
    op.check_feature_level(FeatureLevel.FL_6_4)
    with pytest.raises(DescriptorError) as error:
        op.check_feature_level(FeatureLevel.FL_6_3)
    assert error.value.field == "Steepness"
    make_op("SOFTPLUS", np.float32, (1, 1, 1, 4), Steepness=1.0).check_feature_level(FeatureLevel.FL_1_0)


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


@pytest.mark.parametrize("kind,introduced,before", [
    ("GELU", FeatureLevel.FL_5_1, FeatureLevel.FL_5_0),
    ("SWISH", FeatureLevel.FL_6_2, FeatureLevel.FL_6_1),
    ("HARD_SWISH", FeatureLevel.FL_6_2, FeatureLevel.FL_6_1),
])
def test_newer_activations_exist_from_their_feature_level(kind, introduced, before):
    """GELU arrived at 5_1, SWISH and HARD_SWISH at 6_2, with 1 to 8 dimensions from the start."""
    op = make_op(kind, np.float32, (5,))
    op.check_feature_level(introduced)
    with pytest.raises(DescriptorError) as error:
        op.check_feature_level(before)
    assert error.value.field == "FeatureLevel"


@pytest.mark.parametrize("kind", ["ELU", "HARD_SIGMOID", "IDENTITY", "LEAKY_RELU", "LINEAR", "PARAMETRIC_SOFTPLUS",
                                  "RELU", "SCALED_ELU", "SIGMOID", "SOFTPLUS", "TANH", "THRESHOLDED_RELU"])
def test_original_activations_are_4d_at_feature_level_1_0(kind):
    make_op(kind, np.float32, (1, 2, 3, 4)).check_feature_level(FeatureLevel.FL_1_0)
    with pytest.raises(DescriptorError) as error:
        make_op(kind, np.float32, (2, 3, 4)).check_feature_level(FeatureLevel.FL_1_0)
    assert error.value.field == "InputTensor.DimensionCount"
    make_op(kind, np.float32, (2, 3, 4)).check_feature_level(FeatureLevel.FL_3_0)


@pytest.mark.parametrize("kind, params", [("LINEAR", {"Alpha": 1e-39, "Beta": 0.5}), ("SCALED_TANH", {"Alpha": 2.0, "Beta": -1e-40}),
                                          ("LEAKY_RELU", {"Alpha": 3e-39})])
def test_subnormal_parameters_are_zeros_on_every_device(engine, kind, params):
    """A subnormal FLOAT parameter is sent, and referenced, as a zero of its sign: some devices flush
    it in arithmetic and some do not, and one descriptor must mean one thing. With inputs large enough
    that the subnormal would give a normal result."""
    x = np.array([1e38, -1e38, 3.0, -2.0], np.float32)   # times the subnormal: about 0.1, were it kept
    op = make_op(kind, np.float32, x.shape, **params)
    expected = {"LINEAR": [0.5] * 4, "SCALED_TANH": [0.0] * 4, "LEAKY_RELU": [1e38, 0.0, 3.0, 0.0]}[kind]
    assert op.reference(x).tolist() == pytest.approx(expected) == run(engine, op, x).tolist()
