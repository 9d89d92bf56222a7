// Dispatch of the vector kernels on active_isa(), and their scalar level: the reference formulas in
// plain C++ (double sums, std::exp / std::tanh), which the SIMD levels are tested against. The SIMD
// levels share the glue here (normalisation factors, softmax steps, the attention phases) and run their
// loops through the per-ISA tables.
#include "backend/cpu/kernels/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/bf16.h"
#include "backend/host/isa.h"
#include "backend/reference/kernels.h"

namespace gemma4rt::kernels {
namespace {

// Null at the scalar level.
const detail::VectorOpsTable* simd_table() {
  switch (active_isa()) {
    case Isa::kScalar: return nullptr;
    case Isa::kAvx2: return &detail::vector_ops_avx2();
    case Isa::kAvx512:
    case Isa::kAvx512Bf16: return &detail::vector_ops_avx512();
  }
  return nullptr;
}

float cached_element(const void* base, KvFormat format, int64_t index) {
  if (format == KvFormat::kF32) return static_cast<const float*>(base)[index];
  return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
}

// The reference attention phases over either cache format: double dot products, the reference
// softmax, fp32 accumulation in slot order.
void score_scalar(const float* query, int64_t head_dim, const void* keys, KvFormat format, int64_t row_stride,
                  std::span<const int32_t> slots, float* scores) {
  for (size_t k = 0; k < slots.size(); ++k) {
    const int64_t row = static_cast<int64_t>(slots[k]) * row_stride;
    double dot = 0.0;
    for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(query[d]) * cached_element(keys, format, row + d);
    scores[k] = static_cast<float>(dot);
  }
}

void weigh_values_scalar(float* scores, int64_t head_dim, const void* values, KvFormat format, int64_t row_stride,
                         std::span<const int32_t> slots, float* out) {
  const int64_t count = static_cast<int64_t>(slots.size());
  reference::softmax(scores, count);
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t row = static_cast<int64_t>(slots[k]) * row_stride;
    for (int64_t d = 0; d < head_dim; ++d) out[d] += scores[k] * cached_element(values, format, row + d);
  }
}

void softmax_simd(const detail::VectorOpsTable& table, float* values, int64_t size) {
  if (size <= 0) return;
  const float maximum = table.max(values, size);
  const float total = table.exp_shifted_sum(values, size, maximum, values);
  table.scale_into(values, size, 1.0f / total, nullptr, values);
}

}  // namespace

void rms_norm(const float* x, int64_t size, const float* weight, float eps, float* out) {
  const detail::VectorOpsTable* table = simd_table();
  if (table == nullptr) return reference::rms_norm(x, size, weight, eps, out);
  const double sum_squares = table->sum_squares(x, size);
  const float mean_square = static_cast<float>(sum_squares / static_cast<double>(size)) + eps;
  table->scale_into(x, size, std::pow(mean_square, -0.5f), weight, out);  // pow(ms, -0.5) as the reference
}

void gelu_tanh_multiply(const float* gate, const float* up, int64_t size, float* out) {
  const detail::VectorOpsTable* table = simd_table();
  if (table != nullptr) return table->gelu_tanh_multiply(gate, up, size, out);
  for (int64_t i = 0; i < size; ++i) out[i] = reference::gelu_tanh(gate[i]) * up[i];
}

void softmax(float* values, int64_t size) {
  const detail::VectorOpsTable* table = simd_table();
  if (table == nullptr) return reference::softmax(values, size);
  softmax_simd(*table, values, size);
}

float log_sum_exp(const float* values, int64_t size) {
  const detail::VectorOpsTable* table = simd_table();
  if (table == nullptr || size <= 0) return reference::log_sum_exp(values, size);
  const float maximum = table->max(values, size);
  if (!std::isfinite(maximum)) return maximum;  // as the reference: nothing to normalise against
  // Short fp32 partial sums (a few hundred terms a lane), added in double.
  constexpr int64_t kBlock = 4096;
  double total = 0.0;
  for (int64_t start = 0; start < size; start += kBlock) {
    total += table->exp_shifted_sum(values + start, std::min(kBlock, size - start), maximum, nullptr);
  }
  return maximum + static_cast<float>(std::log(total));
}

