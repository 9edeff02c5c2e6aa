// Storage of each data type. Elements live in 32-bit words (uint buffers): FLOAT16 and BFLOAT16 are two
// halves per word, converted with explicit round-to-nearest-even; a 64-bit element is two words, low
// word first. Defines per variant: DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_I32/I16/I8, DTYPE_U32/U16/U8,
// and the 64-bit ones:
//   DTYPE_F64, DTYPE_I64, DTYPE_U64   native: ELEM_T double / int64_t / uint64_t. The device must have
//                                      shaderFloat64 / shaderInt64 enabled (the patched kp enables them
//                                      where reported; service/descriptors/datatypes.py picks the variant).
//   DTYPE_F64_EMU, DTYPE_I64_EMU, DTYPE_U64_EMU   emulated: ELEM_T is uvec2 (the element's two words,
//                                      .x low, .y high) and the formula does its arithmetic in 32-bit
//                                      integers (glsl/common/emu64.glsl); no device feature needed.
//   Every 64-bit variant defines DTYPE_64BIT (ELEM_BITS 64, BITS_T uvec2); the emulated ones DTYPE_EMU64.
//
// How a .comp writes its 64-bit formulas (the contract; elementwise.glsl and reduction.glsl):
//   #if defined(DTYPE_F64)
//   double activate(double x) { double alpha = PARAM_F64(0); ... }   // FLOAT64, native
//   #elif defined(DTYPE_I64_EMU) || defined(DTYPE_U64_EMU)
//   uvec2 activate(uvec2 x) { ... }                                   // INT64/UINT64 in 32-bit words
//   #elif !defined(DTYPE_INT)
//   float activate(float x) { ... }                                    // FLOAT32, FLOAT16, BFLOAT16
//   #else
//   ELEM_T activate(ELEM_T x) { ... }                                  // integers, INT64/UINT64 native too
//   #endif
// DTYPE_INT and DTYPE_SIGNED hold for the native integer variants (I64 and U64 included; SIGNED_T is
// int or int64_t), never for the emulated ones: generic integer code that cannot handle uvec2 then
// fails to compile instead of computing nonsense.
// Parameters (push constants, elementwise.glsl): 32-bit ones with PARAM(i) (float), PARAM_INT(i),
// PARAM_UINT(i); a 64-bit one takes two words, low first, at an EVEN word index i (8-byte aligned in
// the block): PARAM_F64(i) (double, native F64 only), PARAM_I64(i)/PARAM_U64(i) (int64_t/uint64_t,
// native I64/U64 only), PARAM_U64V(i) (uvec2, any variant). The host side: OperatorDesc.shader_params()
// returns a numpy float64 for a double, numpy int64/uint64 for a 64-bit integer (service/dispatch_geometry.py
// push_words packs them and refuses one at an odd index); a Python float is a float32 word, a Python int a
// uint32 word.
#ifndef VKACT_DTYPE
#define VKACT_DTYPE
#if defined(DTYPE_I64) || defined(DTYPE_U64)
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#endif

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

// Every data type lives in 32-bit words (uint storage): 1, 2 or 4 elements per word, or one element
// in two words (BITS_T uvec2). ELEM_T is what a formula computes in: float for FLOAT32, FLOAT16 and
// BFLOAT16, int or uint for the integer types (wider than the element, so a formula's result wraps
// when to_bits keeps the low ELEM_BITS bits), double/int64_t/uint64_t/uvec2 for the 64-bit types.
#if defined(DTYPE_F64)
    #define DTYPE_64BIT
    #define ELEM_T double
    double from_bits(uvec2 b) { return packDouble2x32(b); }
    uvec2 to_bits(double v) { return unpackDouble2x32(v); }
#elif defined(DTYPE_I64)
    #define DTYPE_64BIT
    #define DTYPE_INT
    #define DTYPE_SIGNED
    #define ELEM_T int64_t
    #define SIGNED_T int64_t
    int64_t from_bits(uvec2 b) { return int64_t(pack64(b)); }
    uvec2 to_bits(int64_t v) { return unpack32(uint64_t(v)); }
#elif defined(DTYPE_U64)
    #define DTYPE_64BIT
    #define DTYPE_INT
    #define ELEM_T uint64_t
    #define SIGNED_T int64_t
    uint64_t from_bits(uvec2 b) { return pack64(b); }
    uvec2 to_bits(uint64_t v) { return unpack32(v); }
#elif defined(DTYPE_F64_EMU) || defined(DTYPE_I64_EMU) || defined(DTYPE_U64_EMU)
    #define DTYPE_64BIT
    #define DTYPE_EMU64
    #define ELEM_T uvec2
    uvec2 from_bits(uvec2 b) { return b; }
    uvec2 to_bits(uvec2 v) { return v; }
#elif defined(DTYPE_F32)
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
    #define SIGNED_T int
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
    #define SIGNED_T int
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

#ifdef DTYPE_64BIT
    #define ELEM_BITS 64
    #define BITS_T uvec2
    #define UNIT_ELEMS 2u                            // elements per 16-byte unit of the packed path
#else
    #define BITS_T uint
    #define ELEMS_PER_WORD (32 / ELEM_BITS)
    #define UNIT_ELEMS (4u * uint(ELEMS_PER_WORD))   // elements per 16-byte unit of the packed path
    #define ELEM_MASK (ELEM_BITS == 32 ? 0xffffffffu : (1u << ELEM_BITS) - 1u)
#endif

#endif
