#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: tanh_d (fdlibm's, on expm1_d: 2 ulp).
double activate(double x) {
    return tanh_d(x);
}
#else
// DML_ACTIVATION_TANH_OPERATOR_DESC: tanh(x) with tanh_f (no cancellation near 0, exactly +-1 at
// +-inf, the sign of -0 kept, NaN stays NaN).
float activate(float x) {
    return tanh_f(x);
}
#endif
