// What one tensor-parallel rank computes: its query heads, KV heads (split when the layer's KV head
// count divides by the degree, otherwise every rank keeps all of them), MLP rows, experts and vocabulary
// rows. Derived from the unsharded head counts of each layer.
#pragma once

#include <vector>

#include "model/config.h"

namespace gemma4rt {

struct Slice {
  int first = 0;
  int count = 0;
  int end() const { return first + count; }
};

struct LayerPartition {
  Slice query_heads;
  Slice kv_heads;
  bool kv_replicated = false;
  Slice mlp_rows;
  Slice experts;
};

struct RankPartition {
  int rank = 0;
  int size = 1;
  std::vector<LayerPartition> layers;
  Slice vocab_rows;
  std::vector<size_t> vocab_counts;   // every rank's vocabulary rows, for gathering logits
};

// Throws Error naming the layer and count when the degree does not divide query heads, MLP rows or experts.
RankPartition partition_for_rank(const ModelConfig& config, int rank, int size);

}  // namespace gemma4rt
