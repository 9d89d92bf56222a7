// What one tensor-parallel rank computes, in the form the forward pass uses: its query heads, KV heads,
// MLP rows, experts and vocabulary rows, read off the shard plan (src/parallel/shard_plan.h).
#pragma once

#include <vector>

#include "core/range.h"
#include "model/config.h"

namespace gemma4rt {

struct LayerPartition {
  Range query_heads;
  Range kv_heads;
  bool kv_replicated = false;
  Range mlp_rows;
  Range experts;
};

struct RankPartition {
  int rank = 0;
  int size = 1;
  std::vector<LayerPartition> layers;
  Range vocab_rows;
  std::vector<size_t> vocab_counts;   // every rank's vocabulary rows, for gathering logits
};

// Throws Error (from the shard plan) naming the layer when the degree does not fit the model.
RankPartition partition_for_rank(const ModelConfig& config, int rank, int size);

}  // namespace gemma4rt
