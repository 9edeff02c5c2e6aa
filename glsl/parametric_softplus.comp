#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

#if defined(DTYPE_F64)
#include "common/f64activation.glsl"  // only here: its doubles would put Float64 in every variant
// FLOAT64: PARAM_F64(0) = Alpha, PARAM_F64(2) = Beta, z = Beta * x = zh + zl exactly (two_prod_d) and
// l = log1p(exp(-|z|)) = lm 2^le (log1p_exp_neg_d, 2 ulp): Alpha * (zh + (zl + l)) where z > 0 (the
// sum's terms have one sign: half an ulp, a product, and l's error weighed by l / (z + l)), else
// Alpha * l as (am lm) 2^(ae + le), rounded once even below the normal range. Where Beta * x
// overflows, (Alpha * Beta) * x (finite for a small Alpha).
double activate(double x) {
    double alpha = PARAM_F64(0), beta = PARAM_F64(2);
    double zl;
    double zh = two_prod_d(beta, x, zl);
    int le, ae;
    double lm = log1p_exp_neg_d(zh, zl, le);
    double am = frexp_d(alpha, ae);
    precise double q = am * lm;
    double tail = ldexp_wide_d(q, ae + le);
    precise double inner = zh + (zl + ldexp_wide_d(lm, le));
    precise double r = alpha * inner;
    precise double overflowed = (alpha * beta) * x;
    return zh > 0.0 ? (isinf(zh) ? overflowed : r) : tail;
}
#else
// DML_ACTIVATION_PARAMETRIC_SOFTPLUS_OPERATOR_DESC { Alpha, Beta }: Alpha * log(1 + exp(Beta * x)).
// PARAM(0..5) = Beta, -head_f(|Beta|), -(|Beta| - head_f(|Beta|)), Alpha * Beta (the slope where
// Beta * x > 0), and Alpha * 2^-64 in two factors: see softplus_f.
float activate(float x) {
    return softplus_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3), PARAM(4), PARAM(5));
}
#endif
