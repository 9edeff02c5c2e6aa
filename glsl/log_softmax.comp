#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(DTYPE_F64)
#define PREP_T dvec2
#else
#define PREP_T vec2
#endif
#include "common/reduction.glsl"

// DML_ACTIVATION_LOG_SOFTMAX(1)_OPERATOR_DESC: x - max - log(sum(exp(x - max))) over the reduced axes.
// prepare: (max, log(sum)), the log as log1p of the sum without the maximum's own term (exactly 1), so
// that the maximum's output -log(sum) keeps its small digits. Non-finite rows as in softmax.comp.
#if defined(DTYPE_F64)
#include "common/reduction_f64.glsl"
// FLOAT64 (reduction_f64.glsl): (x - max) - log1p(sum) with x - max in two parts, the low part added
// last; both terms are <= 0, so nothing cancels.
dvec2 prepare(dvec2 total) {
    double m = isinf(total.x) ? double(uintBitsToFloat(0x7fc00000u)) : total.x;
    return dvec2(m, log1p_d(total.y));
}

double result(double x, uint index, dvec2 p) {
    dvec2 d = two_diff(x, p.x);
    precise double r = (d.x - p.y) + (isinf(d.x) ? 0.0 : d.y);   // an infinite d.x comes with a NaN d.y
    return r;
}
#else
vec2 prepare(vec2 total) {
    float m = isinf(total.x) ? uintBitsToFloat(0x7fc00000u) : total.x;
    return vec2(m, log1p_nonneg(total.y));
}

float result(float x, uint index, vec2 p) {
    return (x - p.x) - p.y;
}
#endif
