// The FLOAT64 operators' building blocks on f64math.glsl: the Gaussian tail and GELU, exact
// multiply-add, softplus's log1p(exp(-|z|)), sigmoid's n / (1 + exp(a)), CELU's alpha expm1(x / alpha),
// each with its error analysis (in ulp of the double result, as in f64math.glsl; measured per operator
// by bench/accuracy.py against mpmath).
#ifndef VKACT_F64ACTIVATION
#define VKACT_F64ACTIVATION
#extension GL_GOOGLE_include_directive : require
#include "f64math.glsl"

// ---- the Gaussian tail (GELU) -----------------------------------------------------------------------

// u Phi(-u) e^(u^2 / 2) for u >= 0.5 (Phi the standard normal CDF), by 16 polynomials of degree 13:
// on [0.5, 8) one per interval of width 1/2 in s = 4 (u - midpoint), on [8, inf) one in s = 128 / u^2 - 1
// (the function is smooth in 1 / u^2 there and tends to 1 / sqrt(2 pi)). Each is the truncated Chebyshev
// series of the function (mpmath, 50 digits: scripts/f64math_coefficients.py) in powers of s, its
// truncation error below 2^-60 relative; evaluated by Horner's rule, whose roundings leave about 1 ulp
// (measured: 1.5 * 2^-53 relative at worst, over 3,000 points).
const double GAUSS_TAIL_C[224] = double[](
    0.2251743467549632, 0.04247662802627471, -0.00687831197544108, 0.0008975001273560152, -0.00010122784768533649, 1.0227395201757057e-05, -9.457419952485203e-07, 8.120299172194018e-08, -6.540932020211311e-09, 4.981291719510187e-10, -3.608001769216821e-11, 2.4980289190154826e-12, -1.6829544424921117e-13, 1.0765847547468628e-14,
    0.2884504016320397, 0.023161368210972644, -0.003286778640122583, 0.00038141998158012564, -3.867611894162881e-05, 3.542429778341476e-06, -2.989499356812077e-07, 2.355433090207764e-08, -1.7491051859687833e-09, 1.2328543266006965e-10, -8.293332901597448e-12, 5.348750966060309e-13, -3.3600298822310974e-14, 2.012498797525687e-15,
    0.3241554131869182, 0.013588661763209648, -0.0017016594402050453, 0.00017648701173706563, -1.6147971428867898e-05, 1.344662058366532e-06, -1.0380136774557607e-07, 7.519310953482262e-09, -5.155856829605274e-10, 3.368143267657544e-11, -2.106784275795176e-12, 1.267053058256862e-13, -7.430309915385698e-15, 4.170372277730845e-16,
    0.3457168592036437, 0.008473684932204103, -0.000943364937679408, 8.79217283164892e-05, -7.289443157148968e-06, 5.537146497660789e-07, -3.920729104321152e-08, 2.61727504678825e-09, -1.6603796281999839e-10, 1.0070090663977184e-11, -5.865754165555603e-13, 3.2940174638407993e-14, -1.805758320667064e-15, 9.507381329593442e-17,
    0.3594930187770546, 0.005559816158426826, -0.0005543920470644109, 4.6696077498577476e-05, -3.5239459937741057e-06, 2.4508363677138325e-07, -1.5966824874147885e-08, 9.847842493399346e-10, -5.793104368475888e-11, 3.2683394039505575e-12, -1.775951001909077e-13, 9.326784149441306e-15, -4.787021125974261e-16, 2.3672374411991027e-17,
    0.36871920192022056, 0.0038067642663398324, -0.00034244442187519907, 2.6216019065253338e-05, -1.8091299164371188e-06, 1.1564168647356536e-07, -6.9543122451693265e-09, 3.9740394367651633e-10, -2.1730736538604158e-11, 1.1429158468276187e-12, -5.804458559284364e-14, 2.8556646153747092e-15, -1.3746076152111003e-16, 6.393516919589746e-18,
    0.37514703613294953, 0.0027017609071603374, -0.0002207523415487894, 1.5444921614763858e-05, -9.791036121395148e-07, 5.7744972954530365e-08, -3.2161431275072e-09, 1.7077668034806556e-10, -8.702671671250805e-12, 4.276645576597057e-13, -2.0341284690839476e-14, 9.392198695224943e-16, -4.247747921107853e-17, 1.8610817136478332e-18,
    0.37977710413360355, 0.0019768298703493896, -0.00014763264811620832, 9.489370573927977e-06, -5.55066110388059e-07, 3.03198667601634e-08, -1.569183307711547e-09, 7.765233620642904e-11, -3.6973644219402585e-12, 1.7016447876955655e-13, -7.596053102284471e-15, 3.298021854610326e-16, -1.404023668341049e-17, 5.803960599447842e-19,
    0.38320814606960946, 0.0014845652740972794, -0.00010192276424369101, 6.048237302412286e-06, -3.278204725899168e-07, 1.6646345610087163e-08, -8.031666720357436e-10, 3.714794443042036e-11, -1.6569830231190284e-12, 7.158861580696464e-14, -3.0056429387664293e-15, 1.2295064134546816e-16, -4.9363350185495314e-18, 1.9284965551624577e-19,
    0.3858132119766376, 0.0011401554056296548, -7.233979160523256e-05, 3.981197598637468e-06, -2.0074852972275953e-07, 9.509723426486214e-09, -4.29104621987809e-10, 1.8602502402499306e-11, -7.79318225414191e-13, 3.1681477035488646e-14, -1.2537264138704364e-15, 4.8414967494729115e-17, -1.8366747229063577e-18, 6.792711530509942e-20,
    0.3878330802708875, 0.0008928326502059101, -5.260154082357869e-05, 2.696115340969901e-06, -1.2694898316349814e-07, 5.628969543149045e-09, -2.38255003163271e-10, 9.707732686517031e-12, -3.8291859969856456e-13, 1.468105252118872e-14, -5.487514629226978e-16, 2.004402733806222e-17, -7.198385483433606e-19, 2.524509534626072e-20,
    0.389428043177263, 0.0007111260643253704, -3.907258875641036e-05, 1.8723828662040964e-06, -8.261270864757407e-08, 3.439510832072133e-09, -1.3695291224218768e-10, 5.2583913513525495e-12, -1.9576429955208725e-13, 7.094325099795864e-15, -2.5098445384837206e-16, 8.688051992170276e-18, -2.959199260794945e-19, 9.857695210638037e-21,
    0.39070776413618996, 0.0005749117333729377, -2.9575491544252784e-05, 1.3297776742621115e-06, -5.51561175092714e-08, 2.162586500966403e-09, -8.122401546894756e-11, 2.9461532749514853e-12, -1.0376021780652413e-13, 3.561781715669786e-15, -1.1950579966053354e-16, 3.927745228907267e-18, -1.2711031244518549e-19, 4.028628835979169e-21,
    0.39174910571695765, 0.0004709607366978888, -2.2765250147227754e-05, 9.63517724525591e-07, -3.7682075808253165e-08, 1.3952119652205902e-09, -4.9555666442719336e-11, 1.7020800528258903e-12, -5.683379572328113e-14, 1.85180548081959e-15, -5.903914806699938e-17, 1.8456939101968803e-18, -5.685158538306928e-20, 1.7170915331508915e-21,
    0.392607113097776, 0.0003903589329644994, -1.7787740169180813e-05, 7.108011292113312e-07, -2.62836232295284e-08, 9.213636424847961e-10, -3.1021614150031507e-11, 1.0111983117297329e-12, -3.207910671692983e-14, 9.940680211372333e-16, -3.017079142222362e-17, 8.987299204447933e-19, -2.6393091546575818e-20, 7.608416441397522e-22,
    0.39589588482488375, -0.0029786255133119914, 6.532711140277183e-05, -2.322953707299363e-06, 1.1261446442388298e-07, -6.8421389882381516e-09, 4.957107550942992e-10, -4.144426586599465e-11, 3.9069607874246125e-12, -4.081950154243617e-13, 4.655701341674905e-14, -5.752099026722877e-15, 8.254829133209414e-16, -1.1848509040551385e-16
);

