// Numerically careful building blocks shared by the formulas. Vulkan's precision rules let exp/tanh
// be loose near zero (tanh may be computed as a ratio of exps), so the formulas call these instead.
#ifndef VKACT_NUMERICS
#define VKACT_NUMERICS

float copysign_f(float magnitude, float sign_of) {
    return uintBitsToFloat((floatBitsToUint(magnitude) & 0x7fffffffu) | (floatBitsToUint(sign_of) & 0x80000000u));
}


// ---- Building blocks of the exp/log/erf-based activations --------------------------------------
// fma() is not fused on every device (lavapipe computes a * b + c with two roundings), and the
// compiler may reassociate float arithmetic, so exact products are built from bit-masked halves:
// nothing here relies on a fused fma or on an expression surviving the optimizer as written.

// x truncated to its 12 leading significand bits: the product of two such heads, or of a head and a
// remainder x - head_f(x) (exact, at most 12 bits), is exact in fp32. A bit mask, not Veltkamp's
// x * 4097 splitting, which reassociation would fold away. NaN stays NaN (quiet NaNs keep bit 22).
float head_f(float x) {
    return uintBitsToFloat(floatBitsToUint(x) & 0xfffff000u);
}

// a * x + b rounded about once, as a fused fma would give it, for a = ah + al split on the host
// (ah = head_f(a)): Dekker's exact product a * x = p + e, then (p + b) + e. Where a * x and b cancel,
// p + b is exact (Sterbenz) and the result is within an ulp; plain a * x + b would keep the absolute
// error of a * x, any number of ulp of a result near 0.
float mul_add_f(float x, float a, float ah, float al, float b) {
    float xh = head_f(x);
    // precise: each step is exact only as written (the optimizer would happily factor ah out).
    precise float xl = x - xh;
    precise float p = a * x;
    precise float e = ((ah * xh - p) + ah * xl + al * xh) + al * xl;
    precise float s = p + b;
    precise float t = s + e;
    return isnan(t) ? s : t;  // x or a * x infinite: e is NaN or inf - inf; s is right
}

// exp(r) - 1 for |r| <= 0.41 by a degree-6 minimax polynomial for exp (relative error 2^-26.6 with
// its fp32 coefficients) in Estrin's order. Callers add the 1 themselves, where it costs least.
float exp_poly_f(float r) {
    float r2 = r * r;
    float a = fma(r, 0.16666382551193237, 0.4999998211860657);
    float b = fma(r, 0.008382739499211311, 0.04167002812027931);
    float q = fma(r2, fma(r2, 0.0013785195769742131, b), a);
    return fma(r2, q, r);
}

// exp(hi + lo) = 2^k * (1 + p) for |lo| <= 2^-11 |hi|: k = round(hi / ln2), r = hi - k ln2 + lo with
// ln2 in two parts (k * ln2_hi is exact, and so is hi - k * ln2_hi), p = exp_poly_f(r) (|r| <= 0.41
// leaves room for lo and a k rounded either way); returns p. hi = NaN gives p = NaN; |hi| beyond
// the callers' ranges gives garbage that the callers select away.
// The reduction is written with precise products and differences: as plain fma()s (and precise
// does not reach inside GLSL's fma) the optimizer refactors k * ln2_lo + (k * ln2_hi + x) into
// k * (ln2_lo + ln2_hi) + x, which is off by up to 60 ulp at |x| = 80 (measured on lavapipe).
float exp_core_f(float hi, float lo, out float k) {
    k = roundEven(hi * 1.44269504);
    precise float r = hi - k * 0.693145752;
    precise float rl = r + lo;
    precise float rr = rl - k * 1.42860677e-6;
    return exp_poly_f(rr);
}

// exp_core_f(x, 0, k) without the add of 0 (which precise keeps).
float exp_core_f(float x, out float k) {
    k = roundEven(x * 1.44269504);
    precise float r = x - k * 0.693145752;
    precise float rr = r - k * 1.42860677e-6;
    return exp_poly_f(rr);
}

// 2^k for an integral k in [-127, 127] (0 at -127): k's bits from k + 1.5 * 2^23.
float exp2_int_f(float k) {
    return uintBitsToFloat((floatBitsToUint(k + 12582912.0) + 127u) << 23);
}

// exp(x) - 1 for x <= 0 (every caller's range: ELU's, CELU's and SCALED_ELU's negative branch, tanh's
// -2|x|) to a few ulp, branch-free (exp(x) - 1 would cancel near zero): x = k ln2 + r (exp_core_f's
// precise reduction: lavapipe's fma is not fused and the compiler regroups plain float math), expm1(r)
// = p by exp_poly_f, then 2^k (1 + p) - 1 = fma(2^k, p, 2^k - 1), exact for k = 0. k <= 0, so nothing
// overflows; the clamp at -87 keeps 2^k normal and is a select, which keeps NaN (GLSL's clamp may drop
// it): NaN gives NaN through p. For x > 0 the result is garbage, which the callers select away.
// (A version for the whole range guarded k = 128 and NaN apart: measured on llvmpipe, ELU, CELU,
// SCALED_ELU, TANH and SCALED_TANH spent 9-11% more CPU time with it, for the same bits where x <= 0.)
float expm1_nonpositive_f(float x) {
    float k;
    float p = exp_core_f(x < -87.0 ? -87.0 : x, k);
    float s = exp2_int_f(k);
    return fma(s, p, s - 1.0);
}

