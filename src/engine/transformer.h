// The Gemma-4 forward pass, written once for every variant and driven by ModelConfig. Word and
// per-layer embeddings are gathered on the host from the memory-mapped tables; the KV cache and the
// scratch activations are allocated at construction, so prefill and decode allocate nothing.
//
// Two kernel paths run the same forward:
//  - reference: scalar fp32 kernels reading weights as stored, fp32 KV cache. This is the path
//    verification and the golden tests hold to the Hugging Face reference.
//  - fast: SIMD kernels chosen at run time, weights in f32, bf16 or q8, bf16 KV cache by default,
//    matrix work spread over a persistent thread pool.
//
// A forward call takes rows: (sequence, position, token) triples. A prefill chunk is many rows of one
// sequence; a batched decode step is one row for each of several sequences, so every weight is read
// once for all of them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/linear.h"
#include "engine/rope.h"
#include "engine/tensor_parallel.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace gemma4rt {

struct EngineOptions {
  int context_tokens = 4096;    // KV cache positions per sequence
  int max_chunk_tokens = 0;     // rows per forward pass (prefill chunk); 0 = 64 reference / 256 fast
  int sequences = 1;            // independent KV slots (batched decode)
  int threads = 0;              // 0 = one per hardware thread
  bool reference = false;       // scalar fp32 reference kernels
  std::optional<WeightFormat> weight_format;   // fast path; default: the checkpoint's dtype (f16 -> bf16)
  std::optional<KvFormat> kv_format;           // default bf16 (fast) / f32 (reference)
  // Tensor parallelism. In process: `tensor_parallel` ranks as threads of this engine. Across processes:
  // `communicator` makes this engine one rank of the communicator's group (e.g. MPI).
  int tensor_parallel = 1;
  parallel::Communicator* communicator = nullptr;
};

struct BatchRow {
  int sequence = 0;
  int position = 0;
  int32_t token = 0;
};

class Transformer {
 public:
  Transformer(const Model& model, const EngineOptions& options);
  ~Transformer();

  // Runs the rows (rows of one sequence in increasing position order; all earlier positions of each
  // sequence must already be in its cache) and writes vocab_size logits for each row listed in
  // `logit_rows` to `logits`, in that order. The final softcap is applied when asked: greedy decoding
  // may skip it because tanh is monotonic.
  void forward(std::span<const BatchRow> rows, std::span<const int> logit_rows, float* logits, bool apply_softcap = true);

  // One sequence's tokens at positions [position, position + size): returns the last token's logits,
  // valid until the next call.
  std::span<const float> forward(std::span<const int32_t> tokens, int position, bool apply_softcap = true, int sequence = 0);

  const ModelConfig& config() const { return config_; }
  int context_tokens() const { return options_.context_tokens; }
  int max_chunk_tokens() const { return options_.max_chunk_tokens; }
  int sequences() const { return options_.sequences; }
  const EngineOptions& options() const { return options_; }
  bool reference() const { return options_.reference; }
  WeightFormat weight_format() const { return weight_format_; }
  const KvCache& kv_cache() const { return *cache_; }
  // Tensor-parallel ranks (1 without tensor parallelism) and the seconds rank 0 spent communicating.
  int tensor_parallel_size() const { return communicator_ ? communicator_->size() : 1; }
  double communication_seconds() const { return communicator_ ? communicator_->communication_seconds() : 0.0; }
  ThreadPool& thread_pool() { return pool_; }
  // Bytes of weights one decode step reads (every used matrix, experts at their top-k share, the head).
  double weight_bytes_per_token() const;
  // Weight bytes this engine holds beyond the memory map (converted or quantised copies).
  size_t owned_weight_bytes() const;
  // Floating-point operations of one token's matrix products, and of its attention at `position`.
  double matmul_flops_per_token() const;
  double attention_flops_per_token(int position) const;

 private:
  struct LayerState;
  void forward_local(std::span<const BatchRow> rows, std::span<const int> logit_rows, float* logits, bool apply_softcap);
  void all_reduce(float* values, int64_t count) {
    if (partition_) communicator_->all_reduce_sum(values, static_cast<size_t>(count));
  }
  // Calls visit(linear, share) for every weight matrix a token reads; share < 1 for experts (top-k of all).
  void visit_linears(const std::function<void(const Linear&, double share)>& visit) const;
  void forward_chunk(std::span<const BatchRow> rows);
  void embed(std::span<const BatchRow> rows);
  void compute_per_layer_inputs(std::span<const BatchRow> rows);
  void attention(int layer, std::span<const BatchRow> rows);
  void feed_forward(int layer, int count);
  void mixture_of_experts(int layer, int count);
  void per_layer_input_block(int layer, int count);
  void linear(const float* x, int rows, const Linear& weight, float* y);
  void norm_rows(const float* x, int rows, int width, const float* weight, float* out);
  void gelu_multiply(float* gate, const float* up, int64_t count);
  void add_rows(float* y, const float* x, int64_t count);
  void store_kv(const float* source, int64_t count, std::byte* destination);

  const Model& model_;
  const ModelConfig& config_;
  const ModelWeights& weights_;
  EngineOptions options_;
  WeightFormat weight_format_ = WeightFormat::kF32;
  ThreadPool pool_;
  // Tensor parallelism: this rank's share, how it talks to the others, and (in process) the other ranks.
  parallel::Communicator* communicator_ = nullptr;
  std::optional<RankPartition> partition_;
  std::unique_ptr<parallel::InProcessGroup> group_;
  std::vector<std::unique_ptr<parallel::Communicator>> group_communicators_;
  std::vector<std::unique_ptr<Transformer>> peers_;
  std::unique_ptr<ThreadPool> rank_threads_;
  std::vector<std::vector<float>> peer_logits_;
  std::vector<float> local_logits_;
  std::vector<std::vector<float>> sliced_weights_;   // column slices of o_proj / down_proj this rank owns
  std::unique_ptr<KvCache> cache_;
  RopeTable rope_sliding_;
  RopeTable rope_full_;
  std::vector<std::unique_ptr<LayerState>> layers_;
  Linear lm_head_;
  Linear per_layer_model_projection_;
  std::vector<float> final_norm_;
  std::vector<float> per_layer_projection_norm_;
  float embed_scale_ = 1.0f;
  float per_layer_embed_scale_ = 1.0f;
  kernels::PreparedActivations prepared_;

  // Scratch, sized for max_chunk_tokens rows at construction.
  std::vector<float> hidden_, normed_, branch_, query_, key_, value_, attention_out_;
  std::vector<float> gate_, up_, ffn_out_, moe_out_, expert_input_, per_layer_inputs_, per_layer_scratch_;
  std::vector<float> rope_cos_, rope_sin_, logits_, router_inputs_, router_logits_;
  std::vector<float> thread_scores_;     // attention scores, one block per thread
  std::vector<int32_t> thread_slots_;    // attention slot lists, one block per thread
  std::vector<int32_t> token_scratch_;
  std::vector<BatchRow> row_scratch_;
  // MoE routing scratch: per row the chosen experts and weights; per expert its rows.
  std::vector<int> chosen_experts_;
  std::vector<float> chosen_weights_;
  std::vector<int> expert_rows_;
  std::vector<float> expert_gathered_, expert_hidden_, expert_output_;
};

}  // namespace gemma4rt
