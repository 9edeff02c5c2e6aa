#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SOFTSIGN_OPERATOR_DESC: x / (1 + |x|); +-inf gives +-1 rather than inf / inf.
float activate(float x) {
    return isinf(x) ? sign(x) : x / (1.0 + abs(x));
}
