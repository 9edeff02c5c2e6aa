#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_RELU_OPERATOR_DESC: max(0, x) as ONNX's np.maximum(x, 0): NaN stays NaN, -0 gives +0.
float activate(float x) {
    return x <= 0.0 ? 0.0 : x;
}
