// Everything an elementwise operator needs except its formula: bindings, push constants, the packed
// fast path, the strided path (up to 8 dimensions, zero strides broadcast) and a grid-stride loop,
// so that one pipeline with a fixed workgroup count serves every element count.
//
// Defines per variant: DTYPE_* (see dtype.glsl), LAYOUT_PACKED or LAYOUT_STRIDED, INPUTS (1 or 2).
// The operator's .comp includes this file, then defines activate(x) (or activate(x, y) for 2 inputs),
// reading its scalar parameters with PARAM(i): OperatorDesc.shader_params(), by default the DirectML
// descriptor's scalar fields in order.
#extension GL_GOOGLE_include_directive : require
#include "dtype.glsl"
#include "numerics.glsl"

#ifndef INPUTS
#define INPUTS 1
#endif
#define MAX_DIMS 8u

layout(local_size_x_id = 0) in;

layout(push_constant) uniform Push {
    uint count;     // logical elements
    uint rank;      // strided path: dimensions after coalescing
    float p[6];     // operator parameters, descriptor order
} pc;
// Copied out of the push-constant block once per invocation: lavapipe reloads push constants at
// every use otherwise, which costs a few percent of an elementwise kernel's throughput.
float param0, param1, param2, param3, param4, param5;
#define PARAM(i) param##i
void load_params() {
    param0 = pc.p[0]; param1 = pc.p[1]; param2 = pc.p[2]; param3 = pc.p[3]; param4 = pc.p[4]; param5 = pc.p[5];
}

#ifdef LAYOUT_PACKED
    #define ARRAY_T UNIT_T
#else
    #define ARRAY_T WORD_T
#endif

// Inputs at bindings 0..INPUTS-1, output at INPUTS (may alias input 0), layout table after it.
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
float activate(float x, float y);
#define ACT(a, b) activate(a, b)
#else
float activate(float x);
#define ACT(a, b) activate(a)
#endif

#ifdef LAYOUT_PACKED

#if defined(DTYPE_F32)
vec4 apply_unit(vec4 a, vec4 b) {
    return vec4(ACT(a.x, b.x), ACT(a.y, b.y), ACT(a.z, b.z), ACT(a.w, b.w));
}
#elif defined(DTYPE_F16)
uint apply_word(uint a, uint b) {
    float lo = ACT(f16_to_f32(a & 0xffffu), f16_to_f32(b & 0xffffu));
    float hi = ACT(f16_to_f32(a >> 16), f16_to_f32(b >> 16));
    return f32_to_f16(lo) | (f32_to_f16(hi) << 16);
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
        UNIT_T a = in0[u];
#if INPUTS > 1
        outv[u] = apply_unit(a, in1[u]);
#else
        outv[u] = apply_unit(a, a);
#endif
    }
}

#else  // LAYOUT_STRIDED

#if defined(DTYPE_F32)
#define LOAD(buf, e) buf[e]
void store_out(uint e, float v) { outv[e] = v; }
#elif defined(DTYPE_F16)
#define LOAD(buf, e) f16_to_f32((buf[(e) >> 1] >> (((e) & 1u) * 16u)) & 0xffffu)
void store_out(uint e, float v) {
    // Two invocations may own the two halves of one word: update only ours, atomically.
    uint shift = (e & 1u) * 16u;
    atomicAnd(outv[e >> 1], ~(0xffffu << shift));
    atomicOr(outv[e >> 1], f32_to_f16(v) << shift);
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
        float a = LOAD(in0, off[0]);
#if INPUTS > 1
        float b = LOAD(in1, off[1]);
#else
        float b = a;
#endif
        store_out(off[INPUTS], ACT(a, b));
    }
}

#endif
