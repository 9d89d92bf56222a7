#version 450
// Streams a buffer once (vec4 loads) and writes one sum per workgroup so no read is optimised away:
// the memory-bandwidth probe behind bench's roofline.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Data { vec4 data[]; };
layout(std430, binding = 1) buffer Sums { float sums[]; };
layout(push_constant) uniform Push {
  uint count;   // vec4 elements
};
shared float partial[256];

void main() {
  const uint step = gl_NumWorkGroups.x * 256u;
  vec4 sum = vec4(0.0);
  for (uint i = gl_GlobalInvocationID.x; i < count; i += step) sum += data[i];
  partial[gl_LocalInvocationID.x] = sum.x + sum.y + sum.z + sum.w;
  barrier();
  if (gl_LocalInvocationID.x == 0u) {
    float total = 0.0;
    for (uint i = 0u; i < 256u; ++i) total += partial[i];
    sums[gl_WorkGroupID.x] = total;
  }
}
