"""BFLOAT16 on the device (both memory modes): stored as bfloat16, computed in float32, rounded to nearest
even on store, NaN kept (quiet); for exactly the operators whose ONNX counterpart defines bfloat16.

Oracles: each operator's float64 reference rounded once to bfloat16 (client.json_values, itself checked
against exact rational rounding in tests/client/test_json_values.py), and for the store's rounding an
exact case: a product that float32 holds exactly, so the only rounding is the store's."""
from __future__ import annotations

import numpy as np
import onnx.defs
import pytest
from pydantic import ValidationError

from client.json_values import BFLOAT16, bfloat16_to_float32
from service.descriptors import DataType, FeatureLevel
from service.errors import DescriptorError
from service.operators import OPERATORS
from tests.conformance.onnx_map import NO_COUNTERPART, ONNX
from tests.engine.test_operators import LAYOUTS, PARAMS, SPECIALS, layout_case, sample
from tests.engine.test_softmax import KINDS as REDUCTIONS
from tests.helpers import assert_matches, make_op, run, tensor, ulp_distance

TAKES_BF16 = [name for name, op in OPERATORS.items() if DataType.BFLOAT16 in op.accepted_types()]
ELEMENTWISE = [(kind, p) for kind, ps in PARAMS.items() for p in ps if f"DML_OPERATOR_ACTIVATION_{kind}" in TAKES_BF16]
TINY = float(np.finfo(np.float32).tiny)  # bfloat16 shares float32's exponent: its subnormals are float32's


def bf16(values) -> np.ndarray:
    return np.asarray(values, np.float64).astype(np.float32).astype(BFLOAT16)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16)


def check(y: np.ndarray, ref: np.ndarray, max_ulp: int = 1) -> None:
    """Within ``max_ulp`` bfloat16 ulp of the once-rounded float64 reference (the kernel's float32 error
    is far below a bfloat16 ulp, but can decide a tie); where the reference is below float32's smallest
    normal, anything from 0 to that normal is taken, as D3D12 and lavapipe may flush fp32 denormals
    (bfloat16's subnormals are float32's). NaN where the reference is, quiet."""
    assert y.dtype == BFLOAT16 and ref.dtype == BFLOAT16
    # A subnormal result may also come out as the smallest normal: SwiftShader's GELU at x = 2^-126 gives
    # 2^-126 (x - x * q with the subnormal product flushed), not 2^-127 (measured).
    flushed = (np.abs(ref.astype(np.float64)) < TINY) & (np.abs(y.astype(np.float64)) <= TINY)
    assert_matches(np.where(flushed, ref, y), ref, max_ulp)
    nan = np.isnan(y.astype(np.float32))
    assert np.all(bits(y)[nan] & 0x0040), "a NaN is stored quiet"


def test_bfloat16_is_accepted_exactly_where_onnx_defines_it():
    for name, op in OPERATORS.items():
        if name in NO_COUNTERPART:
            assert DataType.BFLOAT16 not in op.accepted_types(), name
            continue
        schema = onnx.defs.get_schema(ONNX[name].op_type)
        onnx_has = any("tensor(bfloat16)" in c.allowed_type_strs for c in schema.type_constraints)
        assert (DataType.BFLOAT16 in op.accepted_types()) == onnx_has, name


def test_shrink_refuses_bfloat16_and_a_directml_feature_level_does_too():
    with pytest.raises(ValidationError, match="does not support VKACT_TENSOR_DATA_TYPE_BFLOAT16"):
        make_op("SHRINK", BFLOAT16, (4,))
    op = make_op("RELU", BFLOAT16, (4,))
    with pytest.raises(DescriptorError, match="does not take VKACT_TENSOR_DATA_TYPE_BFLOAT16"):
        op.check_feature_level(FeatureLevel.FL_6_4)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dims", [1, 3, 8])
@pytest.mark.parametrize("kind,params", ELEMENTWISE, ids=[f"{k}-{i}" for k, p in ELEMENTWISE for i in [PARAMS[k].index(p)]])
def test_matches_reference(engine, kind, params, dims, layout):
    rng = np.random.default_rng([dims, LAYOUTS.index(layout), len(kind), 16])
    sizes = sample(rng, dims)
    x, strides, out_strides, in_place = layout_case(layout, rng, sizes, np.float32)
    x = x.astype(BFLOAT16)
    op = make_op(kind, BFLOAT16, sizes, strides, out_strides, **params)
    if in_place and not op.in_place:
        return  # the refusal is tested in test_operators
    check(run(engine, op, x, in_place=in_place), op.reference(x))


