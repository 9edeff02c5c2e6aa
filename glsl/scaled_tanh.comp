#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SCALED_TANH_OPERATOR_DESC { Alpha, Beta }: Alpha * tanh(Beta * x).
float activate(float x) {
    return PARAM(0) * tanh_f(PARAM(1) * x);
}
