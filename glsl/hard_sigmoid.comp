#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = Alpha, PARAM_F64(2) = Beta; Alpha * x + Beta rounded about once (mul_add_d).
double activate(double x) {
    return clamp_unit_d(mul_add_d(x, PARAM_F64(0), PARAM_F64(2)));
}
#else
// DML_ACTIVATION_HARD_SIGMOID_OPERATOR_DESC { Alpha, Beta }: max(0, min(Alpha * x + Beta, 1)).
// PARAM(0..3) = Alpha, head_f(Alpha), Alpha - head_f(Alpha), Beta: Alpha * x + Beta rounded once
// (mul_add_f), so values just above the lower kink keep their relative accuracy. NaN stays NaN.
float activate(float x) {
    return clamp_unit_f(mul_add_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3)));
}
#endif
