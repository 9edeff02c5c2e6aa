// FLOAT64 rows of reduction.glsl (DTYPE_F64, REAL_T double): the double exponential that its (max, sum)
// state declares, for softmax.comp and log_softmax.comp to include. The state is the float one's
// algorithm in double (a running maximum, the sum of exp(x - m) without the designated maximum's exact
// 1, a Kahan compensation); its errors, in ulp of double:
//  - each term exp(x - m) is within 1 ulp (exp_hl_d, x - m carried exactly as two_diff's hi + lo:
//    rounding x - m alone would cost |x - m| / 2 ulp, 350 ulp far below the maximum);
//  - the terms are positive, so the compensated sum s stays within about 1 ulp of their exact sum (a
//    rescaling by exp(m_old - m_new) when the maximum grows adds one rounding to the part summed so far);
//  - softmax: exp(x - m) / (1 + s), one division: below 3 ulp in the worst case, 2 measured;
//  - log-softmax: (x - m) - log1p(s), both terms <= 0 (nothing cancels): x - m exactly as hi + lo,
//    log1p_d (1 ulp) of s, whose relative error it does not amplify (s / ((1 + s) log1p(s)) <= 1).
#ifndef VKACT_REDUCTION_F64
#define VKACT_REDUCTION_F64
#include "f64math.glsl"

// e^(x + lo) for x <= 0 with lo its low part (two_diff's): exp_hl_d; 0 at -inf, NaN stays NaN. An
// infinite x (from an infinite operand of two_diff) comes with a NaN lo, which is not used.
double exp_nonpos(double x, double lo) {
    return isnan(x) ? x : (isinf(x) ? 0.0 : exp_hl_d(x, lo));
}

#endif
