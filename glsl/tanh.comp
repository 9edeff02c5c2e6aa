#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_TANH_OPERATOR_DESC: tanh(x) with tanh_f (no cancellation near 0, exactly +-1 at
// +-inf, the sign of -0 kept, NaN stays NaN).
float activate(float x) {
    return tanh_f(x);
}
