#version 450
#extension GL_GOOGLE_include_directive : require
#define PREP_T vec2
#include "common/reduction.glsl"

// DML_ACTIVATION_LOG_SOFTMAX(1)_OPERATOR_DESC: x - max - log(sum(exp(x - max))) over the reduced axes.
// prepare: (max, log(sum)), the log as log1p of the sum without the maximum's own term (exactly 1), so
// that the maximum's output -log(sum) keeps its small digits. Non-finite rows as in softmax.comp.
vec2 prepare(vec2 total) {
    float m = isinf(total.x) ? uintBitsToFloat(0x7fc00000u) : total.x;
    return vec2(m, log1p_nonneg(total.y));
}

float result(float x, uint index, vec2 p) {
    return (x - p.x) - p.y;
}
