#version 450
// out[row] = log(sum_i exp(values[row][i])), the row's maximum subtracted first; one workgroup per row.
// Two passes over the row: the maximum, then the exponentials' sum (fp32 per lane, then a tree).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Values { float values[]; };
layout(std430, binding = 1) buffer Out { float result[]; };
layout(push_constant) uniform Push {
  uint width;
};
shared float partial[64];

void main() {
  const uint row = gl_WorkGroupID.x;
  const uint lane = gl_LocalInvocationID.x;
  const uint base = row * width;
  float maximum = uintBitsToFloat(0xFF800000u);  // -inf
  for (uint i = lane; i < width; i += 64u) maximum = max(maximum, values[base + i]);
  partial[lane] = maximum;
  barrier();
  for (uint half_width = 32u; half_width > 0u; half_width >>= 1u) {
    if (lane < half_width) partial[lane] = max(partial[lane], partial[lane + half_width]);
    barrier();
  }
  maximum = partial[0];
  barrier();
  // All -inf or any +inf: nothing to normalise against, the maximum is the answer (as on the CPU).
  if (isinf(maximum)) {
    if (lane == 0u) result[row] = maximum;
    return;
  }
  float total = 0.0;
  for (uint i = lane; i < width; i += 64u) total += exp(values[base + i] - maximum);
  partial[lane] = total;
  barrier();
  for (uint half_width = 32u; half_width > 0u; half_width >>= 1u) {
    if (lane < half_width) partial[lane] += partial[lane + half_width];
    barrier();
  }
  if (lane == 0u) result[row] = maximum + log(partial[0]);
}
