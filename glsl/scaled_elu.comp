#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = Alpha, PARAM_F64(2) = Gamma: Gamma * x, or (Gamma * Alpha) * expm1(x), Gamma *
// Alpha exact (both are float32 values): expm1_d's 1 ulp and one product, also for a subnormal x.
double activate(double x) {
    precise double ga = PARAM_F64(2) * PARAM_F64(0);
    return x > 0.0 ? PARAM_F64(2) * x : ga * expm1_d(x);
}
#else
// DML_ACTIVATION_SCALED_ELU_OPERATOR_DESC { Alpha, Gamma }: Gamma * x if x > 0, else
// Gamma * (Alpha * exp(x) - Alpha) = (Gamma * Alpha) * expm1(x), without the cancellation near 0.
// PARAM(0) = Gamma, PARAM(1) = Gamma * Alpha (from the host). NaN takes the second branch and stays NaN.
float activate(float x) {
    return x > 0.0 ? PARAM(0) * x : PARAM(1) * expm1_nonpositive_f(x);
}
#endif
