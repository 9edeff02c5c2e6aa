// Row reductions (the softmax family): everything but the operator's final formula.
//
// The host splits the tensor into rows: a row is one index of the kept (non-reduced) dimensions, its
// elements are the reduced dimensions, so rows = product of the kept sizes and row_len = product of the
// reduced sizes (service/layout.py: row_layout). Each row is reduced in one pass (a running maximum and
// a running sum of exp(x - max) rescaled when the maximum grows, or the first arg-max), the partial
// states of the lanes that share the row are combined, and a second sweep writes the row's outputs.
//
// Who reduces a row (push constant `cluster`, uniform per dispatch):
//   cluster = L (a power of two <= the subgroup size): L lanes of one subgroup per row, combined with
//     subgroup shuffles, no barrier and no shared memory; a subgroup holds SubgroupSize / L rows at
//     a time, so many short rows fill every lane (L = 1: one invocation per row).
//   cluster = 0: a whole workgroup per row (long rows on a GPU): each subgroup combines its lanes with
//     shuffles, then the subgroups' states meet in shared memory after one barrier, and each subgroup
//     combines them all with shuffles again.
// Both modes stride over the rows (grid-stride), so any workgroup count serves any row count.
//
// Layouts (define per variant): LAYOUT_PACKED: a row's elements are contiguous (stride 1) and rows
// start row_stride elements apart in both tensors; the aligned middle of a row moves in 16-byte units,
// the ragged ends element by element. LAYOUT_STRIDED: sizes and strides come from the meta table, for
// the row index (outer dimensions) and the in-row index (inner, reduced, dimensions) separately.
//
// Data types (DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F64): storage is 32-bit words; FLOAT16 and
// BFLOAT16 are two halves per word (from_bits/to_bits of dtype.glsl), math is fp32 (REAL_T float). A
// word that holds elements of two rows (16-bit row ends, strided outputs) is written with atomics on its
// own half only. FLOAT64 (native only: shaderFloat64) is two words per element and REAL_T double: the
// states below in double; the (max, sum) state calls double exp_nonpos(double x, double lo), declared
// here and defined by the .comp (f64math.glsl).
//
// The operator's .comp defines REDUCE_ARGMAX (hardmax) or not (max and sum: softmax, log-softmax),
// PREP_T, and after including this file:
//     PREP_T prepare(STATE_T total);                  // once per row, from the row's reduced state
//     REAL_T result(REAL_T x, uint index, PREP_T p);  // the output of element `index` (0..row_len-1)
// and RESULT_IGNORES_INPUT when result() does not read x (the second sweep then reads nothing).
#ifndef VKACT_REDUCTION
#define VKACT_REDUCTION
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "dtype.glsl"   // from_bits, to_bits

#define MAX_DIMS 8u

layout(local_size_x_id = 0) in;

layout(push_constant) uniform Push {
    uint rows;        // product of the kept sizes (>= 1)
    uint row_len;     // product of the reduced sizes (>= 1)
    uint cluster;     // lanes per row (power of two), or 0: a workgroup per row
    uint row_stride;  // PACKED: elements between the starts of two rows (the same in both tensors)
    uint outer_rank;  // STRIDED: row dimensions, meta[0 .. outer_rank-1]
    uint inner_rank;  // STRIDED: reduced dimensions, meta[outer_rank .. outer_rank+inner_rank-1]
} pc;

