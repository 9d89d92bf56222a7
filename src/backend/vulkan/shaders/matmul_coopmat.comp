#version 450
// The tiled product of matmul_tiled.comp on cooperative-matrix hardware: a workgroup of 4 subgroups
// of 32 computes 64 tokens x 64 rows, each subgroup a 32 x 32 block as 2 x 2 16x16 f32 accumulators,
// multiplying 16x16x16 f16 tiles that the workgroup converts into shared memory from f32
// activations and f32 / bf16 / q8 / q4 weights. f16 holds bf16 weights exactly, activations to 11
// bits; an activation beyond f16's range (65504) would overflow, which normed product inputs do not
// reach.
// GL_NV_cooperative_matrix rather than GL_KHR_cooperative_matrix: the build's glslc (Debian 12,
// shaderc 2023.2 / glslang 11.13) compiles only the NV extension. The backend uses this shader only
// where the device lists the 16x16x16 f16 -> f32 subgroup shape and a self-check agrees with the
// plain tiled shader.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"

layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
#if defined(WEIGHTS_Q4)
layout(std430, binding = 3) readonly buffer Scales { uint scales[]; };  // f16 pairs
#else
layout(std430, binding = 3) readonly buffer Scales { float scales[]; };
#endif

layout(push_constant) uniform Push {
  uint rows;
  uint cols;
  uint tokens;
  uint row_offset;
  uint y_stride;
  uint token_base;
};

const uint kTile = 64u;
const uint kStep = 32u;
// Row pitches of the shared tiles, in elements: multiples of 16 bytes, as matrix loads and stores
// want, and off the bank period.
const uint kInPitch = kStep + 8u;
const uint kOutPitch = kTile + 4u;
shared float16_t x_tile[kTile * kInPitch];  // [token][k]
shared float16_t w_tile[kTile * kInPitch];  // [row][k]
shared float y_tile[kTile * kOutPitch];     // [token][row]

#include "weights.glsl"

void main() {
  const uint local = gl_LocalInvocationID.x;
  const uint first_row = gl_WorkGroupID.x * kTile;
  const uint first_token = token_base + gl_WorkGroupID.y * kTile;
  // Subgroup s owns tokens (s / 2) * 32 .. +32 and rows (s % 2) * 32 .. +32 of the tile.
  const uint block_token = (gl_SubgroupID / 2u) * 32u, block_row = (gl_SubgroupID % 2u) * 32u;
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> sum00 = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> sum01 = sum00, sum10 = sum00, sum11 = sum00;
  for (uint k0 = 0u; k0 < cols; k0 += kStep) {
    for (uint index = local; index < kTile * kStep; index += gl_WorkGroupSize.x) {
      const uint r = index / kStep, kk = index % kStep, k = k0 + kk;
      const uint token = first_token + r, row = first_row + r;
      x_tile[r * kInPitch + kk] = float16_t(token < tokens && k < cols ? x[token * cols + k] : 0.0);
      w_tile[r * kInPitch + kk] = float16_t(row < rows && k < cols ? weight_at(row, k) : 0.0);
    }
    barrier();
    for (uint kk = 0u; kk < kStep; kk += 16u) {
      // A: tokens x k, row-major; B: k x rows, read column-major from the [row][k] tile (B = W^T).
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a0, a1, b0, b1;
      coopMatLoadNV(a0, x_tile, (block_token + 0u) * kInPitch + kk, kInPitch, false);
      coopMatLoadNV(a1, x_tile, (block_token + 16u) * kInPitch + kk, kInPitch, false);
      coopMatLoadNV(b0, w_tile, (block_row + 0u) * kInPitch + kk, kInPitch, true);
      coopMatLoadNV(b1, w_tile, (block_row + 16u) * kInPitch + kk, kInPitch, true);
      sum00 = coopMatMulAddNV(a0, b0, sum00);
      sum01 = coopMatMulAddNV(a0, b1, sum01);
      sum10 = coopMatMulAddNV(a1, b0, sum10);
      sum11 = coopMatMulAddNV(a1, b1, sum11);
    }
    barrier();
  }
  // Through shared memory, so partial tiles at the edges are written with bounds checks.
  coopMatStoreNV(sum00, y_tile, (block_token + 0u) * kOutPitch + block_row + 0u, kOutPitch, false);
  coopMatStoreNV(sum01, y_tile, (block_token + 0u) * kOutPitch + block_row + 16u, kOutPitch, false);
  coopMatStoreNV(sum10, y_tile, (block_token + 16u) * kOutPitch + block_row + 0u, kOutPitch, false);
  coopMatStoreNV(sum11, y_tile, (block_token + 16u) * kOutPitch + block_row + 16u, kOutPitch, false);
  barrier();
  for (uint index = local; index < kTile * kTile; index += gl_WorkGroupSize.x) {
    const uint t = index / kTile, r = index % kTile;
    const uint token = first_token + t, row = first_row + r;
    if (token < tokens && row < rows) y[token * y_stride + row_offset + row] = y_tile[t * kOutPitch + r];
  }
}
