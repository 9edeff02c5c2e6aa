"""The softmax family (SOFTMAX, LOG_SOFTMAX, HARDMAX and their *1 variants) on the real device against
the float64 numpy references of service/operators/reduction.py: row lengths from 1 to 65,536, many
short rows, joint reductions over any set of axes, strided, padded, transposed and broadcast layouts,
non-finite values, both ways of sharing out a row (lanes of a subgroup, or a whole workgroup), and the
descriptor rules.

Tolerances. FLOAT32: softmax within 6 ulp: exp within an ulp (x - max carried in two parts), each
lane's sum compensated (Kahan), then the lanes' sums combined in up to log2(lanes) butterfly steps (and
a workgroup's subgroups folded), about an ulp each, then a reciprocal and a product (5 seen in 2^24
outputs, mostly <= 2). Log-softmax within 4 ulp: the log is log1p of the sum less the maximum's own
term, so the maximum's output -log(sum) keeps its digits (3 seen). Where an fp32 sum term falls below
the smallest normal it may be flushed (D3D12 allows flushing fp32 denormals; lavapipe does), which
moves a result by at most row_len * 2^-126 absolutely: results within that of the reference pass.
FLOAT16: 1 ulp of the correctly rounded result (the maths is fp32). HARDMAX: exact.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import service.dispatch_geometry as geometry_module
from client.buffers import packed_strides
from service.descriptors import FeatureLevel
from service.device_tuning import tuning_for
from service.errors import DescriptorError
from service.layout import row_layout
from service.operators import descriptor_error, parse_operator
from service.shaders import REDUCTION_UNROLLS
from tests.engine.test_properties import layouts
from tests.helpers import assert_matches, make_op, run, tensor

KINDS = ["SOFTMAX", "LOG_SOFTMAX", "HARDMAX"]
# What Vulkan guarantees, not what one driver gives: 1 / x may be 2.5 ulp off and fma() need not be
# fused (the exponential's polynomial then rounds twice a step). lavapipe's worst SOFTMAX was 6 ulp,
# SwiftShader's 7 (long rows with a NaN or infinity elsewhere in the tensor).
F32_ULP = {"SOFTMAX": 8, "LOG_SOFTMAX": 4}
DTYPES = [np.float32, np.float16]
DTYPE_IDS = ["f32", "f16"]


def sample(rng: np.random.Generator, sizes: tuple[int, ...], dtype, kind: str) -> np.ndarray:
    x = rng.standard_normal(sizes) * 3
    if kind.startswith("HARDMAX"):
        x = np.round(x)  # many ties: the first maximum must win, across lanes too
    return x.astype(dtype)


def check(y: np.ndarray, ref: np.ndarray, kind: str, row_len: int) -> None:
    base = kind.removesuffix("1")
    if base == "HARDMAX":
        np.testing.assert_array_equal(y, ref)
        return
    if y.dtype == np.float16:
        assert_matches(y, ref, 1)
        return
    with np.errstate(invalid="ignore"):  # inf - inf where both are -inf
        flushed = np.abs(y.astype(np.float64) - ref.astype(np.float64)) <= row_len * float(np.finfo(np.float32).tiny)
    assert_matches(np.where(flushed, ref, y), ref, F32_ULP[base])


def run_checked(engine, op, x: np.ndarray, kind: str) -> np.ndarray:
    y = run(engine, op, x)
    row_len = int(np.prod([op.InputTensor.Sizes[a] for a in op.reduced_axes()]))
    check(y, op.reference(x), kind, row_len)
    return y


# -- the last dimension ----------------------------------------------------------------------------

SHAPES = [
    (1,), (7,), (256,), (1000,), (1024,), (4096,), (65536,),
    (3, 7), (2, 1024), (1, 1, 5, 33), (1, 1, 1, 1),
    (10000, 3),   # many short rows
    (300, 1),     # rows of one element
    (65, 129),    # odd lengths: FLOAT16 rows share words at their ends
]


@pytest.mark.parametrize("sizes", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", KINDS + [k + "1" for k in KINDS])
def test_last_axis(engine, kind, dtype, sizes):
    """The legacy operators and the *1 operators with Axes omitted (the last dimension)."""
    rng = np.random.default_rng([len(kind), len(sizes), sizes[-1]])
    x = sample(rng, sizes, dtype, kind)
    run_checked(engine, make_op(kind, dtype, sizes), x, kind)


# -- any set of axes -------------------------------------------------------------------------------

AXES_CASES = [
    ((2, 3, 4), (0,)), ((2, 3, 4), (1,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (1, 2)), ((2, 3, 4), (0, 1, 2)),
    ((2, 3, 4, 5), (0, 2)), ((2, 3, 4, 5), (1, 3)), ((2, 3, 4, 5), (3, 1)), ((2, 3, 4, 5), (0, 1)),
    ((3, 1, 4, 6), (1, 2)), ((5, 7, 9), (0,)), ((4, 2, 3, 2, 5), (0, 2, 4)), ((64, 300), (0,)),
    ((2, 3, 2, 3, 2, 3, 2, 3), (1, 3, 5, 7)),
]


@pytest.mark.parametrize("sizes,axes", AXES_CASES, ids=[f"{'x'.join(map(str, s))}-{''.join(map(str, a))}" for s, a in AXES_CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", [k + "1" for k in KINDS])
def test_axes(engine, kind, dtype, sizes, axes):
    rng = np.random.default_rng([len(kind), len(sizes), sum(axes)])
    x = sample(rng, sizes, dtype, kind)
    op = make_op(kind, dtype, sizes, Axes=list(axes))
    y = run_checked(engine, op, x, kind)
    if kind == "SOFTMAX1":
        np.testing.assert_allclose(y.astype(np.float64).sum(axis=axes), 1.0, rtol=1e-2 if dtype is np.float16 else 1e-5)


def test_hardmax1_reference_example(engine):
    """The DirectML page's example: HARDMAX1 with Axes {0, 2} on 2x2x2 sets one 1 in each slice of 4."""
    x = np.array([[[1, 5], [2, 3]], [[4, 0], [7, 7]]], np.float32)
    y = run(engine, make_op("HARDMAX1", np.float32, x.shape, Axes=[0, 2]), x)
    np.testing.assert_array_equal(y, [[[0, 1], [0, 0]], [[0, 0], [1, 0]]])
    assert y.sum(axis=(0, 2)).tolist() == [1, 1]


