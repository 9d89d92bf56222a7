#version 450
// ids[row] = the index of the row's largest value, the lowest index on ties, as the host's argmax_of
// (core/argmax.h) picks it: a NaN is never chosen; a row with nothing above -inf gives -1 (Backend::argmax).
// One workgroup per row.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Values { float values[]; };
layout(std430, binding = 1) buffer Ids { int ids[]; };
layout(push_constant) uniform Push {
  uint width;
};
const uint kNone = 0xFFFFFFFFu;  // a lane that has seen no value above -inf
shared float best_value[64];
shared uint best_index[64];

void main() {
  const uint row = gl_WorkGroupID.x;
  const uint lane = gl_LocalInvocationID.x;
  const uint base = row * width;
  // Only a strictly larger value replaces the best: a comparison with NaN is false either way round,
  // so a NaN never enters, and a lane's first candidate is its lowest index.
  float value = uintBitsToFloat(0xFF800000u);  // -inf
  uint index = kNone;
  for (uint i = lane; i < width; i += 64u) {
    if (values[base + i] > value) value = values[base + i], index = i;
  }
  best_value[lane] = value;
  best_index[lane] = index;
  barrier();
  for (uint half_width = 32u; half_width > 0u; half_width >>= 1u) {
    if (lane < half_width) {
      const float other = best_value[lane + half_width];
      const uint other_index = best_index[lane + half_width];
      if (other_index != kNone &&
          (best_index[lane] == kNone || other > best_value[lane] || (other == best_value[lane] && other_index < best_index[lane]))) {
        best_value[lane] = other;
        best_index[lane] = other_index;
      }
    }
    barrier();
  }
  if (lane == 0u) ids[row] = best_index[0] == kNone ? -1 : int(best_index[0]);
}
