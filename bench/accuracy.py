"""FLOAT64 accuracy: each operator's worst error in ulp against a correctly rounded reference.

The reference is the operator's formula in mpmath at 50 significant digits, rounded once to the
nearest double (subnormals included); the kernel runs on the device through the engine (the native
FLOAT64 variant, glsl/common/f64math.glsl). Points: uniform values in [-60, 60], values of
log-uniform magnitude over the whole double range (subnormals to 2^1023, both signs), and the edges of
each formula (overflow and underflow thresholds, branch points, +-0); non-finite inputs are the
tests' (exact) business. tests/engine/test_float64.py asserts the bound on the same cases;
``python -m bench --only accuracy`` writes the table into bench/RESULTS.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import mpmath
import numpy as np

from service.operators.numerics import flush_subnormal

BOUND_ULP = 4   # issue 17: every FLOAT64 operator within 4 ulp of the correctly rounded result
DPS = 50
mp = mpmath.mpf


def to_double(v) -> float:
    """An mpmath value rounded once to the nearest double (ties to even), subnormals and overflow
    included; NaN for NaN or complex."""
    if isinstance(v, mpmath.mpc) or mpmath.isnan(v):
        return math.nan
    if mpmath.isinf(v) or v == 0:
        return float(v)
    if abs(v) < mp(2) ** -1022:            # a multiple of 2^-1074
        return float(mpmath.nint(v * mp(2) ** 1074)) * 2.0 ** -1074
    with mpmath.workprec(53):
        r = +v
    return float(r) if abs(r) <= np.finfo(np.float64).max else math.copysign(math.inf, r)


def _clamp01(t):
    return min(max(t, mp(0)), mp(1))


def _softplus(z):  # log(1 + e^z) without mpmath's overflow-free but slow path for huge z
    return z + mpmath.log1p(mpmath.exp(-z)) if z > 0 else mpmath.log1p(mpmath.exp(z))


#: (DirectML kind, its parameters, the formula on mpf x and mpf parameters) per case.
@dataclass(frozen=True)
class Case:
    kind: str
    params: dict[str, float] = field(default_factory=dict)
    edges: tuple[float, ...] = ()

    @property
    def name(self) -> str:
        args = ", ".join(f"{k}={v:g}" for k, v in self.params.items())
        return f"{self.kind}({args})" if args else self.kind

    def reference(self, x: np.ndarray) -> np.ndarray:
        # DirectML's FLOAT as every kernel gets it: float32, a subnormal one as zero (flush_subnormal)
        p = {k: mp(flush_subnormal(v)) for k, v in self.params.items()}
        f = FORMULAS[self.kind]
        with mpmath.workdps(DPS):
            return np.array([to_double(f(mp(float(v)), **p)) for v in x], np.float64)


FORMULAS: dict[str, Callable] = {
    "IDENTITY": lambda x: x,
    "RELU": lambda x: max(x, mp(0)),
    "LEAKY_RELU": lambda x, Alpha: x if x >= 0 else Alpha * x,
    "THRESHOLDED_RELU": lambda x, Alpha: x if x > Alpha else mp(0),
    "LINEAR": lambda x, Alpha, Beta: Alpha * x + Beta,
    "HARD_SIGMOID": lambda x, Alpha, Beta: _clamp01(Alpha * x + Beta),
    "HARD_SWISH": lambda x, Alpha, Beta: x * _clamp01(Alpha * x + Beta),
    "SOFTSIGN": lambda x: x / (1 + abs(x)),
    "ELU": lambda x, Alpha: x if x >= 0 else Alpha * mpmath.expm1(x),
    "SCALED_ELU": lambda x, Alpha, Gamma: Gamma * x if x > 0 else Gamma * Alpha * mpmath.expm1(x),
    "CELU": lambda x, Alpha: x if x > 0 else Alpha * mpmath.expm1(x / Alpha),
    "SIGMOID": lambda x: 1 / (1 + mpmath.exp(-x)),
    "SWISH": lambda x, SigmoidInputScale: x / (1 + mpmath.exp(-SigmoidInputScale * x)),
    "TANH": mpmath.tanh,
    "SCALED_TANH": lambda x, Alpha, Beta: Alpha * mpmath.tanh(Beta * x),
    "SOFTPLUS": lambda x, Steepness: _softplus(Steepness * x) / Steepness,
    "PARAMETRIC_SOFTPLUS": lambda x, Alpha, Beta: Alpha * _softplus(Beta * x),
    "GELU": lambda x: x * mpmath.ncdf(x) if abs(x) < 100 else max(x, mp(0)),  # ncdf overflows far out
}

def descriptor(case, shape: tuple[int, ...]):
    """The FLOAT64 descriptor of a Case or RowCase on a packed tensor of ``shape``."""
    from service.operators import parse_operator

    return parse_operator({"Type": f"DML_OPERATOR_ACTIVATION_{case.kind}", **case.params,
                           "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT64", "Sizes": list(shape)}})


def correctly_rounded(desc, *xs: np.ndarray) -> np.ndarray | None:
    """The correctly rounded FLOAT64 result of an elementwise one-input descriptor on finite inputs
    (mpmath), or None for an operator without a formula here (the two-input ones and SHRINK: exact,
    numpy is exact there)."""
    kind = desc.type_name().removeprefix("DML_OPERATOR_ACTIVATION_")
    if kind not in FORMULAS or len(xs) != 1:
        return None
    x = xs[0]
    case = Case(kind, dict(zip(desc.scalar_fields(), desc.scalars())))
    return case.reference(np.ravel(x)).reshape(np.shape(x))


_EXP_EDGES = (-745.1332191019411, -745.0, -744.4, -708.4, -708.3964185322641, -40.0, -38.8, -20.0, -1.0, -0.5,
              -0.34657359027997264, -1e-300, 0.5, 1.0, 20.0, 40.0, 709.7, 709.782712893384, 710.0)

CASES: tuple[Case, ...] = (
    Case("IDENTITY"),
    Case("RELU"),
    Case("LEAKY_RELU", {"Alpha": 0.01}),
    Case("THRESHOLDED_RELU", {"Alpha": 1.0}),
    Case("LINEAR", {"Alpha": 1.5, "Beta": -2.25}),
    Case("LINEAR", {"Alpha": 0.1, "Beta": 3.0}, (30.0, 29.999999999999996)),
    Case("HARD_SIGMOID", {"Alpha": 0.2, "Beta": 0.5}, (-2.5, 2.5, -2.4999999999999996)),
    Case("HARD_SWISH", {"Alpha": 1 / 6, "Beta": 0.5}, (-3.0, 3.0)),
    Case("SOFTSIGN"),
    Case("ELU", {"Alpha": 1.0}, _EXP_EDGES),
    Case("ELU", {"Alpha": 0.25}, _EXP_EDGES),
    Case("SCALED_ELU", {"Alpha": 1.67326319217681884765625, "Gamma": 1.05070102214813232421875}, _EXP_EDGES),
    Case("SCALED_ELU", {"Alpha": -71.5622, "Gamma": -30.25}, _EXP_EDGES),
    Case("CELU", {"Alpha": 1.0}, _EXP_EDGES),
    Case("CELU", {"Alpha": 3.0}, _EXP_EDGES),
    Case("CELU", {"Alpha": -0.75}, (-1.5, -1.4999999, -30.0, -29.9, -532.0, -532.5, -533.0, -600.0)),
    Case("CELU", {"Alpha": -4.0}, (-8.0, -160.0, -2839.0, -2840.0, -3000.0)),
    Case("CELU", {"Alpha": -62.3157}, (-4e-321, -1e-300)),    # x / Alpha subnormal: x itself
    Case("CELU", {"Alpha": 46.6864}, (-2.008862035115327e-309,)),
    Case("SIGMOID", {}, _EXP_EDGES),
    Case("SWISH", {"SigmoidInputScale": 1.0}, _EXP_EDGES),
    Case("SWISH", {"SigmoidInputScale": -2.0}, tuple(-v / 2 for v in _EXP_EDGES)),
    Case("SWISH", {"SigmoidInputScale": 0.001}, (-745000.0, -7.4e5, -1e6, 1e6)),
    Case("SWISH", {"SigmoidInputScale": 146.232}, tuple(v / 146.232 for v in _EXP_EDGES)),
    Case("TANH", {}, (22.0, -22.0, 0.55, 1.0, 2.0**-55)),
    Case("SCALED_TANH", {"Alpha": 1.7159, "Beta": 0.6666}, (22.0, -22.0, 1.5, 2.0**-55)),
    Case("SCALED_TANH", {"Alpha": -82.7485, "Beta": 52.7936}, (5.805874e-318, 2.0**-34)),  # Beta x subnormal
    Case("SCALED_TANH", {"Alpha": 375.11, "Beta": -4.49893}),
    Case("SOFTPLUS", {"Steepness": 1.0}, _EXP_EDGES),
    Case("SOFTPLUS", {"Steepness": 3.0}, tuple(v / 3 for v in _EXP_EDGES)),
    Case("SOFTPLUS", {"Steepness": -0.5}, tuple(-2 * v for v in _EXP_EDGES)),
    Case("PARAMETRIC_SOFTPLUS", {"Alpha": 1.0, "Beta": 1.0}, _EXP_EDGES),
    Case("PARAMETRIC_SOFTPLUS", {"Alpha": 2.5, "Beta": -0.5}, tuple(-2 * v for v in _EXP_EDGES)),
    Case("PARAMETRIC_SOFTPLUS", {"Alpha": 1e30, "Beta": 7.0}, (-100.0, -106.0, -110.0, -150.0)),
    Case("GELU", {}, (0.5, -0.5, 8.0, -8.0, -38.4, -38.5, -38.6, -38.7, 40.0, -40.0)),
)


def sample(case: Case, n: int = 1500, seed: int = 17) -> np.ndarray:
    """Uniform points in [-60, 60], points of log-uniform magnitude over the double range, the case's
    edges and their neighbours, the smallest subnormals and the largest doubles: finite only."""
    rng = np.random.default_rng(seed)
    mags = np.sign(rng.uniform(-1, 1, n)) * 2.0 ** rng.uniform(-1074, 1023, n)
    wide = 2.0 ** rng.uniform(-8, 12, n) * np.sign(rng.uniform(-1, 1, n))
    edges = np.array([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -2.2250738585072014e-308, 1e-200, -1e-200,
                      1.7976931348623157e308, -1.7976931348623157e308, 1e300, -1e300, *case.edges], np.float64)
    with np.errstate(over="ignore"):  # the largest doubles' outer neighbours are inf (dropped)
        near = np.concatenate([edges, np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf)])
    x = np.concatenate([rng.uniform(-60, 60, n), mags, wide, near])
    return x[np.isfinite(x)]


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place of float64 (+0 and -0 are 0 apart; NaN against NaN 0, NaN
    against a number the maximum)."""
    def ordered(x: np.ndarray) -> np.ndarray:
        i = x.view(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFFFFFFFFFF), i)
    d = np.abs(ordered(a) - ordered(b))
    na, nb = np.isnan(a), np.isnan(b)
    return np.where(na & nb, 0, np.where(na | nb, np.iinfo(np.int64).max, d))


