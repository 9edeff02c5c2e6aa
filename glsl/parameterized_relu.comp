#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_PARAMETERIZED_RELU_OPERATOR_DESC { InputTensor, SlopeTensor }: x if x >= 0, else slope * x.
// NaN fails the comparison and gives slope * NaN = NaN.
// Integers (INT8/16/32 from 5_1): slope * x wraps to the type, as numpy's integer product does.
#if defined(DTYPE_I64_EMU)
#include "common/emu64.glsl"
// INT64 in 32-bit words: the sign is the high word's, the product's low 64 bits wrap as int64 does.
uvec2 activate(uvec2 x, uvec2 slope) {
    return int(x.y) >= 0 ? x : u64_mul(slope, x);
}
#elif defined(DTYPE_U64_EMU)
uvec2 activate(uvec2 x, uvec2 slope) { return x; }  // UINT64: never negative
#else
ELEM_T activate(ELEM_T x, ELEM_T slope) {
    return x >= ELEM_T(0) ? x : slope * x;
}
#endif
