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
// DML_ACTIVATION_SOFTSIGN_OPERATOR_DESC: x / (1 + |x|); +-inf gives +-1 rather than inf / inf.
float activate(float x) {
    return isinf(x) ? sign(x) : x / (1.0 + abs(x));
}
#endif
