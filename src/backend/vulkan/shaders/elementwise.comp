#version 450
// The element-wise ops, chosen by `op`, over `count` elements with a grid-stride loop.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push {
  uint op;
  uint count;
  uint width;
  uint stride;
  uint offset;
  float f0;
  float f1;
};

const uint kScale = 0u;          // a *= f0
const uint kScaleColumns = 1u;   // a[r][i] = a[r][i] * b[i] * f0
const uint kAdd = 2u;            // a += b
const uint kCopy = 3u;           // a = b
const uint kGeluMultiply = 4u;   // a[r][i] = gelu(a[r][i]) * b[r * stride + offset + i]
const uint kCombine = 5u;        // a = (b + a * f0) * f1
const uint kSoftcap = 6u;        // a = tanh(a / f0) * f0
const uint kGeluGateUp = 7u;     // a[r][i] = gelu(b[r][i]) * b[r][width + i], b rows of 2 * width
const uint kGatherRows = 8u;     // a[r][i] = b[ids[r]][i]

void main() {
  const uint step = gl_NumWorkGroups.x * 64u;
  for (uint i = gl_GlobalInvocationID.x; i < count; i += step) {
    const uint r = width > 0u ? i / width : 0u;
    const uint c = width > 0u ? i - r * width : i;
    if (op == kScale) {
      a[i] *= f0;
    } else if (op == kScaleColumns) {
      a[i] = a[i] * b[c] * f0;
    } else if (op == kAdd) {
      a[i] += b[i];
    } else if (op == kCopy) {
      a[i] = b[i];
    } else if (op == kGeluMultiply) {
      a[i] = gelu_tanh(a[i]) * b[r * stride + offset + c];
    } else if (op == kCombine) {
      a[i] = (b[i] + a[i] * f0) * f1;
    } else if (op == kSoftcap) {
      a[i] = tanh(clamp(a[i] / f0, -20.0, 20.0)) * f0;
    } else if (op == kGeluGateUp) {
      a[i] = gelu_tanh(b[r * 2u * width + c]) * b[r * 2u * width + width + c];
    } else if (op == kGatherRows) {
      a[i] = b[uint(ids[r]) * width + c];
    }
  }
}