# -- layouts ---------------------------------------------------------------------------------------

def named_layouts(sizes: tuple[int, ...]):
    padded = packed_strides(sizes[:-1] + (sizes[-1] + 3,))            # every row padded by 3 elements
    column_major = tuple(reversed(packed_strides(tuple(reversed(sizes)))))
    return {
        "padded-rows": (padded, padded),                                  # PACKED with a row stride, misaligned rows
        "padded-in": (padded, None),
        "column-major-out": (None, column_major),
        "transposed-in": (column_major, None),                            # rows are neighbours: a lane per row
        "broadcast-rows": ((0,) + packed_strides(sizes)[1:], None),       # every row the same
    }


@pytest.mark.parametrize("layout", ["padded-rows", "padded-in", "column-major-out", "transposed-in", "broadcast-rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", KINDS)
def test_strided_layouts(engine, kind, dtype, layout):
    sizes = (70, 37)
    strides, out_strides = named_layouts(sizes)[layout]
    rng = np.random.default_rng([len(kind), len(layout)])
    x = sample(rng, sizes, dtype, kind)
    if layout == "broadcast-rows":
        x = np.broadcast_to(x[:1], sizes).copy()
    op = make_op(kind, dtype, sizes, strides, out_strides)
    y = run_checked(engine, op, x, kind)
    if layout == "broadcast-rows":
        assert (y == y[:1]).all()


def test_padding_between_rows_is_cleared(engine):
    """The output's gaps (padded rows) come back zero, whatever the pooled buffer held before."""
    sizes, padded = (4, 5), (8, 1)
    noise = np.full((4, 8), 7.0, np.float32)
    run(engine, make_op("SOFTSIGN", np.float32, (4, 8)), noise)   # leave non-zero bytes in the pool
    op = make_op("SOFTMAX", np.float32, sizes, padded, padded)
    out = engine.execute(op, [np.ones(3 * 8 + 5, np.float32).tobytes()])
    grid = np.zeros(4 * 8, np.float32)
    grid[: 3 * 8 + 5] = out.view(np.float32)
    grid = grid.reshape(4, 8)
    np.testing.assert_array_equal(grid[:, 5:], 0.0)
    np.testing.assert_allclose(grid[:, :5], 0.2, rtol=1e-6)


def test_row_layout():
    """Rows are the kept dimensions, elements the reduced ones, each coalesced on its own."""
    op = make_op("SOFTMAX1", np.float32, (2, 3, 4, 5), Axes=[2, 3])
    rl = row_layout((op.InputTensor, op.OutputTensor), op.reduced_axes())
    assert (rl.outer, rl.inner, rl.rows, rl.row_len, rl.packed) == ((6,), (20,), 6, 20, True)
    op = make_op("SOFTMAX1", np.float32, (2, 3, 4), Axes=[0, 2])
    rl = row_layout((op.InputTensor, op.OutputTensor), op.reduced_axes())
    assert (rl.outer, rl.inner, rl.inner_strides[0], rl.packed) == ((3,), (2, 4), (12, 1), False)
    op = make_op("SOFTMAX", np.float32, (1, 1, 9, 33), (1, 1, 40, 1), (1, 1, 40, 1))
    rl = row_layout((op.InputTensor, op.OutputTensor), op.reduced_axes())
    assert (rl.rows, rl.row_len, rl.row_stride, rl.packed) == (9, 33, 40, True)
    op = make_op("SOFTMAX1", np.float32, (4, 1, 5), Axes=[1])
    rl = row_layout((op.InputTensor, op.OutputTensor), op.reduced_axes())
    assert (rl.rows, rl.row_len) == (20, 1)


@st.composite
def reductions(draw):
    """Any *1 operator, data type, 1 to 8 dimensions, non-empty set of axes, and layouts (input:
    packed, padded, permuted or broadcast; output: packed, padded or permuted)."""
    kind = draw(st.sampled_from([k + "1" for k in KINDS]))
    dtype = draw(st.sampled_from(DTYPES))
    sizes = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=8)))
    axes = sorted(draw(st.sets(st.sampled_from(range(len(sizes))), min_size=1)))
    axes = draw(st.permutations(axes))                    # Axes in any order: a set
    body = {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "Axes": list(axes),
            "InputTensor": tensor(dtype, sizes, draw(layouts(sizes, broadcast=True))),
            "OutputTensor": tensor(dtype, sizes, draw(layouts(sizes, broadcast=False)))}
    return kind, dtype, body, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=120, deadline=None)
