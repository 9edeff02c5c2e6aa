#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_RELU_GRAD_OPERATOR_DESC { InputTensor, InputGradientTensor }: dY if X > 0, else 0.
#if defined(DTYPE_I64_EMU)
#include "common/emu64.glsl"
uvec2 activate(uvec2 x, uvec2 dy) {  // INT64 in 32-bit words
    return i64_lt(uvec2(0u), x) ? dy : uvec2(0u);
}
#else
ELEM_T activate(ELEM_T x, ELEM_T dy) {
    return x > ELEM_T(0) ? dy : ELEM_T(0);
}
#endif
