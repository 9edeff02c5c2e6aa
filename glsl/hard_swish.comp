#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: as the float formula, with mul_add_d. PARAM_F64(0) = Alpha, PARAM_F64(2) = Beta.
double activate(double x) {
    double h = clamp_unit_d(mul_add_d(x, PARAM_F64(0), PARAM_F64(2)));
    return h > 0.0 ? x * h : h;
}
#else
// DML_ACTIVATION_HARD_SWISH_OPERATOR_DESC { Alpha, Beta }: x * max(0, min(Alpha * x + Beta, 1)).
// PARAM(0..3) as HARD_SIGMOID's. Where the clamp gives 0 the result is 0 even for x = +-inf (the
// limit, not inf * 0); NaN stays NaN.
float activate(float x) {
    float h = clamp_unit_f(mul_add_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3)));
    return h > 0.0 ? x * h : h;
}
#endif
