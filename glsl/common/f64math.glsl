// Double-precision exp, expm1, log, log1p and tanh, for the FLOAT64 formulas (f64activation.glsl
// builds the operators' pieces on them).
// GLSL.std.450's transcendental instructions are 16/32-bit only; doubles have +, -, *, /, sqrt, floor
// and bit access, so these are written out: fdlibm's (Sun's freely distributable libm) kernels for
// exp, expm1 and log1p, whose polynomials and error bounds (< 1 ulp each) are published with them,
// ported to branch on the same ranges; tanh on a polynomial of its own below 1; the scaling and the
// exact splitting the operators need.
//
// Two device facts shape every line (both hold for float too, see numerics.glsl):
//  - fma(a, b, c) need not be fused (lavapipe rounds a * b, then the sum: measured on doubles too), and
//  - the optimizer reassociates and contracts arithmetic unless the result is `precise`.
// So every expression whose rounding is part of the analysis is `precise` (which also forbids
// contracting a * b + c into an fma: the result is the same on every device), and exact products are
// built by splitting (two_prod_d), never by a fused fma. Double denormals are kept by lavapipe (measured:
// 2^-1022 * 0.5 = 2^-1023), and results in the subnormal range are formed by one final multiply by a
// power of two, so they are rounded once. (Vulkan lets a device flush double denormals unless it
// reports shaderDenormPreserveFloat64: such a device would give 0 or a flushed input there.)
//
// Error analysis, in ulp of the double result (u = 2^-53): fdlibm's kernels are < 1 ulp each (their
// polynomial errors are below 2^-57 or so; the rest is the last few roundings). What these functions
// add is said beside each. Measured against mpmath (tests/glsl/test_f64math.py, lavapipe): exp, expm1,
// log, log1p, tanh 1 ulp at worst; gelu_d 2.
#ifndef VKACT_F64MATH
#define VKACT_F64MATH

// ---- bits and powers of two ---------------------------------------------------------------------

// 2^n for an integer n in [-1022, 1023], from its bits.
double pow2_d(int n) {
    return packDouble2x32(uvec2(0u, uint(n + 1023) << 20));
}

// y * 2^n for |y| in [2^-100, 2^100] and any integer n, rounded once: n (clamped to [-2044, 2046],
// beyond which the result is 0 or inf anyway) is split in two halves, the first multiply is exact (the
// intermediate y 2^(n/2) stays normal), the second rounds, into the subnormal range or to inf where
// it must.
double ldexp_wide_d(double y, int n) {
    int m = clamp(n, -2044, 2046);
    int n1 = m >> 1;                // floor(m / 2) in [-1022, 1023]
    precise double t = y * pow2_d(n1);
    precise double r = t * pow2_d(m - n1);
    return r;
}

// x truncated to its 26 leading significand bits (the low 27 stored bits cleared): the product of
// two such heads is exact, and so is a head times a tail x - head_d(x) (at most 27 bits). A mask, not
// Veltkamp's splitting, so that no optimizer can fold it away.
double head_d(double x) {
    uvec2 b = unpackDouble2x32(x);
    return packDouble2x32(uvec2(b.x & 0xf8000000u, b.y));
}

// a * b = p + e with p = fl(a * b) (Dekker's product with masked halves). e is exact but for the
// tail * tail term (up to 54 bits, rounded: an error below 2^-104 |a b|), which is far below what any
// caller needs. Finite a * b without overflow; |a b| above 2^-969 so that e is not subnormal garbage
// (callers use it where the product's relative error would be amplified, i.e. large products).
double two_prod_d(double a, double b, out double e) {
    double ah = head_d(a), bh = head_d(b);
    precise double al = a - ah;
    precise double bl = b - bh;
    precise double p = a * b;
    precise double err = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
    e = err;
    return p;
}

// a - b = d + e exactly (Knuth's TwoSum), for finite a and b.
double two_diff_d(double a, double b, out double e) {
    precise double d = a - b;
    precise double t = d - a;
    precise double err = (a - (d - t)) + (-b - t);
    e = err;
    return d;
}

// ---- exp ------------------------------------------------------------------------------------------

