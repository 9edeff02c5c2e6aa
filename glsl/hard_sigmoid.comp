#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_HARD_SIGMOID_OPERATOR_DESC { Alpha, Beta }: max(0, min(Alpha * x + Beta, 1)).
// PARAM(0..3) = Alpha, head_f(Alpha), Alpha - head_f(Alpha), Beta: Alpha * x + Beta rounded once
// (mul_add_f), so values just above the lower kink keep their relative accuracy. NaN stays NaN.
float activate(float x) {
    return clamp_unit_f(mul_add_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3)));
}
