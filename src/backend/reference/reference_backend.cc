#include "backend/reference/reference_backend.h"

#include <cmath>
#include <cstring>

#include "backend/reference/kernels.h"
#include "core/error.h"

namespace gemma4rt::backend {
namespace {

constexpr int64_t kOutputsPerTask = 16;

}  // namespace

void ReferenceBackend::check_formats(WeightFormat weights, KvFormat kv) const {
  if (weights != WeightFormat::kF32) fail("the reference backend computes in f32; it cannot run {} weights", format_name(weights));
  if (kv != KvFormat::kF32) fail("the reference kernels keep the KV cache in f32");
}

void ReferenceBackend::store_weight(int32_t id, const TensorView& view, WeightFormat) {
  views_.resize(static_cast<size_t>(id) + 1);
  views_[static_cast<size_t>(id)] = view;
}

// Split by output features: each value is still one thread's double sum, so the thread count never changes it.
void ReferenceBackend::multiply(const float* x, int rows, int32_t id, float* y) {
  const TensorView& view = views_[static_cast<size_t>(id)];
  pool().parallel_for(view.shape[0], kOutputsPerTask, [&](int64_t first, int64_t last) { reference::matmul(x, rows, view, y, first, last); });
}

void ReferenceBackend::norm_row(const float* x, int64_t width, const float* weight, float eps, float* out) {
  reference::rms_norm(x, width, weight, eps, out);
}

void ReferenceBackend::gelu_multiply_span(float* gate, const float* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) gate[i] = reference::gelu_tanh(gate[i]) * up[i];
}

void ReferenceBackend::add_span(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void ReferenceBackend::rotate_heads(float* heads, int count, int head_dim, const float* cos, const float* sin) {
  for (int head = 0; head < count; ++head) reference::apply_rope(heads + static_cast<int64_t>(head) * head_dim, head_dim, cos, sin);
}

void ReferenceBackend::store_kv_row(const float* source, int64_t count, KvFormat format, void* destination) {
  if (format != KvFormat::kF32) fail("the reference kernels keep the KV cache in f32");
  std::memcpy(destination, source, static_cast<size_t>(count) * sizeof(float));
}

// The reference keeps its cache in f32 (the engine refuses other KV formats with it).
void ReferenceBackend::score_keys(const float* queries, int group, int head_dim, const std::byte* keys, KvFormat, int64_t row_stride,
                                  std::span<const int32_t> slots, float* scores) {
  for (int g = 0; g < group; ++g) {
    reference::attention_scores(queries + static_cast<int64_t>(g) * head_dim, head_dim, reinterpret_cast<const float*>(keys), row_stride,
                                slots, scores + static_cast<int64_t>(g) * static_cast<int64_t>(slots.size()));
  }
}

void ReferenceBackend::weigh_values(float* scores, int group, int head_dim, const std::byte* values, KvFormat, int64_t row_stride,
                                    std::span<const int32_t> slots, float* out) {
  for (int g = 0; g < group; ++g) {
    reference::weigh_values(scores + static_cast<int64_t>(g) * static_cast<int64_t>(slots.size()), head_dim,
                            reinterpret_cast<const float*>(values), row_stride, slots, out + static_cast<int64_t>(g) * head_dim);
  }
}

void ReferenceBackend::softcap_span(float* values, int64_t count, float cap) {
  for (int64_t i = 0; i < count; ++i) values[i] = std::tanh(values[i] / cap) * cap;
}

float ReferenceBackend::log_sum_exp_span(const float* values, int64_t count) { return reference::log_sum_exp(values, count); }
int64_t ReferenceBackend::argmax_span(const float* values, int64_t count) { return reference::argmax(values, count); }

void ReferenceBackend::router_softmax(float* values, int64_t count) { reference::softmax(values, count); }

}  // namespace gemma4rt::backend
