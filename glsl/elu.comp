#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_ELU_OPERATOR_DESC { Alpha }: x if x >= 0, else Alpha * (exp(x) - 1), with expm1_f (no
// cancellation near 0). -0 takes the identity branch; NaN fails the test and stays NaN; -inf gives -Alpha.
float activate(float x) {
    return x >= 0.0 ? x : PARAM(0) * expm1_f(x);
}
