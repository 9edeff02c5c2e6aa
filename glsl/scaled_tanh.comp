#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = Alpha, PARAM_F64(2) = Beta. tanh's condition number 2x / sinh(2x) is at most 1,
// so Beta * x's rounding costs at most half an ulp: tanh_d (2 ulp) and Alpha's product, below 3 ulp.
// |Beta x| < 2^-28: tanh(z) = z to 2^-57, and the result is (Alpha Beta) x (Alpha Beta exact: both are
// float32 values), rounded once; Alpha * (Beta * x) would magnify a subnormal Beta * x's rounding.
double activate(double x) {
    double z = PARAM_F64(2) * x;
    precise double small = (PARAM_F64(0) * PARAM_F64(2)) * x;
    return abs(z) < 3.725290298461914e-09 ? small : PARAM_F64(0) * tanh_d(z);
}
#else
// DML_ACTIVATION_SCALED_TANH_OPERATOR_DESC { Alpha, Beta }: Alpha * tanh(Beta * x).
float activate(float x) {
    return PARAM(0) * tanh_f(PARAM(1) * x);
}
#endif