// u Phi(-u) for u >= 0.5: exp(-u^2 / 2) * P(u), u^2 as an exact head and tail (two_prod_d): exp's
// relative error is u^2 times that of its argument, so a rounded u * u would cost up to 370 ulp near
// u = 38. exp as m 2^k (< 1 ulp), P (about 1 ulp), m P (1/2 ulp), one exact-or-final scaling: below
// 3 ulp in all, and 0 from u = 38.6 on (the result underflows), u = inf included (u is capped at 40).
double gauss_tail_d(double u) {
    double uc = min(u, 40.0);
    bool far = uc >= 8.0;
    int i = far ? 15 : int((uc - 0.5) * 2.0);
    precise double s = far ? 128.0 / (uc * uc) - 1.0 : (uc - (0.75 + 0.5 * double(i))) * 4.0;
    int base = 14 * i;
    precise double p = GAUSS_TAIL_C[base + 13];
    for (int j = 12; j >= 0; --j) p = p * s + GAUSS_TAIL_C[base + j];
    double e;
    double q = two_prod_d(uc, uc, e);
    int k;
    double m = exp_parts_d(-0.5 * q, -0.5 * e, k);
    precise double mp = m * p;
    return ldexp_wide_d(mp, k);
}

// x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, GELU's exact form.
// |x| <= 1/2: x / 2 + t S(t) with t = x^2 and S(t) = erf(x / sqrt 2) / (2 x) by its Taylor series in t
// (degree 11, truncation below 2^-62 relative); for x < 0 the two terms cancel at most to 0.61 of
// the larger, so the roundings of t and of the sum stay below 2 ulp of the result.
// |x| > 1/2: x - u Phi(-u) for x > 0 (the tail is at most 0.45 of the result: its error counts for
// less than half) and -u Phi(-u) for x < 0 (the tail itself, to the underflow), u = |x|.
// GELU(+inf) = inf, GELU(-inf) = -0 (the limit), NaN stays NaN.
const double GELU_SERIES[12] = double[](
    0.3989422804014327, -0.06649038006690544, 0.009973557010035817, -0.0011873282154804543,
    0.00011543468761615529, -9.444656259503615e-06, 6.659693516316651e-07, -4.122667414862689e-08,
    2.2735298243728065e-09, -1.1301171641619213e-10, 5.1124347902563106e-12, -2.121761474217046e-13);

