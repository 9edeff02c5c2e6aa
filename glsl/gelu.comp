#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: gelu_d (f64activation.glsl: a series near 0, the Gaussian tail with an exact u^2 elsewhere).
double activate(double x) {
    return gelu_d(x);
}
#else
// DML_ACTIVATION_GELU_OPERATOR_DESC: x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt 2)), the exact form.
//
// With u = |x|: x * Phi(x) = x - u * Phi(-u) for x >= 0 and -u * Phi(-u) for x < 0, where
// u * Phi(-u) = exp(-u^2 / 2) * u * G(u) and G(u) = Phi(-u) * exp(u^2 / 2) (a scaled erfc) is smooth:
// G(u) = H(t) / (u + K) with t = (u - K) / (u + K) in [-1, 1) and H a degree-9 polynomial (minimax,
// K = 3.5, relative error 2^-25.3 on u in [0, 14] with its fp32 coefficients). So
// u * Phi(-u) = exp(-u^2 / 2) * w * H(2 w - 1), w = u / (u + K): one division, and no erf - 1 or
// 1 - erf that cancels. exp(-u^2 / 2) takes u^2 as an exact head and tail: its relative error is
// u^2 times that of its argument, which a rounded u * u would leave at up to 100 ulp near u = 13.
// x < 0 gives the tail x * Phi(x) to a few ulp down to the underflow (x = -13.2).
// u is capped at 14 (exp(-98) is 0 in fp32): -inf then gives 0, not -inf * 0, and +inf gives +inf.
float activate(float x) {
    float u = abs(x);
    u = u > 14.0 ? 14.0 : u;  // a select, not min(): NaN stays NaN
    float uh = head_f(u);
    float ul = u - uh;
    float hi = -0.5 * (uh * uh);
    float k;
    float p = exp_core_f(hi, -0.5 * (ul * (u + uh)), k);  // exp(-u^2 / 2) = 2^k (1 + p)
    float w = u / (u + 3.5);
    float t = fma(w, 2.0, -1.0);
    // H(t) = c0 + t (c1 + t E(t)): Estrin's order for E (short dependency chains, which is what
    // limits lavapipe here), Horner's for the last two steps, where the rounding errors that matter
    // are made (as accurate as Horner throughout: 1.6 ulp against 2.1 for Estrin's alone).
    float t2 = t * t;
    float t4 = t2 * t2;
    float e01 = fma(t, -0.1160513237118721, 0.31542596220970154);
    float e23 = fma(t, 0.006482984870672226, 0.01739862561225891);
    float e45 = fma(t, -0.0004718555719591677, -0.0031551166903227568);
    float e67 = fma(t, 9.443577437195927e-05, 0.0004069230635650456);
    float e = fma(t4, fma(t2, e67, e45), fma(t2, e23, e01));
    float h = fma(fma(e, t, -0.565561830997467), t, 0.7444160580635071);
    float wh = w * h;
    float tail = hi < -88.0 ? 0.0 : exp2_int_f(k) * fma(wh, p, wh);  // u * Phi(-u)
    return (x >= 0.0 ? x : 0.0) - tail;
}
#endif
