#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_RELU_GRAD_OPERATOR_DESC { InputTensor, InputGradientTensor }: dY if X > 0, else 0.
ELEM_T activate(ELEM_T x, ELEM_T dy) {
    return x > ELEM_T(0) ? dy : ELEM_T(0);
}
