#version 450
// The MoE router for one row per invocation: softmax over the experts' logits (in place), the top_k
// most probable (ties: the lower index), renormalised and scaled by per_expert_scale.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Scale { float per_expert_scale[]; };
layout(std430, binding = 2) buffer Chosen { int chosen[]; };
layout(std430, binding = 3) buffer Weights { float weights[]; };
layout(push_constant) uniform Push {
  uint rows;
  uint experts;
  uint top_k;
};

void main() {
  const uint row = gl_GlobalInvocationID.x;
  if (row >= rows) return;
  const uint base = row * experts;
  float maximum = -3.402823466e38;
  for (uint e = 0u; e < experts; ++e) maximum = max(maximum, logits[base + e]);
  float total = 0.0;
  for (uint e = 0u; e < experts; ++e) {
    logits[base + e] = exp(logits[base + e] - maximum);
    total += logits[base + e];
  }
  for (uint e = 0u; e < experts; ++e) logits[base + e] /= total;
  float chosen_total = 0.0;
  for (uint k = 0u; k < top_k; ++k) {
    int best = -1;
    for (uint e = 0u; e < experts; ++e) {
      bool taken = false;
      for (uint j = 0u; j < k; ++j) taken = taken || chosen[row * top_k + j] == int(e);
      if (taken) continue;
      if (best < 0 || logits[base + e] > logits[base + uint(best)]) best = int(e);
    }
    chosen[row * top_k + k] = best;
    chosen_total += logits[base + uint(best)];
  }
  for (uint k = 0u; k < top_k; ++k) {
    const uint e = uint(chosen[row * top_k + k]);
    weights[row * top_k + k] = logits[base + e] / chosen_total * per_expert_scale[e];
  }
}