// exp(a + b) = m * 2^k for a in [-2100, 2100] and |b| <= 2^-40 |a| (or |b| <= 2^-40): fdlibm's e_exp.c
// kernel. k = round(a / ln2); hi = a - k ln2_hi is exact (ln2_hi has 32 significant bits, |k| < 2^12,
// and hi is small against a: Sterbenz; 2^k itself is the caller's to form), lo = k ln2_lo - b (rounded: an error below 2^-53 * 2^-20,
// relative to e^r an absolute error of that order: nothing), r = hi - lo in [-0.35, 0.35]; then
// e^r = 1 - ((lo - r c / (2 - c)) - hi) with c = r - r^2 P(r^2), P of degree 5 (error below 2^-59).
// m is in [0.7, 1.42] with a relative error below 1 ulp (fdlibm's bound for exp, whose last step is
// this m times an exact power of two).
double exp_parts_d(double a, double b, out int k) {
    double kd = roundEven(a * 1.44269504088896338700e+00);
    precise double hi = a - kd * 6.93147180369123816490e-01;
    precise double lo = kd * 1.90821492927058770002e-10 - b;
    precise double r = hi - lo;
    precise double t = r * r;
    precise double c = r - t * (1.66666666666666019037e-01 + t * (-2.77777777770155933842e-03 + t * (6.61375632143793436117e-05
                         + t * (-1.65339022054652515390e-06 + t * 4.13813679705723846039e-08))));
    precise double m = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    k = int(kd);
    return m;
}

// exp(a + b), the argument in two parts (|b| <= 2^-40 |a|, see exp_parts_d): < 1 ulp (one rounding
// after exp_parts_d's, for results in the subnormal range half an ulp of 2^-1074 more), 0 below
// -745.13, inf above 709.78, NaN stays NaN (a = NaN: b may be anything).
double exp_hl_d(double a, double b) {
    int k;
    double m = exp_parts_d(clamp(a, -2100.0, 710.0), b, k);
    double r = ldexp_wide_d(m, k);
    return isnan(a) ? a : (a > 710.0 ? 1.0 / 0.0 : r);
}

double exp_d(double x) {
    return exp_hl_d(x, 0.0);
}

// ---- expm1 ----------------------------------------------------------------------------------------

// exp(x) - 1: fdlibm's s_expm1.c (< 1 ulp), branch for branch. x = k ln2 + r (hi - lo, with the
// correction c of the rounded hi - lo), expm1(r) by a rational form of r / 2 whose polynomial is of
// degree 5 in r^2 / 4 (error below 2^-61), then 2^k (1 + expm1(r)) - 1 arranged per k so that no
// step cancels. -1 below -56 ln2 (where e^x < 2^-57), inf above 709.78, x for |x| < 2^-54 (-0 kept),
// NaN stays NaN.
double expm1_d(double x) {
    if (isnan(x)) return x;
    if (x > 709.782712893383973096) return 1.0 / 0.0;
    if (x < -38.816242111356935) return -1.0;               // -56 ln2: exp(x) below 2^-57 of 1
    double ax = abs(x);
    if (ax < 5.551115123125783e-17) return x;               // 2^-54
    double hi, lo, c = 0.0;
    int k = 0;
    precise double xr = x;
    if (ax > 0.34657359027997264) {                          // 0.5 ln2
        double kd;
        if (ax < 1.0397207708399179) {                       // 1.5 ln2: k = +-1
            kd = x > 0.0 ? 1.0 : -1.0;
        } else {
            kd = roundEven(x * 1.44269504088896338700e+00);
        }
        precise double h = x - kd * 6.93147180369123816490e-01;   // exact, as in exp_parts_d
        precise double l = kd * 1.90821492927058770002e-10;
        precise double rr = h - l;
        precise double cc = (h - rr) - l;
        hi = h; lo = l; xr = rr; c = cc;
        k = int(kd);
    }
    precise double hfx = 0.5 * xr;
    precise double hxs = xr * hfx;
    precise double r1 = 1.0 + hxs * (-3.33333333333331316428e-02 + hxs * (1.58730158725481460165e-03 + hxs * (-7.93650757867487942473e-05
                           + hxs * (4.00821782732936239552e-06 + hxs * -2.01099218183624371326e-07))));
    precise double t = 3.0 - r1 * hfx;
    precise double e = hxs * ((r1 - t) / (6.0 - xr * t));
    if (k == 0) {
        precise double y0 = xr - (xr * e - hxs);
        return y0;
    }
    precise double e2 = (xr * (e - c) - c) - hxs;
    if (k == -1) {
        precise double y1 = 0.5 * (xr - e2) - 0.5;
        return y1;
    }
    if (k == 1) {
        precise double ylo = -2.0 * (e2 - (xr + 0.5));
        precise double yhi = 1.0 + 2.0 * (xr - e2);
        return xr < -0.25 ? ylo : yhi;
    }
    if (k <= -2 || k > 56) {
        precise double y = 1.0 - (e2 - xr);
        precise double ys = ldexp_wide_d(y, k) - 1.0;         // exact scaling (k <= 1024), then - 1
        return ys;
    }
    if (k < 20) {
        precise double t1 = 1.0 - pow2_d(-k);                // exact
        precise double y = t1 - (e2 - xr);
        precise double ys = y * pow2_d(k);
        return ys;
    }
    precise double y = xr - (e2 + pow2_d(-k));
    precise double y2 = (y + 1.0) * pow2_d(k);
    return y2;
}

