#include "engine/tensor_parallel.h"

#include "core/error.h"
#include "parallel/shard_plan.h"

namespace gemma4rt {
// The shard plan decides who holds what; this only converts one rank's view of it.
RankPartition partition_for_rank(const ModelConfig& config, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) fail("rank {} of {} does not exist", rank, size);
  const parallel::ShardPlan plan = parallel::make_shard_plan(config, size);
  RankPartition partition;
  partition.rank = rank;
  partition.size = size;
  for (int index = 0; index < config.num_layers; ++index) {
    LayerPartition part;
    part.query_heads = plan.q_heads(index, rank);
    part.kv_heads = plan.kv_heads(index, rank);
    part.kv_replicated = plan.layer(index).kv_replicated;
    part.mlp_rows = plan.mlp_rows(index, rank);
    part.experts = plan.experts(index, rank);
    partition.layers.push_back(part);
  }
  partition.vocab_rows = plan.vocab_rows(rank);
  for (int other = 0; other < size; ++other) partition.vocab_counts.push_back(static_cast<size_t>(plan.vocab_rows(other).count));
  return partition;
}

}  // namespace gemma4rt