BF16_SPECIALS = [*SPECIALS, 2.0**-126, -(2.0**-126), 2.0**-133, -(2.0**-133), 9.18e-41, 3.3895313892515355e38, -3.3895313892515355e38]


@pytest.mark.parametrize("kind,params", ELEMENTWISE, ids=[f"{k}-{i}" for k, p in ELEMENTWISE for i in [PARAMS[k].index(p)]])
def test_special_values(engine, kind, params):
    """NaN, infinities, -0, bfloat16 subnormals, its largest finite values."""
    x = bf16(BF16_SPECIALS)
    op = make_op(kind, BFLOAT16, x.shape, **params)
    check(run(engine, op, x), op.reference(x))


def test_the_store_rounds_to_nearest_even_exactly(engine):
    """LEAKY_RELU with Alpha = 1 + 2^-8 over every negative normal bfloat16: Alpha * x needs 17 bits, so
    float32 holds it exactly and the store's rounding is the only one: it must be the correct rounding,
    bit for bit, ties to even (x = -1 gives the tie -(1 + 2^-8): -1), and the largest values overflow to
    -inf ((2 - 2^-15) 2^127 is past bfloat16's half-way point to 2^128)."""
    negative_normals = np.arange(0x8080, 0xFF80, dtype=np.uint16)  # exponent 1..254, sign set
    x = negative_normals.view(BFLOAT16)
    op = make_op("LEAKY_RELU", BFLOAT16, x.shape, Alpha=1 + 2.0**-8)
    y = run(engine, op, x)
    ref = op.reference(x)
    np.testing.assert_array_equal(bits(y), bits(ref))
    assert bits(y)[np.flatnonzero(negative_normals == 0xBF80)[0]] == 0xBF80  # -1 * (1 + 2^-8): the tie, to even
    assert bits(y)[-1] == 0xFF80  # -inf
    assert np.isfinite(bfloat16_to_float32(bits(y)[:-200])).all()


def test_nan_payloads_and_signs_stay_nans_on_identity(engine):
    nans = np.array([0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0x7F80, 0xFF80, 0x8000, 0x0001], np.uint16)
    op = make_op("IDENTITY", BFLOAT16, nans.shape)
    y = bits(run(engine, op, nans.view(BFLOAT16)))
    assert all(v & 0x7F80 == 0x7F80 and v & 0x0040 for v in y[:5].tolist())  # NaN, quiet
    assert y[5:7].tolist() == [0x7F80, 0xFF80]  # infinities
    assert y[7] in (0x8000, 0x0000) and y[8] in (0x0001, 0x0000, 0x8000)  # -0; a subnormal (or flushed)


@pytest.mark.parametrize("kind", REDUCTIONS + [k + "1" for k in REDUCTIONS])
@pytest.mark.parametrize("sizes", [(7,), (65, 129), (1, 3, 1000)])  # rows sharing words at their ends
def test_reductions(engine, kind, sizes):
    rng = np.random.default_rng([len(kind), len(sizes)])
    x = rng.standard_normal(sizes) * 3
    if kind.startswith("HARDMAX"):
        x = np.round(x)
    x = bf16(x)
    op = make_op(kind, BFLOAT16, sizes)
    y, ref = run(engine, op, x), op.reference(x)
    if kind.startswith("HARDMAX"):
        np.testing.assert_array_equal(bits(y), bits(ref))
    else:
        check(y, ref)


def test_two_input_operator(engine):
    from service.operators import parse_operator
    rng = np.random.default_rng(5)
    x, slope = bf16(rng.standard_normal(300) * 3), bf16(rng.standard_normal(300))
    op = parse_operator({"Type": "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU", "InputTensor": tensor(BFLOAT16, (300,)),
                         "SlopeTensor": tensor(BFLOAT16, (300,))})
    check(run(engine, op, x, slope), op.reference(x, slope), 0)  # one product: float32 holds it exactly


def test_ulp_distance_reads_bfloat16():
    a, b = bf16([1.0, -0.0, np.nan]), bf16([1.0078125, 0.0, np.nan])
    assert ulp_distance(a, b).tolist() == [1, 0, 0]
