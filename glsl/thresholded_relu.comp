#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = Alpha.
double activate(double x) {
    return x > PARAM_F64(0) ? x : 0.0;
}
#else
// DML_ACTIVATION_THRESHOLDED_RELU_OPERATOR_DESC { Alpha }: x if x > Alpha, else 0. NaN gives 0: the
// comparison is false, as in ONNX ThresholdedRelu (np.where(x > alpha, x, 0)).
float activate(float x) {
    return x > PARAM(0) ? x : 0.0;
}
#endif