#ifdef LAYOUT_PACKED
layout(binding = 0) readonly buffer In0 { uvec4 in_units[]; };
layout(binding = 1) buffer Out { uvec4 out_units[]; };
#define IN_WORD_RAW(w) in_units[(w) >> 2][(w) & 3u]
#define OUT_WORD(w) out_units[(w) >> 2][(w) & 3u]
#else
layout(binding = 0) readonly buffer In0 { uint in_words[]; };
layout(binding = 1) buffer Out { uint out_words[]; };
// meta[d]: size of dimension d (row dimensions first, then reduced ones, each innermost last);
// meta[MAX_DIMS + d]: the input's element stride in d; meta[2 * MAX_DIMS + d]: the output's.
layout(binding = 2) readonly buffer Meta { uint meta[]; };
#define IN_WORD_RAW(w) in_words[w]
#define OUT_WORD(w) out_words[w]
#endif
// Every read of the input goes through IN_WORD (a 32-bit word) or IN_UNIT (16 bytes, PACKED). A graph
// prologue (service/graph_glsl.py: elementwise nodes before this one, fused into its loads) defines
// PROLOGUE and, after this file, the two functions that give the words the prologue's last node would
// have stored, computed from its inputs' words at the same place (recomputed at each read: exact).
#ifdef PROLOGUE
uint prologue_word(uint w);
uvec4 prologue_unit(uint u);
#define IN_WORD(w) prologue_word(w)
#define IN_UNIT(u) prologue_unit(u)
#else
#define IN_WORD(w) IN_WORD_RAW(w)
#define IN_UNIT(u) in_units[u]
#endif

// -- elements ------------------------------------------------------------------------------------

#if defined(DTYPE_F64)
#define REAL_T double
#define REAL2_T dvec2
#define REAL3_T dvec3
#define REAL_MAX 1.7976931348623157e308LF
#define UNIT_LEN 2u
// Each element owns its two words: plain stores.
double load_elem(uint e) { return packDouble2x32(uvec2(IN_WORD(2u * e), IN_WORD(2u * e + 1u))); }
void store_elem(uint e, double v) {
    uvec2 w = unpackDouble2x32(v);
    OUT_WORD(2u * e) = w.x;
    OUT_WORD(2u * e + 1u) = w.y;
}
#elif defined(DTYPE_F32)
#define UNIT_LEN 4u
float load_elem(uint e) { return uintBitsToFloat(IN_WORD(e)); }
void store_elem(uint e, float v) { OUT_WORD(e) = floatBitsToUint(v); }
#elif defined(DTYPE_F16) || defined(DTYPE_BF16)
#define UNIT_LEN 8u
float load_elem(uint e) { return from_bits((IN_WORD(e >> 1) >> ((e & 1u) * 16u)) & 0xffffu); }
void store_elem(uint e, float v) {
    // The other half may belong to another row (or to padding): update only ours, atomically, set
    // bits first and both atomics taking the value (elementwise.glsl's store_out says why).
    uint shift = (e & 1u) * 16u, bits = to_bits(v) & 0xffffu;
    atomicOr(OUT_WORD(e >> 1), bits << shift);
    atomicAnd(OUT_WORD(e >> 1), ~((~bits & 0xffffu) << shift));
}
#else
#error "define DTYPE_F32, DTYPE_F16, DTYPE_BF16 or DTYPE_F64"
#endif
#ifndef REAL_T
#define REAL_T float
#define REAL2_T vec2
#define REAL3_T vec3
#define REAL_MAX 3.40282347e38
#endif
// Whether a's bits exceed b's (a deterministic tie-break, not an order of values).
bool bits_greater(float a, float b) { return floatBitsToUint(a) > floatBitsToUint(b); }
#ifdef DTYPE_F64
bool bits_greater(double a, double b) {
    uvec2 x = unpackDouble2x32(a), y = unpackDouble2x32(b);
    return x.y > y.y || (x.y == y.y && x.x > y.x);
}
double exp_nonpos(double x, double lo);   // e^(x + lo) for x <= 0: the .comp defines it (f64math.glsl)
#endif

// -- numerics ------------------------------------------------------------------------------------
// Vulkan lets exp and log be loose (exp: 3 + 2|x| ulp), and Mesa's NIR rewrites float expressions
// not marked `precise` (the two-constant Cody-Waite reduction written with fma() lost ~16 ulp at
// x = -25 on lavapipe), so these are written out with `precise` wherever the order matters.

