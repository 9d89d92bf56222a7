// Vectorised element-wise and attention kernels. Each function dispatches at call time on
// active_isa() to a scalar, AVX2 or AVX-512 body, so tests can force every path. They compute the same
// functions as the scalar kernels in reference.h; the scalar level is those formulas in plain C++.
//
// Accuracy of the SIMD paths (fp32 throughout):
// - exp (max 7.5e-8 relative, 1.3 ulp) and tanh (max 1.6e-7 relative, 2.6 ulp, also for tiny |x|) are
//   polynomial approximations; exp(x) is 0 below ln(FLT_MIN) (about -87.34) instead of a subnormal,
//   so softmax of widely spread values gives exact zeros; tanh saturates to +-1 and GELU to x or -0.
// - GELU-tanh is evaluated as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which equals
//   0.5 x (1 + tanh(u)) but avoids its cancellation for negative x: within 1.4e-7 max(1, |x|) of the
//   exact value, 8e-7 relative down to x = -3 (where u's own fp32 rounding dominates).
// - rms_norm, softmax and dot products accumulate in fp32 over several vector accumulators instead of
//   the reference's doubles: a few 1e-7 relative on the results (see tests/unit/vector_ops_test.cc).
// - bf16 K/V rows widen to fp32 exactly; store_kv_row rounds to nearest even, bit-equal to float_to_bf16.
// The AVX-512+BF16 level currently runs the AVX-512 bodies: exact widening keeps queries and
// probabilities in fp32, where vdpbf16ps would round them to bf16.
#pragma once

#include <cstdint>
#include <span>

#include "core/formats.h"

namespace gemma4rt::kernels {

// out = x / sqrt(mean(x^2) + eps) * weight; weight may be null (the weightless norm); out may alias x.
void rms_norm(const float* x, int64_t size, const float* weight, float eps, float* out);

// out[i] = gelu_tanh(gate[i]) * up[i]; out may be gate.
void gelu_tanh_multiply(const float* gate, const float* up, int64_t size, float* out);
// gate[i] = gelu_tanh(gate[i]) * up[i].
inline void gelu_tanh_multiply(float* gate, const float* up, int64_t size) { gelu_tanh_multiply(gate, up, size, gate); }
// The same operation under the name the feed-forward callers use for a per-element factor.
inline void gelu_tanh_multiply_by(float* gate, const float* factor, int64_t size) {
  gelu_tanh_multiply(gate, factor, size);
}

// In-place softmax (maximum subtracted first).
void softmax(float* values, int64_t size);

// log(sum_i exp(values[i])), the maximum subtracted first: the log of softmax's normaliser, so that
// log p_i = values[i] - log_sum_exp. The exponentials are summed in fp32 over blocks of 4,096 values and
// the blocks in double. Edge cases as reference::log_sum_exp.
float log_sum_exp(const float* values, int64_t size);

// The index of the largest value, the lowest on ties; NaN is never chosen; 0 when nothing is larger
// than -inf (or size is 0).
int64_t argmax(const float* values, int64_t size);

// Rotates `head_count` contiguous heads of `head_dim` in place, "rotate half" convention: pairs
// (j, j + head_dim/2). cos and sin hold head_dim values shared by every head.
void apply_rope(float* heads, int64_t head_count, int64_t head_dim, const float* cos, const float* sin);

void add(float* y, const float* x, int64_t size);      // y += x
void scale(float* y, float factor, int64_t size);      // y *= factor
void softcap(float* values, int64_t size, float cap);  // v = tanh(v / cap) * cap

// Writes one row of `size` values into the cache format (bf16: round to nearest even).
void store_kv_row(const float* source, int64_t size, KvFormat format, void* destination);

// One query head against cached rows; row j is at base + slots[j] * row_stride elements of the cache
// format. out = softmax(q . k_j) @ v_j over the listed slots, scale 1.0 (Gemma-4 has no 1/sqrt(d)).
// `scores` needs slots.size() floats and holds the probabilities afterwards. No slots: out = 0.
void attend(const float* query, int64_t head_dim, const void* keys, const void* values, KvFormat format,
            int64_t row_stride, std::span<const int32_t> slots, float* scores, float* out);

// `group` query heads ([group][head_dim], contiguous) that share one KV head: every K/V row is read
// once for the whole group. scores: [group][slots.size()] (probabilities afterwards); out: [group][head_dim],
// overlapping neither queries nor scores.
void attend_group(const float* queries, int64_t group, int64_t head_dim, const void* keys, const void* values,
                  KvFormat format, int64_t row_stride, std::span<const int32_t> slots, float* scores, float* out);

// attend_group's two phases, for callers that produce the scores another way (keys rebuilt from values):
// scores[h * slots.size() + j] = queries[h] . key(slots[j]); then softmax of each head's scores (left
// in `scores`) and out[h] = sum_j p[h][j] * value(slots[j]).
void attention_scores(const float* queries, int64_t group, int64_t head_dim, const void* keys, KvFormat format,
                      int64_t row_stride, std::span<const int32_t> slots, float* scores);
void attention_weigh_values(float* scores, int64_t group, int64_t head_dim, const void* values, KvFormat format,
                            int64_t row_stride, std::span<const int32_t> slots, float* out);

namespace detail {

// The per-ISA bodies behind the functions above, one table per instruction-set file
// (vector_ops_avx2.cc, vector_ops_avx512.cc). Call the dispatching functions instead.
struct VectorOpsTable {
  float (*max)(const float* values, int64_t size);
  // The sum of exp(values[i] - shift) for values[i] <= shift; each term is also written to out[i] unless
  // out is null (out may alias values).
  float (*exp_shifted_sum)(const float* values, int64_t size, float shift, float* out);
  float (*sum_squares)(const float* x, int64_t size);
  // Per lane l of the vector width W: the largest of values[l], values[l + W], ... over the first
  // `covered` values (a multiple of W, returned) and its lowest index, ties and NaN as argmax; -inf and
  // index 0 in a lane where nothing is larger. Writes lanes [0, W) of the 16 given.
  int64_t (*argmax_lanes)(const float* values, int64_t size, float* lane_values, int32_t* lane_indices);
  // out[i] = (x[i] * factor) * weight[i], or x[i] * factor without weight; out may alias x.
  void (*scale_into)(const float* x, int64_t size, float factor, const float* weight, float* out);
  void (*gelu_tanh_multiply)(const float* gate, const float* up, int64_t size, float* out);
  void (*apply_rope)(float* heads, int64_t head_count, int64_t head_dim, const float* cos, const float* sin);
  void (*add)(float* y, const float* x, int64_t size);
  void (*softcap)(float* values, int64_t size, float cap);
  void (*store_bf16_row)(const float* source, int64_t size, uint16_t* destination);
  // scores[h * count + j] = queries[h] . key(slots[j]) for h < group.
  void (*attention_scores)(const float* queries, int64_t group, int64_t head_dim, const void* keys, KvFormat format,
                           int64_t row_stride, const int32_t* slots, int64_t count, float* scores);
  // out[h] += sum_j probabilities[h * count + j] * value(slots[j]) for h < group.
  void (*attention_accumulate)(const float* probabilities, int64_t group, int64_t head_dim, const void* values,
                               KvFormat format, int64_t row_stride, const int32_t* slots, int64_t count, float* out);
};

const VectorOpsTable& vector_ops_avx2();
const VectorOpsTable& vector_ops_avx512();

}  // namespace detail
}  // namespace gemma4rt::kernels
