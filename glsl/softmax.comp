#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(DTYPE_F64)
#define PREP_T dvec2
#else
#define PREP_T vec2
#endif
#include "common/reduction.glsl"

// DML_ACTIVATION_SOFTMAX(1)_OPERATOR_DESC: exp(x - max) / sum(exp(x - max)) over the reduced axes.
// prepare: (max, 1 / sum). A row whose maximum is +inf gives NaN everywhere (exp(inf - inf) is in the
// sum), as numpy's formula does; a row of -inf has sum 0 and gives 0 / 0 = NaN; NaN in a row makes
// the sum NaN.
#if defined(DTYPE_F64)
#include "common/reduction_f64.glsl"
// FLOAT64 (reduction_f64.glsl): prepare gives (max, 1 + sum), and the result is one division of
// exp(x - max) (x - max in two parts) by it, a rounding fewer than a reciprocal and a product.
dvec2 prepare(dvec2 total) {
    double m = isinf(total.x) ? double(uintBitsToFloat(0x7fc00000u)) : total.x;
    precise double d = 1.0 + total.y;
    return dvec2(m, d);
}

double result(double x, uint index, dvec2 p) {
    precise double r = exp_minus(x, p.x) / p.y;
    return r;
}
#else
vec2 prepare(vec2 total) {
    float m = isinf(total.x) ? uintBitsToFloat(0x7fc00000u) : total.x;
    return vec2(m, 1.0 / (1.0 + total.y));
}

// exp(x - max) with x - max in two parts (exp_minus): far below the maximum, rounding x - max to fp32
// alone would cost up to 64 ulp.
float result(float x, uint index, vec2 p) {
    return exp_minus(x, p.x) * p.y;
}
#endif
