#version 450
// The device's own ceiling for the benchmark: a grid-stride copy of 16-byte vectors, nothing else.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform Push { uint units; } pc;
layout(binding = 0) readonly buffer Src { uvec4 src[]; };
layout(binding = 1) writeonly buffer Dst { uvec4 dst[]; };

void main() {
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint u = gl_GlobalInvocationID.x; u < pc.units; u += step) dst[u] = src[u];
}
