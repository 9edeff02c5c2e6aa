#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: the same formula as celu.comp's (alpha_expm1_quotient_d serves either sign of Alpha).
double activate(double x) {
    return x > 0.0 ? x : alpha_expm1_quotient_d(x, PARAM_F64(0));
}
#else
// DML_ACTIVATION_CELU_OPERATOR_DESC for Alpha < 0 (Celu.kernel picks it). PARAM(0) = Alpha,
// PARAM(1) = 1 / Alpha, PARAM(2), PARAM(3) = Alpha's head and tail. x / Alpha > 0 for x < 0, and exp
// amplifies the quotient's rounding |x / Alpha|-fold: its tail (x - y Alpha) / Alpha, with y Alpha
// formed exactly, joins the argument; Alpha is folded into 2^k before exp can overflow.
float activate(float x) {
    float y = x * PARAM(1);
    float tail = mul_add_f(y, -PARAM(0), -PARAM(2), -PARAM(3), x) * PARAM(1);
    return x > 0.0 ? x : scaled_expm1_f(y, tail, PARAM(0));
}
#endif