// e^(x + lo) for x <= 0 (|lo| << 1, the low part of x), within an ulp; 0 below about -87.3 (where
// fp32 turns subnormal; D3D12 lets fp32 denormals flush), NaN stays NaN. x = k ln2 + r (Cody-Waite,
// ln2 in two parts, k * hi exact for |k| <= 151), e^r = 1 + r + r^2 q(r) by a degree-6 minimax
// polynomial (relative error 2^-26.6 on |r| <= 0.41), 2^k from the bits of k.
float exp_nonpos(float x, float lo) {
    float t = max(x, -104.0);
    float k = roundEven(t * 1.44269504);
    precise float r = t - k * 0.693145752;
    r = (r - k * 1.42860677e-6) + lo;
    float r2 = r * r;
    float a = fma(r, 0.16666382551193237, 0.4999998211860657);
    float b = fma(r, 0.008382739499211311, 0.04167002812027931);
    float q = fma(r2, fma(r2, 0.0013785195769742131, b), a);
    float s = uintBitsToFloat(uint(max(int(k) + 127, 0)) << 23);  // 2^k, 0 below 2^-126
    float e = fma(s, fma(r2, q, r), s);
    return x >= -104.0 ? e : (isnan(x) ? x : 0.0);   // -inf comes with a NaN lo; max() may drop a NaN
}

// x - y as hi + lo exactly (Knuth's TwoSum): an exponential of x - y for far-apart x and y keeps its
// accuracy only with lo (rounding x - y = -25 alone is an error of 16 ulp in e^(x - y)). Infinite or
// NaN operands give an infinite or NaN hi, which exp_nonpos handles without lo.
REAL2_T two_diff(REAL_T x, REAL_T y) {
    precise REAL_T hi = x - y;
    precise REAL_T t = hi - x;
    precise REAL_T lo = (x - (hi - t)) + (-y - t);
    return REAL2_T(hi, lo);
}

// e^(x - m) for x <= m, x - m carried in two parts.
REAL_T exp_minus(REAL_T x, REAL_T m) {
    REAL2_T d = two_diff(x, m);
    return exp_nonpos(d.x, d.y);
}

// log(1 + x) for x >= -1, about 1 ulp (fdlibm's logf kernel on u = 1 + x, plus the rounding error of
// u); -inf at -1, NaN stays NaN. log(sum) of a row whose maximum dominates is log1p of the rest.
float log1p_nonneg(float x) {
    precise float u = 1.0 + x;
    precise float err = x - (u - 1.0);         // u + err == 1 + x exactly
    uint bits = floatBitsToUint(u);
    int k = int(bits >> 23) - 127;
    float f = uintBitsToFloat((bits & 0x7fffffu) | 0x3f800000u);    // u = 2^k f, f in [1, 2)
    if (f > 1.41421356) { f *= 0.5; k += 1; }                      // f in [sqrt(1/2), sqrt(2))
    precise float g = f - 1.0;                                      // exact
    float s = g / (2.0 + g);
    float z = s * s;
    float w = z * z;
    float R = z * (0.66666662693 + w * 0.28498786688) + w * (0.40000972152 + w * 0.24279078841);
    precise float hfsq = 0.5 * g * g;
    float dk = float(k);
    precise float lg = dk * 0.69313812256 - ((hfsq - (s * (hfsq + R) + dk * 9.0580006145e-6)) - g);
    precise float result = lg + err / u;
    return x > -1.0 ? result : (x == -1.0 ? -1.0 / 0.0 : x);   // x is NaN in the last case
}

// -- the reduced state ---------------------------------------------------------------------------

