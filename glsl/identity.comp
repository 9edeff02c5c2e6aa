#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_IDENTITY_OPERATOR_DESC: x (NaN payloads included; FLOAT16 round-trips exactly).
float activate(float x) {
    return x;
}
