#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_RELU_OPERATOR_DESC: max(0, x) as ONNX's np.maximum(x, 0): NaN stays NaN, -0 gives +0.
#if defined(DTYPE_F64)
double activate(double x) {  // FLOAT64 (ONNX)
    return x <= 0.0 ? 0.0 : x;
}
#elif defined(DTYPE_I64_EMU)
uvec2 activate(uvec2 x) {  // INT64 in 32-bit words: the sign is the high word's
    return int(x.y) < 0 ? uvec2(0u) : x;
}
#elif defined(DTYPE_INT)
ELEM_T activate(ELEM_T x) {  // INT8/16/32 (DirectML 5_1), INT64 (ONNX)
    return x < ELEM_T(0) ? ELEM_T(0) : x;
}
#else
float activate(float x) {
    return x <= 0.0 ? 0.0 : x;
}
#endif