#ifdef REDUCE_ARGMAX
// (value bits, index) of the element numpy's argmax picks: the first NaN if any, else the first
// maximum; ties between lanes go to the lower index. NO_INDEX marks an empty state. FLOAT64: the
// value in two words (uvec3: low, high, index).
#define NO_INDEX 0xffffffffu
#ifdef DTYPE_F64
#define STATE_T uvec3
STATE_T pick(double v, uint i) { return uvec3(unpackDouble2x32(v), i); }
double pick_value(STATE_T a) { return packDouble2x32(a.xy); }
uint pick_index(STATE_T a) { return a.z; }
#else
#define STATE_T uvec2
STATE_T pick(float v, uint i) { return uvec2(floatBitsToUint(v), i); }
float pick_value(STATE_T a) { return uintBitsToFloat(a.x); }
uint pick_index(STATE_T a) { return a.y; }
#endif
#define ACC_T STATE_T
ACC_T acc_empty() { return pick(REAL_T(0), NO_INDEX); }
// A lane visits its elements in increasing index order (accumulate() below), so a later element
// replaces the pick only if strictly greater, or the first NaN.
void acc_add(inout ACC_T a, REAL_T v, uint i) {
    REAL_T w = pick_value(a);
    bool take = pick_index(a) == NO_INDEX || (isnan(v) && !isnan(w)) || v > w;
    a = take ? pick(v, i) : a;
}
STATE_T acc_state(ACC_T a) { return a; }
STATE_T state_empty() { return acc_state(acc_empty()); }
// Whether b's pick precedes a's in numpy's order: NaN first, then the larger value, then the lower index.
bool precedes(STATE_T b, STATE_T a) {
    REAL_T v = pick_value(b), w = pick_value(a);
    bool vn = isnan(v), wn = isnan(w);
    bool earlier = pick_index(b) < pick_index(a);
    bool better = vn ? (!wn || earlier) : (!wn && (v > w || (v == w && earlier)));
    return pick_index(b) != NO_INDEX && (pick_index(a) == NO_INDEX || better);
}
STATE_T combine(STATE_T a, STATE_T b) { return precedes(b, a) ? b : a; }
#else
// (m, s): the running maximum m and s = sum of exp(x - m) over the row's elements except one that
// equals m (the "designated" maximum, whose term is exactly 1), so that log(sum) = log1p(s) keeps
// the small terms of a dominated row. Empty: m = -FLT_MAX, s = -1, which also makes rows of -inf
// come out as sum 0 (NaN outputs, as numpy's exp(x - max) / sum gives). A NaN anywhere makes s NaN.
// The lane accumulator adds a Kahan compensation c (the sum's lost low part, subtracted at the end).
#define STATE_T REAL2_T
#define ACC_T REAL3_T
ACC_T acc_empty() { return REAL3_T(-REAL_MAX, -1.0, 0.0); }
// Branch-free (selects): a CPU driver runs both sides of a divergent branch anyway.
void acc_add(inout ACC_T a, REAL_T v, uint i) {
    REAL2_T d = two_diff(v, a.x);
    bool up = d.x > 0.0;                                    // a new maximum
    REAL_T e = exp_nonpos(up ? -d.x : d.x, up ? -d.y : d.y);  // exp(x - m), or exp(m - x) for a new one
    precise REAL_T y = e - a.z;
    precise REAL_T t = a.y + y;
    precise REAL_T c = (t - a.y) - y;
    // a new maximum: the old designated one (and the sum so far) joins the sum, scaled by e
    a = up ? REAL3_T(v, (1.0 + a.y) * e, a.z * e) : REAL3_T(a.x, t, c);
}
STATE_T acc_state(ACC_T a) { return REAL2_T(a.x, a.y - a.z); }
STATE_T state_empty() { return acc_state(acc_empty()); }   // combine()'s identity
STATE_T combine(STATE_T a, STATE_T b) {
    // Symmetric and deterministic (the larger maximum, then the larger sum bits, leads), so every
    // lane of a butterfly ends with the same bits.
    bool swap = b.x > a.x || (b.x == a.x && bits_greater(b.y, a.y));
    REAL2_T hi = swap ? b : a;
    REAL2_T lo = swap ? a : b;
    REAL2_T d = two_diff(lo.x, hi.x);
    return REAL2_T(hi.x, hi.y + (1.0 + lo.y) * exp_nonpos(d.x, d.y));
}
#endif

// Four consecutive elements, in order (one at a time: on lavapipe this measured faster than taking
// the maximum of the four first with one rescaling, whose extra exponential and masks cost more).
void acc_add4(inout ACC_T a, vec4 v, uint i) {
    acc_add(a, v.x, i);
    acc_add(a, v.y, i + 1u);
    acc_add(a, v.z, i + 2u);
    acc_add(a, v.w, i + 3u);
}

PREP_T prepare(STATE_T total);
REAL_T result(REAL_T x, uint index, PREP_T p);

// -- one row, one lane's share -------------------------------------------------------------------

