"""The 64-bit types (FLOAT64, INT64, UINT64) on the real device, on both kernel paths: native (the
device's shaderFloat64/shaderInt64, enabled by the patched kp) and emulated in 32-bit words
(Settings.native_64bit=False, as on a device without the features). Integers are checked against exact
rational arithmetic, FLOAT64 Shrink against float64 numpy (its x -/+ Bias is one correctly rounded
operation, so numpy is exact there), bit for bit."""
from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pytest

from service.config import Settings
from service.descriptors import DataType
from service.descriptors.datatypes import KERNEL_FEATURES
from service.dispatch_geometry import push_words
from service.engine import Engine
from service.errors import UnsupportedOnDevice
from client.buffers import packed_strides
from service.operators import OPERATORS, parse_operator
from tests.engine.test_integers import shrink_layout
from tests.helpers import make_op, run, tensor

I64, U64 = np.iinfo(np.int64), np.iinfo(np.uint64)


@pytest.fixture(scope="module", params=["native", "emulated"])
def path(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine64(memory: str, path: str) -> Iterator[Engine]:
    """An engine in the memory mode on one 64-bit path; the native one only where the device reports
    the features (a device without them runs the emulated kernels either way)."""
    e = Engine(Settings(memory=memory, native_64bit=path == "native"))
    if path == "native" and set(e.features_enabled) != set(KERNEL_FEATURES):
        e.close()
        pytest.skip(f"{e.device.name} reports {sorted(e.device.features)}: no native 64-bit path")
    yield e
    e.close()


def served(engine: Engine, kind: str, dtype) -> bool:
    op = OPERATORS[f"DML_OPERATOR_ACTIVATION_{kind}"]
    return op.served_types(engine.kernel_features)[DataType.from_numpy(dtype)] is not None


def need(engine: Engine, kind: str, dtype) -> None:
    if not served(engine, kind, dtype):
        pytest.skip(f"{kind} has no {np.dtype(dtype).name} kernel on this path")


# -- the device and the setting ------------------------------------------------------------------------

def test_features_are_the_reported_ones(engine64: Engine, path: str):
    assert engine64.features_enabled == frozenset(f for f in KERNEL_FEATURES if f in engine64.device.features)
    assert engine64.kernel_features == (engine64.features_enabled if path == "native" else frozenset())
    emulated = {np.float64: "F64_EMU", np.int64: "I64_EMU", np.uint64: "U64_EMU"}
    for dtype, define in emulated.items():   # which kernel this path's Shrink runs
        want = define if path == "emulated" else DataType.from_numpy(dtype).info.shader
        assert make_op("SHRINK", dtype, (4,)).shader_dtype(engine64.kernel_features) == want


def test_a_type_without_a_kernel_names_the_missing_feature():
    info = DataType.FLOAT64.info
    assert info.variant(frozenset({"shaderFloat64"}), emulated=False) == "F64"
    assert info.variant(frozenset({"shaderInt64"}), emulated=True) == "F64_EMU"
    assert info.variant(frozenset(), emulated=False) is None
    assert "shaderFloat64" in info.missing()
    assert DataType.FLOAT32.info.variant(frozenset(), emulated=False) == "F32"


def test_push_constants_carry_64_bit_values_in_two_words():
    words = push_words([7, 2, np.float64(0.1), np.uint64(2**64 - 3), 9])
    assert words[2:4].view(np.float64)[0] == 0.1
    assert int(words[4:6].view(np.uint64)[0]) == 2**64 - 3
    assert words[6] == 9
    with pytest.raises(ValueError, match="even word"):
        push_words([7, 2, 1, np.float64(0.5)])


# -- Shrink ------------------------------------------------------------------------------------------

def exact_shrink(values, bias: float, threshold: float, dtype) -> np.ndarray:
    """ONNX Shrink of integers without ONNX's rounding through float64: exact, truncated, wrapped."""
    t, b = Fraction(float(np.float32(threshold))), Fraction(float(np.float32(bias)))
    bits = 8 * np.dtype(dtype).itemsize
    out = []
    for v in (int(v) for v in values):
        exact = v + b if v < -t else v - b if v > t else Fraction(0)
        r = int(exact) % (1 << bits)   # int() truncates toward zero
        out.append(r - (1 << bits) if np.dtype(dtype).kind == "i" and r >= 1 << (bits - 1) else r)
    return np.array(out, dtype)


SHRINK_PARAMS = [(0.0, 0.5), (1.5, 2.0), (-2.5, 0.0), (0.25, -3.25), (2.0**40 + 0.5, 1e3), (1e19, 7.0), (-1e30, 1e25), (0.5, 2.0**62)]


def int64_values(rng: np.random.Generator, dtype, n: int) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = [info.min, info.max, info.min + 1, info.max - 1, 0, 1, 2, 3, 2**53 + 1, 2**53, 2**62, 2**62 - 1, 2**63 - 1]
    if info.min < 0:
        edges += [-1, -2, -3, -(2**53) - 1, -(2**62), -(2**62) - 1]
    else:
        edges += [2**63, 2**63 + 5, 2**64 - 2]
    raw = [int(v) for v in rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)]
    raw[: min(n, len(edges))] = edges[:n]
    raw[len(edges)::4] = [int(v) for v in rng.integers(-9, 10, len(raw[len(edges)::4]))]
    return np.array([min(max(v, info.min), info.max) for v in raw], dtype)


