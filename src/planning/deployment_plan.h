// The deployment planner behind `gemma4rt plan`: for a model, a target (an AWS Inferentia2 / Trainium
// instance, one H100 / H200, or a CPU with a memory budget), a weight dtype, a context length and a batch,
// how many bytes every tensor-parallel rank needs, whether that fits, the smallest degree that does, the
// host memory, and (on Neuron) which ops overflow the on-chip buffer and what works instead.
//
// What lives where (the layout of the published Inferentia2 ports and of make_shard_plan):
//   host    the token embedding and PLE tables, gathered per token from the mmap'd checkpoint and sent
//           to the device as activations (they are never multiplied, so they need not be on the device);
//   device  the decoder layers, split by make_shard_plan; the tied LM head as its own copy of the
//           embedding matrix, split by vocabulary rows; the final norm and the PLE projection, replicated.
// A CPU target is one rank that holds all of it; the embedding doubles as the head there when the weights
// keep the checkpoint's bf16.
//
// Every parameter counts (the full parameter count: "E2B" and "A4B" are effective or active counts, but
// all layers and all 128 experts are resident). Bytes are decimal (GB = 1e9); capacities are written the
// way vendors quote them (GiB for Neuron HBM and instance memory, GB for NVIDIA HBM).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/formats.h"
#include "model/config.h"
#include "parallel/shard_plan.h"

namespace gemma4rt::planning {

using parallel::LayerShard;
using parallel::make_shard_plan;
using parallel::ShardPlan;
using parallel::valid_tp_degrees;

enum class TargetKind { kNeuron, kGpu, kCpu };

// A NeuronCore's state buffer (SBUF): a tensor's rows go to partitions and a row must fit one partition.
struct OnChipBuffer {
  int partitions = 0;
  int64_t bytes_per_partition = 0;
};

struct Target {
  std::string name;                      // "inf2.24xlarge", "h200", "cpu:64"
  TargetKind kind = TargetKind::kCpu;
  std::string family;                    // "inf2" / "trn1" for Neuron instances, else empty
  std::string description;
  int ranks = 1;                         // NeuronCores (one per TP rank), GPUs, or 1
  int64_t memory_per_rank_bytes = 0;     // HBM per NeuronCore / per GPU; the budget for cpu:<GiB>
  double usable_fraction = 1.0;          // share of memory_per_rank_bytes the model may fill
  std::optional<int64_t> host_memory_bytes;   // instance RAM; unknown for the bare GPU targets
  std::optional<OnChipBuffer> on_chip_buffer; // Neuron only

  int64_t usable_per_rank_bytes() const;
  std::optional<int64_t> usable_host_bytes() const;
};

// The listed targets (instances and GPUs; "cpu:<GiB>" is parsed, not listed), in table order.
const std::vector<Target>& known_targets();
// A listed target by name, or "cpu:<GiB>" (a positive number of GiB). Throws Error for anything else.
Target parse_target(const std::string& name);

// "f32" / "fp32", "bf16", "q8" (the CPU kernels' int8 with one fp32 scale per 32 values).
WeightFormat parse_weight_dtype(const std::string& name);

struct PlanOptions {
  WeightFormat dtype = WeightFormat::kBF16;   // the checkpoint's own; f32 also makes the KV cache f32
  int context_tokens = 4096;                // KV positions per sequence (the engine's default context)
  int batch = 1;                            // sequences decoded together, each with its own cache
  int prefill_chunk_tokens = 256;           // rows per forward pass (the engine's fast-path chunk)
  bool full_sliding_cache = false;          // sliding layers keep every position (EngineOptions::full_sliding_cache)
  std::optional<int> tp;                    // judge this degree instead of the smallest that fits
};

// One rank's bytes at one degree. Shards are equal except the vocabulary, whose largest slice is used.
struct RankMemory {
  int tp = 1;
  int64_t decoder_layer_bytes = 0;    // this rank's share of every decoder layer
  int64_t lm_head_bytes = 0;          // this rank's vocabulary rows of the head (0 on CPU when shared)
  int64_t other_weight_bytes = 0;     // replicated outside the layers: final norm, PLE projection;
                                      // on CPU also the embedding and PLE tables
  int64_t weight_bytes = 0;
  int64_t kv_cache_bytes = 0;         // KV-owning layers only; sliding layers keep a window-sized ring
  int64_t activation_bytes = 0;       // scratch of one prefill chunk through the largest layer, logits
  int64_t total_bytes = 0;
  bool fits = false;                  // total_bytes <= the target's usable memory per rank
  bool within_target = false;         // tp <= the target's ranks
  // The longest context per sequence (at the plan's batch, dtype and chunk) whose total still fits, up to
  // the model's max_position_embeddings; nullopt when not even one token fits. Set by make_deployment_plan.
  std::optional<int> max_context_tokens;
};

// An op whose working set does not fit the on-chip buffer, with the remedy that works.
struct OnChipIssue {
  std::string op;                     // final_softcap_tanh, sliding_attention_scores, full_attention_scores
  std::string detail;
  int64_t bytes_per_partition = 0;
  int64_t limit_bytes_per_partition = 0;
  std::string remedy;
};

struct DeploymentPlan {
  std::string model;
  Target target;
  PlanOptions options;
  int64_t parameter_count = 0;        // every parameter, embeddings and PLE included
  int max_position_embeddings = 0;    // the model's longest context (0 when its config does not say)
  int64_t host_table_bytes = 0;       // embedding + PLE tables, as stored (bf16)
  std::vector<RankMemory> by_tp;      // every degree make_shard_plan accepts
  std::optional<int> smallest_fitting_tp;   // over all valid degrees, even beyond the target's ranks
  int tp = 1;                         // the degree the verdict is about
  bool fits = false;                  // at `tp`, on this target (ranks, device memory and host memory)
  std::optional<std::string> instance;      // Neuron: the smallest listed instance of the family that fits
  int64_t host_memory_bytes = 0;      // host RAM the deployment needs at `tp`
  std::optional<bool> host_fits;      // unknown when the target does not say its host memory
  std::vector<OnChipIssue> on_chip_issues;  // at `tp`, Neuron only
  std::vector<std::string> remedies;  // what makes it fit when it does not

  const RankMemory& at(int degree) const;
};

// Throws Error for a bad option (context beyond the model's, batch < 1, a --tp make_shard_plan rejects).
DeploymentPlan make_deployment_plan(const ModelConfig& config, const std::string& model_name, const Target& target,
                                    const PlanOptions& options);

// One rank's bytes at `tp` without the verdicts (fits / within_target are false).
RankMemory rank_memory(const ModelConfig& config, const ShardPlan& shards, const Target& target, const PlanOptions& options);

// Bytes of every decoder layer together at `dtype`, unsharded (what a single rank would hold of them).
int64_t decoder_layer_bytes(const ModelConfig& config, WeightFormat dtype);

nlohmann::json to_json(const DeploymentPlan& plan);
nlohmann::json to_json(const ShardPlan& plan);

}  // namespace gemma4rt::planning
