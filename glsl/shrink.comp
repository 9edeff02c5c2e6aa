#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SHRINK_OPERATOR_DESC { Bias, Threshold }, tested in ONNX Shrink's order (x < -Threshold
// first: it decides a negative Threshold). NaN falls through to 0, as in ONNX.
float activate(float x) {
    float bias = PARAM(0), threshold = PARAM(1);
    if (x < -threshold) return x + bias;
    if (x > threshold) return x - bias;
    return 0.0;
}
