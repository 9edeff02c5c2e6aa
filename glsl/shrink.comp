#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"
#include "common/emu64.glsl"

// DML_ACTIVATION_SHRINK_OPERATOR_DESC { Bias, Threshold }, tested in ONNX Shrink's order (x < -Threshold
// first: it decides a negative Threshold).
#if defined(DTYPE_F64)
// FLOAT64: Bias and Threshold come as doubles (the float32 values, exactly). NaN falls through to 0.
double activate(double x) {
    double bias = PARAM_F64(0), threshold = PARAM_F64(2);
    if (x < -threshold) return x + bias;
    if (x > threshold) return x - bias;
    return 0.0LF;
}
#elif defined(DTYPE_F64_EMU)
// FLOAT64 in 32-bit words: IEEE comparisons and a correctly rounded x -/+ Bias (emu64.glsl), so the
// same bits as the native kernel and float64 numpy.
// One add for both branches (x + Bias or x + -Bias): a device that runs every lane through both
// sides of a branch (SwiftShader; a GPU's divergent warp) pays for one IEEE add, not two.
uvec2 activate(uvec2 x) {
    uvec2 bias = PARAM_U64V(0), threshold = PARAM_U64V(2);
    bool low = f64_lt(x, f64_neg(threshold));
    bool high = !low && f64_lt(threshold, x);
    uvec2 sum = f64_add(x, high ? f64_neg(bias) : bias);
    return low || high ? sum : uvec2(0u);
}
#elif defined(DTYPE_I64_EMU) || defined(DTYPE_U64_EMU)
// INT64/UINT64 in 32-bit words: the integer kernel below, step by step (same parameters: PARAM_U64V(0)
// low bound, (2) high bound, (4) and (6) each branch's ci, PARAM_UINT(8) flags).
#ifdef DTYPE_I64_EMU
    #define LT(a, b) i64_lt(a, b)
    #define LE(a, b) i64_le(a, b)
#else
    #define LT(a, b) u64_lt(a, b)
    #define LE(a, b) u64_le(a, b)
#endif
const uvec2 QUARTER = uvec2(0u, 0x40000000u), MINUS_QUARTER = uvec2(0u, 0xc0000000u), ONE = uvec2(1u, 0u), MINUS_ONE = uvec2(~0u);
bool above_zero(uvec2 x, uvec2 y) {  // is the exact x - ci >= 1? (cf != 0 implies |ci| < 2^23)
#ifdef DTYPE_I64_EMU
    return i64_le(QUARTER, x) || (i64_lt(MINUS_QUARTER, x) && i64_le(ONE, y));
#else
    return u64_le(QUARTER, x) || i64_le(ONE, y);
#endif
}
bool below_zero(uvec2 x, uvec2 y) {  // is the exact x - ci <= -1?
#ifdef DTYPE_I64_EMU
    return i64_le(x, MINUS_QUARTER) || (i64_lt(x, QUARTER) && i64_le(y, MINUS_ONE));
#else
    return u64_lt(x, QUARTER) && i64_le(y, MINUS_ONE);
#endif
}
// With selects, one subtraction for both branches (as the FLOAT64 kernel above, for SwiftShader).
uvec2 minus(uvec2 x, uvec2 ci, uint cf_sign) {
    uvec2 y = u64_sub(x, ci);
    bool down = cf_sign == 1u && above_zero(x, y), up = cf_sign == 2u && below_zero(x, y);
    return u64_add(y, down ? MINUS_ONE : up ? ONE : uvec2(0u));
}
uvec2 activate(uvec2 x) {
    uint flags = PARAM_UINT(8);
    bool low = (flags & 1u) != 0u || ((flags & 2u) == 0u && LE(x, PARAM_U64V(0)));
    bool high = (flags & 4u) != 0u || ((flags & 8u) == 0u && LE(PARAM_U64V(2), x));
    uvec2 y = minus(x, low ? PARAM_U64V(4) : PARAM_U64V(6), (flags >> (low ? 4u : 6u)) & 3u);
    return low || high ? y : uvec2(0u);
}
#elif !defined(DTYPE_INT)
// NaN falls through to 0, as in ONNX.
float activate(float x) {
    float bias = PARAM(0), threshold = PARAM(1);
    if (x < -threshold) return x + bias;
    if (x > threshold) return x - bias;
    return 0.0;
}
#else
// Integers, exactly: the host turns Threshold into integer bounds and each branch's x -/+ Bias into
// x - c with c = ci + cf (ci an integer modulo 2^32, or 2^64 for the 64-bit types, cf in (-1, 1) given
// by its sign), see Shrink.shader_params. trunc(x - c) is then y = x - ci, moved one step towards zero
// when cf pushes y - cf across an integer; the arithmetic wraps, which wraps the result to the type.
#ifdef DTYPE_64BIT
    #define WORD_T uint64_t                // a bound or ci, modulo 2^64
    #define QUARTER (ELEM_T(1) << 62)      // a quarter of the computing type's range
    #define P_LOW PARAM_U64(0)
    #define P_HIGH PARAM_U64(2)
    #define P_CI_LOW PARAM_U64(4)
    #define P_CI_HIGH PARAM_U64(6)
    #define P_FLAGS PARAM_UINT(8)
#else
    #define WORD_T uint
    #define QUARTER (ELEM_T(1) << 30)
    #define P_LOW PARAM_UINT(0)
    #define P_HIGH PARAM_UINT(1)
    #define P_FLAGS PARAM_UINT(2)
    #define P_CI_LOW PARAM_UINT(3)
    #define P_CI_HIGH PARAM_UINT(4)
#endif
bool above_zero(ELEM_T x, ELEM_T y) {  // is the exact x - ci >= 1? (cf != 0 implies |ci| < 2^23)
#ifdef DTYPE_SIGNED
    return x >= QUARTER || (x > -QUARTER && y >= ELEM_T(1));
#else
    return x >= QUARTER || SIGNED_T(y) >= SIGNED_T(1);
#endif
}
bool below_zero(ELEM_T x, ELEM_T y) {  // is the exact x - ci <= -1?
#ifdef DTYPE_SIGNED
    return x <= -QUARTER || (x < QUARTER && y <= ELEM_T(-1));
#else
    return x < QUARTER && SIGNED_T(y) <= SIGNED_T(-1);
#endif
}
ELEM_T minus(ELEM_T x, WORD_T ci, uint cf_sign) {
    ELEM_T y = x - ELEM_T(ci);
    if (cf_sign == 1u && above_zero(x, y)) return y - ELEM_T(1);
    if (cf_sign == 2u && below_zero(x, y)) return y + ELEM_T(1);
    return y;
}
ELEM_T activate(ELEM_T x) {
    uint flags = P_FLAGS;
    bool low = (flags & 1u) != 0u || ((flags & 2u) == 0u && x <= ELEM_T(P_LOW));
    bool high = (flags & 4u) != 0u || ((flags & 8u) == 0u && x >= ELEM_T(P_HIGH));
    if (low) return minus(x, P_CI_LOW, (flags >> 4) & 3u);
    if (high) return minus(x, P_CI_HIGH, (flags >> 6) & 3u);
    return ELEM_T(0);
}
#endif
