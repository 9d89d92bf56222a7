#version 450
// Attention for one (row, query head) per workgroup: the row's visible keys (its sequence's positions
// up to its own; sliding layers the last `window`) are read from the row table, so the work follows
// the actual context while the dispatch depends only on the step's shape. Scores go to a scratch row,
// then softmax (maximum subtracted), then out = sum_k p_k v_k. Scale 1: Gemma-4 has no 1/sqrt(d).
// KV_BF16: the cache holds bf16 packed two per uint. K=V layers (derived_keys) cache only values: each
// key is RoPE(value * key_norm) at the key's position, folded into the dot product (query * key_norm
// against the value, the rotated pairs turned by the position's cos/sin from the rotation table).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Queries { float queries[]; };
layout(std430, binding = 1) readonly buffer Rows { int row_table[]; };
layout(std430, binding = 2) readonly buffer Keys { uint keys[]; };
layout(std430, binding = 3) readonly buffer Values { uint values[]; };
layout(std430, binding = 4) buffer Scores { float scores[]; };
layout(std430, binding = 5) buffer Out { float result[]; };
layout(std430, binding = 6) readonly buffer KeyNorm { float key_norm[]; };
layout(std430, binding = 7) readonly buffer Rotations { float rotations[]; };  // [position][cos of each pair, then sin]
layout(push_constant) uniform Push {
  uint query_heads;
  uint kv_heads;
  uint head_dim;
  uint first_query_head;
  uint first_kv_head;
  uint group_size;
  uint capacity;
  uint window;      // 0: full attention
  uint max_keys;    // scratch scores per (row, head)
  uint pair_base;   // (row, head) pairs are dispatched in batches of at most 65535
  uint derived_keys;   // 1: keys are rebuilt from values (K=V layers)
  uint rotated_pairs;  // derived keys: pairs (d, d + head_dim / 2) that rotate
};
shared float query[512];
shared float norm[512];  // derived keys: the k_norm weight
shared float partial[64];

float cached(uint index, bool is_key) {
#if defined(KV_BF16)
  return bf16_at(is_key ? keys[index >> 1] : values[index >> 1], index);
#else
  return uintBitsToFloat(is_key ? keys[index] : values[index]);
#endif
}

void main() {
  const uint pair = pair_base + gl_WorkGroupID.x;
  const uint row = pair / query_heads;
  const uint head = pair - row * query_heads;
  const uint lane = gl_LocalInvocationID.x;
  const int position = row_table[row * 3u + 1u];
  const int first_key = window > 0u ? max(0, position - int(window) + 1) : 0;
  const uint count = uint(position - first_key + 1);
  const uint sequence = uint(row_table[row * 3u]);
  const uint kv_head = (first_query_head + head) / group_size - first_kv_head;
  const uint score_base = pair * max_keys;
  for (uint d = lane; d < head_dim; d += 64u) {
    query[d] = queries[pair * head_dim + d];
    norm[d] = derived_keys != 0u ? key_norm[d] : 1.0;
  }
  barrier();
  const uint half_dim = head_dim / 2u;

  float maximum = -3.402823466e38;
  for (uint k = lane; k < count; k += 64u) {
    const uint slot = sequence * capacity + uint(first_key + int(k)) % capacity;
    const uint base = (slot * kv_heads + kv_head) * head_dim;
    float dot_product = 0.0;
    if (derived_keys == 0u) {
      for (uint d = 0u; d < head_dim; ++d) dot_product += query[d] * cached(base + d, true);
    } else {
      // q . RoPE(v * w): unrotated dims give q_d w_d v_d; a rotated pair with a = w_a v_a, b = w_b v_b
      // gives cos (q_a a + q_b b) + sin (q_b a - q_a b).
      const uint angles = uint(first_key + int(k)) * 2u * rotated_pairs;
      for (uint i = 0u; i < rotated_pairs; ++i) {
        const float a = norm[i] * cached(base + i, false), b = norm[i + half_dim] * cached(base + i + half_dim, false);
        const float qa = query[i], qb = query[i + half_dim];
        dot_product += rotations[angles + i] * (qa * a + qb * b) + rotations[angles + rotated_pairs + i] * (qb * a - qa * b);
      }
      for (uint d = rotated_pairs; d < half_dim; ++d) {
        dot_product += query[d] * norm[d] * cached(base + d, false) + query[d + half_dim] * norm[d + half_dim] * cached(base + d + half_dim, false);
      }
    }
    scores[score_base + k] = dot_product;
    maximum = max(maximum, dot_product);
  }
  partial[lane] = maximum;
  barrier();
  for (uint width = 32u; width > 0u; width >>= 1u) {
    if (lane < width) partial[lane] = max(partial[lane], partial[lane + width]);
    barrier();
  }
  maximum = partial[0];
  barrier();
  float total = 0.0;
  for (uint k = lane; k < count; k += 64u) {
    const float value = exp(scores[score_base + k] - maximum);
    scores[score_base + k] = value;
    total += value;
  }
  partial[lane] = total;
  barrier();
  for (uint width = 32u; width > 0u; width >>= 1u) {
    if (lane < width) partial[lane] += partial[lane + width];
    barrier();
  }
  const float inverse = 1.0 / partial[0];
  for (uint k = lane; k < count; k += 64u) scores[score_base + k] *= inverse;
  memoryBarrierBuffer();
  barrier();

  for (uint d = lane; d < head_dim; d += 64u) {
    float sum = 0.0;
    for (uint k = 0u; k < count; ++k) {
      const uint slot = sequence * capacity + uint(first_key + int(k)) % capacity;
      sum += scores[score_base + k] * cached((slot * kv_heads + kv_head) * head_dim + d, false);
    }
    result[pair * head_dim + d] = sum;
  }
}
