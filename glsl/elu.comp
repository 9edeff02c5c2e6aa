#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: Alpha * expm1_d(x) for x < 0 (1 ulp, then the product: below 2 ulp). PARAM_F64(0) = Alpha.
double activate(double x) {
    return x >= 0.0 ? x : PARAM_F64(0) * expm1_d(x);
}
#else
// DML_ACTIVATION_ELU_OPERATOR_DESC { Alpha }: x if x >= 0, else Alpha * (exp(x) - 1), with
// expm1_nonpositive_f (no cancellation near 0). -0 takes the identity branch; NaN fails the test and
// stays NaN; -inf gives -Alpha.
float activate(float x) {
    return x >= 0.0 ? x : PARAM(0) * expm1_nonpositive_f(x);
}
#endif
