// The Gemma-4 forward pass, written once for every variant and driven by ModelConfig, against the
// backend interface (backend/backend.h): weights, activations and the KV cache live in the backend's
// memory, allocated at construction, so prefill and decode allocate nothing. Word and per-layer
// embeddings are gathered on the host from the memory-mapped tables and uploaded per step.
//
// A forward call takes rows: (sequence, position, token) triples. A prefill chunk is many rows of one
// sequence; a batched decode step is one row for each of several sequences, so every weight is read
// once for all of them. Each chunk of rows is one backend step: upload the inputs, issue (or replay)
// the ops, download the result: argmax ids for greedy decoding, softcapped logits for sampling.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/formats.h"
#include "core/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/rope.h"
#include "engine/tensor_parallel.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace gemma4rt {

struct EngineOptions {
  std::string backend = "cpu";  // a name from backend::backend_names(): "cpu" (SIMD) or "reference" (scalar fp32)
  int context_tokens = 4096;    // KV cache positions per sequence
  int max_chunk_tokens = 0;     // rows per forward step (prefill chunk); 0 = the backend's default
  int sequences = 1;            // independent KV slots (batched decode)
  // Sliding layers keep every position of the context instead of a ring of window + chunk - 1: more
  // memory, but a slot's cached prefix stays reusable however the new prompt diverges (kv_cache.h).
  bool full_sliding_cache = false;
  int threads = 0;              // host threads; 0 = one per core this process may use
  int device = -1;              // a GPU backend's device index; -1 = the backend's own choice
  std::optional<WeightFormat> weight_format;   // default: the backend's choice for the checkpoint's dtype
  std::optional<KvFormat> kv_format;           // default: the backend's (bf16 cpu, f32 reference)
  // Tensor parallelism. In process: `tensor_parallel` ranks as threads of this engine. Across processes:
  // `communicator` makes this engine one rank of the communicator's group (e.g. MPI).
  int tensor_parallel = 1;
  parallel::Communicator* communicator = nullptr;
  // Called while weights are uploaded to a device with its own memory: bytes uploaded so far, of about
  // `total` (the planner's estimate; the last call passes done == total).
  std::function<void(uint64_t done, uint64_t total)> on_weight_upload;
};

// One row of a step. Laid out as the backend's row table (three int32), and uploaded as it is.
struct BatchRow {
  int32_t sequence = 0;
  int32_t position = 0;
  int32_t token = 0;
};
static_assert(sizeof(BatchRow) == backend::kRowTableInts * sizeof(int32_t));

class Transformer {
 public:
  // Runs on the backend EngineOptions::backend names.
  Transformer(const Model& model, const EngineOptions& options);
  // Runs on `backend` (e.g. a decorated one); in-process tensor-parallel peers get backends of the same name.
  Transformer(const Model& model, const EngineOptions& options, std::unique_ptr<backend::Backend> backend);
  ~Transformer();

  // Runs the rows (rows of one sequence in increasing position order; all earlier positions of each
  // sequence must already be in its cache) and writes vocab_size softcapped logits for each row listed
  // in `logit_rows` to `logits`, in that order; and, if `log_normalisers` is given, each of those rows'
  // log(sum exp(logit)), so that a token's log-probability is its logit minus that (computed on the device).
  void forward(std::span<const BatchRow> rows, std::span<const int> logit_rows, float* logits, float* log_normalisers = nullptr);
  // The same, for greedy decoding: the argmax token of each listed row (the softcap is skipped: tanh is
  // monotonic), so only the ids leave the device.
  void forward_greedy(std::span<const BatchRow> rows, std::span<const int> logit_rows, int32_t* ids);

  // One sequence's tokens at positions [position, position + size): the last token's softcapped logits,
  // valid until the next call (and, if asked, their log normaliser), or its argmax token.
  std::span<const float> forward(std::span<const int32_t> tokens, int position, int sequence = 0, float* log_normaliser = nullptr);
  int32_t forward_greedy(std::span<const int32_t> tokens, int position, int sequence = 0);

  const ModelConfig& config() const { return config_; }
  int context_tokens() const { return options_.context_tokens; }
  int max_chunk_tokens() const { return options_.max_chunk_tokens; }
  int sequences() const { return options_.sequences; }
  const EngineOptions& options() const { return options_; }
  backend::Backend& backend() { return *backend_; }
  const backend::Backend& backend() const { return *backend_; }
  WeightFormat weight_format() const { return weight_format_; }
  const KvCache& kv_cache() const { return *cache_; }
  // Tensor-parallel ranks (1 without tensor parallelism) and the seconds rank 0 spent communicating.
  int tensor_parallel_size() const { return communicator_ ? communicator_->size() : 1; }
  double communication_seconds() const { return communicator_ ? communicator_->communication_seconds() : 0.0; }
  // Bytes of weights one decode step reads (every used matrix, experts at their top-k share, the head).
  double weight_bytes_per_token() const;
  // Weight bytes this engine's backend holds beyond the memory map (converted or quantised copies).
  size_t owned_weight_bytes() const { return backend_->owned_weight_bytes(); }
  // Floating-point operations of one token's matrix products through the decoder layers (the LM head
  // excluded), of one row of the LM head, and of one token's attention at `position`.
  double layer_matmul_flops_per_token() const;
  double head_flops_per_row() const;
  double attention_flops_per_token(int position) const;

