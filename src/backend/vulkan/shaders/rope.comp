#version 450
// Rotates query heads, then key heads, of each row by the row's position ("rotate half": pairs
// (j, j + head_dim / 2)), angle = position * inverse_frequencies[j]. One invocation per (row, head, j).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Queries { float queries[]; };
layout(std430, binding = 1) buffer Keys { float keys[]; };
layout(std430, binding = 2) readonly buffer Rows { int row_table[]; };
layout(std430, binding = 3) readonly buffer Frequencies { float inverse_frequencies[]; };
layout(push_constant) uniform Push {
  uint rows;
  uint query_heads;
  uint key_heads;
  uint head_dim;
};

void main() {
  const uint half_dim = head_dim / 2u;
  const uint heads = query_heads + key_heads;
  const uint total = rows * heads * half_dim;
  const uint step = gl_NumWorkGroups.x * 64u;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += step) {
    const uint j = i % half_dim;
    const uint head = (i / half_dim) % heads;
    const uint row = i / (half_dim * heads);
    const float angle = float(row_table[row * 3u + 1u]) * inverse_frequencies[j];
    const float c = cos(angle);
    const float s = sin(angle);
    if (head < query_heads) {
      const uint base = (row * query_heads + head) * head_dim;
      const float first = queries[base + j];
      const float second = queries[base + j + half_dim];
      queries[base + j] = first * c - second * s;
      queries[base + j + half_dim] = second * c + first * s;
    } else {
      const uint base = (row * key_heads + head - query_heads) * head_dim;
      const float first = keys[base + j];
      const float second = keys[base + j + half_dim];
      keys[base + j] = first * c - second * s;
      keys[base + j + half_dim] = second * c + first * s;
    }
  }
}
