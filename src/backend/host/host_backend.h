// What the two CPU backends share: buffers in host memory, a thread pool, eager execution of every op
// as it is issued, and the ops' loops (rows, heads, experts, tensor-parallel collectives). What differs
// between them is only the arithmetic, which each supplies through the kernel hooks below: the SIMD
// kernels (backend/cpu) or the scalar fp32 reference kernels (backend/reference).
#pragma once

#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/host/bandwidth.h"
#include "core/thread_pool.h"

namespace gemma4rt::backend {

class HostBackend : public Backend {
 public:
  explicit HostBackend(int threads);

  int threads() const override { return pool_.size(); }

  Buffer allocate(size_t bytes) override;
  void upload(Buffer destination, size_t offset, const void* source, size_t bytes) override;
  void download(Buffer source, size_t offset, void* destination, size_t bytes) override;
  Weight prepare_weight(const TensorView& view, WeightFormat format) override;
  size_t buffer_bytes() const override { return buffer_bytes_; }
  double measure_read_bandwidth() override;
  ComputePeak measure_compute_peak(WeightFormat format) override;

  void matmul(Buffer x, int rows, Weight weight, Buffer y) override;
  void matmul_each(Buffer x, int rows, std::span<const Weight> weights, std::span<const Buffer> ys) override;
  void rms_norm(Buffer x, int64_t rows, int width, Buffer weight, float eps, Buffer out) override;
  void scale(Buffer x, int64_t count, float factor) override;
  void scale_columns(Buffer x, int rows, int width, Buffer weights, float factor) override;
  void add(Buffer y, Buffer x, int64_t count) override;
  void copy(Buffer source, Buffer destination, int64_t count) override;
  void gelu_multiply(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset) override;
  void combine_per_layer_inputs(Buffer context, Buffer inputs, int64_t count, float embed_scale, float combine_scale) override;
  void rope(Buffer queries, int query_heads, Buffer keys, int key_heads, int rows, int head_dim, Buffer row_table,
            Buffer inverse_frequencies) override;
  void store_kv(Buffer source, int rows, int64_t row_elements, Buffer row_table, Buffer cache, int capacity, KvFormat format) override;
  void attention(Buffer queries, int rows, Buffer row_table, Buffer keys, Buffer values, const AttentionShape& shape, Buffer out) override;
  void route_experts(Buffer router_logits, int rows, int experts, int top_k, Buffer per_expert_scale, Buffer chosen_experts,
                     Buffer chosen_weights) override;
  void expert_feed_forward(Buffer input, int rows, Buffer chosen_experts, Buffer chosen_weights, const ExpertSet& experts,
                           Buffer out) override;
  void gather_rows(Buffer source, Buffer row_ids, int rows, int width, Buffer out) override;
  void softcap(Buffer values, int64_t count, float cap) override;
  void argmax(Buffer values, int rows, int width, Buffer ids) override;
  void log_sum_exp(Buffer values, int rows, int width, Buffer out) override;
  void all_reduce_sum(Buffer values, int64_t count, parallel::Communicator& communicator) override;
  void all_gather_rows(Buffer local, int rows, std::span<const size_t> counts, Buffer out, parallel::Communicator& communicator) override;

