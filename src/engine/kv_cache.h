// The static KV cache: allocated once, in the backend's memory, for a chosen context length and number
// of sequences. Only layers that compute their own K/V own storage; KV-shared layers read their source
// layer's. Full-attention layers keep one slot per context position; sliding layers keep a ring of
// sliding_window + chunk - 1 slots: the oldest key the first row of a chunk needs survives while the
// whole chunk is written (or, with full_sliding, one slot per position too). A layer's keys (and values) are one buffer [sequence][slot][KV heads * head dim].
// K=V layers (V = v_norm(k_proj x), K = RoPE(k_norm(k_proj x))) keep only the values: K is V scaled by
// the k_norm weight and rotated, so attention rebuilds it (AttentionShape::DerivedKeys) and the layer's
// cache is half the size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/formats.h"
#include "model/config.h"

namespace gemma4rt {

class KvCache {
 public:
  // kv_heads: KV heads kept per layer (a tensor-parallel rank keeps its share); empty = the config's.
  KvCache(backend::Backend& backend, const ModelConfig& config, int context_tokens, int max_chunk_tokens, int sequences,
          KvFormat format, std::vector<int> kv_heads = {}, bool full_sliding = false);

  int context_tokens() const { return context_tokens_; }
  int sequences() const { return sequences_; }
  KvFormat format() const { return format_; }
  // Storage of the layer that owns the K/V `layer` reads; keys are invalid where they are derived.
  backend::Buffer keys(int layer) const { return storage_[source(layer)].keys; }
  bool keys_derived(int layer) const { return config_->layers[source(layer)].k_eq_v; }
  backend::Buffer values(int layer) const { return storage_[source(layer)].values; }
  // Slots per sequence; a position lives in slot position % capacity.
  int capacity(int layer) const { return capacity_[source(layer)]; }
  // Elements per cached position: kv heads * head dim.
  int64_t row_elements(int layer) const { return static_cast<int64_t>(kv_heads_[layer]) * config_->layers[layer].head_dim; }
  int kv_heads(int layer) const { return kv_heads_[layer]; }
  size_t element_bytes() const { return kv_element_bytes(format_); }
  size_t size_bytes() const { return size_bytes_; }
  // Bytes one more position of context costs across all layers (sliding rings excluded: they are fixed).
  size_t bytes_per_context_token() const;
  // A slot holds the K/V of `cached` positions and a new sequence shares its first `common` tokens: how
  // many of them it can keep instead of computing again. `common`, when every sliding ring still holds
  // the window position `common` attends to (later positions of the old sequence overwrite the ring's
  // oldest entries); else 0, as a shorter prefix needs even older entries.
  int reusable_prefix(int cached, int common) const;

 private:
  struct Storage {
    backend::Buffer keys, values;
  };
  size_t source(int layer) const { return static_cast<size_t>(config_->layers[layer].kv_source_layer); }
  size_t tensors(int layer) const { return config_->layers[layer].k_eq_v ? 1 : 2; }

  const ModelConfig* config_;
  int context_tokens_;
  int sequences_;
  KvFormat format_;
  std::vector<int> capacity_;      // by layer; 0 for KV-shared layers
  std::vector<int> kv_heads_;      // by layer
  std::vector<Storage> storage_;   // by layer; invalid for KV-shared layers
  size_t size_bytes_ = 0;
};

}  // namespace gemma4rt
