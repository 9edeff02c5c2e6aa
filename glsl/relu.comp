#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64math.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: as the float formula below.
double activate(double x) {
    return x <= 0.0 ? 0.0 : x;
}
#else
// DML_ACTIVATION_RELU_OPERATOR_DESC: max(0, x) as ONNX's np.maximum(x, 0): NaN stays NaN, -0 gives +0.
float activate(float x) {
    return x <= 0.0 ? 0.0 : x;
}
#endif
