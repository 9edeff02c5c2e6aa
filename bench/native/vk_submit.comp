#version 450
// bench/native/vk_submit.c's dispatch: every word of the buffer plus one (a small real write)
layout(local_size_x = 256) in;
layout(binding = 0) buffer Words { uint words[]; };
void main() { words[gl_GlobalInvocationID.x] += 1u; }
