// The Gemma-4 forward pass, written once for every variant and driven by ModelConfig. Word and
// per-layer embeddings are gathered on the host from the memory-mapped tables; the KV cache and all
// scratch activations are allocated at construction, so prefill and decode allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/rope.h"
#include "model/weights.h"

namespace gemma4rt {

struct TransformerOptions {
  int context_tokens = 4096;    // KV cache length: positions 0 .. context_tokens-1
  int max_chunk_tokens = 64;    // prefill processes the prompt in chunks of at most this many tokens
};

class Transformer {
 public:
  Transformer(const Model& model, const TransformerOptions& options);

  // Runs `tokens` at positions [position, position + tokens.size()) and returns the logits of the last
  // one (vocab_size floats, valid until the next call). The final softcap is applied when asked:
  // greedy decoding may skip it because tanh is monotonic.
  std::span<const float> forward(std::span<const int32_t> tokens, int position, bool apply_softcap = true);

  const ModelConfig& config() const { return config_; }
  int context_tokens() const { return options_.context_tokens; }
  const KvCache& kv_cache() const { return cache_; }

 private:
  // Norm weights and scalars of one layer, converted to floats once at load.
  struct LayerVectors {
    std::vector<float> input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    std::vector<float> q_norm, k_norm;
    std::vector<float> router_scale, per_expert_scale, pre_feedforward_norm_2, post_feedforward_norm_1,
        post_feedforward_norm_2;
    std::vector<float> per_layer_post_norm;
    float layer_scalar = 1.0f;
  };
  void forward_chunk(std::span<const int32_t> tokens, int position);
  void embed(std::span<const int32_t> tokens);
  void compute_per_layer_inputs(std::span<const int32_t> tokens);
  void attention(int layer, int tokens, int position);
  void feed_forward(int layer, int tokens);
  void mixture_of_experts(int layer, int tokens, float* out);
  void per_layer_input_block(int layer, int tokens);
  void linear(const float* x, int rows, const TensorView& weight, float* y) const;
  void norm_rows(const float* x, int rows, int width, const float* weight, float* out) const;

  const Model& model_;
  const ModelConfig& config_;
  const ModelWeights& weights_;
  TransformerOptions options_;
  KvCache cache_;
  RopeTable rope_sliding_;
  RopeTable rope_full_;
  std::vector<LayerVectors> layer_vectors_;
  std::vector<float> final_norm_;
  std::vector<float> per_layer_projection_norm_;
  float embed_scale_ = 1.0f;
  float per_layer_embed_scale_ = 1.0f;

  // Scratch, sized for max_chunk_tokens rows.
  std::vector<float> hidden_, normed_, branch_, query_, key_, value_, attention_out_;
  std::vector<float> gate_, up_, ffn_out_, moe_out_, expert_input_, per_layer_inputs_, per_layer_scratch_;
  std::vector<float> rope_cos_, rope_sin_, scores_, logits_, router_logits_;
  std::vector<int32_t> slots_;
};

}  // namespace gemma4rt
