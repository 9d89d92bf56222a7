#version 450
// y[t][row] = sum_k x[t][k] * W[row][k]: each subgroup computes whole rows (its lanes stride over k,
// subgroupAdd sums them: no shared memory, no barriers), `rows_per_group` rows per workgroup, for a
// block of up to 8 tokens (the second dispatch dimension), so decode reads every weight row once.
// Variants (compile-time): WEIGHTS_F32 / WEIGHTS_BF16 / WEIGHTS_Q8 / WEIGHTS_Q4 (weights.glsl); GATHERED
// for expert products, where token t is an (input row, choice) assignment and only assignments that
// chose `expert` are computed.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
#if defined(WEIGHTS_Q4)
layout(std430, binding = 3) readonly buffer Scales { uint scales[]; };  // f16 pairs
#else
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
#endif
layout(std430, binding = 4) readonly buffer Ids { int ids[]; };

layout(push_constant) uniform Push {
  uint rows;         // rows of this chunk
  uint cols;
  uint tokens;       // rows of x (GATHERED: assignments)
  uint row_offset;   // the chunk's first row in y
  uint y_stride;     // y elements between tokens
  uint expert;       // GATHERED: the expert this dispatch computes
  uint top_k;        // GATHERED: choices per input row; 0: x holds one row per assignment
  uint rows_per_group;
};

const uint kTokens = 8;

#include "weights.glsl"

void main() {
  const uint first = gl_WorkGroupID.y * kTokens;
  const uint count = min(kTokens, tokens - first);
  const uint lane = gl_SubgroupInvocationID;
  for (uint r = gl_SubgroupID; r < rows_per_group; r += gl_NumSubgroups) {
    const uint row = gl_WorkGroupID.x * rows_per_group + r;
    if (row >= rows) return;
    float sums[kTokens];
    for (uint t = 0u; t < kTokens; ++t) sums[t] = 0.0;
    bool any = true;
#if defined(GATHERED)
    // Assignments that chose other experts are skipped; a block with none reads no weights.
    any = false;
    for (uint t = 0u; t < count; ++t) any = any || ids[first + t] == int(expert);
#endif
    if (!any) continue;
    for (uint k = lane; k < cols; k += gl_SubgroupSize) {
      const float weight = weight_at(row, k);
      for (uint t = 0u; t < count; ++t) {
#if defined(GATHERED)
        const uint source_row = top_k > 0u ? (first + t) / top_k : first + t;
#else
        const uint source_row = first + t;
#endif
        sums[t] += weight * x[source_row * cols + k];
      }
    }
    for (uint t = 0u; t < count; ++t) {
      const float total = subgroupAdd(sums[t]);
#if defined(GATHERED)
      if (ids[first + t] != int(expert)) continue;
#endif
      if (lane == 0u) y[(first + t) * y_stride + row_offset + row] = total;
    }
  }
}
