"""Every FLOAT64 operator within 4 ulp of the correctly rounded result (bench/accuracy.py's cases:
mpmath at 50 digits, rounded once), on the device's native FLOAT64 kernels; the non-finite inputs and
the signs of zero exactly as the float64 reference has them."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from bench import accuracy
from service.config import Settings
from service.descriptors import DataType
from service.engine import Engine
from service.operators import OPERATORS
from tests.helpers import make_op, run, tensor
from service.operators import parse_operator


@pytest.fixture(scope="module")
def engine64() -> Iterator[Engine]:
    """One engine (host memory: the formulas do not depend on the memory mode, which the plumbing's
    tests cover) with the native 64-bit path, where the device has shaderFloat64."""
    e = Engine(Settings(memory="host"))
    if "shaderFloat64" not in e.kernel_features:
        e.close()
        pytest.skip(f"{e.device.name} has no shaderFloat64: FLOAT64 operators are refused there (422)")
    yield e
    e.close()


def execute(engine: Engine, case: accuracy.Case, x: np.ndarray) -> np.ndarray:
    return run(engine, make_op(case.kind, np.float64, x.shape, **case.params), x)


@pytest.mark.parametrize("case", accuracy.CASES, ids=lambda c: c.name)
def test_within_4_ulp_of_the_correctly_rounded_result(engine64, case):
    worst = accuracy.measure(lambda c, x: execute(engine64, c, x), case)
    assert worst.ulp <= accuracy.BOUND_ULP, worst


@pytest.mark.parametrize("case", accuracy.ROW_CASES, ids=lambda c: c.name)
def test_softmax_family_within_4_ulp(engine64, case):
    worst = accuracy.measure_rows(lambda c, x: run(engine64, make_op(c.kind, np.float64, x.shape, **c.params), x), case)
    assert worst.ulp <= accuracy.BOUND_ULP, worst


@pytest.mark.parametrize("kind", ["SOFTMAX1", "LOG_SOFTMAX1", "HARDMAX1"])
def test_softmax_family_rows_with_nan_inf_and_ties_as_the_reference(engine64, kind):
    x = np.array([[1.0, math.nan, 2.0], [math.inf, 1.0, 0.0], [-math.inf, -math.inf, -math.inf],
                  [3.0, 3.0, -1.0], [-math.inf, 0.5, 5e-324], [-1e308, 1e308, 0.0]])
    op = make_op(kind, np.float64, x.shape, Axes=[1])
    got = run(engine64, op, x)
    np.testing.assert_array_equal(got, op.reference(x))


def test_hardmax_picks_as_numpy_in_double(engine64):
    rng = np.random.default_rng(8)
    x = np.round(rng.normal(0, 3, (300, 17)), 1)            # ties
    x[::7, 3] = 1 + 2.0**-52                                 # values float32 would merge
    x[::7, 5] = 1.0
    op = make_op("HARDMAX1", np.float64, x.shape, Axes=[1])
    np.testing.assert_array_equal(run(engine64, op, x), op.reference(x))


SPECIAL = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0])


@pytest.mark.parametrize("case", accuracy.CASES, ids=lambda c: c.name)
def test_non_finite_inputs_and_zeros_as_the_reference(engine64, case):
    op = make_op(case.kind, np.float64, SPECIAL.shape, **case.params)
    got = run(engine64, op, SPECIAL)
    want = op.reference(SPECIAL)
    def signed(a):  # a zero's sign counts; a NaN's does not (no operator defines it)
        return [("nan",) if math.isnan(v) else (repr(v), math.copysign(1, v)) for v in a]
    assert signed(got) == signed(want)


def test_every_float_operator_serves_float64(engine64):
    missing = [name for name, op in OPERATORS.items() if DataType.FLOAT32 in op.accepted_types()
               and op.served_types(engine64.kernel_features).get(DataType.FLOAT64) is None]
    assert not missing


@pytest.mark.parametrize("kind", ["PARAMETERIZED_RELU", "RELU_GRAD"])
def test_two_input_operators_exactly(engine64, kind):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 10, 500), [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324]])
    y = np.concatenate([rng.normal(0, 3, 500), [2.0, -1.0, 0.5, 3.0, 1.0, -1e308, 7.0]])
    second = "SlopeTensor" if kind == "PARAMETERIZED_RELU" else "InputGradientTensor"
    op = parse_operator({"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(np.float64, x.shape),
                         second: tensor(np.float64, x.shape)})
    got = run(engine64, op, x, y)
    np.testing.assert_array_equal(got, op.reference(x, y))
