// The static KV cache: allocated once for a chosen context length. Only layers that compute their own
// K/V own storage; KV-shared layers read their source layer's. Full-attention layers keep one slot per
// context position; sliding layers keep a ring of sliding_window + chunk - 1 slots, enough for the
// oldest key the first query of a chunk needs while the whole chunk is written.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace gemma4rt {

class KvCache {
 public:
  KvCache(const ModelConfig& config, int context_tokens, int max_chunk_tokens);

  int context_tokens() const { return context_tokens_; }
  // Storage of the layer that owns the K/V `layer` reads.
  float* keys(int layer) { return storage_[config_->layers[layer].kv_source_layer].keys.data(); }
  float* values(int layer) { return storage_[config_->layers[layer].kv_source_layer].values.data(); }
  int capacity(int layer) const { return storage_[config_->layers[layer].kv_source_layer].capacity; }
  int slot(int layer, int position) const { return position % capacity(layer); }
  // Floats per cached position: kv heads * head dim.
  int64_t row_floats(int layer) const {
    const LayerConfig& geometry = config_->layers[layer];
    return static_cast<int64_t>(geometry.num_kv_heads) * geometry.head_dim;
  }
  size_t size_bytes() const;

 private:
  struct LayerStorage {
    int capacity = 0;
    std::vector<float> keys, values;
  };
  const ModelConfig* config_;
  int context_tokens_;
  std::vector<LayerStorage> storage_;  // indexed by layer; empty for KV-shared layers
};

}  // namespace gemma4rt