// ---- log and log1p --------------------------------------------------------------------------------

// log(2^k (1 + f)) + c for f in [sqrt(1/2) - 1, sqrt(2) - 1), with c a small correction (the part of
// 1 + x that rounding dropped, divided by 1 + x): fdlibm's kernel of s_log1p.c (< 1 ulp). s = f / (2 + f),
// log(1 + f) = 2s + s R(s^2) written as f - (hfsq - s (hfsq + R)), R of degree 7 in s^2 (error below
// 2^-58.45), k ln2 in two parts (z2; the shorter z1 where k = 0 and c = 0). hu_zero: |f| < 2^-20, where a short series suffices.
double log_kernel_d(double f, int k, double c, bool hu_zero) {
    double dk = double(k);
    precise double hfsq = 0.5 * f * f;
    if (hu_zero) {
        if (f == 0.0) {
            precise double z0 = dk * 6.93147180369123816490e-01 + (c + dk * 1.90821492927058770002e-10);
            return k == 0 ? 0.0 : z0;
        }
        precise double R0 = hfsq * (1.0 - 0.66666666666666666 * f);
        precise double z1 = f - R0;
        precise double z2 = dk * 6.93147180369123816490e-01 - ((R0 - (dk * 1.90821492927058770002e-10 + c)) - f);
        return k == 0 && c == 0.0 ? z1 : z2;
    }
    precise double s = f / (2.0 + f);
    precise double z = s * s;
    precise double R = z * (6.666666666666735130e-01 + z * (3.999999999940941908e-01 + z * (2.857142874366239149e-01
                        + z * (2.222219843214978396e-01 + z * (1.818357216161805012e-01 + z * (1.531383769920937332e-01
                        + z * 1.479819860511658591e-01))))));
    precise double z1 = f - (hfsq - s * (hfsq + R));
    precise double z2 = dk * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + R) + (dk * 1.90821492927058770002e-10 + c))) - f);
    return k == 0 && c == 0.0 ? z1 : z2;   // fdlibm drops c for k = 0, which costs 2 ulp at x = -0.29289...
}

// u (positive, finite, normal) as 2^k (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)): f exact. Returns f;
// hu_zero says |f| < 2^-20 (fdlibm's test on the high word).
double log_reduce_d(double u, out int k, out bool hu_zero) {
    uvec2 b = unpackDouble2x32(u);
    k = int(b.y >> 20) - 1023;
    uint hu = b.y & 0x000fffffu;
    double m;
    if (hu < 0x6a09eu) {
        m = packDouble2x32(uvec2(b.x, hu | 0x3ff00000u));
    } else {
        k += 1;
        m = packDouble2x32(uvec2(b.x, hu | 0x3fe00000u));
        hu = (0x00100000u - hu) >> 2;
    }
    hu_zero = hu == 0u;
    precise double f = m - 1.0;
    return f;
}

