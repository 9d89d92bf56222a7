#include "engine/kv_cache.h"

#include <algorithm>

namespace gemma4rt {

KvCache::KvCache(const ModelConfig& config, int context_tokens, int max_chunk_tokens)
    : config_(&config), context_tokens_(context_tokens), storage_(config.layers.size()) {
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const LayerConfig& geometry = config.layers[layer];
    if (!geometry.owns_kv(layer)) continue;
    LayerStorage& storage = storage_[layer];
    storage.capacity = geometry.is_sliding() ? std::min(context_tokens, geometry.sliding_window + max_chunk_tokens - 1)
                                             : context_tokens;
    const size_t floats = static_cast<size_t>(storage.capacity) * row_floats(layer);
    storage.keys.assign(floats, 0.0f);
    storage.values.assign(floats, 0.0f);
  }
}

size_t KvCache::size_bytes() const {
  size_t total = 0;
  for (const LayerStorage& storage : storage_) total += (storage.keys.size() + storage.values.size()) * sizeof(float);
  return total;
}

}  // namespace gemma4rt