int64_t argmax(const float* values, int64_t size) {
  const detail::VectorOpsTable* table = simd_table();
  if (table == nullptr) return reference::argmax(values, size);
  // Lanes the ISA does not have stay at -inf, index 0, and change nothing.
  alignas(64) float lane_values[16];
  alignas(64) int32_t lane_indices[16] = {};
  std::fill_n(lane_values, 16, -std::numeric_limits<float>::infinity());
  const int64_t covered = table->argmax_lanes(values, size, lane_values, lane_indices);
  float best_value = lane_values[0];
  int64_t best = lane_indices[0];
  for (int lane = 1; lane < 16; ++lane) {
    if (lane_values[lane] > best_value || (lane_values[lane] == best_value && lane_indices[lane] < best)) {
      best_value = lane_values[lane];
      best = lane_indices[lane];
    }
  }
  // The values after the last whole vector have higher indices: only a larger value replaces the best.
  const int64_t rest = reference::argmax(values + covered, size - covered);
  return covered < size && values[covered + rest] > best_value ? covered + rest : best;
}

void apply_rope(float* heads, int64_t head_count, int64_t head_dim, const float* cos, const float* sin) {
  const detail::VectorOpsTable* table = simd_table();
  if (table != nullptr) return table->apply_rope(heads, head_count, head_dim, cos, sin);
  for (int64_t h = 0; h < head_count; ++h) reference::apply_rope(heads + h * head_dim, head_dim, cos, sin);
}

void add(float* y, const float* x, int64_t size) {
  const detail::VectorOpsTable* table = simd_table();
  if (table != nullptr) return table->add(y, x, size);
  for (int64_t i = 0; i < size; ++i) y[i] += x[i];
}

void scale(float* y, float factor, int64_t size) {
  const detail::VectorOpsTable* table = simd_table();
  if (table != nullptr) return table->scale_into(y, size, factor, nullptr, y);
  for (int64_t i = 0; i < size; ++i) y[i] *= factor;
}

void softcap(float* values, int64_t size, float cap) {
  const detail::VectorOpsTable* table = simd_table();
  if (table != nullptr) return table->softcap(values, size, cap);
  for (int64_t i = 0; i < size; ++i) values[i] = std::tanh(values[i] / cap) * cap;
}

void store_kv_row(const float* source, int64_t size, KvFormat format, void* destination) {
  if (format == KvFormat::kF32) {
    std::memcpy(destination, source, static_cast<size_t>(size) * sizeof(float));
    return;
  }
  auto* row = static_cast<uint16_t*>(destination);
  const detail::VectorOpsTable* table = simd_table();
  if (table != nullptr) return table->store_bf16_row(source, size, row);
  for (int64_t i = 0; i < size; ++i) row[i] = float_to_bf16(source[i]);
}

void attend(const float* query, int64_t head_dim, const void* keys, const void* values, KvFormat format,
            int64_t row_stride, std::span<const int32_t> slots, float* scores, float* out) {
  attend_group(query, 1, head_dim, keys, values, format, row_stride, slots, scores, out);
}

void attend_group(const float* queries, int64_t group, int64_t head_dim, const void* keys, const void* values,
                  KvFormat format, int64_t row_stride, std::span<const int32_t> slots, float* scores, float* out) {
  attention_scores(queries, group, head_dim, keys, format, row_stride, slots, scores);
  attention_weigh_values(scores, group, head_dim, values, format, row_stride, slots, out);
}

void attention_scores(const float* queries, int64_t group, int64_t head_dim, const void* keys, KvFormat format,
                      int64_t row_stride, std::span<const int32_t> slots, float* scores) {
  const int64_t count = static_cast<int64_t>(slots.size());
  if (count == 0) return;
  const detail::VectorOpsTable* table = simd_table();
  if (table == nullptr) {
    for (int64_t h = 0; h < group; ++h) score_scalar(queries + h * head_dim, head_dim, keys, format, row_stride, slots, scores + h * count);
    return;
  }
  table->attention_scores(queries, group, head_dim, keys, format, row_stride, slots.data(), count, scores);
}

void attention_weigh_values(float* scores, int64_t group, int64_t head_dim, const void* values, KvFormat format,
                            int64_t row_stride, std::span<const int32_t> slots, float* out) {
  const int64_t count = static_cast<int64_t>(slots.size());
  const detail::VectorOpsTable* table = simd_table();
  if (table == nullptr) {
    for (int64_t h = 0; h < group; ++h) {
      weigh_values_scalar(scores + h * count, head_dim, values, format, row_stride, slots, out + h * head_dim);
    }
    return;
  }
  std::fill(out, out + group * head_dim, 0.0f);
  if (count == 0) return;
  // Each phase reads its rows once for the whole group: softmax per head, then the weighted values.
  for (int64_t h = 0; h < group; ++h) softmax_simd(*table, scores + h * count, count);
  table->attention_accumulate(scores, group, head_dim, values, format, row_stride, slots.data(), count, out);
}

}  // namespace gemma4rt::kernels
