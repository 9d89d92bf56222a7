#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace gemma4rt {

KvCache::KvCache(backend::Backend& backend, const ModelConfig& config, int context_tokens, int max_chunk_tokens, int sequences,
                 KvFormat format, std::vector<int> kv_heads)
    : config_(&config), context_tokens_(context_tokens), sequences_(sequences), format_(format), capacity_(config.num_layers, 0),
      kv_heads_(std::move(kv_heads)), storage_(config.num_layers) {
  if (kv_heads_.empty()) {
    for (const LayerConfig& layer : config.layers) kv_heads_.push_back(layer.num_kv_heads);
  }
  if (context_tokens <= 0) fail("the context length must be positive, got {}", context_tokens);
  if (sequences <= 0) fail("the number of sequences must be positive, got {}", sequences);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const LayerConfig& geometry = config.layers[layer];
    if (!geometry.owns_kv(layer)) continue;
    capacity_[layer] = geometry.is_sliding() ? std::min(context_tokens, geometry.sliding_window + max_chunk_tokens - 1) : context_tokens;
    const size_t bytes = static_cast<size_t>(sequences) * capacity_[layer] * row_elements(layer) * element_bytes();
    // K=V layers keep only the values; attention rebuilds each key from its value.
    if (!geometry.k_eq_v) storage_[layer].keys = backend.allocate(bytes);
    storage_[layer].values = backend.allocate(bytes);
    size_bytes_ += tensors(layer) * bytes;
  }
}

size_t KvCache::bytes_per_context_token() const {
  size_t total = 0;
  for (int layer = 0; layer < config_->num_layers; ++layer) {
    if (capacity_[layer] == 0 || config_->layers[layer].is_sliding()) continue;
    total += tensors(layer) * static_cast<size_t>(row_elements(layer)) * element_bytes();
  }
  return total * sequences_;
}

}  // namespace gemma4rt