@given(reductions())
def test_any_axes_and_layout(engine, case):
    kind, dtype, body, seed = case
    op = parse_operator(body)
    d = op.InputTensor
    x = sample(np.random.default_rng(seed), d.Sizes, dtype, kind)
    index = tuple(slice(0, 1) if st_ == 0 and s > 1 else slice(None) for s, st_ in zip(d.Sizes, d.strides))
    x = np.broadcast_to(x[index], d.Sizes).copy()       # a broadcast input holds one value per zero stride
    run_checked(engine, op, x, kind)


BIG_CASES = [
    ("SOFTMAX", np.float32, (1, 1 << 22), None, None),             # one row: a workgroup for it
    ("HARDMAX", np.float16, (1 << 21, 1), None, None),             # rows of one: many per invocation
    ("LOG_SOFTMAX1", np.float32, (20000, 5), (0, 1), (6, 1)),        # strided, two reduced dimensions
    ("SOFTMAX1", np.float32, (3, 1 << 20), (0,), None),              # rows are columns: a lane per row
]


@pytest.mark.parametrize("kind,dtype,sizes,axes,out_strides", BIG_CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[2]))}" for c in BIG_CASES])
def test_big_rows_and_many_rows(engine, kind, dtype, sizes, axes, out_strides):
    """lavapipe ends a shader invocation's loops after 65535 iterations in all, silently: the grid
    keeps every invocation's loops below that (Engine._row_split), whatever the rows' count and length."""
    x = sample(np.random.default_rng(len(sizes)), sizes, dtype, kind)
    op = make_op(kind, dtype, sizes, None, out_strides, **({"Axes": list(axes)} if axes else {}))
    run_checked(engine, op, x, kind)


