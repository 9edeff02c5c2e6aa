#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_THRESHOLDED_RELU_OPERATOR_DESC { Alpha }: x if x > Alpha, else 0. NaN gives 0: the
// comparison is false, as in ONNX ThresholdedRelu (np.where(x > alpha, x, 0)).
float activate(float x) {
    return x > PARAM(0) ? x : 0.0;
}
