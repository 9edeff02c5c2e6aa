"""Property-based: any valid descriptor (shape, strides, parameters, data type) gives the reference
answer on the device; any descriptor broken in one place is refused with that place named."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bench import accuracy
from client.buffers import packed_strides
from service.errors import UnsupportedOnDevice
from service.operators import OPERATORS, descriptor_error, parse_operator
from tests.engine.test_operators import F32_ULP
from tests.helpers import assert_matches, run, tensor

ELEMENTWISE = sorted(name for name, op in OPERATORS.items() if getattr(op, "kind", "elementwise") == "elementwise")
finite = st.floats(-8, 8, allow_nan=False, width=32)


@st.composite
def layouts(draw, sizes: tuple[int, ...], broadcast: bool) -> tuple[int, ...] | None:
    """Packed (None), padded rows, a permuted order, or (inputs only) zero strides over some dims."""
    kind = draw(st.sampled_from(["packed", "padded", "permuted", "broadcast"] if broadcast else ["packed", "padded", "permuted"]))
    if kind == "packed":
        return None
    if kind == "padded":
        pads = draw(st.lists(st.integers(0, 2), min_size=len(sizes), max_size=len(sizes)))
        return packed_strides(tuple(s + p for s, p in zip(sizes, pads)))
    order = draw(st.permutations(range(len(sizes))))
    step, strides = 1, [0] * len(sizes)
    for d in reversed(order):
        strides[d] = step
        step *= sizes[d]
    if kind == "broadcast":
        zero = draw(st.sets(st.sampled_from(range(len(sizes)))))
        strides = [0 if d in zero else s for d, s in enumerate(strides)]
    return tuple(strides)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(ELEMENTWISE))
    op = OPERATORS[name]
    dtype = np.dtype(draw(st.sampled_from(sorted((t.info.numpy for t in op.accepted_types()), key=str))))
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=8)))
    params = {f: draw(finite) for f in op.scalar_fields() if draw(st.booleans())}
    in_strides = [draw(layouts(sizes, broadcast=True)) for _ in op.input_fields]
    out_strides = draw(layouts(sizes, broadcast=False))
    in_place = op.in_place and draw(st.booleans())
    if in_place:
        in_strides[0] = out_strides
    body = {"Type": name, **params, op.output_field: tensor(dtype, sizes, out_strides)}
    body.update({f: tensor(dtype, sizes, s) for f, s in zip(op.input_fields, in_strides)})
    return body, dtype, in_place, draw(st.integers(0, 2**32 - 1))


def sample_inputs(desc, dtype: np.dtype, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for d in desc.inputs:
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            x = rng.integers(max(info.min, -300), min(info.max, 300), d.Sizes, endpoint=True).astype(dtype)
        else:
            x = (rng.standard_normal(d.Sizes) * 4).astype(dtype)
        # a broadcast input holds one value along each zero-stride dimension
        index = tuple(slice(0, 1) if st_ == 0 and s > 1 else slice(None) for s, st_ in zip(d.Sizes, d.strides))
        arrays.append(np.broadcast_to(x[index], d.Sizes).copy())
    return arrays


@settings(max_examples=150, deadline=None)
@given(cases())
def test_valid_descriptors_give_the_reference_answer(engine, case):
    body, dtype, in_place, seed = case
    try:
        desc = parse_operator(body)
    except ValidationError as exc:
        # a parameter value the operator forbids (CELU's Alpha = 0) is no valid case; anything else fails
        assume(descriptor_error(exc).field not in OPERATORS[body["Type"]].scalar_fields())
        raise
    arrays = sample_inputs(desc, dtype, seed)
    if desc.served_types(engine.kernel_features)[desc.data_type] is None:   # a FLOAT64 operator on a device without shaderFloat64
        with pytest.raises(UnsupportedOnDevice, match=desc.data_type.info.feature or "?"):
            run(engine, desc, *arrays, in_place=in_place)
        return
    got = run(engine, desc, *arrays, in_place=in_place)
    if dtype == np.float64 and (exact := accuracy.correctly_rounded(desc, *arrays)) is not None:
        # float64 numpy is no oracle for FLOAT64 in ulp (its own errors reach thousands of ulp): mpmath
        assert_matches(got, exact, accuracy.BOUND_ULP)
        return
    kind = desc.type_name().removeprefix("DML_OPERATOR_ACTIVATION_")
    tolerance = 0 if dtype.kind in "iu" else (F32_ULP.get(kind, 4) if dtype == np.float32 else 1)
    assert_matches(got, desc.reference(*arrays), tolerance)


def _breakers(body: dict, desc) -> list[tuple[str, object]]:
    """(field path, mutation) pairs that each break exactly one DirectML rule."""
    name_in, name_out = desc.input_fields[0], desc.output_field
    sizes = list(desc.inputs[0].Sizes)
    minimum = desc.inputs[0].min_bytes
    found: list[tuple[str, object]] = [
        (f"{name_out}.Sizes", lambda b: b[name_out].update(Sizes=sizes[:-1] + [sizes[-1] + 1])),
        (f"{name_in}.DimensionCount", lambda b: b[name_in].update(DimensionCount=len(sizes) + 1)),
        (f"{name_in}.DimensionCount", lambda b: b[name_in].update(Sizes=[1] * 9, Strides=None)),
        (f"{name_in}.Strides", lambda b: b[name_in].update(Strides=[1] * (len(sizes) + 1))),
        (f"{name_out}.DataType", lambda b: b[name_out].update(DataType="DML_TENSOR_DATA_TYPE_FLOAT16" if b[name_out]["DataType"] != "DML_TENSOR_DATA_TYPE_FLOAT16" else "DML_TENSOR_DATA_TYPE_FLOAT32")),
        ("Bogus", lambda b: b.update(Bogus=1)),
    ]
    if minimum >= 4:
        found.append((f"{name_in}.TotalTensorSizeInBytes", lambda b: b[name_in].update(TotalTensorSizeInBytes=minimum - 4)))
    if math.prod(sizes) > 1:
        found.append((f"{name_out}.Strides", lambda b: b[name_out].update(Strides=[0] * len(sizes))))
    for field in desc.scalar_fields():
        found.append((field, lambda b, f=field: b.update({f: float("nan")})))
    return found


@settings(max_examples=200, deadline=None)
@given(cases(), st.data())
def test_descriptors_broken_in_one_place_name_it(case, data):
    body, _, _, _ = case
    try:
        desc = parse_operator(body)
    except ValidationError:
        assume(False)
    field, mutate = data.draw(st.sampled_from(_breakers(body, desc)))
    broken = {k: (dict(v) if isinstance(v, dict) else v) for k, v in body.items()}
    mutate(broken)
    try:
        parse_operator(broken)
    except ValidationError as exc:
        assert descriptor_error(exc).field == field
    else:
        raise AssertionError(f"accepted a descriptor broken at {field}")
