// Everything an elementwise operator needs except its formula: bindings, push constants, the packed
// fast path, the strided path (up to 8 dimensions, zero strides broadcast) and a grid-stride loop,
// so that one pipeline with a fixed workgroup count serves every element count.
//
// Defines per variant: DTYPE_* (see dtype.glsl), LAYOUT_PACKED or LAYOUT_STRIDED, INPUTS (1 or 2).
// The operator's .comp includes this file, then defines activate(x) (or activate(x, y) for 2 inputs),
// reading its scalar parameters with PARAM(i): OperatorDesc.shader_params(), by default the DirectML
// descriptor's scalar fields in order. 64-bit types and parameters: see the contract in dtype.glsl.
#extension GL_GOOGLE_include_directive : require
#include "dtype.glsl"
#include "numerics.glsl"

#ifndef INPUTS
#define INPUTS 1
#endif
#define MAX_DIMS 8u
#define PARAM_WORDS 14  // service/dispatch_geometry.py PUSH_WORDS - 2

layout(local_size_x_id = 0) in;

layout(push_constant) uniform Push {
    uint count;     // logical elements
    uint rank;      // strided path: dimensions after coalescing
    uint p[PARAM_WORDS];  // operator parameters as 32-bit words (float bits, integers; 64-bit ones in two)
} pc;
// Copied out of the push-constant block once per invocation: lavapipe reloads push constants at
// every use otherwise, which costs a few percent of an elementwise kernel's throughput. (Words a
// kernel never reads cost nothing: the compiler drops their copies.)
uint param0, param1, param2, param3, param4, param5, param6, param7, param8, param9, param10, param11, param12, param13;
#define PARAM(i) uintBitsToFloat(param##i)
#define PARAM_INT(i) int(param##i)
#define PARAM_UINT(i) param##i
// A 64-bit parameter: words i (low) and i + 1 (high), i even (dtype.glsl's contract).
#define PARAM_U64V(i) PARAM_PAIR_##i
#define PARAM_PAIR_0 uvec2(param0, param1)
#define PARAM_PAIR_2 uvec2(param2, param3)
#define PARAM_PAIR_4 uvec2(param4, param5)
#define PARAM_PAIR_6 uvec2(param6, param7)
#define PARAM_PAIR_8 uvec2(param8, param9)
#define PARAM_PAIR_10 uvec2(param10, param11)
#define PARAM_PAIR_12 uvec2(param12, param13)
#if defined(DTYPE_F64)
#define PARAM_F64(i) packDouble2x32(PARAM_U64V(i))
#endif
#if defined(DTYPE_I64) || defined(DTYPE_U64)
#define PARAM_U64(i) pack64(PARAM_U64V(i))
#define PARAM_I64(i) int64_t(pack64(PARAM_U64V(i)))
#endif
void load_params() {
    param0 = pc.p[0]; param1 = pc.p[1]; param2 = pc.p[2]; param3 = pc.p[3]; param4 = pc.p[4]; param5 = pc.p[5];
    param6 = pc.p[6]; param7 = pc.p[7]; param8 = pc.p[8]; param9 = pc.p[9]; param10 = pc.p[10];
    param11 = pc.p[11]; param12 = pc.p[12]; param13 = pc.p[13];
}

// Inputs at bindings 0..INPUTS-1, output at INPUTS (may alias input 0), layout table after it.
#if defined(LAYOUT_PACKED) && (defined(DTYPE_I64) || defined(DTYPE_U64))
    // Native 64-bit integers move as such: 16-byte units of two, no word shuffles (measured on llvmpipe:
    // uvec4 units with pack64/unpack32 ran INT64 RELU at 0.6 of the copy shader)
    #define ARRAY_T u64vec2
#elif defined(LAYOUT_PACKED) && defined(DTYPE_F64)
    #define ARRAY_T dvec2
#elif defined(LAYOUT_PACKED)
    #define ARRAY_T uvec4
#else
    #define ARRAY_T uint
#endif
layout(binding = 0) readonly buffer In0 { ARRAY_T in0[]; };
#if INPUTS > 1
layout(binding = 1) readonly buffer In1 { ARRAY_T in1[]; };
#endif
layout(binding = INPUTS) buffer Out { ARRAY_T outv[]; };
#ifdef LAYOUT_STRIDED
// meta[d] = size of dimension d (innermost last); meta[MAX_DIMS * (t + 1) + d] = element stride of
// tensor t (inputs first, output last) in dimension d.
layout(binding = INPUTS + 1) readonly buffer Meta { uint meta[]; };
#endif

