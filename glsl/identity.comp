#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: x, bits and all.
double activate(double x) {
    return x;
}
#else
// DML_ACTIVATION_IDENTITY_OPERATOR_DESC: x (NaN payloads included; FLOAT16 round-trips exactly).
float activate(float x) {
    return x;
}
#endif