# -- a whole workgroup per row (the GPU path for long rows) -----------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", KINDS)
def test_workgroup_per_row(engine, monkeypatch, kind, dtype):
    """A GPU gives long rows a whole workgroup (subgroups combined in shared memory after a barrier);
    lavapipe never does, so the test pretends to be a GPU with a low threshold. Fewer workgroups than
    rows (the CPU cap) makes each one take several rows, alternating its two shared buffers."""
    gpu = dataclasses.replace(engine.device, type="discrete-gpu")
    monkeypatch.setattr(engine, "device", gpu)
    monkeypatch.setattr(engine, "tuning", dataclasses.replace(tuning_for(gpu), loop_budget=engine.tuning.loop_budget))
    monkeypatch.setattr(geometry_module, "WORKGROUP_ROW_LEN", 16)
    rng = np.random.default_rng(len(kind))
    for sizes, axes in [((37, 3000), (1,)), ((5, 3, 700), (0, 2)), ((20, 17), (1,))]:
        x = sample(rng, sizes, dtype, kind)
        op = make_op(kind + "1", dtype, sizes, Axes=list(axes))
        assert engine._row_split(row_layout((op.InputTensor, op.OutputTensor), axes), x.itemsize)[0] == 0
        run_checked(engine, op, x, kind)


@pytest.mark.parametrize("unroll", REDUCTION_UNROLLS)
def test_each_unroll_variant(engine, monkeypatch, unroll):
    """Both loop shapes of the reduction kernels (unrolled by 4 where llvmpipe's loop limit needs it,
    rolled elsewhere: device_tuning), over packed and strided rows of every length class: both on
    lavapipe, only its own elsewhere (unrolled, SwiftShader's compiler grows without bound)."""
    if unroll != engine.reduction_unroll and engine.device.driver_name != "llvmpipe":
        pytest.skip("another device runs only its own variant")
    monkeypatch.setattr(engine, "reduction_unroll", unroll)
    rng = np.random.default_rng(unroll)
    for kind in KINDS:
        for dtype in DTYPES:
            for sizes, axes in [((7, 1), (1,)), ((9, 33), (1,)), ((3, 517), (1,)), ((4, 5, 6), (0, 2)), ((2, 5000), (1,))]:
                x = sample(rng, sizes, dtype, kind)
                op = make_op(kind + "1", dtype, sizes, Axes=list(axes))
                assert engine._reduction(op)[0].unroll == unroll
                run_checked(engine, op, x, kind)