// a * (exp(hi + lo) - 1) for any normal a (|lo| <= 2^-11 |hi|: an argument carried as head and tail,
// see exp_core_f), also where exp alone overflows but the product is a float (|a| < 1, hi up to
// 88.72 + ln(1 / |a|) <= 176): a is folded into 2^k exactly, as a * 2^min(k, 127) * 2^max(k - 128, 0),
// before the multiply by 1 + p; the last factor 2 (k >= 128) comes after it.
float scaled_expm1_f(float hi, float lo, float a) {
    float k;
    float p = exp_core_f(clamp(hi, -87.0, 176.0), lo, k);
    bool top = k > 127.0;
    float as = a * exp2_int_f(min(k, 127.0)) * exp2_int_f(max(k - 128.0, 0.0));
    float result = fma(as, p, as - (top ? 0.5 * a : a)) * (top ? 2.0 : 1.0);
    result = isinf(as) ? as : result;           // already overflowed: inf * p + inf could be NaN
    return isnan(hi) ? hi : result;
}

// tanh to a few ulp: -expm1(-2|x|) / (2 + expm1(-2|x|)) has no cancellation near zero and saturates
// to exactly 1; the sign of x (and of zero) is restored at the end.
float tanh_f(float x) {
    float e = expm1_nonpositive_f(-2.0 * abs(x));
    return copysign_f(-e / (2.0 + e), x);
}

// exp(x) to about 1 ulp (2 at most) for x <= 0, and 0 where the result would be subnormal (below
// 2^-126; D3D12 lets fp32 flush those). exp(-inf) = 0, NaN stays NaN.
float exp_neg_f(float x) {
    float k;
    float m = 1.0 + exp_core_f(x, k);
    return x < -88.0 ? 0.0 : exp2_int_f(k) * m;  // exact scaling; k >= -127 above -88
}

// exp(hi + lo) * 2^b for hi <= 0, with b = 64 below hi = -80 (b = 0 above) and unscale = 2^-b: a
// result down to 2^-160 stays a normal number until the caller has multiplied it by whatever makes
// the final value normal again (x * sigmoid(x) near x = -90), then multiplies by unscale.
float exp_neg_scaled_f(float hi, float lo, out float unscale) {
    float k;
    float m = 1.0 + exp_core_f(hi, lo, k);
    bool deep = hi < -80.0;
    unscale = deep ? 5.421010862427522e-20 : 1.0;  // 2^-64
    return hi < -120.0 ? 0.0 : exp2_int_f(deep ? k + 64.0 : k) * m;
}

// exp(hi + lo) * 2^64 for hi <= 0 (|lo| <= 2^-11 |hi|): a normal number down to exp(hi + lo) = 2^-190,
// for a caller that multiplies the result by something large before it scales it back; 0 below -120.
float exp_neg_x2p64_f(float hi, float lo) {
    float k;
    float m = 1.0 + exp_core_f(hi, lo, k);
    return hi < -120.0 ? 0.0 : exp2_int_f(k + 64.0) * m;
}

// log1p(y) / y - 1 for y in [0, 1], so that log1p(y) = y + y * log1p_tail_f(y) with one rounding
// that matters: y * (c2 + c3 y + ... + c10 y^8), a minimax fit of relative error 2^-27.5 on [0, 1]
// with its coefficients rounded to fp32 one at a time (each refit after the previous was rounded).
float log1p_tail_f(float y) {
    float y2 = y * y;
    float y4 = y2 * y2;
    float q01 = fma(y, 0.33330464363098145, -0.4999993145465851);
    float q23 = fma(y, 0.19692102074623108, -0.24958018958568573);
    float q45 = fma(y, 0.10661128163337708, -0.15344880521297455);
    float q67 = fma(y, 0.020086241886019707, -0.05745723098516464);
    float q47 = fma(y2, fma(y2, -0.003290468594059348, q67), q45);
    return y * fma(y4, q47, fma(y2, q23, q01));
}

// scale * log(1 + exp(s * x)) for DirectML's SOFTPLUS (scale = 1 / s) and PARAMETRIC_SOFTPLUS, as
// slope * max(x, 0 in the sign of s) + scale * log1p(exp(-|s x|)), slope = s * scale from the host (1
// for SOFTPLUS), so that the linear part cannot overflow where s * x would. -|s x| goes to exp as an
// exact head and tail (nsh = -head_f(|s|), nsl = -(|s| - head_f(|s|)) from the host): exp's relative
// error is |s x| times that of its argument, so a rounded s * x would cost up to 40 ulp near the
// underflow. log1p(exp(-|s x|)) stays scaled by 2^64 until it is multiplied by scale: (l * f1) * f2
// with f1 * f2 = scale * 2^-64, f1 = scale * 2^-64 and f2 = 1 for |scale| >= 1, else f1 = scale and
// f2 = 2^-64 (host), so that a large scale (PARAMETRIC_SOFTPLUS's Alpha, 1 / Steepness below 1) still
// lifts a tail below the normal range, and no step overflows or flushes early.
float softplus_f(float x, float s, float nsh, float nsl, float slope, float f1, float f2) {
    float a = abs(x);
    float ah = head_f(a);
    float al = a - ah;
    float e = exp_neg_x2p64_f(nsh * ah, fma(nsh, al, nsl * a));  // exp(-|s x|) * 2^64
    float l = fma(e, log1p_tail_f(e * 5.421010862427522e-20), e);  // log1p(exp(-|s x|)) * 2^64
    return fma(s * x > 0.0 ? x : 0.0, slope, (l * f1) * f2);
}

// min(max(t, 0), 1) that keeps NaN (GLSL's min and max may drop it).
float clamp_unit_f(float t) {
    return t >= 1.0 ? 1.0 : (t <= 0.0 ? 0.0 : t);
}

#endif