double gelu_d(double x) {
    if (isnan(x)) return x;
    double u = abs(x);
    if (u <= 0.5) {
        precise double t = x * x;
        precise double S = GELU_SERIES[11];
        for (int j = 10; j >= 0; --j) S = S * t + GELU_SERIES[j];
        precise double r = 0.5 * x + t * S;
        return x == 0.0 ? x : r;                            // -0 stays -0
    }
    double tail = gauss_tail_d(u);
    precise double r = x - tail;
    return x > 0.0 ? r : -tail;
}

// ---- building blocks of the operators --------------------------------------------------------------

// x = m * 2^e with |m| in [0.5, 1) for finite nonzero x (0, inf, NaN: m = x, e = 0) (subnormals included: scaled by 2^54 first);
// bit arithmetic, not GLSL's frexp, whose handling of subnormal doubles is the driver's.
double frexp_d(double x, out int e) {
    if (x == 0.0 || isinf(x) || isnan(x)) { e = 0; return x; }
    bool sub = abs(x) < 2.2250738585072014e-308;
    precise double xs = x * 18014398509481984.0;            // 2^54, exact
    uvec2 b = unpackDouble2x32(sub ? xs : x);
    e = int((b.y >> 20) & 0x7ffu) - 1022 - (sub ? 54 : 0);
    return packDouble2x32(uvec2(b.x, (b.y & 0x800fffffu) | 0x3fe00000u));
}

// a * x + b rounded about once, for finite a and b: Dekker's exact product a * x = p + e, then
// (p + b) + e. Where a * x and b cancel, p + b is exact (Sterbenz) and the result is within half an
// ulp; elsewhere within an ulp. x or a * x infinite: e is NaN, and p + b is the answer.
double mul_add_d(double x, double a, double b) {
    double e;
    double p = two_prod_d(a, x, e);
    precise double s = p + b;
    precise double t = s + e;
    return isnan(t) ? s : t;
}

