#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_PARAMETERIZED_RELU_OPERATOR_DESC { InputTensor, SlopeTensor }: x if x >= 0, else slope * x.
// NaN fails the comparison and gives slope * NaN = NaN.
// Integers (INT8/16/32 from 5_1): slope * x wraps to the type, as numpy's integer product does.
ELEM_T activate(ELEM_T x, ELEM_T slope) {
    return x >= ELEM_T(0) ? x : slope * x;
}