@pytest.mark.parametrize("layout", ["packed", "strided", "broadcast", "in_place"])
@pytest.mark.parametrize("bias,threshold", SHRINK_PARAMS)
@pytest.mark.parametrize("dtype", [np.int64, np.uint64], ids=lambda d: np.dtype(d).name)
def test_shrink_int64(engine64, dtype, bias, threshold, layout):
    need(engine64, "SHRINK", dtype)
    rng = np.random.default_rng([int(abs(bias)) % 1000, len(layout), np.dtype(dtype).itemsize])
    x, strides = shrink_layout(layout, rng, lambda sizes: int64_values(rng, dtype, int(np.prod(sizes))).reshape(sizes))
    op = make_op("SHRINK", dtype, x.shape, strides, Bias=bias, Threshold=threshold)
    got = run(engine64, op, x, in_place=layout == "in_place")
    np.testing.assert_array_equal(got, exact_shrink(x.reshape(-1), bias, threshold, dtype).reshape(x.shape))
    np.testing.assert_array_equal(got, op.reference(x))


@pytest.mark.parametrize(
    "dtype,values,bias,threshold,expected",
    [
        (np.int64, [I64.min, I64.max], -1.0, 0.5, [I64.max, I64.min]),              # min - 1, max + 1 wrap
        (np.int64, [I64.min, I64.max], 1.0, 0.5, [I64.min + 1, I64.max - 1]),
        (np.int64, [2**53 + 1, -(2**53) - 1], 0.5, 0.0, [2**53, -(2**53)]),          # exact beyond 2^53
        (np.uint64, [2**63 + 5], 0.5, 0.0, [2**63 + 4]),                            # ONNX's reference says 2^63
        (np.uint64, [U64.max, 0, 3], 5.5, 0.5, [U64.max - 6, 0, 2**64 - 2]),         # 3 - 5.5 = -2.5 -> -2 wraps
        (np.int64, [5, -5, 0], 2.0**-52, 0.0, [4, -4, 0]),                           # 5 - 2^-52 truncates to 4
    ],
)
def test_shrink_int64_edges(engine64, dtype, values, bias, threshold, expected):
    need(engine64, "SHRINK", dtype)
    x = np.array(values, dtype)
    op = make_op("SHRINK", dtype, x.shape, Bias=bias, Threshold=threshold)
    got = run(engine64, op, x)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.array(expected, dtype))


TINY = float(np.finfo(np.float64).smallest_subnormal)
FLOAT64_EDGES = [0.0, -0.0, TINY, -TINY, 2.2250738585072014e-308, 1e-300, -1e-300, 0.5, -0.5, 0.5000000000000001,
                 -0.5000000000000001, 1.0, -1.0, 1.5, 3.0, -3.0, 1e300, -1e300, np.finfo(np.float64).max,
                 -np.finfo(np.float64).max, np.inf, -np.inf, np.nan, -np.nan, 2.0**53 + 2, 1.0 + 2.0**-52, 4.4e-16]


