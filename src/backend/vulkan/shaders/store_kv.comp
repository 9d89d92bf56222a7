#version 450
// Writes each row's K or V into the cache [sequence][slot][row_elements] at slot position % capacity.
// KV_BF16: the cache holds bf16 packed two per uint; each invocation writes one pair.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Source { float source[]; };
layout(std430, binding = 1) readonly buffer Rows { int row_table[]; };
layout(std430, binding = 2) buffer Cache { uint cache[]; };
layout(push_constant) uniform Push {
  uint rows;
  uint row_elements;
  uint capacity;
};

void main() {
#if defined(KV_BF16)
  const uint per_row = row_elements / 2u;
#else
  const uint per_row = row_elements;
#endif
  const uint total = rows * per_row;
  const uint step = gl_NumWorkGroups.x * 64u;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += step) {
    const uint row = i / per_row;
    const uint e = i - row * per_row;
    const uint sequence = uint(row_table[row * 3u]);
    const uint position = uint(row_table[row * 3u + 1u]);
    const uint slot = sequence * capacity + position % capacity;
#if defined(KV_BF16)
    const uint value = bf16_bits(source[row * row_elements + 2u * e]) | (bf16_bits(source[row * row_elements + 2u * e + 1u]) << 16);
    cache[slot * per_row + e] = value;
#else
    cache[slot * per_row + e] = floatBitsToUint(source[row * row_elements + e]);
#endif
  }
}
