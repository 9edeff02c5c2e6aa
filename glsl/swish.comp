#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = s. s x = zh + zl exactly (two_prod_d: sigmoid's relative error is up to |s x|
// times its argument's), then x / (1 + exp(-s x)) by over_1p_exp_d (below 2 ulp; x exp(s x) is never
// formed, so nothing underflows early where x is large). Where sigmoid is 0 (s x = -inf) the result
// is 0, also for an infinite x.
double activate(double x) {
    if (isnan(x)) return x;
    double zl;
    double zh = two_prod_d(PARAM_F64(0), x, zl);
    if (isnan(zh)) return zh;                              // s = 0 and x infinite: 0 * inf
    zl = abs(zh) > 1500.0 ? 0.0 : zl;                      // NaN where the product overflowed; irrelevant there
    if (isinf(x) && zh < 0.0) return 0.0;
    return over_1p_exp_d(x, -clamp(zh, -1600.0, 1600.0), -zl);
}
#else
// DML_ACTIVATION_SWISH_OPERATOR_DESC { SigmoidInputScale }: x * sigmoid(s * x), s = SigmoidInputScale.
// PARAM(0..2) = s, -head_f(|s|), -(|s| - head_f(|s|)): exp(-|s x|) from an exact head and tail (as in
// softplus_f). With e = exp(-|s x|): x / (1 + e) where s x >= 0, x * e / (1 + e) where s x < 0,
// the latter scaled by 2^64 below the normal range so that x * e survives until it is normal again
// (x * sigmoid(x) is normal down to x = -91.8, where exp(x) is not). Where sigmoid is 0 the result
// is 0 even for an infinite x (x is clamped to the finite range there); NaN stays NaN.
float activate(float x) {
    float a = abs(x);
    float ah = head_f(a);
    float al = a - ah;
    float unscale;
    float e = exp_neg_scaled_f(PARAM(1) * ah, fma(PARAM(1), al, PARAM(2) * a), unscale);  // * 2^b
    float d = 1.0 + e * unscale;
    bool positive = PARAM(0) * x >= 0.0;
    float n = positive ? x : clamp(x, -3.40282347e38, 3.40282347e38) * e;
    return (n / d) * (positive ? 1.0 : unscale);
}
#endif