#ifdef LAYOUT_PACKED
// A row is elements base .. base + row_len - 1: a head up to the first 16-byte boundary, whole units,
// and a tail; units are shared out lane by lane, then the head and tail elements.
struct Span { uint base; uint head; uint first_unit; uint units; uint tail; };
Span row_span(uint row) {
    Span s;
    s.base = row * pc.row_stride;
    s.head = min(pc.row_len, (UNIT_LEN - s.base % UNIT_LEN) % UNIT_LEN);
    s.first_unit = (s.base + s.head) / UNIT_LEN;
    s.units = (pc.row_len - s.head) / UNIT_LEN;
    s.tail = pc.row_len - s.head - s.units * UNIT_LEN;
    return s;
}
// The q-th loose element (head, then tail) of a row, as an index within the row.
uint loose_index(Span s, uint q) { return q < s.head ? q : pc.row_len - s.tail + (q - s.head); }

// UNROLL (a define per variant, 1 or 4): element loop steps per iteration. lavapipe (llvmpipe) ends
// every loop of a shader invocation once its loops have run 65535 iterations in all
// (LP_MAX_TGSI_LOOP_ITERATIONS), silently, so there the loops take 4 steps per iteration and the host
// sizes the grid so that no invocation comes near the limit (Engine._row_split counts every loop here:
// sweeps, butterfly, strided index arithmetic). Elsewhere 1: the unrolled bodies (16 to 32 inlined
// exponentials per loop) made SwiftShader's compiler (Subzero) run for minutes and grow to 24 GB in
// vkCreateComputePipelines; rolled, it compiles the kernel in 0.3 s.
#if UNROLL != 1 && UNROLL != 4
#error "define UNROLL as 1 or 4"
#endif

// Element k (0 .. UNIT_LEN-1) of a unit's words.
REAL_T unit_elem(uvec4 w, uint k) {
#if defined(DTYPE_F64)
    return packDouble2x32(k == 0u ? w.xy : w.zw);
#elif defined(DTYPE_F32)
    return uintBitsToFloat(w[k]);
#else
    return from_bits((w[k >> 1] >> ((k & 1u) * 16u)) & 0xffffu);
#endif
}

void acc_unit(inout ACC_T acc, Span s, uint u) {
    uvec4 w = IN_UNIT(s.first_unit + u);
    uint i = s.head + u * UNIT_LEN;
#if UNROLL == 1 || defined(DTYPE_F64)
    // Rolled (see UNROLL): one copy of acc_add in the code, not 4 or 8 (FLOAT64: a unit holds two).
    for (uint k = 0u; k < UNIT_LEN; k++) acc_add(acc, unit_elem(w, k), i + k);
#elif defined(DTYPE_F32)
    acc_add4(acc, uintBitsToFloat(w), i);
#else
    acc_add4(acc, vec4(from_bits(w.x & 0xffffu), from_bits(w.x >> 16), from_bits(w.y & 0xffffu), from_bits(w.y >> 16)), i);
    acc_add4(acc, vec4(from_bits(w.z & 0xffffu), from_bits(w.z >> 16), from_bits(w.w & 0xffffu), from_bits(w.w >> 16)), i + 4u);
#endif
}

// Head elements, units, tail elements: each lane sees its elements in increasing index order.
void accumulate(uint row, uint lane, uint lanes, inout ACC_T acc) {
    Span s = row_span(row);
    for (uint q = lane; q < s.head; q += lanes) acc_add(acc, load_elem(s.base + q), q);
    uint u = lane;
#if UNROLL == 4
    for (; u + 3u * lanes < s.units; u += 4u * lanes) {
        acc_unit(acc, s, u);
        acc_unit(acc, s, u + lanes);
        acc_unit(acc, s, u + 2u * lanes);
        acc_unit(acc, s, u + 3u * lanes);
    }
#endif
    for (; u < s.units; u += lanes) acc_unit(acc, s, u);
    for (uint q = lane; q < s.tail; q += lanes) {
        uint i = pc.row_len - s.tail + q;
        acc_add(acc, load_elem(s.base + i), i);
    }
}

#if defined(DTYPE_F16) || defined(DTYPE_BF16)
uint result_pair(uint w, uint i, PREP_T p) {
    float lo = result(from_bits(w & 0xffffu), i, p);
    float hi = result(from_bits(w >> 16), i + 1u, p);
    return to_bits(lo) | (to_bits(hi) << 16);
}
#endif

