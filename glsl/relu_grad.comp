#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_RELU_GRAD_OPERATOR_DESC { InputTensor, InputGradientTensor }: dY if X > 0, else 0.
float activate(float x, float dy) {
    return x > 0.0 ? dy : 0.0;
}