#if INPUTS > 1
ELEM_T activate(ELEM_T x, ELEM_T y);
#define ACT(a, b) activate(a, b)
#else
ELEM_T activate(ELEM_T x);
#define ACT(a, b) activate(a)
#endif

#ifdef LAYOUT_PACKED

#if defined(DTYPE_I64) || defined(DTYPE_U64) || defined(DTYPE_F64)
// A unit holds two elements, read and written in the computing type.
ARRAY_T apply_unit(ARRAY_T a, ARRAY_T b) {
    return ARRAY_T(ACT(ELEM_T(a.x), ELEM_T(b.x)), ACT(ELEM_T(a.y), ELEM_T(b.y)));
}
#elif defined(DTYPE_64BIT)
// A unit holds two elements, two words each.
uvec4 apply_unit(uvec4 a, uvec4 b) {
    return uvec4(to_bits(ACT(from_bits(a.xy), from_bits(b.xy))), to_bits(ACT(from_bits(a.zw), from_bits(b.zw))));
}
#else
uint apply_word(uint a, uint b) {
#if ELEMS_PER_WORD == 1
    return to_bits(ACT(from_bits(a), from_bits(b)));
#else
    uint r = 0u;
    for (int k = 0; k < ELEMS_PER_WORD; ++k) {
        ELEM_T x = from_bits(bitfieldExtract(a, k * ELEM_BITS, ELEM_BITS));
        ELEM_T y = from_bits(bitfieldExtract(b, k * ELEM_BITS, ELEM_BITS));
        r = bitfieldInsert(r, to_bits(ACT(x, y)), k * ELEM_BITS, ELEM_BITS);
    }
    return r;
#endif
}

uvec4 apply_unit(uvec4 a, uvec4 b) {
    return uvec4(apply_word(a.x, b.x), apply_word(a.y, b.y), apply_word(a.z, b.z), apply_word(a.w, b.w));
}
#endif

void main() {
    load_params();
    uint units = (pc.count + UNIT_ELEMS - 1u) / UNIT_ELEMS;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint u = gl_GlobalInvocationID.x; u < units; u += step) {
        ARRAY_T a = in0[u];
#if INPUTS > 1
        outv[u] = apply_unit(a, in1[u]);
#else
        outv[u] = apply_unit(a, a);
#endif
    }
}

#else  // LAYOUT_STRIDED

#if defined(DTYPE_64BIT)
// Each element owns its two words: plain stores, no atomics.
#define LOAD(buf, e) from_bits(uvec2(buf[2u * (e)], buf[2u * (e) + 1u]))
void store_out(uint e, ELEM_T v) {
    uvec2 w = to_bits(v);
    outv[2u * e] = w.x;
    outv[2u * e + 1u] = w.y;
}
#elif ELEMS_PER_WORD == 1
#define LOAD(buf, e) from_bits(buf[e])
void store_out(uint e, ELEM_T v) { outv[e] = to_bits(v); }
#else
#define LOAD(buf, e) from_bits(bitfieldExtract(buf[(e) / uint(ELEMS_PER_WORD)], int((e) % uint(ELEMS_PER_WORD)) * ELEM_BITS, ELEM_BITS))
void store_out(uint e, ELEM_T v) {
    // Several invocations may own elements of one word: update only ours, atomically: set the
    // value's one bits, then clear its zero bits. Never "clear ours, then or the value in": in place
    // (outv is in0's buffer) a compiler that sinks the element's load to its use loads after the
    // clear and reads 0, as NVIDIA's did (H200, 580.159.04: in-place INT8/INT16 RELU and BFLOAT16
    // IDENTITY gave all zeros); here both atomics take the value, so the load comes first.
    uint word = e / uint(ELEMS_PER_WORD);
    uint shift = (e % uint(ELEMS_PER_WORD)) * uint(ELEM_BITS);
    uint bits = to_bits(v) & ELEM_MASK;
    atomicOr(outv[word], bits << shift);
    atomicAnd(outv[word], ~((~bits & ELEM_MASK) << shift));
}
#endif

void main() {
    load_params();
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += step) {
        uint rem = i;
        uint off[INPUTS + 1];
        for (uint t = 0u; t <= uint(INPUTS); ++t) off[t] = 0u;
        for (uint d = pc.rank; d-- > 0u;) {
            uint size = meta[d];
            uint c = rem % size;
            rem /= size;
            for (uint t = 0u; t <= uint(INPUTS); ++t) off[t] += c * meta[MAX_DIMS * (t + 1u) + d];
        }
        ELEM_T a = LOAD(in0, off[0]);
#if INPUTS > 1
        ELEM_T b = LOAD(in1, off[1]);
#else
        ELEM_T b = a;
#endif
        store_out(off[INPUTS], ACT(a, b));
    }
}

#endif
