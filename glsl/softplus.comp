#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SOFTPLUS_OPERATOR_DESC { Steepness }: log(1 + exp(Steepness * x)) / Steepness.
// PARAM(0..5) = s, -head_f(|s|), -(|s| - head_f(|s|)), 1 (the slope s * (1 / s)), and 1 / s * 2^-64
// in two factors: see softplus_f.
// +inf gives +inf, -inf gives 0, NaN stays NaN.
float activate(float x) {
    return softplus_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3), PARAM(4), PARAM(5));
}
