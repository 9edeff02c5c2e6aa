#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SIGMOID_OPERATOR_DESC: 1 / (1 + exp(-x)), as 1 / (1 + e) for x >= 0 and e / (1 + e)
// for x < 0 with e = exp(-|x|) <= 1: no overflow, and full relative accuracy in the tail x << 0.
// +-inf give 1 and 0; NaN stays NaN.
float activate(float x) {
    float e = exp_neg_f(-abs(x));
    return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}