@dataclass
class Worst:
    case: Case | RowCase
    ulp: int
    at: float
    got: float
    want: float
    points: int


def measure(execute: Callable[[Case, np.ndarray], np.ndarray], case: Case, n: int = 1500) -> Worst:
    """The worst ulp of ``execute(case, x)`` (the device's result) over the case's sample."""
    x = sample(case, n)
    got = execute(case, x)
    want = case.reference(x)
    d = ulp_distance(got, want)
    i = int(np.argmax(d))
    return Worst(case, int(d[i]), float(x[i]), float(got[i]), float(want[i]), x.size)


@dataclass(frozen=True)
class RowCase:
    """A softmax-family case: ``kind`` over ``axes`` of a tensor of ``sizes`` (rows of the product of
    the reduced sizes), values spread so that exp(x - max) runs from 1 down past the underflow."""
    kind: str              # SOFTMAX1 or LOG_SOFTMAX1
    sizes: tuple[int, ...]
    axes: tuple[int, ...]
    spread: float = 300.0

    @property
    def name(self) -> str:
        return f"{self.kind}(Sizes={list(self.sizes)}, Axes={list(self.axes)}, spread {self.spread:g})"

    @property
    def params(self) -> dict:
        return {"Axes": list(self.axes)}

    def inputs(self, seed: int = 5) -> np.ndarray:
        rng = np.random.default_rng(seed)
        x = rng.normal(0.0, self.spread, self.sizes)
        x.flat[:: max(1, x.size // 7)] *= 3.0     # a few far below (or above) the rest
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        rows = np.moveaxis(x, self.axes, tuple(range(x.ndim - len(self.axes), x.ndim)))
        flat = rows.reshape(-1, int(np.prod([x.shape[a] for a in self.axes])))
        out = np.empty_like(flat)
        with mpmath.workdps(DPS):
            for r, row in enumerate(flat):
                v = [mp(float(t)) for t in row]
                m = max(v)
                top = v.index(m)
                rest = mpmath.fsum(mpmath.exp(t - m) for j, t in enumerate(v) if j != top)  # 1 + rest: the sum
                if self.kind == "SOFTMAX1":
                    out[r] = [to_double(mpmath.exp(t - m) / (1 + rest)) for t in v]
                else:  # log1p: log(1 + rest) at 50 digits would lose a rest below 10^-50
                    out[r] = [to_double((t - m) - mpmath.log1p(rest)) for t in v]
        return np.moveaxis(out.reshape(rows.shape), tuple(range(x.ndim - len(self.axes), x.ndim)), self.axes)


ROW_CASES: tuple[RowCase, ...] = tuple(
    RowCase(kind, sizes, axes, spread)
    for kind in ("SOFTMAX1", "LOG_SOFTMAX1")
    for sizes, axes, spread in (((64, 7), (1,), 300.0), ((4, 1000), (1,), 100.0), ((2, 5000), (1,), 30.0),
                                ((3, 40, 6), (0, 2), 200.0), ((1, 3), (1,), 1e-3))
)


def measure_rows(execute: Callable[[RowCase, np.ndarray], np.ndarray], case: RowCase) -> Worst:
    x = case.inputs()
    got, want = execute(case, x), case.reference(x)
    d = ulp_distance(got.reshape(-1), want.reshape(-1))
    i = int(np.argmax(d))
    return Worst(case, int(d[i]), float(x.reshape(-1)[i]), float(got.reshape(-1)[i]), float(want.reshape(-1)[i]), x.size)


def section(device_name: str, results: list[Worst]) -> str:
    lines = [f"<!-- accuracy: {device_name} -->", f"## {device_name}: FLOAT64 accuracy", "",
             "Worst error over each case's points (`bench/accuracy.py`: uniform in [-60, 60], log-uniform",
             "magnitudes from 2^-1074 to 2^1023, the formula's edges and their neighbours) against the formula",
             f"in mpmath at {DPS} digits rounded once to double; the bound is {BOUND_ULP} ulp.", "",
             "| operator | points | worst ulp | at x | |", "|---|--:|--:|--:|---|"]
    for w in results:
        lines.append(f"| {w.case.name} | {w.points:,} | {w.ulp} | {w.at!r} | {'PASS' if w.ulp <= BOUND_ULP else 'ABOVE'} |")
    lines += ["", "<!-- end accuracy -->", ""]
    return "\n".join(lines)