// log(1 + exp(-|z|)) = lm * 2^le for z = zh + zl (the exact product of a parameter and x, see
// two_prod_d), the part of softplus that never overflows; the caller scales it (divides by Steepness,
// multiplies by Alpha) as y * 2^le with ldexp_wide_d, so that a value below the normal range is still
// rounded only once at the end. |z| < 40: lm = log1p(exp(-|z|)), le = 0 (exp: 1 ulp, log1p's
// condition number at most 1 there: below 2 ulp in all); |z| >= 40: exp(-|z|) < 2^-57, so
// log1p(e) = e (1 - e / 2 + ...) rounds to e: lm 2^le = exp(-|z|) as exp_parts_d's m 2^k (1 ulp).
// NaN z gives NaN.
double log1p_exp_neg_d(double zh, double zl, out int le) {
    double a = -abs(zh);
    double b = zh > 0.0 ? -zl : zl;                          // -|z| = a + b
    b = a < -1500.0 ? 0.0 : b;                               // zl is NaN where zh overflowed
    int k;
    double m = exp_parts_d(max(a, -2100.0), b, k);
    bool near = a > -40.0;
    le = near ? 0 : k;
    double lm = near ? log1p_d(ldexp_wide_d(m, k)) : m;
    return isnan(zh) ? zh : lm;
}

// alpha * expm1(x / alpha) for x <= 0 and alpha != 0 (CELU's negative branch; either sign of alpha).
// y = x / alpha is rounded, and expm1's relative error is y e^y / expm1(y) times y's, up to y for
// y = x / alpha >> 0 (alpha < 0): so its tail yl = (x - y alpha) / alpha (y alpha exactly by
// two_prod_d) is added back as expm1(y + yl) = expm1(y) + yl (1 + expm1(y)) for y < 40 (below 2 ulp:
// expm1, the sum, the product); beyond, expm1(y) = exp(y) (e^-40 is below 2^-57), and alpha is folded
// into exp's power of two, alpha e^y = (am m) 2^(ae + k), so that it overflows exactly where the result
// does (|alpha| < 1 lets the result stay finite where e^y is not). |y| < 2^-54: x itself (alpha expm1(y)
// = x (1 + y / 2 + ...) rounds to x), where y may be subnormal and hold too few bits to give x back.
double alpha_expm1_quotient_d(double x, double alpha) {
    precise double y = x / alpha;
    if (abs(y) < 5.551115123125783e-17) return x;
    double e;
    double p = two_prod_d(y, alpha, e);
    precise double yl = ((x - p) - e) / alpha;
    yl = abs(y) > 1500.0 ? 0.0 : yl;                      // y or y alpha overflowed: the tail is irrelevant
    double em = expm1_d(y);
    precise double em2 = yl == 0.0 ? em : em + yl * (1.0 + em);   // x = -0: -0
    precise double near = alpha * em2;
    int k, ae;
    double m = exp_parts_d(min(y, 2000.0), yl, k);
    double am = frexp_d(alpha, ae);
    precise double q = am * m;
    double far = ldexp_wide_d(q, k + ae);
    return y >= 40.0 ? far : near;                        // NaN: near, NaN
}

// n / (1 + exp(a + b)) for finite a in [-2100, 2100] (|b| <= 2^-40 |a|, a tail as exp_parts_d takes
// it): sigmoid and x sigmoid(z), with a = -z. exp(a + b) = m 2^k (exp_parts_d, 1 ulp). k <= 60:
// n / (1 + m 2^k), where 1 + e carries at most e's relative error (e / (1 + e) < 1) plus its own
// rounding, and the quotient adds one: below 2 ulp (e / (1 + e) over 1 + 1 / e, with e's error
// entering twice, would reach 3). k > 60: 1 + e is e to 2^-60, and the result is (nm / m) 2^(ne - k)
// for n = nm 2^ne, rounded once, also where e overflows or the result is below the normal range.
double over_1p_exp_d(double n, double a, double b) {
    int k, ne;
    double m = exp_parts_d(a, b, k);
    precise double d = 1.0 + ldexp_wide_d(m, min(k, 61));
    precise double q = n / d;
    double nm = frexp_d(n, ne);
    precise double r = nm / m;
    return k <= 60 ? q : ldexp_wide_d(r, ne - k);
}

// min(max(t, 0), 1) that keeps NaN (GLSL's min and max may drop it).
double clamp_unit_d(double t) {
    return t >= 1.0 ? 1.0 : (t <= 0.0 ? 0.0 : t);
}

#endif
