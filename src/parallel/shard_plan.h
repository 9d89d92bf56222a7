// The tensor-parallel shard plan: which rank holds which query heads, KV heads, MLP rows, experts and
// vocabulary rows of a model, for a tensor-parallel degree T (Megatron-style: the residual stream is
// replicated on every rank, each block is split so that it needs one all-reduce).
//
// Per decoder layer:
//   q_proj, gate_proj, up_proj   column-parallel: rank r computes its own heads / intermediate rows.
//   o_proj, down_proj            row-parallel: rank r multiplies the input rows it owns; the partial
//                                outputs are summed by an all-reduce (one after attention, one after the FFN).
//   k_proj, v_proj (and caches)  split by KV head when T divides the layer's KV head count; otherwise
//                                (T a multiple of the KV head count) every rank keeps the one KV head its
//                                query heads read, so each KV head is replicated on T / kv_heads ranks.
//   experts (MoE)                expert-parallel: rank r holds experts_per_rank whole experts and adds
//                                their weighted outputs for the tokens routed to them; the sum rides on
//                                the FFN all-reduce. The router (and its scales) is replicated: every rank
//                                routes every token identically.
//   norms, layer_scalar, PLE gate/projection   replicated (small).
// Outside the layers: the token embedding and PLE tables stay on the host (rows gathered per token from
// the mmap); the tied LM head is split by vocabulary rows, each rank produces its slice of the logits and
// the argmax (greedy) or the logits (sampling) are gathered.
//
// GQA under TP: HF maps query head h to KV head h / G with G = q_heads / kv_heads. A rank owns the
// contiguous query heads [r*q_per_rank, (r+1)*q_per_rank). When KV heads are split, those queries read
// exactly the rank's kv_heads_per_rank heads and the group size stays G. When they are replicated, all
// of a rank's queries fall in one group (T is a multiple of kv_heads), so the rank needs one KV head
// and its group count is q_per_rank. Either way groups_per_rank = q_heads_per_rank / kv_heads_per_rank,
// and local query head i reads local KV head i / groups_per_rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/range.h"
#include "model/config.h"

namespace gemma4rt::parallel {

// How one decoder layer is divided. Counts are per rank; every rank holds the same counts.
struct LayerShard {
  int layer = 0;
  bool sliding = true;
  int head_dim = 0;
  int q_heads = 0;              // query heads of the layer, unsharded
  int q_heads_per_rank = 0;
  bool owns_kv = true;          // false: KV-shared layer, attends with kv_source_layer's cache on the same rank
  int kv_source_layer = 0;
  int kv_heads = 0;             // KV heads of the layer, unsharded
  int kv_heads_per_rank = 0;    // KV heads a rank projects (when it owns KV), caches and attends with
  bool kv_replicated = false;   // T does not divide kv_heads: each KV head is kept by kv_replicas ranks
  int kv_replicas = 1;          // ranks holding each KV head (1 when split)
  int groups_per_rank = 0;      // local query heads per local KV head
  int mlp_rows = 0;             // dense MLP intermediate size, unsharded
  int mlp_rows_per_rank = 0;
  int experts = 0;              // MoE experts, unsharded (0: no MoE block)
  int experts_per_rank = 0;
};

class ShardPlan {
 public:
  int tp() const { return tp_; }
  int vocab_size() const { return vocab_size_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const std::vector<LayerShard>& layers() const { return layers_; }
  const LayerShard& layer(int index) const { return layers_.at(static_cast<size_t>(index)); }

  // What rank `rank` holds of layer `layer`. Heads index the unsharded head list; q_rows / kv_rows are
  // the same ranges in rows of q_proj / k_proj / v_proj (and columns of o_proj): heads * head_dim.
  Range q_heads(int layer, int rank) const;
  Range kv_heads(int layer, int rank) const;
  Range q_rows(int layer, int rank) const;
  Range kv_rows(int layer, int rank) const;
  Range mlp_rows(int layer, int rank) const;   // rows of gate/up_proj, columns of down_proj
  Range experts(int layer, int rank) const;    // empty without MoE
  // Vocabulary rows of the LM head (and logits) on `rank`: as even as possible, the first
  // vocab_size % tp ranks take one row more.
  Range vocab_rows(int rank) const;
  int64_t max_vocab_rows_per_rank() const;
  // The global KV head that local query head `local_q` (0-based on `rank`) attends with.
  int kv_head_for_query(int layer, int rank, int local_q) const;

 private:
  friend ShardPlan make_shard_plan(const ModelConfig& config, int tp);
  void check_rank(int layer, int rank) const;

  int tp_ = 1;
  int vocab_size_ = 0;
  std::vector<LayerShard> layers_;
};

// The plan for degree `tp`. Throws Error when tp does not divide a layer's query heads, its MLP rows or
// the experts, or when it neither divides nor is a multiple of a layer's KV heads; the message names the
// layer and lists the degrees that work for this model.
ShardPlan make_shard_plan(const ModelConfig& config, int tp);

// Why `tp` cannot shard this model (the first problem found), or nothing when it can.
std::optional<std::string> shard_problem(const ModelConfig& config, int tp);

// Every degree that make_shard_plan accepts, ascending (1 always; never more than the query heads).
std::vector<int> valid_tp_degrees(const ModelConfig& config);

}  // namespace gemma4rt::parallel