void write_unit(Span s, uint u, PREP_T p) {
    uint i = s.head + u * UNIT_LEN;
#ifdef RESULT_IGNORES_INPUT
    uvec4 w = uvec4(0u);
#else
    uvec4 w = IN_UNIT(s.first_unit + u);
#endif
#if defined(DTYPE_F64)
    out_units[s.first_unit + u] = uvec4(unpackDouble2x32(result(unit_elem(w, 0u), i, p)), unpackDouble2x32(result(unit_elem(w, 1u), i + 1u, p)));
#elif UNROLL == 1
    uvec4 o = uvec4(0u);
    for (uint k = 0u; k < UNIT_LEN; k++) {
        float y = result(unit_elem(w, k), i + k, p);
#if defined(DTYPE_F32)
        o[k] = floatBitsToUint(y);
#else
        o[k >> 1] |= to_bits(y) << ((k & 1u) * 16u);
#endif
    }
    out_units[s.first_unit + u] = o;
#elif defined(DTYPE_F32)
    vec4 v = uintBitsToFloat(w);
    out_units[s.first_unit + u] = floatBitsToUint(vec4(
        result(v.x, i, p), result(v.y, i + 1u, p), result(v.z, i + 2u, p), result(v.w, i + 3u, p)));
#else
    out_units[s.first_unit + u] = uvec4(
        result_pair(w.x, i, p), result_pair(w.y, i + 2u, p), result_pair(w.z, i + 4u, p), result_pair(w.w, i + 6u, p));
#endif
}

void write_row(uint row, uint lane, uint lanes, PREP_T p) {
    Span s = row_span(row);
    uint u = lane;
#if UNROLL == 4
    for (; u + 3u * lanes < s.units; u += 4u * lanes) {
        write_unit(s, u, p);
        write_unit(s, u + lanes, p);
        write_unit(s, u + 2u * lanes, p);
        write_unit(s, u + 3u * lanes, p);
    }
#endif
    for (; u < s.units; u += lanes) write_unit(s, u, p);
    for (uint q = lane; q < s.head + s.tail; q += lanes) {
        uint i = loose_index(s, q);
#ifdef RESULT_IGNORES_INPUT
        REAL_T x = 0.0;
#else
        REAL_T x = load_elem(s.base + i);
#endif
        store_elem(s.base + i, result(x, i, p));
    }
}


#else  // LAYOUT_STRIDED

// Offsets of index `rem` over dimensions first .. first + rank - 1 (innermost last) of the meta table,
// in the input and the output. (A loop of `rank` iterations: written as MAX_DIMS uniform branches it
// costs all eight on lavapipe, which runs untaken branches too; the host counts these iterations.)
uvec2 offsets(uint rem, uint first, uint rank) {
    uvec2 off = uvec2(0u);
    for (uint d = first + rank; d-- > first;) {
        uint size = meta[d];
        off += (rem % size) * uvec2(meta[MAX_DIMS + d], meta[2u * MAX_DIMS + d]);
        rem /= size;
    }
    return off;
}

// Element offsets of a row's first element in the input and the output.
uvec2 row_offsets(uint row) { return offsets(row, 0u, pc.outer_rank); }

// Offsets of element i of a row, relative to the row's first element.
uvec2 elem_offsets(uint i) {
    uint first = pc.outer_rank;
    if (pc.inner_rank == 1u) return i * uvec2(meta[MAX_DIMS + first], meta[2u * MAX_DIMS + first]);
    return offsets(i, first, pc.inner_rank);
}

void acc_elem(inout ACC_T acc, uint base, uint i) { acc_add(acc, load_elem(base + elem_offsets(i).x), i); }

void accumulate(uint row, uint lane, uint lanes, inout ACC_T acc) {
    uint base = row_offsets(row).x;
    uint i = lane;
#if UNROLL == 4
    for (; i + 3u * lanes < pc.row_len; i += 4u * lanes) {
        acc_elem(acc, base, i);
        acc_elem(acc, base, i + lanes);
        acc_elem(acc, base, i + 2u * lanes);
        acc_elem(acc, base, i + 3u * lanes);
    }
#endif
    for (; i < pc.row_len; i += lanes) acc_elem(acc, base, i);
}

