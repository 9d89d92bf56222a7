#version 450
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (weight optional), one workgroup per row.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) buffer Out { float result[]; };
layout(push_constant) uniform Push {
  uint width;
  uint has_weight;
  float eps;
  uint row_base;   // rows are dispatched in batches of at most 65535
};
shared float partial[64];

void main() {
  const uint row = row_base + gl_WorkGroupID.x;
  const uint lane = gl_LocalInvocationID.x;
  const uint base = row * width;
  float sum = 0.0;
  for (uint i = lane; i < width; i += 64u) sum += x[base + i] * x[base + i];
  partial[lane] = sum;
  barrier();
  for (uint half_width = 32u; half_width > 0u; half_width >>= 1u) {
    if (lane < half_width) partial[lane] += partial[lane + half_width];
    barrier();
  }
  const float inverse_rms = pow(partial[0] / float(width) + eps, -0.5);
  barrier();
  for (uint i = lane; i < width; i += 64u) {
    const float normalised = x[base + i] * inverse_rms;
    result[base + i] = has_weight != 0u ? normalised * weight[i] : normalised;
  }
}
