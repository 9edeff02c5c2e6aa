#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: x for x > 0, else alpha_expm1_quotient_d (f64activation.glsl: x / Alpha's rounding made up for,
// below 2 ulp). PARAM_F64(0) = Alpha.
double activate(double x) {
    return x > 0.0 ? x : alpha_expm1_quotient_d(x, PARAM_F64(0));
}
#else
// DML_ACTIVATION_CELU_OPERATOR_DESC { Alpha }: max(0, x) + min(0, Alpha * (exp(x / Alpha) - 1)), for
// Alpha > 0 (celu_negative_alpha.comp has the rest). PARAM(0) = Alpha, PARAM(1) = 1 / Alpha.
// x / Alpha <= 0 here: exp is at most 1, and the rounding of the quotient barely shows in the result.
// For x > 0 the second term is 0; NaN takes the second branch and stays NaN.
float activate(float x) {
    return x > 0.0 ? x : PARAM(0) * expm1_nonpositive_f(x * PARAM(1));
}
#endif
