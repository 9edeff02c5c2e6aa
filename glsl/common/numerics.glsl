// Numerically careful building blocks shared by the formulas. Vulkan's precision rules let exp/tanh
// be loose near zero (tanh may be computed as a ratio of exps), so the formulas call these instead.
#ifndef VKACT_NUMERICS
#define VKACT_NUMERICS

float copysign_f(float magnitude, float sign_of) {
    return uintBitsToFloat((floatBitsToUint(magnitude) & 0x7fffffffu) | (floatBitsToUint(sign_of) & 0x80000000u));
}

// exp(x) - 1 to about 1 ulp everywhere, branch-free (exp(x) - 1 would cancel near zero):
// x = k ln2 + r with |r| <= ln2/2 (Cody-Waite), expm1(r) by its Taylor polynomial to r^7 evaluated in
// Estrin's order (shorter dependency chains than Horner's), then
// 2^k * (expm1(r) + 1) - 1 = 2^k * expm1(r) + (2^k - 1), exact for k = 0.
float expm1_f(float x) {
    float t = clamp(x, -87.0, 88.0);
    // k = round(t / ln2); 2^k is built from the bits of k + 1.5 * 2^23 (an exact sum that holds k in
    // its low mantissa bits), so k and 2^k always agree.
    float k = roundEven(t * 1.44269504);
    uint kb = floatBitsToUint(k + 12582912.0);
    float r = fma(k, -0.693145752, t);           // ln2 in two parts: k * hi is exact
    r = fma(k, -1.42860677e-6, r);
    float r2 = r * r;
    float a = fma(r, 1.0 / 6.0, 0.5);
    float b = fma(r, 1.0 / 120.0, 1.0 / 24.0);
    float c = fma(r, 1.0 / 5040.0, 1.0 / 720.0);
    float p = fma(r2, fma(r2 * r2, c, fma(r2, b, a)), r);
    float s = uintBitsToFloat((kb + 127u) << 23);  // 2^k, k in [-126, 127]
    float result = fma(s, p, s - 1.0);
    if (isnan(x)) return x;                      // clamp may drop a NaN
    return x > 88.0 ? x * 1e38 : result;         // overflow to inf
}

// tanh to a few ulp: -expm1(-2|x|) / (2 + expm1(-2|x|)) has no cancellation near zero and saturates
// to exactly 1; the sign of x (and of zero) is restored at the end.
float tanh_f(float x) {
    float e = expm1_f(-2.0 * abs(x));
    return copysign_f(-e / (2.0 + e), x);
}

#endif
