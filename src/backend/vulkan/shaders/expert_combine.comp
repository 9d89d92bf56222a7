#version 450
// out[row][i] = sum over the row's choices, in ascending expert index, of weight * expert_out[choice][i].
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer ExpertOut { float expert_out[]; };
layout(std430, binding = 1) readonly buffer Chosen { int chosen[]; };
layout(std430, binding = 2) readonly buffer Weights { float weights[]; };
layout(std430, binding = 3) buffer Out { float result[]; };
layout(push_constant) uniform Push {
  uint rows;
  uint hidden;
  uint top_k;
};

void main() {
  const uint total = rows * hidden;
  const uint step = gl_NumWorkGroups.x * 64u;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += step) {
    const uint row = i / hidden;
    const uint c = i - row * hidden;
    float sum = 0.0;
    int previous = -1;
    for (uint n = 0u; n < top_k; ++n) {
      // The next expert above `previous` among the row's choices.
      uint next = 0u;
      int next_expert = 0x7FFFFFFF;
      for (uint k = 0u; k < top_k; ++k) {
        const int expert = chosen[row * top_k + k];
        if (expert > previous && expert < next_expert) next_expert = expert, next = k;
      }
      previous = next_expert;
      sum += expert_out[(row * top_k + next) * hidden + c] * weights[row * top_k + next];
    }
    result[i] = sum;
  }
}