def float64_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Every class of double: random bit patterns (all exponents, NaN payloads, subnormals), small
    values near the thresholds, and the edges."""
    x = rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64).copy()
    x[1::3] = rng.uniform(-4, 4, x[1::3].shape)
    x[2::5] = rng.integers(-8, 9, x[2::5].shape) / 4
    x[: min(n, len(FLOAT64_EDGES))] = FLOAT64_EDGES[:n]
    return x


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal as doubles, -0 against +0 included; any NaN matches any NaN."""
    assert got.dtype == want.dtype == np.float64
    both_nan = np.isnan(got) & np.isnan(want)
    bad = ~both_nan & (got.view(np.uint64) != want.view(np.uint64))
    assert not bad.any(), f"{int(bad.sum())} differ, first at {np.argmax(bad)}: got {got.reshape(-1)[np.argmax(bad)]!r}, want {want.reshape(-1)[np.argmax(bad)]!r}"


FLOAT_PARAMS = [(0.0, 0.5), (1.5, 2.0), (-2.5, 0.0), (0.25, -3.25), (0.5, 0.5), (1e-40, 1e-45), (3e38, 1e30), (0.1, 0.1)]


@pytest.mark.parametrize("layout", ["packed", "strided", "broadcast", "in_place"])
@pytest.mark.parametrize("bias,threshold", FLOAT_PARAMS)
def test_shrink_float64(engine64, bias, threshold, layout):
    need(engine64, "SHRINK", np.float64)
    rng = np.random.default_rng([len(layout), int(abs(bias * 100)) % 1000])
    x, strides = shrink_layout(layout, rng, lambda sizes: float64_values(rng, int(np.prod(sizes))).reshape(sizes))
    op = make_op("SHRINK", np.float64, x.shape, strides, Bias=bias, Threshold=threshold)
    same_bits(run(engine64, op, x, in_place=layout == "in_place"), op.reference(x))


def test_shrink_float64_near_ties(engine64):
    """x - Bias where rounding to nearest even decides: halfway cases, cancellation to subnormals and
    to zero, the overflow edge."""
    need(engine64, "SHRINK", np.float64)
    eps = 2.0**-52
    for bias in (1.0, 0.5, -0.5, 1.0 + 2.0**-23, 3e38, 2.0**-126):
        x = np.array([1.0 + eps, 1.0 + 2 * eps, 1.0 + 3 * eps, 2.0**53 - 1, 2.0**53 + 2, -(2.0**53 + 2), bias, -bias, bias + TINY,
                      np.nextafter(bias, 0), np.nextafter(bias, 10), 1.7976931348623157e308, -1.7976931348623157e308,
                      2.0**-1022 + 2.0**-1074 * 3, 2.0**-1000, 1.0 + 2.0**-30], np.float64)
        op = make_op("SHRINK", np.float64, x.shape, Bias=bias, Threshold=0.0)
        same_bits(run(engine64, op, x), op.reference(x))


def test_a_float64_operator_without_a_kernel_is_refused_with_the_feature(engine64):
    """Where no FLOAT64 kernel of an operator serves this path, execution is a 422 naming shaderFloat64."""
    for name, op in OPERATORS.items():
        if DataType.FLOAT64 in op.accepted_types() and op.served_types(engine64.kernel_features)[DataType.FLOAT64] is None:
            desc = make_op(name.removeprefix("DML_OPERATOR_ACTIVATION_"), np.float64, (4,)) if op.input_fields == ("InputTensor",) else None
            if desc is None:
                continue
            with pytest.raises(UnsupportedOnDevice, match="shaderFloat64") as info:
                run(engine64, desc, np.zeros(4))
            assert info.value.field == "InputTensor.DataType"
            return
    pytest.skip("every FLOAT64 operator has a kernel on this path")


# -- the two-input operators that take INT64 --------------------------------------------------------------

