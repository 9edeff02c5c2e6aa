#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_PARAMETERIZED_RELU_OPERATOR_DESC { InputTensor, SlopeTensor }: x if x >= 0, else slope * x.
// NaN fails the comparison and gives slope * NaN = NaN.
float activate(float x, float slope) {
    return x >= 0.0 ? x : slope * x;
}