 protected:
  // ---- kernel hooks: the arithmetic each CPU backend brings
  // Keeps whatever the backend's products read for weight `id` (in place or converted).
  virtual void store_weight(int32_t id, const TensorView& view, WeightFormat format) = 0;
  // y = x W^T for `rows` rows of weight `id`; may use the pool.
  virtual void multiply(const float* x, int rows, int32_t id, float* y) = 0;
  // The same for several weights of one input; one multiply after another unless the backend joins them.
  virtual void multiply_each(const float* x, int rows, std::span<const int32_t> ids, std::span<float* const> ys) {
    for (size_t i = 0; i < ids.size(); ++i) multiply(x, rows, ids[i], ys[i]);
  }
  virtual void norm_row(const float* x, int64_t width, const float* weight, float eps, float* out) = 0;
  virtual void gelu_multiply_span(float* gate, const float* up, int64_t count) = 0;
  virtual void add_span(float* y, const float* x, int64_t count) = 0;
  virtual void rotate_heads(float* heads, int count, int head_dim, const float* cos, const float* sin) = 0;
  virtual void store_kv_row(const float* source, int64_t count, KvFormat format, void* destination) = 0;
  // Attention of `group` query heads that share one KV head, in two phases (see kernels::attend_group):
  // scores [group][slots.size()] against the listed key rows, then softmax and the weighted value rows.
  virtual void score_keys(const float* queries, int group, int head_dim, const std::byte* keys, KvFormat format, int64_t row_stride,
                          std::span<const int32_t> slots, float* scores) = 0;
  virtual void weigh_values(float* scores, int group, int head_dim, const std::byte* values, KvFormat format, int64_t row_stride,
                            std::span<const int32_t> slots, float* out) = 0;
  virtual void softcap_span(float* values, int64_t count, float cap) = 0;
  virtual float log_sum_exp_span(const float* values, int64_t count) = 0;
  virtual int64_t argmax_span(const float* values, int64_t count) = 0;  // the lowest index on ties
  virtual void router_softmax(float* values, int64_t count) = 0;

  template <typename T = float>
  T* data(Buffer buffer) {
    return reinterpret_cast<T*>(buffers_.at(static_cast<size_t>(buffer.id)).get());
  }
  ThreadPool& pool() { return pool_; }
  // Grow-only scratch: sized by the first step at each shape, so later steps allocate nothing.
  template <typename T>
  static void reserve(std::vector<T>& scratch, size_t size) {
    if (scratch.size() < size) scratch.resize(size);
  }

 private:
  struct FreeDeleter {
    void operator()(std::byte* pointer) const { std::free(pointer); }
  };

  // Row-by-row element-wise ops (norms, RoPE, GELU) below this many elements run on the calling thread:
  // a decode step (one row, or a few) does not wake the pool, a prompt's rows are shared out.
  static constexpr int64_t kMinParallelElements = int64_t{1} << 16;
  // work(first, last, thread) over rows [0, rows) of `row_elements` each, on the pool or, below
  // kMinParallelElements, all on the calling thread (thread 0).
  template <class Work>
  void for_rows(int64_t rows, int64_t row_elements, const Work& work) {
    if (rows <= 1 || rows * row_elements < kMinParallelElements || pool_.size() == 1) return work(0, rows, 0);
    pool_.run([&](int thread, int threads) {
      const ThreadPool::Range range = ThreadPool::share(rows, 1, thread, threads);
      if (range.begin < range.end) work(range.begin, range.end, thread);
    });
  }

  struct DerivedScratch;
  void derived_scores(const AttentionShape& shape, const float* queries, int group, const std::byte* value_rows, int64_t row_stride,
                      int first_key, std::span<const int32_t> visible, DerivedScratch& scratch, float* scores);

  ThreadPool pool_;
  std::vector<int32_t> each_ids_;  // matmul_each's operands (grow-only)
  std::vector<float*> each_outputs_;
  std::unique_ptr<kernels::ReadProbe> read_probe_;  // made by the first measure_read_bandwidth()
  std::vector<std::unique_ptr<std::byte, FreeDeleter>> buffers_;
  size_t buffer_bytes_ = 0;
  int32_t weight_count_ = 0;
  // Attention: scores and slot lists, one block per thread.
  std::vector<float> attention_scores_;
  std::vector<int32_t> attention_slots_;
  // K=V attention, per thread: the group's queries scaled by k_norm, their rotated pairs, a block of
  // keys' rotated pairs and its scores (see derived_scores); block_slots_ = 0..block-1.
  static constexpr int kDerivedKeyBlock = 64;
  struct DerivedScratch {
    std::vector<float> queries, pair_queries, pair_keys, block_scores;
  };
  std::vector<DerivedScratch> derived_scratch_;
  std::vector<int32_t> block_slots_;
  std::vector<float> rope_cos_, rope_sin_;
  // Mixture of experts: per expert the rows that chose it, their inputs and intermediate products.
  std::vector<int> expert_rows_;
  std::vector<float> expert_gathered_, expert_hidden_, expert_activated_, expert_output_;
};

}  // namespace gemma4rt::backend
