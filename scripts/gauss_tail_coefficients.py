"""Coefficients of glsl/common/f64math.glsl's GAUSS_TAIL_C (u Phi(-u) exp(u^2 / 2), see gauss_tail_d) and of gelu_d's
small-argument series; prints them (python scripts/gauss_tail_coefficients.py; the series to stderr)."""
import mpmath
mpmath.mp.dps = 50
DEG = 13
def uG(u):  # u Phi(-u) e^{u^2/2}
    return u * mpmath.erfc(u / mpmath.sqrt(2)) / 2 * mpmath.exp(u * u / 2)
def power_coeffs(f, a, b, n=DEG, nodes=60):
    # truncated Chebyshev series of f on [a, b] (from interpolation at `nodes` points), in powers of s in [-1, 1]
    N = nodes
    xs = [mpmath.cos(mpmath.pi * (k + 0.5) / N) for k in range(N)]
    fs = [f((b - a) / 2 * x + (a + b) / 2) for x in xs]
    c = [2 * mpmath.fsum(fs[k] * mpmath.cos(mpmath.pi * j * (k + 0.5) / N) for k in range(N)) / N for j in range(n + 1)]
    c[0] /= 2
    # Chebyshev -> power basis
    T = [[mpmath.mpf(1)], [mpmath.mpf(0), mpmath.mpf(1)]]
    for k in range(2, n + 1):
        prev, prev2 = T[k - 1], T[k - 2]
        t = [mpmath.mpf(0)] + [2 * v for v in prev]
        for i, v in enumerate(prev2): t[i] -= v
        T.append(t)
    p = [mpmath.mpf(0)] * (n + 1)
    for k in range(n + 1):
        for i, v in enumerate(T[k]): p[i] += c[k] * v
    return p
rows = []
for i in range(15):
    a = mpmath.mpf(0.5) + mpmath.mpf(i) / 2
    rows.append(power_coeffs(uG, a, a + mpmath.mpf(0.5)))
def F(v):  # u G(u) as a function of v = 1 / u^2
    return uG(1 / mpmath.sqrt(v))
rows.append(power_coeffs(F, mpmath.mpf(0) + mpmath.mpf(10)**-30, mpmath.mpf(1) / 64))
import sys
out = []
for r in rows:
    out.append("    " + ", ".join(repr(float(v)) for v in r))
print(",\n".join(out))
# small |x|: S(t) = erf(x / sqrt 2) / (2 x), t = x^2: Taylor
S = [1 / mpmath.sqrt(2 * mpmath.pi) * (-1) ** n / (2 ** n * mpmath.factorial(n) * (2 * n + 1)) for n in range(12)]
print("S:", ", ".join(repr(float(v)) for v in S), file=sys.stderr)