 private:
  struct LayerState;
  // What a step hands back, and where.
  struct StepOutput {
    float* logits = nullptr;           // softcapped logits,
    float* log_normalisers = nullptr;  // with them if wanted: each row's log of its softmax normaliser; or
    int32_t* ids = nullptr;            // argmax ids
  };
  void load();
  // Throws when the model does not fit a device with its own memory; returns the weight bytes to upload
  // there (0 for backends that keep weights in host memory).
  uint64_t check_fits(KvFormat kv_format) const;
  // Fills row_scratch_ with one sequence's tokens from `position`; returns the last row's index.
  int single_sequence_rows(std::span<const int32_t> tokens, int position, int sequence);
  void run(std::span<const BatchRow> rows, std::span<const int> logit_rows, StepOutput output);
  void run_local(std::span<const BatchRow> rows, std::span<const int> logit_rows, StepOutput output);
  void check_rows(std::span<const BatchRow> rows, std::span<const int> logit_rows) const;
  // One chunk: upload its inputs, issue (or replay) its ops, download its result.
  void step(std::span<const BatchRow> rows, std::span<const int32_t> logit_rows, StepOutput output);
  void issue_step(int rows, int logit_rows, bool greedy);
  void compute_per_layer_inputs(int rows);
  void attention(int layer, int rows);
  void feed_forward(int layer, int rows);
  void mixture_of_experts(int layer, int rows);
  void per_layer_input_block(int layer, int rows);
  void all_reduce(backend::Buffer values, int64_t count);
  // Calls visit(weight, share) for every weight matrix a token reads; share < 1 for experts (top-k of all).
  void visit_weights(const std::function<void(const backend::Weight&, double share)>& visit) const;

  const Model& model_;
  const ModelConfig& config_;
  const ModelWeights& weights_;
  EngineOptions options_;
  std::unique_ptr<backend::Backend> backend_;
  WeightFormat weight_format_ = WeightFormat::kF32;
  float eps_ = 0.0f;
  int logit_capacity_ = 0;   // logit rows one step can return
  // Tensor parallelism: this rank's share, how it talks to the others, and (in process) the other ranks.
  parallel::Communicator* communicator_ = nullptr;
  std::optional<RankPartition> partition_;
  std::unique_ptr<parallel::InProcessGroup> group_;
  std::vector<std::unique_ptr<parallel::Communicator>> group_communicators_;
  std::vector<std::unique_ptr<Transformer>> peers_;
  std::unique_ptr<ThreadPool> rank_threads_;
  std::vector<std::vector<float>> peer_logits_;
  std::vector<std::vector<int32_t>> peer_ids_;
  std::vector<std::vector<float>> sliced_weights_;   // column slices of o_proj / down_proj this rank owns
  std::unique_ptr<KvCache> cache_;
  std::vector<std::unique_ptr<LayerState>> layers_;
  backend::Weight lm_head_;
  backend::Weight per_layer_model_projection_;
  backend::Buffer final_norm_, per_layer_projection_norm_;
  backend::Buffer rope_sliding_, rope_full_;   // inverse frequencies
  struct KeyRotations {
    backend::Buffer table;  // RopeTable::rotations over the context; only where a K=V layer has this attention type
    int pairs = 0;
  };
  KeyRotations key_rotations_sliding_, key_rotations_full_;
  float embed_scale_ = 1.0f;
  float per_layer_embed_scale_ = 1.0f;

  // Device buffers, sized for max_chunk_tokens rows at construction.
  backend::Buffer row_table_, logit_row_ids_, hidden_, normed_, branch_, query_, key_, value_, attention_out_;
  backend::Buffer gate_, up_, ffn_out_, moe_out_, expert_input_, per_layer_inputs_, per_layer_projected_, per_layer_gate_;
  backend::Buffer router_inputs_, router_logits_, chosen_experts_, chosen_weights_;
  backend::Buffer final_hidden_, local_logits_, logits_, log_normalisers_, ids_;
  // Host staging: embedding rows gathered from the mmap, logit row ids, and the single-sequence results.
  std::vector<float> embedding_rows_, per_layer_rows_;
  std::vector<int32_t> logit_row_scratch_;
  std::vector<BatchRow> row_scratch_;
  std::vector<float> last_logits_;
};

}  // namespace gemma4rt
