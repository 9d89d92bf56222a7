#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace gemma4rt {

KvCache::KvCache(backend::Backend& backend, const ModelConfig& config, int context_tokens, int max_chunk_tokens, int sequences,
                 KvFormat format, std::vector<int> kv_heads, bool full_sliding)
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
    capacity_[layer] = geometry.is_sliding() && !full_sliding ? std::min(context_tokens, geometry.sliding_window + max_chunk_tokens - 1)
                                                               : context_tokens;
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

int KvCache::reusable_prefix(int cached, int common) const {
  if (common <= 0 || common > cached) return 0;
  for (int layer = 0; layer < config_->num_layers; ++layer) {
    const LayerConfig& geometry = config_->layers[layer];
    if (capacity_[layer] == 0 || !geometry.is_sliding()) continue;
    // Position `common` reads the window [common - window + 1, common]; the ring's slot for position p
    // was last written by the old sequence's latest position congruent to p, which is p itself only
    // while p >= cached - capacity.
    const int oldest_read = std::max(0, common - geometry.sliding_window + 1);
    if (oldest_read < cached - capacity_[layer]) return 0;
  }
  return common;
}

}  // namespace gemma4rt