def exact_two_input(kind: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """PRelu (x if x >= 0 else slope * x, the product wrapped to 64 bits) and ReluGrad (dy if x > 0
    else 0) in Python integers."""
    signed = x.dtype.kind == "i"

    def one(a: int, b: int) -> int:
        if kind == "PARAMETERIZED_RELU":
            r = a if a >= 0 else (a * b) % 2**64
        else:
            r = b if a > 0 else 0
        return r - 2**64 if signed and r >= 2**63 else r
    return np.array([one(int(a), int(b)) for a, b in zip(x.reshape(-1), y.reshape(-1))], x.dtype).reshape(x.shape)


@pytest.mark.parametrize("layout", ["packed", "strided", "broadcast", "in_place"])
@pytest.mark.parametrize("kind,second,dtype", [("PARAMETERIZED_RELU", "SlopeTensor", np.int64), ("PARAMETERIZED_RELU", "SlopeTensor", np.uint64),
                                                ("RELU_GRAD", "InputGradientTensor", np.int64)])
def test_two_input_int64(engine64, kind, second, dtype, layout):
    need(engine64, kind, dtype)
    if layout == "in_place" and kind == "RELU_GRAD":
        pytest.skip("RELU_GRAD is not in place (DirectML)")
    rng = np.random.default_rng([len(layout), len(kind)])
    sizes = (5, 7, 3)
    x = int64_values(rng, dtype, 105).reshape(sizes)
    y = int64_values(rng, dtype, 105)[::-1].copy().reshape(sizes)
    if dtype is np.int64:
        y.reshape(-1)[:8] = [-1, 2, 3, I64.max, I64.min, -(2**32), 2**32 + 1, 0]
    x_strides = y_strides = None
    if layout in ("strided", "in_place"):
        x_strides = packed_strides(tuple(s + 1 for s in sizes))
    elif layout == "broadcast":   # the second input per channel (ONNX's broadcast slope)
        y_strides = (0, 1, 0)
        y = np.broadcast_to(y[:1, :, :1], sizes).copy()
    body = {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(dtype, sizes, x_strides), second: tensor(dtype, sizes, y_strides)}
    if layout == "in_place":
        body["OutputTensor"] = tensor(dtype, sizes, x_strides)
    op = parse_operator(body)
    got = run(engine64, op, x, y, in_place=layout == "in_place")
    np.testing.assert_array_equal(got, exact_two_input(kind, x, y))
    np.testing.assert_array_equal(got, op.reference(x, y))


# -- a FLOAT64 reduction: the reduction kernels' 8-byte elements ------------------------------------------

@pytest.mark.parametrize("sizes,axes,strided", [((7, 33), [1], False), ((3, 5, 9), [0, 2], False), ((4, 6), [1], True), ((2, 1000), [1], False)])
def test_hardmax_float64(engine64, sizes, axes, strided):
    """HARDMAX1 in FLOAT64 (native only): 1 at numpy's argmax (the first NaN, else the first maximum),
    values that differ only beyond float32's precision, packed and strided."""
    need(engine64, "HARDMAX1", np.float64)
    rng = np.random.default_rng(len(sizes))
    x = 1.0 + rng.integers(0, 4, sizes) * 2.0**-40     # ties broken only by double precision
    x.reshape(-1)[::17] = np.nan if strided else 1.0 + 4 * 2.0**-40
    strides = packed_strides(tuple(s + 1 for s in sizes)) if strided else None
    op = parse_operator({"Type": "DML_OPERATOR_ACTIVATION_HARDMAX1", "InputTensor": tensor(np.float64, sizes, strides), "Axes": axes})
    same_bits(run(engine64, op, x), op.reference(x))


def test_shrink_float64_random_biases(engine64):
    """x -/+ Bias over random bits of both: every exponent distance between the operands (the emulated
    add's alignment, sticky bit, cancellation and carry paths), each against numpy's double."""
    need(engine64, "SHRINK", np.float64)
    rng = np.random.default_rng(64)
    x = float64_values(rng, 4096)
    x[::2] = rng.uniform(-1, 1, 2048) * 2.0 ** rng.integers(-160, 160, 2048)   # near the biases' scale
    for bias in rng.integers(0, 2**32, 40, dtype=np.uint64).astype(np.uint32).view(np.float32):
        if not np.isfinite(bias):
            continue
        op = make_op("SHRINK", np.float64, x.shape, Bias=float(bias), Threshold=0.0)
        same_bits(run(engine64, op, x), op.reference(x))


@pytest.mark.parametrize("layout", ["packed", "strided", "broadcast", "in_place"])
def test_relu_int64(engine64, layout):
    """ONNX Relu's int64: max(0, x), INT64 min and max included."""
    need(engine64, "RELU", np.int64)
    rng = np.random.default_rng(len(layout))
    x, strides = shrink_layout(layout, rng, lambda sizes: int64_values(rng, np.int64, int(np.prod(sizes))).reshape(sizes))
    op = make_op("RELU", np.int64, x.shape, strides)
    got = run(engine64, op, x, in_place=layout == "in_place")
    np.testing.assert_array_equal(got, np.array([max(int(v), 0) for v in x.reshape(-1)], np.int64).reshape(x.shape))