// log(1 + x): fdlibm's s_log1p.c (< 1 ulp). -inf at -1, NaN below it and for NaN, inf at inf, x itself
// for |x| < 2^-54 (subnormals and -0 kept).
double log1p_d(double x) {
    uvec2 b = unpackDouble2x32(x);
    uint ax = b.y & 0x7fffffffu;
    if (isnan(x) || x < -1.0) return uintBitsToFloat(0x7fc00000u);  // float NaN widens to a double NaN
    if (x == -1.0) return -1.0 / 0.0;
    if (isinf(x)) return x;
    if (ax < 0x3e200000u) {                                  // |x| < 2^-29
        precise double y = x - x * x * 0.5;
        return ax < 0x3c900000u ? x : y;                     // |x| < 2^-54: x
    }
    if (x < 0.41421356237309503 && x > -0.2928932188134524) {   // 1 + x in (sqrt(1/2), sqrt(2)): k = 0
        return log_kernel_d(x, 0, 0.0, false);
    }
    int k;
    bool hu_zero;
    double f, c;
    if (x < 9007199254740992.0) {                            // 2^53: 1 + x rounds, keep the correction
        precise double u = 1.0 + x;
        f = log_reduce_d(u, k, hu_zero);
        precise double cp = 1.0 - (u - x);
        precise double cn = x - (u - 1.0);
        precise double cq = (u >= 2.0 ? cp : cn) / u;  // fdlibm's test of the exponent of u
        c = cq;
    } else {
        f = log_reduce_d(x, k, hu_zero);
        c = 0.0;
    }
    return log_kernel_d(f, k, c, hu_zero);
}

// log(x): the same kernel on x = 2^k (1 + f) (< 1 ulp, as fdlibm's e_log.c, which shares it);
// subnormals are scaled by 2^54 first. -inf at +-0, NaN below 0 and for NaN, inf at inf.
double log_d(double x) {
    if (isnan(x) || x < 0.0) return uintBitsToFloat(0x7fc00000u);
    if (x == 0.0) return -1.0 / 0.0;
    if (isinf(x)) return x;
    bool sub = x < 2.2250738585072014e-308;
    precise double xs = x * 18014398509481984.0;              // 2^54, exact
    int k;
    bool hu_zero;
    double f = log_reduce_d(sub ? xs : x, k, hu_zero);
    return log_kernel_d(f, sub ? k - 54 : k, 0.0, hu_zero);
}

// ---- tanh -----------------------------------------------------------------------------------------

// tanh(x). |x| < 1: x + x^3 P(x^2), P of degree 16 in s = x^2, the truncated Chebyshev series of
// (tanh(x) - x) / x^3 on s in [0, 1] in powers of s (scripts/f64math_coefficients.py; truncation below 2^-59;
// tanh's poles at +-i pi / 2 leave the coefficients decreasing, so Horner's rule is stable); the
// correction is at most 0.31 of the result (at x = 1), so its roundings count for less than a third
// and the result is within about 0.7 ulp (measured: 1 ulp at worst). fdlibm's -t / (t + 2) with
// t = expm1(-2|x|), which this replaces there, magnified expm1's error up to 1.76-fold (2 ulp).
// 1 <= |x| < 22: fdlibm's s_tanh.c, 1 - 2 / (t + 2) with t = expm1(2|x|) (2|x| exact): the quotient is
// at most 0.27 of 1, so t's 1 ulp and the quotient's rounding leave below 1 ulp after the exact
// subtraction (Sterbenz). +-1 from 22 on, x itself below 2^-55 (-0 kept), NaN stays NaN.
const double TANH_P[17] = double[](
    -0.3333333333333333, 0.1333333333333331, -0.05396825396823286, 0.021869488535341427,
    -0.008863235513349253, 0.0035921278317203402, -0.0014558327094050015, 0.000590017846113261,
    -0.0002390893895924028, 9.679340247406682e-05, -3.899610828768604e-05, 1.5422152957250004e-05,
    -5.783211740971914e-06, 1.9256321021686362e-06, -5.140824043471534e-07, 9.413815546586091e-08,
    -8.60008634867734e-09);

double tanh_d(double x) {
    double ax = abs(x);
    double z;
    if (ax < 2.7755575615628914e-17) {                      // 2^-55
        return x;
    } else if (ax < 1.0) {
        precise double s = ax * ax;
        precise double p = TANH_P[16];
        for (int j = 15; j >= 0; --j) p = p * s + TANH_P[j];
        precise double q = ax + (ax * s) * p;
        z = q;
    } else if (ax < 22.0) {
        double t = expm1_d(2.0 * ax);
        precise double q = 1.0 - 2.0 / (t + 2.0);
        z = q;
    } else {
        z = 1.0;
    }
    return isnan(x) ? x : (x < 0.0 ? -z : z);
}

#endif
