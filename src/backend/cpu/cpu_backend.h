// The default backend: the SIMD kernels (AVX-512 BF16/VNNI, AVX2 or scalar, chosen at run time) over
// weights in f32, bf16, q8 or q4 (bf16 and f32 used in place from the memory map), a bf16 KV cache by
// default, and the matrix work spread over the host backend's thread pool.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/prepared_weight.h"
#include "backend/host/host_backend.h"
#include "core/stealing_ranges.h"

namespace gemma4rt::backend {

class CpuBackend : public HostBackend {
 public:
  explicit CpuBackend(int threads) : HostBackend(threads) {}

  std::string name() const override { return "cpu"; }
  std::string kernels() const override;
  int default_chunk_tokens() const override { return 256; }
  // The checkpoint's own: q8 for a `gemma4rt quantize` output, f32 for f32 files, else bf16 (f16 too).
  WeightFormat default_weight_format(DType stored) const override;
  KvFormat default_kv_format() const override { return KvFormat::kBF16; }
  void check_formats(WeightFormat, KvFormat) const override {}
  size_t weight_read_bytes(Weight weight) const override { return weights_.at(static_cast<size_t>(weight.id)).read_bytes(); }
  size_t owned_weight_bytes() const override;
  void gelu_multiply_matmul(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset, Weight weight,
                            Buffer y) override;
  void gelu_feed_forward(Buffer x, int rows, Weight gate, Weight up, int width, Weight down, Buffer gate_out, Buffer up_out,
                         Buffer y) override;

 protected:
  void store_weight(int32_t id, const TensorView& view, WeightFormat format) override;
  void allow_weight_copies(uint64_t bytes) override { copy_budget_ = bytes; }
  void multiply(const float* x, int rows, int32_t id, float* y) override;
  void multiply_each(const float* x, int rows, std::span<const int32_t> ids, std::span<float* const> ys) override;
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
  // Whether a product of `rows` input rows is large enough to be worth waking the pool for.
  static bool worth_threads(const kernels::WeightMatrix& matrix, int rows);
  void prepare_input(const float* x, int rows, const kernels::WeightMatrix& matrix, bool threaded);
  // The products of `input` (prepared) with weights `ids` into `ys`, on the pool.
  void run_products(const kernels::PreparedActivations& input, std::span<const int32_t> ids, std::span<float* const> ys);
  // Rows per stolen chunk of a decode step's product of `weight`.
  static int64_t steal_chunk_rows(const PreparedWeight& weight);
  // Whether `weight` is in the AVX-512 kernels' panels (q8, q4) of 16 rows, which tiles take whole.
  static bool in_panels(const PreparedWeight& weight);
  // Rows a thread's share of a product of `weight` keeps together (a multiple of 16).
  static int64_t rows_together(const PreparedWeight& weight);

  std::vector<PreparedWeight> weights_;
  uint64_t copy_budget_ = 0;  // bytes of in-place weights still allowed a copy of their own (allow_weight_copies)
  kernels::PreparedActivations prepared_;
  kernels::PreparedActivations down_input_;  // gelu_feed_forward's products, prepared for down_proj
  std::vector<std::vector<float>> gelu_rows_;  // gelu_multiply_matmul's row of products, one per thread
  std::deque<StealingRanges> steals_;  // one per weight of run_products (a deque: they cannot move)
};

}  // namespace gemma4rt::backend
