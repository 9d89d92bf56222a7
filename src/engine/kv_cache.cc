#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace gemma4rt {

KvCache::KvCache(const ModelConfig& config, int context_tokens, int max_chunk_tokens, int sequences, KvFormat format,
                 std::vector<int> kv_heads)
    : config_(&config), context_tokens_(context_tokens), sequences_(sequences), format_(format), capacity_(config.num_layers, 0),
      kv_heads_(std::move(kv_heads)) {
  if (kv_heads_.empty()) {
    for (const LayerConfig& layer : config.layers) kv_heads_.push_back(layer.num_kv_heads);
  }
  if (context_tokens <= 0) fail("the context length must be positive, got {}", context_tokens);
  if (sequences <= 0) fail("the number of sequences must be positive, got {}", sequences);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const LayerConfig& geometry = config.layers[layer];
    if (!geometry.owns_kv(layer)) continue;
    capacity_[layer] = geometry.is_sliding() ? std::min(context_tokens, geometry.sliding_window + max_chunk_tokens - 1) : context_tokens;
  }
  storage_.resize(static_cast<size_t>(sequences) * config.num_layers);
  for (int sequence = 0; sequence < sequences; ++sequence) {
    for (int layer = 0; layer < config.num_layers; ++layer) {
      if (capacity_[layer] == 0) continue;
      const size_t bytes = static_cast<size_t>(capacity_[layer]) * row_elements(layer) * element_bytes();
      Storage& storage = storage_[static_cast<size_t>(sequence) * config.num_layers + layer];
      storage.keys.resize(bytes);
      storage.values.resize(bytes);
    }
  }
}

size_t KvCache::size_bytes() const {
  size_t total = 0;
  for (const Storage& storage : storage_) total += storage.keys.size() + storage.values.size();
  return total;
}

size_t KvCache::bytes_per_context_token() const {
  size_t total = 0;
  for (int layer = 0; layer < config_->num_layers; ++layer) {
    if (capacity_[layer] == 0 || config_->layers[layer].is_sliding()) continue;
    total += 2 * static_cast<size_t>(row_elements(layer)) * element_bytes();
  }
  return total * sequences_;
}

}  // namespace gemma4rt
