"""The polynomial coefficients in glsl/common/f64math.glsl, from mpmath at 50 digits; prints them.

usage: python scripts/f64math_coefficients.py
- GAUSS_TAIL_C (gauss_tail_d): u Phi(-u) exp(u^2 / 2), 16 polynomials of degree 13: on [0.5, 8) one per
  interval of width 1/2 in s = 4 (u - midpoint), on [8, inf) one in s = 128 / u^2 - 1 (v = 1 / u^2).
- gelu_d's series: erf(x / sqrt 2) / (2 x) in t = x^2, Taylor, degree 11.
- tanh_d's P: (tanh(x) - x) / x^3 in s = x^2 on [0, 1], degree 16.
Each polynomial is the truncated Chebyshev series of the function (interpolated at 60 nodes), in powers
of its variable.
"""
from __future__ import annotations

import mpmath

mpmath.mp.dps = 50


def power_coeffs(f, a, b, degree: int, nodes: int = 60) -> list:
    """f's Chebyshev series on [a, b] truncated at ``degree``, in powers of the variable itself."""
    xs = [mpmath.cos(mpmath.pi * (k + mpmath.mpf(0.5)) / nodes) for k in range(nodes)]
    fs = [f((b - a) / 2 * x + (a + b) / 2) for x in xs]
    c = [2 * mpmath.fsum(fs[k] * mpmath.cos(mpmath.pi * j * (k + mpmath.mpf(0.5)) / nodes) for k in range(nodes)) / nodes
         for j in range(degree + 1)]
    c[0] /= 2
    T = [[mpmath.mpf(1)], [mpmath.mpf(0), mpmath.mpf(1)]]       # Chebyshev polynomials in powers of w
    for k in range(2, degree + 1):
        t = [mpmath.mpf(0)] + [2 * v for v in T[k - 1]]
        for i, v in enumerate(T[k - 2]):
            t[i] -= v
        T.append(t)
    in_w = [mpmath.fsum(c[k] * T[k][i] for k in range(i, degree + 1) if i < len(T[k])) for i in range(degree + 1)]
    alpha, beta = 2 / (b - a), -(a + b) / (b - a)              # w = alpha s + beta
    return [mpmath.fsum(v * mpmath.binomial(i, j) * alpha ** j * beta ** (i - j) for i, v in enumerate(in_w) if i >= j)
            for j in range(degree + 1)]


def u_gauss_tail(u):  # u Phi(-u) e^(u^2 / 2)
    return u * mpmath.erfc(u / mpmath.sqrt(2)) / 2 * mpmath.exp(u * u / 2)


def tanh_correction(s):  # (tanh(x) - x) / x^3, s = x^2
    if s == 0:
        return -mpmath.mpf(1) / 3
    x = mpmath.sqrt(s)
    return (mpmath.tanh(x) - x) / x ** 3


def main() -> None:
    rows = []
    for i in range(15):   # in s = 4 (u - midpoint) on [-1, 1]
        mid = mpmath.mpf(0.75) + mpmath.mpf(i) / 2
        rows.append(power_coeffs(lambda s, m=mid: u_gauss_tail(m + s / 4), -1, 1, 13))
    # u >= 8: in s = 128 v - 1 on [-1, 1], v = 1 / u^2 (v = 0, u = inf, taken as 10^-30)
    rows.append(power_coeffs(lambda s: u_gauss_tail(1 / mpmath.sqrt(max((s + 1) / 128, mpmath.mpf(10) ** -30))), -1, 1, 13))
    print("GAUSS_TAIL_C:")
    print(",\n".join("    " + ", ".join(repr(float(v)) for v in r) for r in rows))
    series = [1 / mpmath.sqrt(2 * mpmath.pi) * (-1) ** n / (2 ** n * mpmath.factorial(n) * (2 * n + 1)) for n in range(12)]
    print("gelu_d series:", ", ".join(repr(float(v)) for v in series))
    print("tanh_d P:", ", ".join(repr(float(v)) for v in power_coeffs(tanh_correction, 0, 1, 16)))


if __name__ == "__main__":
    main()
