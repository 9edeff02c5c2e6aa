#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = s. s x = zh + zl exactly (two_prod_d; exp's relative error is |s x| times its
// argument's), l = log1p(exp(-|s x|)) as lm 2^le (log1p_exp_neg_d, 2 ulp); the result is x + l / s where
// s x > 0 (the linear part s x / s is x exactly, and l / s has x's sign: the sum adds half an ulp to at
// most 2.5 of the tail's), else l / s, formed as (lm / sm) 2^(le - se) for s = sm 2^se so that a tail
// below the normal range (or above it: s tiny) is rounded once. +inf gives inf, -inf 0, NaN NaN.
double activate(double x) {
    double s = PARAM_F64(0);
    double zl;
    double zh = two_prod_d(s, x, zl);
    int le, se;
    double lm = log1p_exp_neg_d(zh, zl, le);
    double sm = frexp_d(s, se);
    precise double q = lm / sm;
    double tail = ldexp_wide_d(q, le - se);
    precise double r = x + tail;
    return zh > 0.0 ? r : tail;
}
#else
// DML_ACTIVATION_SOFTPLUS_OPERATOR_DESC { Steepness }: log(1 + exp(Steepness * x)) / Steepness.
// PARAM(0..5) = s, -head_f(|s|), -(|s| - head_f(|s|)), 1 (the slope s * (1 / s)), and 1 / s * 2^-64
// in two factors: see softplus_f.
// +inf gives +inf, -inf gives 0, NaN stays NaN.
float activate(float x) {
    return softplus_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3), PARAM(4), PARAM(5));
}
#endif
