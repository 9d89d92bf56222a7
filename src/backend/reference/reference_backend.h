// The verification backend: the scalar fp32 reference kernels (backend/reference/kernels.h) reading
// weights as stored, double accumulation in products, an f32 KV cache. This is the path the golden
// tests hold to the Hugging Face reference and `verify` compares every other backend against.
#pragma once

#include <vector>

#include "backend/host/host_backend.h"

namespace gemma4rt::backend {

class ReferenceBackend : public HostBackend {
 public:
  explicit ReferenceBackend(int threads) : HostBackend(threads) {}

  std::string name() const override { return "reference"; }
  std::string kernels() const override { return "scalar fp32"; }
  int default_chunk_tokens() const override { return 64; }
  WeightFormat default_weight_format(DType) const override { return WeightFormat::kF32; }
  KvFormat default_kv_format() const override { return KvFormat::kF32; }
  void check_formats(WeightFormat weights, KvFormat kv) const override;
  size_t weight_read_bytes(Weight weight) const override { return views_.at(static_cast<size_t>(weight.id)).size_bytes(); }
  size_t owned_weight_bytes() const override { return 0; }
  // Scalar products have no instruction ceiling worth holding them to.
  ComputePeak measure_compute_peak(WeightFormat) override { return {}; }

 protected:
  void store_weight(int32_t id, const TensorView& view, WeightFormat format) override;
  void multiply(const float* x, int rows, int32_t id, float* y) override;
  void norm_row(const float* x, int64_t width, const float* weight, float eps, float* out) override;
  void gelu_multiply_span(float* gate, const float* up, int64_t count) override;
  void add_span(float* y, const float* x, int64_t count) override;
  void rotate_heads(float* heads, int count, int head_dim, const float* cos, const float* sin) override;
  void store_kv_row(const float* source, int64_t count, KvFormat format, void* destination) override;
  void score_keys(const float* queries, int group, int head_dim, const std::byte* keys, KvFormat format, int64_t row_stride,
                  std::span<const int32_t> slots, float* scores) override;
  void weigh_values(float* scores, int group, int head_dim, const std::byte* values, KvFormat format, int64_t row_stride,
                    std::span<const int32_t> slots, float* out) override;
  void softcap_span(float* values, int64_t count, float cap) override;
  float log_sum_exp_span(const float* values, int64_t count) override;
  int64_t argmax_span(const float* values, int64_t count) override;
  void router_softmax(float* values, int64_t count) override;

 private:
  std::vector<TensorView> views_;   // weights are read as stored, straight from the memory map
};

}  // namespace gemma4rt::backend
