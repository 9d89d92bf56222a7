#version 450
// y[t][row_offset + row] = sum_k x[t][k] * W[row][k] for prefill: a workgroup computes a tile of 64
// tokens x 64 rows, 4 x 4 outputs per invocation, staging 32-wide k slices of x and W in shared
// memory, so each weight element is read from memory once per 64 tokens (the GEMV of matmul.comp
// reads it once per 8). Uses no subgroup operations: any subgroup size works.
// Variants (compile-time): WEIGHTS_F32 / WEIGHTS_BF16 / WEIGHTS_Q8 / WEIGHTS_Q4, decoded as matmul.comp
// does (weights.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
#if defined(WEIGHTS_Q4)
layout(std430, binding = 3) readonly buffer Scales { uint scales[]; };  // f16 pairs
#else
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
#endif

layout(push_constant) uniform Push {
  uint rows;         // rows of this chunk
  uint cols;
  uint tokens;       // rows of x
  uint row_offset;   // the chunk's first row in y
  uint y_stride;     // y elements between tokens
  uint token_base;   // first token of this dispatch (grids are split at 65535 workgroups)
};

const uint kTile = 64u;
const uint kStep = 32u;
const uint kBlock = 4u;                   // outputs per invocation along tokens and along rows
const uint kLanes = kTile / kBlock;       // 16 x 16 invocations
// [k][token] and [k][row]; the +1 keeps the stores of 32 consecutive k in distinct banks.
shared float x_tile[kStep][kTile + 1u];
shared float w_tile[kStep][kTile + 1u];

#include "weights.glsl"

void main() {
  const uint local = gl_LocalInvocationID.x;
  const uint lane_row = local % kLanes, lane_token = local / kLanes;
  const uint first_row = gl_WorkGroupID.x * kTile;
  const uint first_token = token_base + gl_WorkGroupID.y * kTile;
  float sums[kBlock][kBlock];
  for (uint i = 0u; i < kBlock; ++i) {
    for (uint j = 0u; j < kBlock; ++j) sums[i][j] = 0.0;
  }
  for (uint k0 = 0u; k0 < cols; k0 += kStep) {
    // Consecutive invocations load consecutive k of one token / row: contiguous reads.
    for (uint index = local; index < kTile * kStep; index += gl_WorkGroupSize.x) {
      const uint r = index / kStep, kk = index % kStep, k = k0 + kk;
      const uint token = first_token + r, row = first_row + r;
      x_tile[kk][r] = token < tokens && k < cols ? x[token * cols + k] : 0.0;
      w_tile[kk][r] = row < rows && k < cols ? weight_at(row, k) : 0.0;
    }
    barrier();
    for (uint kk = 0u; kk < kStep; ++kk) {
      float a[kBlock], b[kBlock];
      // Strided by kLanes: neighbouring invocations take neighbouring rows (conflict-free reads, contiguous writes).
      for (uint i = 0u; i < kBlock; ++i) a[i] = x_tile[kk][lane_token + i * kLanes];
      for (uint j = 0u; j < kBlock; ++j) b[j] = w_tile[kk][lane_row + j * kLanes];
      for (uint i = 0u; i < kBlock; ++i) {
        for (uint j = 0u; j < kBlock; ++j) sums[i][j] += a[i] * b[j];
      }
    }
    barrier();
  }
  for (uint i = 0u; i < kBlock; ++i) {
    const uint token = first_token + lane_token + i * kLanes;
    if (token >= tokens) break;
    for (uint j = 0u; j < kBlock; ++j) {
      const uint row = first_row + lane_row + j * kLanes;
      if (row < rows) y[token * y_stride + row_offset + row] = sums[i][j];
    }
  }
}
