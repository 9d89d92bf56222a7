// The static KV cache: allocated once for a chosen context length and number of sequences. Only layers
// that compute their own K/V own storage; KV-shared layers read their source layer's. Full-attention
// layers keep one slot per context position; sliding layers keep a ring of sliding_window + chunk - 1
// slots: the oldest key the first row of a chunk needs survives while the whole chunk is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/vector_ops.h"
#include "model/config.h"

namespace gemma4rt {

using kernels::KvFormat;

class KvCache {
 public:
  // kv_heads: KV heads kept per layer (a tensor-parallel rank keeps its share); empty = the config's.
  KvCache(const ModelConfig& config, int context_tokens, int max_chunk_tokens, int sequences, KvFormat format,
          std::vector<int> kv_heads = {});

  int context_tokens() const { return context_tokens_; }
  int sequences() const { return sequences_; }
  KvFormat format() const { return format_; }
  // Storage of the layer that owns the K/V `layer` reads, for one sequence.
  std::byte* keys(int sequence, int layer) { return entry(sequence, layer).keys.data(); }
  std::byte* values(int sequence, int layer) { return entry(sequence, layer).values.data(); }
  int capacity(int layer) const { return capacity_[config_->layers[layer].kv_source_layer]; }
  int slot(int layer, int position) const { return position % capacity(layer); }
  // Elements per cached position: kv heads * head dim.
  int64_t row_elements(int layer) const {
    return static_cast<int64_t>(kv_heads_[layer]) * config_->layers[layer].head_dim;
  }
  int kv_heads(int layer) const { return kv_heads_[layer]; }
  size_t element_bytes() const { return format_ == KvFormat::kF32 ? 4 : 2; }
  size_t size_bytes() const;
  // Bytes one more position of context costs across all layers (sliding rings excluded: they are fixed).
  size_t bytes_per_context_token() const;

 private:
  struct Storage {
    std::vector<std::byte> keys, values;
  };
  Storage& entry(int sequence, int layer) {
    return storage_[static_cast<size_t>(sequence) * config_->num_layers + config_->layers[layer].kv_source_layer];
  }

  const ModelConfig* config_;
  int context_tokens_;
  int sequences_;
  KvFormat format_;
  std::vector<int> capacity_;      // by layer; 0 for KV-shared layers
  std::vector<int> kv_heads_;      // by layer
  std::vector<Storage> storage_;   // [sequence][layer]; empty for KV-shared layers
};

}  // namespace gemma4rt
