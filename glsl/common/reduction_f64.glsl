// FLOAT64 rows for reduction.glsl (included there for DTYPE_F64): the numerics on f64math.glsl and,
// for the softmax family, the (m, s) state in double. The same algorithm as the float state (see
// reduction.glsl: a running maximum, the sum of exp(x - m) without the designated maximum's exact 1,
// a Kahan compensation), with these error terms, in ulp of double:
//  - each term exp(x - m) is within 1 ulp (exp_hl_d, x - m carried exactly as two_diff_d's d + dl:
//    rounding x - m alone would cost |x - m| / 2 ulp, 350 ulp far below the maximum);
//  - the terms are positive, so the compensated sum s is within about 1 ulp of their exact sum
//    (rescalings by exp(m_old - m_new) when the maximum grows add one rounding per rescaling, each a
//    relative 2^-53 of the part already summed);
//  - softmax: exp(x - m) / (1 + s), one division: below 3 ulp in the worst case, measured 2;
//  - log-softmax: (x - m) - log1p(s) has both terms <= 0 (no cancellation): x - m exactly as d + dl,
//    log1p_d (1 ulp) of s whose relative error it does not amplify (s / ((1 + s) log1p(s)) <= 1).
#ifndef VKACT_REDUCTION_F64
#define VKACT_REDUCTION_F64
#include "f64math.glsl"

// e^(x + lo) for x <= 0 with lo its low part (two_diff_d's): exp_hl_d; 0 at -inf, NaN stays NaN. An
// infinite x (from an infinite operand of two_diff_d) comes with a NaN lo, which is not used.
double exp_nonpos_d(double x, double lo) {
    return isnan(x) ? x : (isinf(x) ? 0.0 : exp_hl_d(x, lo));
}

// e^(x - m) for x <= m, x - m carried in two parts.
double exp_minus_d(double x, double m) {
    double lo;
    double d = two_diff_d(x, m, lo);
    return exp_nonpos_d(d, lo);
}

#ifndef REDUCE_ARGMAX
#define STATE_T dvec2
#define ACC_T dvec3
ACC_T acc_empty() { return dvec3(-1.7976931348623157e308, -1.0, 0.0); }
// Branch-free (selects), as the float one.
void acc_add(inout ACC_T a, double v, uint i) {
    double dl;
    double d = two_diff_d(v, a.x, dl);
    bool up = d > 0.0;                                       // a new maximum
    double e = exp_nonpos_d(up ? -d : d, up ? -dl : dl);     // exp(x - m), or exp(m - x) for a new one
    precise double y = e - a.z;
    precise double t = a.y + y;
    precise double c = (t - a.y) - y;
    precise double grown = (1.0 + a.y) * e;
    precise double carried = a.z * e;
    a = up ? dvec3(v, grown, carried) : dvec3(a.x, t, c);
}
STATE_T acc_state(ACC_T a) {
    precise double s = a.y - a.z;
    return dvec2(a.x, s);
}
STATE_T state_empty() { return acc_state(acc_empty()); }   // combine()'s identity
// The sum's bits as one ordered key, for the deterministic tie-break below.
bool bits_above(double b, double a) {
    uvec2 ub = unpackDouble2x32(b), ua = unpackDouble2x32(a);
    return ub.y > ua.y || (ub.y == ua.y && ub.x > ua.x);
}
STATE_T combine(STATE_T a, STATE_T b) {
    // Symmetric and deterministic, as the float one: every lane of a butterfly ends with the same bits.
    bool swap = b.x > a.x || (b.x == a.x && bits_above(b.y, a.y));
    dvec2 hi = swap ? b : a;
    dvec2 lo = swap ? a : b;
    double dl;
    double d = two_diff_d(lo.x, hi.x, dl);
    precise double s = hi.y + (1.0 + lo.y) * exp_nonpos_d(d, dl);
    return dvec2(hi.x, s);
}
#endif

#endif
