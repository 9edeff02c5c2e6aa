// 64-bit arithmetic in 32-bit words, for devices without shaderInt64/shaderFloat64 (the DTYPE_*_EMU
// variants of dtype.glsl). A value is a uvec2: .x the low word, .y the high word, as in memory.
// Integers wrap modulo 2^64 (two's complement); the doubles are IEEE 754 binary64, computed exactly
// with round to nearest, ties to even: NaN, infinities, signed zeros and subnormals included (no
// flushing), so an emulated kernel gives the bits that a correctly rounded double operation gives.
#ifndef VKACT_EMU64
#define VKACT_EMU64

// -- integers ------------------------------------------------------------------------------------

uvec2 u64_add(uvec2 a, uvec2 b) {
    uint carry;
    uint lo = uaddCarry(a.x, b.x, carry);
    return uvec2(lo, a.y + b.y + carry);
}

uvec2 u64_sub(uvec2 a, uvec2 b) {
    uint borrow;
    uint lo = usubBorrow(a.x, b.x, borrow);
    return uvec2(lo, a.y - b.y - borrow);
}

// The low 64 bits of a * b (the same bits for signed and unsigned operands).
uvec2 u64_mul(uvec2 a, uvec2 b) {
    uint hi, lo;
    umulExtended(a.x, b.x, hi, lo);
    return uvec2(lo, hi + a.x * b.y + a.y * b.x);
}

bool u64_lt(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x < b.x); }
bool i64_lt(uvec2 a, uvec2 b) { return int(a.y) < int(b.y) || (a.y == b.y && a.x < b.x); }
bool u64_le(uvec2 a, uvec2 b) { return !u64_lt(b, a); }
bool i64_le(uvec2 a, uvec2 b) { return !i64_lt(b, a); }

// Shifts by n < 64, written with selects rather than branches: a device that runs every lane through
// both sides of a branch (SwiftShader) pays for each side (measured there: FLOAT64 Shrink's add at
// 0.5 us an element with branchy shifts). A shift by 32 or more is undefined in GLSL: the selects
// never use such a result.
uvec2 u64_shl(uvec2 v, uint n) {
    uint m = n & 31u;
    uvec2 w = n >= 32u ? uvec2(0u, v.x) : v;
    uint carry = m == 0u ? 0u : w.x >> (32u - m);
    return uvec2(w.x << m, (w.y << m) | carry);
}

uvec2 u64_shr(uvec2 v, uint n) {  // logical
    uint m = n & 31u;
    uvec2 w = n >= 32u ? uvec2(v.y, 0u) : v;
    uint carry = m == 0u ? 0u : w.y << (32u - m);
    return uvec2((w.x >> m) | carry, w.y >> m);
}

// v >> n with the bits shifted out ORed into bit 0 (the sticky bit of rounding); any n.
uvec2 u64_shr_sticky(uvec2 v, uint n) {
    uvec2 r = n >= 64u ? uvec2(0u) : u64_shr(v, n);
    uvec2 below = n >= 64u ? uvec2(~0u) : n >= 32u ? uvec2(~0u, (1u << (n & 31u)) - 1u) : uvec2((1u << n) - 1u, 0u);
    uvec2 lost = v & below;
    r.x |= (lost.x | lost.y) != 0u ? 1u : 0u;
    return r;
}

// The index of the highest set bit; -1 for 0.
int u64_msb(uvec2 v) { return v.y != 0u ? 32 + findMSB(v.y) : findMSB(v.x); }

// -- doubles -------------------------------------------------------------------------------------

#define F64_SIGN 0x80000000u
#define F64_EXP_HI 0x7ff00000u          // the exponent field in the high word

bool f64_isnan(uvec2 a) { uint h = a.y & ~F64_SIGN; return h > F64_EXP_HI || (h == F64_EXP_HI && a.x != 0u); }
bool f64_iszero(uvec2 a) { return ((a.y & ~F64_SIGN) | a.x) == 0u; }
uvec2 f64_neg(uvec2 a) { return uvec2(a.x, a.y ^ F64_SIGN); }

