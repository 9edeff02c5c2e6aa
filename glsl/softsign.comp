#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: as the float formula below (1 + |x| and the quotient: 1 ulp).
double activate(double x) {
    return isinf(x) ? sign(x) : x / (1.0 + abs(x));
}
#else
// DML_ACTIVATION_SOFTSIGN_OPERATOR_DESC: x / (1 + |x|); from |x| = 2^24 on, 1 + |x| rounds to |x| and
// the quotient is exactly +-1, which is returned directly: +-inf included (rather than inf / inf), and
// a GPU whose division is x * (1 / y) never sees 1 / y underflow to 0 (NVIDIA's gave SOFTSIGN(3e38) = 0
// on an H200). NaN fails the comparison and stays NaN.
float activate(float x) {
    return abs(x) >= 16777216.0 ? sign(x) : x / (1.0 + abs(x));
}
#endif
