#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SCALED_ELU_OPERATOR_DESC { Alpha, Gamma }: Gamma * x if x > 0, else
// Gamma * (Alpha * exp(x) - Alpha) = (Gamma * Alpha) * expm1(x), without the cancellation near 0.
// PARAM(0) = Gamma, PARAM(1) = Gamma * Alpha (from the host). NaN takes the second branch and stays NaN.
float activate(float x) {
    return x > 0.0 ? PARAM(0) * x : PARAM(1) * expm1_f(x);
}
