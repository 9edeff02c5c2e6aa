"""glsl/common/f64math.glsl on the device against mpmath: each double function within its stated
ulp bound of the correctly rounded value, at random points over its whole range (log-uniform
magnitudes and uniform values) and at the edges: subnormals, the overflow and underflow thresholds,
the branch points of the kernels, +-0, +-inf, NaN."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from tests.glsl.f64_harness import device, rounded, run
from tests.helpers import ulp_distance

# A device without shaderFloat64 (SwiftShader) would run a Float64 shader and return wrong values.
pytestmark = pytest.mark.skipif("shaderFloat64" not in device().features, reason="the device has no shaderFloat64")

TINY = 2.2250738585072014e-308
MAX = np.finfo(np.float64).max
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, TINY, -TINY, TINY * (1 - 2**-52), 1e-300,
         2.0**-54, 2.0**-55, -2.0**-54, 2.0**-29, 1.0, -1.0, 0.5, MAX, -MAX, 1e308]


def sample(lo: float, hi: float, n: int, seed: int, edges=()) -> np.ndarray:
    """Uniform values in [lo, hi], values of log-uniform magnitude (2^-70 up to the range's end, both
    signs) within it, the edges and their neighbours (one ulp either way)."""
    rng = np.random.default_rng(seed)
    top = math.log2(max(abs(lo), abs(hi)))
    mags = np.sign(rng.uniform(-1, 1, n)) * 2.0 ** rng.uniform(-70, top, n)
    e = np.array([*EDGES, *edges], np.float64)
    with np.errstate(over="ignore"):  # MAX's neighbour is inf
        near = np.concatenate([e, np.nextafter(e, math.inf), np.nextafter(e, -math.inf)])
    x = np.concatenate([rng.uniform(lo, hi, n), mags[(mags >= lo) & (mags <= hi)], near])
    return x


def worst(fn: str, ref, x: np.ndarray) -> tuple[int, float]:
    finite = np.isfinite(x)  # the infinities: test_special_values_exactly
    x = x[finite]
    y = run(fn, x)
    d = ulp_distance(y, rounded(ref, x))
    i = int(np.argmax(d))
    return int(d[i]), float(x[i])


EXP_EDGES = [709.782712893384, 709.7827128933841, 709.78, 710.0, -745.1332191019411, -745.1332191019412,
             -708.3964185322641, -708.39641853226, -744.44007192138, 0.34657359027997264, -0.34657359027997264,
             1.0397207708399179, -1.0397207708399179, 100.0, -100.0, -1074 * math.log(2)]

CASES = {
    # name: (mpmath reference, points, max ulp)
    "exp_d": (mpmath.exp, sample(-760, 720, 3000, 1, EXP_EDGES), 1),
    "expm1_d": (mpmath.expm1, sample(-50, 720, 3000, 2, [*EXP_EDGES, -38.816242111356935, -38.8, 38.8, 56 * math.log(2), 20 * math.log(2)]), 1),
    "log1p_d": (mpmath.log1p, np.concatenate([sample(-1, MAX, 3000, 3, [-0.2928932188134524, 0.41421356237309503, 2**53, -1 + 2**-53]),
                                              -np.random.default_rng(4).uniform(0, 1, 1000)]), 1),
    "log_d": (mpmath.log, np.concatenate([sample(-1, MAX, 3000, 5, [2**-1074, 2**-1022, 0.7071067811865476, 1.4142135623730951]),
                                          np.random.default_rng(6).uniform(0.5, 2, 1000)]), 1),
    "tanh_d": (mpmath.tanh, sample(-30, 30, 3000, 7, [22.0, -22.0, 1.0, -1.0, 0.5493061443340549, 2.0**-55]), 1),
    # x Phi(x): the tail x < 0 down to its underflow (x = -38.6), both sides of each polynomial's interval
    "gelu_d": (lambda x: x * mpmath.erfc(-x / mpmath.sqrt(2)) / 2 if abs(x) < 100 else max(x, mpmath.mpf(0)),
               np.concatenate([sample(-45, 45, 3000, 8, [0.5, -0.5, 8.0, -8.0, -38.4, -38.5, -38.6, -38.7, 40.0, -40.0]),
                               np.random.default_rng(9).uniform(-0.6, 0.6, 1000), -np.random.default_rng(10).uniform(37, 39, 500),
                               np.arange(0.5, 8.01, 0.5), -np.arange(0.5, 8.01, 0.5)]), 2),
}


@pytest.mark.parametrize("fn", sorted(CASES))
def test_within_its_ulp_bound_everywhere(fn):
    ref, x, bound = CASES[fn]
    ulp, at = worst(fn, ref, x)
    assert ulp <= bound, f"{fn}: {ulp} ulp at x = {at!r}"


def test_special_values_exactly():
    x = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, -2.0])
    expected = {
        "exp_d": [math.nan, math.inf, 0.0, 1.0, 1.0],
        "expm1_d": [math.nan, math.inf, -1.0, 0.0, -0.0],
        "log1p_d": [math.nan, math.inf, math.nan, 0.0, -0.0, -math.inf, math.nan],
        "log_d": [math.nan, math.inf, math.nan, -math.inf, -math.inf, math.nan, math.nan],
        "tanh_d": [math.nan, 1.0, -1.0, 0.0, -0.0],
        "gelu_d": [math.nan, math.inf, -0.0, 0.0, -0.0],   # GELU(-inf): the limit, not -inf * 0
    }
    for fn, want in expected.items():
        got = run(fn, x[: len(want)])
        assert [(repr(v), math.copysign(1, v)) for v in got] == [(repr(v), math.copysign(1, v)) for v in np.array(want)], fn
