#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_SHRINK_OPERATOR_DESC { Bias, Threshold }, tested in ONNX Shrink's order (x < -Threshold
// first: it decides a negative Threshold).
#ifndef DTYPE_INT
// NaN falls through to 0, as in ONNX.
float activate(float x) {
    float bias = PARAM(0), threshold = PARAM(1);
    if (x < -threshold) return x + bias;
    if (x > threshold) return x - bias;
    return 0.0;
}
#else
// Integers, exactly: the host turns Threshold into integer bounds and each branch's x -/+ Bias into
// x - c with c = ci + cf (ci an integer modulo 2^32, cf in (-1, 1) given by its sign), see
// Shrink.shader_params. trunc(x - c) is then y = x - ci, moved one step towards zero when cf pushes
// y - cf across an integer; to_bits keeps the low bits, which wraps the result to the type.
bool above_zero(ELEM_T x, ELEM_T y) {  // is the exact x - ci >= 1? (cf != 0 implies |ci| < 2^23)
#ifdef DTYPE_SIGNED
    return x >= (1 << 30) || (x > -(1 << 30) && y >= 1);
#else
    return x >= (1u << 30) || int(y) >= 1;
#endif
}
bool below_zero(ELEM_T x, ELEM_T y) {  // is the exact x - ci <= -1?
#ifdef DTYPE_SIGNED
    return x <= -(1 << 30) || (x < (1 << 30) && y <= -1);
#else
    return x < (1u << 30) && int(y) <= -1;
#endif
}
ELEM_T minus(ELEM_T x, uint ci, uint cf_sign) {
    ELEM_T y = x - ELEM_T(ci);
    if (cf_sign == 1u && above_zero(x, y)) return y - ELEM_T(1);
    if (cf_sign == 2u && below_zero(x, y)) return y + ELEM_T(1);
    return y;
}
ELEM_T activate(ELEM_T x) {
    uint flags = PARAM_UINT(2);
    bool low = (flags & 1u) != 0u || ((flags & 2u) == 0u && x <= ELEM_T(PARAM_UINT(0)));
    bool high = (flags & 4u) != 0u || ((flags & 8u) == 0u && x >= ELEM_T(PARAM_UINT(1)));
    if (low) return minus(x, PARAM_UINT(3), (flags >> 4) & 3u);
    if (high) return minus(x, PARAM_UINT(4), (flags >> 6) & 3u);
    return ELEM_T(0);
}
#endif
