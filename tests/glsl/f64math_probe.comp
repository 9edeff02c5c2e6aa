#version 450
#extension GL_GOOGLE_include_directive : require
// The test harness of glsl/common/f64math.glsl and f64activation.glsl (tests/glsl/f64_harness.py): y[i] = FN(x[i]) (or
// FN(x[i], p[i]) with TWO_ARGS) on doubles carried as their two 32-bit words.
#include "common/f64activation.glsl"   // and f64math.glsl
#ifdef EXTRA_INCLUDE
#include EXTRA_INCLUDE
#endif

layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer In { uvec2 xin[]; };
layout(binding = 1) readonly buffer Par { uvec2 pin[]; };
layout(binding = 2) buffer Out { uvec2 yout[]; };
layout(push_constant) uniform Push { uint count; } pc;

void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += step) {
        double x = packDouble2x32(xin[i]);
#ifdef TWO_ARGS
        yout[i] = unpackDouble2x32(FN(x, packDouble2x32(pin[i])));
#else
        yout[i] = unpackDouble2x32(FN(x));
#endif
    }
}
