#include "engine/tensor_parallel.h"

#include "core/error.h"

namespace gemma4rt {
namespace {

Slice even_share(int total, int rank, int size, const char* what, int layer) {
  if (total % size != 0) fail("tensor parallelism {}: layer {} has {} {}, not divisible by {}", size, layer, total, what, size);
  const int share = total / size;
  return {rank * share, share};
}

}  // namespace

RankPartition partition_for_rank(const ModelConfig& config, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) fail("rank {} of {} does not exist", rank, size);
  RankPartition partition;
  partition.rank = rank;
  partition.size = size;
  for (int index = 0; index < config.num_layers; ++index) {
    const LayerConfig& layer = config.layers[index];
    LayerPartition part;
    part.query_heads = even_share(layer.num_query_heads, rank, size, "query heads", index);
    part.kv_replicated = layer.num_kv_heads % size != 0;
    part.kv_heads = part.kv_replicated ? Slice{0, layer.num_kv_heads} : even_share(layer.num_kv_heads, rank, size, "KV heads", index);
    part.mlp_rows = even_share(layer.mlp_intermediate_size, rank, size, "MLP rows", index);
    if (config.enable_moe_block) part.experts = even_share(config.num_experts, rank, size, "experts", index);
    partition.layers.push_back(part);
  }
  // The vocabulary need not divide evenly: the first ranks take one row more.
  int first = 0;
  for (int other = 0; other < size; ++other) {
    const int rows = config.vocab_size / size + (other < config.vocab_size % size ? 1 : 0);
    partition.vocab_counts.push_back(static_cast<size_t>(rows));
    if (other == rank) partition.vocab_rows = {first, rows};
    first += rows;
  }
  return partition;
}

}  // namespace gemma4rt
