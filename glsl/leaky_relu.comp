#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_LEAKY_RELU_OPERATOR_DESC { Alpha }: x if x >= 0, else Alpha * x. NaN gives Alpha * NaN.
float activate(float x) {
    return x >= 0.0 ? x : PARAM(0) * x;
}