def test_lanes_and_groups(engine):
    """Lanes per row follow the row length (a lane per row when rows are neighbours in memory), and
    the workgroup count covers the rows, rounded to three significant bits, within the cap."""
    def split(sizes, axes, strides=None):
        op = make_op("SOFTMAX1", np.float32, sizes, strides, Axes=list(axes))
        return engine._row_split(row_layout((op.InputTensor, op.OutputTensor), axes), 4)

    sub = engine.device.subgroup_size
    assert split((10000, 3), (1,))[0] == 1
    assert split((16, 1024), (1,))[0] == min(128, sub)
    # reducing the outer axis: rows adjacent, a lane each once there are 8 rows per subgroup lane (fewer
    # rows share a subgroup per row: 64 of them on a 32-lane GPU)
    assert split((300, 8 * sub), (0,))[0] == 1
    assert split((300, 4 * sub), (0,))[0] == sub
    for rows in (1, 5, 9, 1000, 99999):
        lanes, groups = split((rows, 40), (1,))
        assert 1 <= groups <= engine.max_reduction_workgroups
        assert groups == engine.max_reduction_workgroups or groups * (engine.local_size // lanes) >= rows


# -- special values --------------------------------------------------------------------------------

SPECIAL_ROWS = [
    [1.0, 2.0, np.nan, 3.0],            # NaN: softmax NaN throughout; hardmax at the NaN
    [np.nan, 5.0, np.nan, 1.0],         # the first NaN
    [np.inf, 1.0, 2.0, 3.0],            # +inf: exp(inf - inf) is in numpy's sum: NaN
    [np.inf, np.inf, 0.0, -np.inf],
    [-np.inf, -np.inf, -np.inf, -np.inf],  # only -inf: 0 / 0
    [-np.inf, 0.0, 1.0, -np.inf],       # -inf is exp 0
    [3.0, 3.0, 3.0, 3.0],               # ties: hardmax at the first
    [-0.0, 0.0, -1.0, -0.0],            # -0 == 0
    [-3e38, -3.4e38, -3.4028235e38, -1e38],
    [3e38, 3.4028235e38, -3e38, 0.0],
    [-100.0, 0.0, -100.0, -200.0],      # terms far below the maximum
    [1e-30, -1e-30, 0.0, 1e-38],
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", KINDS)
def test_special_values(engine, kind, dtype):
    with np.errstate(over="ignore"):
        x = np.array(SPECIAL_ROWS, dtype)
    y = run_checked(engine, make_op(kind, dtype, x.shape), x, kind)
    if kind != "HARDMAX":   # NaN rows: a NaN, a +inf (FLOAT16: also +-3e38), only -inf
        nan_rows = np.isnan(x).any(axis=1) | (x == np.inf).any(axis=1) | (x == -np.inf).all(axis=1)
        assert nan_rows[:5].all()
        np.testing.assert_array_equal(np.isnan(y).all(axis=1), nan_rows)
        np.testing.assert_array_equal(np.isnan(y).any(axis=1), nan_rows)
    if kind == "SOFTMAX":
        np.testing.assert_array_equal(y[5], np.array([0, 1 / (1 + np.e), np.e / (1 + np.e), 0], dtype))
    if kind == "HARDMAX":
        assert y.argmax(axis=1).tolist()[:8] == [2, 0, 0, 0, 0, 2, 0, 0]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", KINDS)
def test_special_values_in_long_rows(engine, kind, dtype):
    """The same, with the special value at every position class of a long row (first lane, last
    lane, the ragged tail) and rows long enough for several steps per lane."""
    n = 1000
    rows = []
    for value in (np.nan, np.inf, -np.inf):
        for at in (0, 7, 500, n - 1):
            row = np.linspace(-5, 5, n)
            row[at] = value
            rows.append(row)
    rows.append(np.full(n, -np.inf))
    x = np.array(rows, dtype)
    run_checked(engine, make_op(kind, dtype, x.shape), x, kind)


def test_log_softmax_of_a_dominated_row_keeps_its_small_digits(engine):
    """log(sum) of a row with one dominant element is log1p of the small rest: the maximum's output
    is -4.5e-5, not 0 (1 + 4.5e-5 in fp32 would keep two digits of it)."""
    x = np.array([0.0, -10.0, -12.0, -30.0], np.float32)
    op = make_op("LOG_SOFTMAX", np.float32, x.shape)
    y = run_checked(engine, op, x, "LOG_SOFTMAX")
    expected = -np.log1p(np.exp(-10.0) + np.exp(-12.0) + np.exp(-30.0))
    assert abs(float(y[0]) / expected - 1) < 1e-6


# -- descriptor rules ------------------------------------------------------------------------------

def field_of(body: dict) -> str:
    with pytest.raises(ValidationError) as info:
        parse_operator(body)
    return descriptor_error(info.value).field


def body(kind: str, sizes, **extra) -> dict:
    return {"Type": f"DML_OPERATOR_ACTIVATION_{kind}",
            "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": list(sizes)}, **extra}


@pytest.mark.parametrize("kind", KINDS)
def test_legacy_operators_take_effective_rank_at_most_two(kind):
    for ok in [(5,), (3, 4), (1, 1, 3, 4), (1, 1, 1, 1, 1, 1, 1, 7)]:
        parse_operator(body(kind, ok))
    for bad in [(2, 3, 4), (1, 2, 1, 4), (2, 1, 1, 1)]:
        assert field_of(body(kind, bad)) == "InputTensor.Sizes"


@pytest.mark.parametrize("kind", [k + "1" for k in KINDS])
def test_axes_rules(kind):
    sizes = (2, 3, 4)
    assert field_of(body(kind, sizes, Axes=[3])) == "Axes[0]"
    assert field_of(body(kind, sizes, Axes=[0, 5])) == "Axes[1]"
    assert field_of(body(kind, sizes, Axes=[-1])) == "Axes[0]"
    assert field_of(body(kind, sizes, Axes=[1, 1])) == "Axes"
    assert field_of(body(kind, sizes, Axes=[])) == "Axes"
    assert field_of(body(kind, sizes, Axes=[0, 1], AxisCount=3)) == "AxisCount"
    assert field_of(body(kind, sizes, AxisCount=1)) == "Axes"
    op = parse_operator(body(kind, sizes, Axes=[2, 0]))
    assert (op.AxisCount, op.reduced_axes()) == (2, (0, 2))
    assert parse_operator(body(kind, sizes, Axes=[1], AxisCount=1)).AxisCount == 1
    assert parse_operator(body(kind, sizes)).Axes == (2,)       # omitted: the last dimension


@pytest.mark.parametrize("kind", KINDS + [k + "1" for k in KINDS])
def test_no_in_place_execution(engine, kind):
    op = make_op(kind, np.float32, (2, 3))
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(DescriptorError) as info:
        engine.execute(op, [x.tobytes()], in_place=True)
    assert info.value.field == "InPlace"


def test_feature_levels():
    legacy = parse_operator(body("SOFTMAX", (1, 1, 2, 3)))
    legacy.check_feature_level(FeatureLevel.FL_1_0)
    with pytest.raises(DescriptorError, match="4 dimensions"):
        parse_operator(body("SOFTMAX", (2, 3))).check_feature_level(FeatureLevel.FL_1_0)
    axes = parse_operator(body("HARDMAX1", (2, 3), Axes=[0]))
    axes.check_feature_level(FeatureLevel.FL_5_1)
    with pytest.raises(DescriptorError) as info:
        axes.check_feature_level(FeatureLevel.FL_5_0)
    assert info.value.field == "FeatureLevel"


def test_float64_references_follow_numpy():
    """The references are numpy's formulas (ONNX's reference implementation), NaN rules included."""
    x = np.array([[1.0, np.nan, 2.0], [np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [2.0, 2.0, 1.0]])
    for kind in KINDS:
        op = make_op(kind, np.float32, x.shape)
        with np.errstate(invalid="ignore"):
            y = op.formula(x)
        if kind == "HARDMAX":
            np.testing.assert_array_equal(y, [[0, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]])
        else:
            assert np.isnan(y[:3]).all()
    e = np.exp([0.0, 0.0, -1.0])
    np.testing.assert_allclose(make_op("SOFTMAX", np.float32, (3,)).formula(np.array([2.0, 2.0, 1.0])), e / e.sum())
