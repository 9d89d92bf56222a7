#include "backend/reference/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/argmax.h"

namespace gemma4rt::reference {

void matmul(const float* x, int64_t rows, const TensorView& weight, float* y) { matmul(x, rows, weight, y, 0, weight.shape[0]); }

void matmul(const float* x, int64_t rows, const TensorView& weight, float* y, int64_t first_out, int64_t last_out) {
  const int64_t out_features = weight.shape[0];
  const int64_t in_features = weight.shape[1];
  std::vector<float> weight_row(static_cast<size_t>(in_features));
  for (int64_t o = first_out; o < last_out; ++o) {
    weight.read_floats(o * in_features, in_features, weight_row.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* input = x + r * in_features;
      // Double accumulation keeps the reference well inside the fp32 noise of the HF reference.
      double sum = 0.0;
      for (int64_t i = 0; i < in_features; ++i) sum += static_cast<double>(input[i]) * weight_row[i];
      y[r * out_features + o] = static_cast<float>(sum);
    }
  }
}

void rms_norm(const float* x, int64_t size, const float* weight, float eps, float* out) {
  double sum_squares = 0.0;
  for (int64_t i = 0; i < size; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
  const float mean_square = static_cast<float>(sum_squares / static_cast<double>(size)) + eps;
  const float inverse_rms = std::pow(mean_square, -0.5f);  // the reference uses pow(ms, -0.5), not rsqrt
  for (int64_t i = 0; i < size; ++i) {
    const float normalised = x[i] * inverse_rms;
    out[i] = weight != nullptr ? normalised * weight[i] : normalised;
  }
}

float gelu_tanh(float x) {
  constexpr float kSqrtTwoOverPi = 0.7978845608028654f;
  const float inner = kSqrtTwoOverPi * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

void softmax(float* values, int64_t size) {
  float maximum = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < size; ++i) maximum = std::max(maximum, values[i]);
  double total = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    values[i] = std::exp(values[i] - maximum);
    total += values[i];
  }
  const float inverse = static_cast<float>(1.0 / total);
  for (int64_t i = 0; i < size; ++i) values[i] *= inverse;
}

float log_sum_exp(const float* values, int64_t size) {
  if (size <= 0) return -std::numeric_limits<float>::infinity();
  const float maximum = *std::max_element(values, values + size);
  if (!std::isfinite(maximum)) return maximum;
  double total = 0.0;
  for (int64_t i = 0; i < size; ++i) total += std::exp(static_cast<double>(values[i]) - maximum);
  return maximum + static_cast<float>(std::log(total));
}

int64_t argmax(const float* values, int64_t size) { return argmax_of(values, size); }

void apply_rope(float* head, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float first = head[j];
    const float second = head[j + half];
    head[j] = first * cos[j] - second * sin[j];
    head[j + half] = second * cos[j + half] + first * sin[j + half];
  }
}

void attend(const float* query, int64_t head_dim, const float* keys, const float* values, int64_t row_stride,
            std::span<const int32_t> slots, float* scores, float* out) {
  attention_scores(query, head_dim, keys, row_stride, slots, scores);
  weigh_values(scores, head_dim, values, row_stride, slots, out);
}

void attention_scores(const float* query, int64_t head_dim, const float* keys, int64_t row_stride, std::span<const int32_t> slots,
                      float* scores) {
  for (size_t k = 0; k < slots.size(); ++k) {
    const float* key = keys + static_cast<int64_t>(slots[k]) * row_stride;
    double dot = 0.0;
    for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(query[d]) * key[d];
    scores[k] = static_cast<float>(dot);
  }
}

void weigh_values(float* scores, int64_t head_dim, const float* values, int64_t row_stride, std::span<const int32_t> slots, float* out) {
  const int64_t count = static_cast<int64_t>(slots.size());
  softmax(scores, count);
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t k = 0; k < count; ++k) {
    const float* value = values + static_cast<int64_t>(slots[k]) * row_stride;
    for (int64_t d = 0; d < head_dim; ++d) out[d] += scores[k] * value[d];
  }
}

}  // namespace gemma4rt::reference