// IEEE a < b: false when either is NaN, -0 == +0. Ordered by the bits: a positive double's bits grow
// with it, a negative one's shrink.
bool f64_lt(uvec2 a, uvec2 b) {
    if (f64_isnan(a) || f64_isnan(b)) return false;
    if (f64_iszero(a) && f64_iszero(b)) return false;
    bool na = (a.y & F64_SIGN) != 0u, nb = (b.y & F64_SIGN) != 0u;
    if (na != nb) return na;
    return na ? u64_lt(b, a) : u64_lt(a, b);
}

// a + b, correctly rounded (to nearest, ties to even). The magnitudes are aligned with three extra
// bits below the 53-bit significand (guard, round, sticky): enough for an exact rounding decision,
// since a subtraction that cancels more than one leading bit had at most one bit shifted out.
uvec2 f64_add(uvec2 a, uvec2 b) {
    if (f64_isnan(a)) return uvec2(a.x, a.y | 0x00080000u);   // quieted, payload kept
    if (f64_isnan(b)) return uvec2(b.x, b.y | 0x00080000u);
    uint ea = (a.y >> 20) & 0x7ffu, eb = (b.y >> 20) & 0x7ffu;
    if (ea == 0x7ffu) return (eb == 0x7ffu && ((a.y ^ b.y) & F64_SIGN) != 0u) ? uvec2(0u, 0xfff80000u) : a;  // inf - inf: NaN
    if (eb == 0x7ffu) return b;
    if (f64_iszero(a)) return f64_iszero(b) ? uvec2(0u, a.y & b.y & F64_SIGN) : b;  // -0 only from -0 + -0
    if (f64_iszero(b)) return a;
    // |a| >= |b| from here (the bits without the sign order the magnitudes).
    bool swap = u64_lt(uvec2(a.x, a.y & ~F64_SIGN), uvec2(b.x, b.y & ~F64_SIGN));
    uvec2 big = swap ? b : a;
    b = swap ? a : b;
    a = big;
    uint eig = swap ? eb : ea;
    eb = swap ? ea : eb;
    ea = eig;
    uint sign = a.y & F64_SIGN;
    bool subtract = ((a.y ^ b.y) & F64_SIGN) != 0u;
    // Significands with the implicit bit (none for subnormals, whose exponent is then 1), times 8.
    uvec2 ma = uvec2(a.x, a.y & 0xfffffu), mb = uvec2(b.x, b.y & 0xfffffu);
    if (ea != 0u) ma.y |= 0x100000u; else ea = 1u;
    if (eb != 0u) mb.y |= 0x100000u; else eb = 1u;
    ma = u64_shl(ma, 3u);
    mb = u64_shr_sticky(u64_shl(mb, 3u), ea - eb);
    int e = int(ea);
    uvec2 m;
    if (!subtract) {
        m = u64_add(ma, mb);
        if ((m.y & 0x1000000u) != 0u) {          // carried into bit 56: one more exponent step
            m = u64_shr_sticky(m, 1u);
            e += 1;
        }
    } else {
        m = u64_sub(ma, mb);
        if ((m.x | m.y) == 0u) return uvec2(0u);  // exact cancellation: +0
        int shift = min(55 - u64_msb(m), e - 1);  // normalise, but not below the subnormal exponent
        m = u64_shl(m, uint(shift));
        e -= shift;
    }
    if (e >= 0x7ff) return uvec2(0u, sign | F64_EXP_HI);   // overflow: infinity
    // Round the 56-bit m to 53 bits. The result's bits are (e - 1) * 2^52 + significand: a normal
    // significand brings its implicit bit (2^52) and adds 1 to the exponent field, a subnormal one
    // (e = 1, below 2^52) does not, and a significand rounded up to 2^53 carries into the exponent
    // (to the infinity bits above the largest double), all with no special case.
    uint grs = m.x & 7u;
    m = u64_shr(m, 3u);
    if (grs > 4u || (grs == 4u && (m.x & 1u) != 0u)) m = u64_add(m, uvec2(1u, 0u));
    uvec2 bits = u64_add(m, uvec2(0u, uint(e - 1) << 20));
    return uvec2(bits.x, bits.y | sign);
}

#endif
