#version 450
#extension GL_GOOGLE_include_directive : require
#define PREP_T vec2
#include "common/reduction.glsl"

// DML_ACTIVATION_SOFTMAX(1)_OPERATOR_DESC: exp(x - max) / sum(exp(x - max)) over the reduced axes.
// prepare: (max, 1 / sum). A row whose maximum is +inf gives NaN everywhere (exp(inf - inf) is in the
// sum), as numpy's formula does; a row of -inf has sum 0 and gives 0 / 0 = NaN; NaN in a row makes
// the sum NaN.
vec2 prepare(vec2 total) {
    float m = isinf(total.x) ? uintBitsToFloat(0x7fc00000u) : total.x;
    return vec2(m, 1.0 / (1.0 + total.y));
}

// exp(x - max) with x - max in two parts (exp_minus): far below the maximum, rounding x - max to fp32
// alone would cost up to 64 ulp.
float result(float x, uint index, vec2 p) {
    return exp_minus(x, p.x) * p.y;
}
