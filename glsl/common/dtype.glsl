// Storage of each data type. Elements live in 32-bit words so that no device feature is needed
// (Kompute enables none): FLOAT16 and BFLOAT16 are two halves per word, converted with explicit
// round-to-nearest-even. Defines per variant: DTYPE_F32, DTYPE_F16, DTYPE_BF16 or an integer DTYPE_*.
#ifndef VKACT_DTYPE
#define VKACT_DTYPE

float f16_to_f32(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint expo = (h >> 10) & 0x1fu;
    uint mant = h & 0x3ffu;
    if (expo == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (mant << 13));    // inf, NaN
    if (expo != 0u) return uintBitsToFloat(sign | ((expo + 112u) << 23) | (mant << 13));
    // Zero and subnormals: mant * 2^-24 is exact in fp32 (and survives flush-to-zero of fp32 math).
    return uintBitsToFloat(sign | floatBitsToUint(float(mant) * 5.9604644775390625e-8));
}

uint f32_to_f16(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u);
    if (a >= 0x477ff000u) return sign | 0x7c00u;                     // rounds to >= 65520: overflow
    if (a >= 0x38800000u) {                                           // normal half
        uint r = a - 0x38000000u;                                     // rebias exponent 127 -> 15
        r += 0xfffu + ((r >> 13) & 1u);                               // round to nearest, ties to even
        return sign | (r >> 13);
    }
    if (a < 0x33000000u) return sign;                                 // below half the smallest subnormal
    uint e = a >> 23;                                                 // subnormal half: shift the full mantissa
    uint m = (a & 0x7fffffu) | 0x800000u;
    uint shift = 126u - e;                                            // 14..24
    uint q = m >> shift;
    uint rem = m & ((1u << shift) - 1u);
    uint half_ = 1u << (shift - 1u);
    q += (rem > half_ || (rem == half_ && (q & 1u) != 0u)) ? 1u : 0u;
    return sign | q;
}

// BFLOAT16 is the top half of a float32: widening is exact; narrowing rounds to nearest, ties to even
// (overflow to infinity included), and a NaN stays a NaN, made quiet, its sign kept.
uint f32_to_bf16(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u;
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// Every data type lives in 32-bit words (uint storage): 1, 2 or 4 elements per word. ELEM_T is
// what a formula computes in: float for FLOAT32/FLOAT16, int or uint for the integer types (wider
// than the element, so a formula's result wraps when to_bits keeps the low ELEM_BITS bits).
#if defined(DTYPE_F32)
    #define ELEM_T float
    #define ELEM_BITS 32
    float from_bits(uint b) { return uintBitsToFloat(b); }
    uint to_bits(float v) { return floatBitsToUint(v); }
#elif defined(DTYPE_F16)
    #define ELEM_T float
    #define ELEM_BITS 16
    float from_bits(uint b) { return f16_to_f32(b); }
    uint to_bits(float v) { return f32_to_f16(v); }
#elif defined(DTYPE_BF16)
    #define ELEM_T float
    #define ELEM_BITS 16
    float from_bits(uint b) { return uintBitsToFloat(b << 16); }
    uint to_bits(float v) { return f32_to_bf16(v); }
#elif defined(DTYPE_I32) || defined(DTYPE_I16) || defined(DTYPE_I8)
    #define DTYPE_INT
    #define DTYPE_SIGNED
    #define ELEM_T int
    #if defined(DTYPE_I32)
        #define ELEM_BITS 32
    #elif defined(DTYPE_I16)
        #define ELEM_BITS 16
    #else
        #define ELEM_BITS 8
    #endif
    int from_bits(uint b) { return bitfieldExtract(int(b), 0, ELEM_BITS); }  // sign-extends
    uint to_bits(int v) { return uint(v); }
#elif defined(DTYPE_U32) || defined(DTYPE_U16) || defined(DTYPE_U8)
    #define DTYPE_INT
    #define ELEM_T uint
    #if defined(DTYPE_U32)
        #define ELEM_BITS 32
    #elif defined(DTYPE_U16)
        #define ELEM_BITS 16
    #else
        #define ELEM_BITS 8
    #endif
    uint from_bits(uint b) { return b; }
    uint to_bits(uint v) { return v; }
#else
    #error "define a DTYPE_* for this variant"
#endif

#define ELEMS_PER_WORD (32 / ELEM_BITS)
#define UNIT_ELEMS (4u * uint(ELEMS_PER_WORD))   // elements per 16-byte unit of the packed path
#define ELEM_MASK (ELEM_BITS == 32 ? 0xffffffffu : (1u << ELEM_BITS) - 1u)

#endif
