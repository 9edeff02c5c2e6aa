#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = Alpha.
double activate(double x) {
    return x >= 0.0 ? x : PARAM_F64(0) * x;
}
#else
// DML_ACTIVATION_LEAKY_RELU_OPERATOR_DESC { Alpha }: x if x >= 0, else Alpha * x. NaN gives Alpha * NaN.
float activate(float x) {
    return x >= 0.0 ? x : PARAM(0) * x;
}
#endif
