#include "parallel/shard_plan.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace gemma4rt::parallel {
namespace {

std::optional<std::string> layer_problem(const ModelConfig& config, int index, int tp) {
  const LayerConfig& geometry = config.layers.at(static_cast<size_t>(index));
  if (geometry.num_query_heads % tp != 0) {
    return fmt::format("tensor-parallel degree {} does not divide layer {}'s {} query heads", tp, index,
                       geometry.num_query_heads);
  }
  const int kv = geometry.num_kv_heads;
  if (kv % tp != 0 && tp % kv != 0) {
    // Neither split nor one-head-per-rank replication keeps every rank's queries on whole KV groups.
    return fmt::format("tensor-parallel degree {} neither divides nor is a multiple of layer {}'s {} KV heads, so "
                       "a rank's query heads would straddle KV groups",
                       tp, index, kv);
  }
  if (geometry.mlp_intermediate_size % tp != 0) {
    return fmt::format("tensor-parallel degree {} does not divide layer {}'s {} MLP rows", tp, index,
                       geometry.mlp_intermediate_size);
  }
  if (config.enable_moe_block && config.num_experts % tp != 0) {
    return fmt::format("tensor-parallel degree {} does not divide the {} experts of layer {}", tp, config.num_experts, index);
  }
  return std::nullopt;
}

int max_query_heads(const ModelConfig& config) {
  int most = config.num_attention_heads;
  for (const LayerConfig& layer : config.layers) most = std::max(most, layer.num_query_heads);
  return most;
}

}  // namespace

std::optional<std::string> shard_problem(const ModelConfig& config, int tp) {
  if (tp < 1) return fmt::format("the tensor-parallel degree must be at least 1, got {}", tp);
  if (config.layers.empty()) return std::string("the model has no layers");
  for (int index = 0; index < config.num_layers; ++index) {
    if (auto problem = layer_problem(config, index, tp)) return problem;
  }
  if (config.vocab_size < tp) return fmt::format("tensor-parallel degree {} exceeds the {} vocabulary rows", tp, config.vocab_size);
  return std::nullopt;
}

std::vector<int> valid_tp_degrees(const ModelConfig& config) {
  std::vector<int> degrees;
  const int most = max_query_heads(config);
  for (int tp = 1; tp <= most; ++tp) {
    if (!shard_problem(config, tp)) degrees.push_back(tp);
  }
  return degrees;
}

ShardPlan make_shard_plan(const ModelConfig& config, int tp) {
  if (auto problem = shard_problem(config, tp)) {
    fail("{} (degrees that work for this model: {})", *problem, fmt::join(valid_tp_degrees(config), ", "));
  }
  ShardPlan plan;
  plan.tp_ = tp;
  plan.vocab_size_ = config.vocab_size;
  for (int index = 0; index < config.num_layers; ++index) {
    const LayerConfig& geometry = config.layers[static_cast<size_t>(index)];
    LayerShard shard;
    shard.layer = index;
    shard.sliding = geometry.is_sliding();
    shard.head_dim = geometry.head_dim;
    shard.q_heads = geometry.num_query_heads;
    shard.q_heads_per_rank = geometry.num_query_heads / tp;
    shard.owns_kv = geometry.owns_kv(index);
    shard.kv_source_layer = geometry.kv_source_layer;
    shard.kv_heads = geometry.num_kv_heads;
    shard.kv_replicated = geometry.num_kv_heads % tp != 0;
    shard.kv_heads_per_rank = shard.kv_replicated ? 1 : geometry.num_kv_heads / tp;
    shard.kv_replicas = shard.kv_replicated ? tp / geometry.num_kv_heads : 1;
    shard.groups_per_rank = shard.q_heads_per_rank / shard.kv_heads_per_rank;
    shard.mlp_rows = geometry.mlp_intermediate_size;
    shard.mlp_rows_per_rank = geometry.mlp_intermediate_size / tp;
    shard.experts = config.enable_moe_block ? config.num_experts : 0;
    shard.experts_per_rank = shard.experts / tp;
    plan.layers_.push_back(shard);
  }
  return plan;
}

void ShardPlan::check_rank(int layer, int rank) const {
  if (layer < 0 || layer >= num_layers()) fail("layer {} is outside the model's {} layers", layer, num_layers());
  if (rank < 0 || rank >= tp_) fail("rank {} is outside the {} tensor-parallel ranks", rank, tp_);
}

Range ShardPlan::q_heads(int layer, int rank) const {
  check_rank(layer, rank);
  const LayerShard& shard = layers_[static_cast<size_t>(layer)];
  return {static_cast<int64_t>(rank) * shard.q_heads_per_rank, shard.q_heads_per_rank};
}

Range ShardPlan::kv_heads(int layer, int rank) const {
  const Range queries = q_heads(layer, rank);
  const LayerShard& shard = layers_[static_cast<size_t>(layer)];
  const int group = shard.q_heads / shard.kv_heads;  // unsharded GQA group size
  return {queries.first / group, shard.kv_heads_per_rank};
}

Range ShardPlan::q_rows(int layer, int rank) const {
  const Range heads = q_heads(layer, rank);
  const int64_t head_dim = layers_[static_cast<size_t>(layer)].head_dim;
  return {heads.first * head_dim, heads.count * head_dim};
}

Range ShardPlan::kv_rows(int layer, int rank) const {
  const Range heads = kv_heads(layer, rank);
  const int64_t head_dim = layers_[static_cast<size_t>(layer)].head_dim;
  return {heads.first * head_dim, heads.count * head_dim};
}

Range ShardPlan::mlp_rows(int layer, int rank) const {
  check_rank(layer, rank);
  const LayerShard& shard = layers_[static_cast<size_t>(layer)];
  return {static_cast<int64_t>(rank) * shard.mlp_rows_per_rank, shard.mlp_rows_per_rank};
}

Range ShardPlan::experts(int layer, int rank) const {
  check_rank(layer, rank);
  const LayerShard& shard = layers_[static_cast<size_t>(layer)];
  return {static_cast<int64_t>(rank) * shard.experts_per_rank, shard.experts_per_rank};
}

Range ShardPlan::vocab_rows(int rank) const {
  if (rank < 0 || rank >= tp_) fail("rank {} is outside the {} tensor-parallel ranks", rank, tp_);
  const int64_t base = vocab_size_ / tp_;
  const int64_t extra = vocab_size_ % tp_;
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  return {first, base + (rank < extra ? 1 : 0)};
}

int64_t ShardPlan::max_vocab_rows_per_rank() const { return vocab_rows(0).count; }

int ShardPlan::kv_head_for_query(int layer, int rank, int local_q) const {
  const LayerShard& shard = layers_.at(static_cast<size_t>(layer));
  if (local_q < 0 || local_q >= shard.q_heads_per_rank) {
    fail("local query head {} is outside the {} query heads a rank holds", local_q, shard.q_heads_per_rank);
  }
  return static_cast<int>(kv_heads(layer, rank).first) + local_q / shard.groups_per_rank;
}

}  // namespace gemma4rt::parallel