void write_elem(uvec2 base, uint i, PREP_T p) {
    uvec2 off = base + elem_offsets(i);
#ifdef RESULT_IGNORES_INPUT
    REAL_T x = 0.0;
#else
    REAL_T x = load_elem(off.x);
#endif
    store_elem(off.y, result(x, i, p));
}

void write_row(uint row, uint lane, uint lanes, PREP_T p) {
    uvec2 base = row_offsets(row);
    uint i = lane;
#if UNROLL == 4
    for (; i + 3u * lanes < pc.row_len; i += 4u * lanes) {
        write_elem(base, i, p);
        write_elem(base, i + lanes, p);
        write_elem(base, i + 2u * lanes, p);
        write_elem(base, i + 3u * lanes, p);
    }
#endif
    for (; i < pc.row_len; i += lanes) write_elem(base, i, p);
}

#endif

// -- who reduces a row -----------------------------------------------------------------------------

// Combine the states of the `lanes` (a power of two, uniform) aligned lanes of a subgroup that share
// a row: after the butterfly every one of them holds the same total.
STATE_T butterfly(STATE_T st, uint lanes) {
    for (uint o = 1u; o < lanes; o <<= 1) st = combine(st, subgroupShuffleXor(st, o));
    return st;
}

// One state per subgroup: a subgroup has at least one invocation (Vulkan allows subgroups of 1), so a
// workgroup has at most gl_WorkGroupSize.x of them. 16 bytes per invocation: 16 KiB, the spec's minimum
// maxComputeSharedMemorySize, at 1,024 (the engine keeps the workgroup within the device's limits);
// FLOAT64's states take twice that (32 KiB at 1,024; 8 KiB at the default 256).
shared STATE_T partial[2][gl_WorkGroupSize.x];

void rows_per_workgroup() {
    // Two buffers for the subgroups' states, alternating by row: a subgroup can write the next row's
    // state while slower ones still read this row's, and one barrier per row suffices.
    uint parity = 0u;
    for (uint row = gl_WorkGroupID.x; row < pc.rows; row += gl_NumWorkGroups.x) {
        ACC_T acc = acc_empty();
        accumulate(row, gl_LocalInvocationID.x, gl_WorkGroupSize.x, acc);
        STATE_T st = butterfly(acc_state(acc), gl_SubgroupSize);
        if (subgroupElect()) partial[parity][gl_SubgroupID] = st;
        barrier();
        // Every subgroup combines all the states the same way (lane j folds states j, j + size, ...,
        // then a butterfly): few roundings in a row, and the same bits everywhere.
        STATE_T total = state_empty();
        for (uint g = gl_SubgroupInvocationID; g < gl_NumSubgroups; g += gl_SubgroupSize) total = combine(total, partial[parity][g]);
        total = butterfly(total, gl_SubgroupSize);
        write_row(row, gl_LocalInvocationID.x, gl_WorkGroupSize.x, prepare(total));
        parity ^= 1u;
    }
}

void rows_per_cluster() {
    uint lanes = min(pc.cluster, gl_SubgroupSize);
    uint per_subgroup = gl_SubgroupSize / lanes;                  // rows a subgroup holds at a time
    uint subgroup = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint step = gl_NumWorkGroups.x * gl_NumSubgroups * per_subgroup;
    uint lane = gl_SubgroupInvocationID & (lanes - 1u);
    // The loop condition is uniform in the subgroup, so every lane takes part in the shuffles;
    // lanes past the last row carry an empty state.
    for (uint first = subgroup * per_subgroup; first < pc.rows; first += step) {
        uint row = first + gl_SubgroupInvocationID / lanes;
        bool live = row < pc.rows;
        ACC_T acc = acc_empty();
        if (live) accumulate(row, lane, lanes, acc);
        STATE_T total = butterfly(acc_state(acc), lanes);
        if (live) write_row(row, lane, lanes, prepare(total));
    }
}

void main() {
    if (pc.cluster == 0u) {
        rows_per_workgroup();
    } else {
        rows_per_cluster();
    }
}

#endif
