#include "planning/deployment_plan.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "model/model_shapes.h"

namespace gemma4rt::planning {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kKiB = 1024;

// Neuron runtime, compiled program, collective buffers and fragmentation on a NeuronCore; CUDA context,
// library workspaces and NCCL buffers on a GPU. 10% is the allowance vLLM's default
// gpu_memory_utilization (0.9) makes; without it 31B would seem to fit four 16 GiB cores at 15.8 GB each.
constexpr double kAcceleratorUsableFraction = 0.9;

// NeuronCore-v2 (Inferentia2 and Trainium1): 16 GiB of HBM per core (a chip has 2 cores and 32 GiB) and a
// 24 MiB state buffer of 128 partitions x 192 KiB.
constexpr int64_t kNeuronCoreHbm = 16 * kGiB;
constexpr OnChipBuffer kNeuronCoreSbuf{128, 192 * kKiB};

Target neuron(const char* name, const char* family, const char* description, int cores, int64_t host_gib) {
  Target target;
  target.name = name;
  target.kind = TargetKind::kNeuron;
  target.family = family;
  target.description = description;
  target.ranks = cores;
  target.memory_per_rank_bytes = kNeuronCoreHbm;
  target.usable_fraction = kAcceleratorUsableFraction;
  target.host_memory_bytes = host_gib * kGiB;
  target.on_chip_buffer = kNeuronCoreSbuf;
  return target;
}

Target gpu(const char* name, const char* description, int64_t hbm_bytes) {
  Target target;
  target.name = name;
  target.kind = TargetKind::kGpu;
  target.description = description;
  target.ranks = 1;
  target.memory_per_rank_bytes = hbm_bytes;
  target.usable_fraction = kAcceleratorUsableFraction;
  return target;
}

// The instance facts the planner relies on (AWS instance pages; NVIDIA data sheets):
//
//   target          accelerators                         cores  HBM            host RAM
//   inf2.xlarge     1 Inferentia2 chip                   2      32 GiB         16 GiB
//   inf2.8xlarge    1 Inferentia2 chip                   2      32 GiB         128 GiB
//   inf2.24xlarge   6 Inferentia2 chips                  12     192 GiB        384 GiB
//   inf2.48xlarge   12 Inferentia2 chips                 24     384 GiB        768 GiB
//   trn1.2xlarge    1 Trainium chip                      2      32 GiB         32 GiB
//   trn1.32xlarge   16 Trainium chips                    32     512 GiB        512 GiB
//   h100            1 NVIDIA H100                        -      80 GB HBM3     (not part of the target)
//   h200            1 NVIDIA H200                        -      141 GB HBM3e   (not part of the target)
//
// Every NeuronCore-v2 is one TP rank with 16 GiB. The GPU capacities are the data-sheet decimal GB (the
// driver reports a little more: 81559 MiB and 143771 MiB), so the plan errs on the safe side. GPUs have
// no on-chip buffer limit of the Neuron kind: their kernels tile through shared memory.
const std::vector<Target> kTargets = {
    neuron("inf2.xlarge", "inf2", "1 Inferentia2 chip: 2 NeuronCores-v2, 32 GiB HBM (16 GiB per core)", 2, 16),
    neuron("inf2.8xlarge", "inf2", "1 Inferentia2 chip: 2 NeuronCores-v2, 32 GiB HBM (16 GiB per core)", 2, 128),
    neuron("inf2.24xlarge", "inf2", "6 Inferentia2 chips: 12 NeuronCores-v2, 192 GiB HBM (16 GiB per core)", 12, 384),
    neuron("inf2.48xlarge", "inf2", "12 Inferentia2 chips: 24 NeuronCores-v2, 384 GiB HBM (16 GiB per core)", 24, 768),
    neuron("trn1.2xlarge", "trn1", "1 Trainium chip: 2 NeuronCores-v2, 32 GiB HBM (16 GiB per core)", 2, 32),
    neuron("trn1.32xlarge", "trn1", "16 Trainium chips: 32 NeuronCores-v2, 512 GiB HBM (16 GiB per core)", 32, 512),
    gpu("h100", "1 NVIDIA H100 GPU, 80 GB HBM3", 80'000'000'000),
    gpu("h200", "1 NVIDIA H200 GPU, 141 GB HBM3e", 141'000'000'000),
};

std::string target_names() {
  std::vector<std::string> names;
  for (const Target& target : kTargets) names.push_back(target.name);
  names.emplace_back("cpu:<GiB>");
  return fmt::format("{}", fmt::join(names, ", "));
}

// Bytes of `values` weights of a role at a dtype. Norm weights, scales and layer scalars are vectors the
// kernels keep in fp32; the host tables stay as the checkpoint stores them (bf16).
int64_t linear_bytes(int64_t values, WeightFormat dtype) {
  switch (dtype) {
    case WeightFormat::kF32: return values * 4;
    case WeightFormat::kBF16: return values * 2;
    case WeightFormat::kQ8: return values + (values + 31) / 32 * 4;  // int8 plus one fp32 scale per 32 values
    case WeightFormat::kQ4: return (values + 1) / 2 + (values + 31) / 32 * 2;  // nibbles plus one f16 scale per 32
  }
  return values * 4;
}

int64_t tensor_bytes(int64_t values, TensorRole role, WeightFormat dtype) {
  switch (role) {
    case TensorRole::kLinear:
    case TensorRole::kTokenEmbedding: return linear_bytes(values, dtype);
    case TensorRole::kPerLayerEmbedding: return values * 2;
    case TensorRole::kNorm:
    case TensorRole::kLayerScalar: return values * 4;
  }
  return values * 4;
}

constexpr int64_t kStoredTableBytesPerValue = 2;  // released checkpoints are bf16

// The share of a decoder-layer tensor one rank holds. Tensors not split count as replicated.
std::pair<int64_t, int64_t> layer_tensor_share(const LayerShard& shard, TensorKind kind) {
  switch (kind) {
    case TensorKind::kQProj:
    case TensorKind::kOProj: return {shard.q_heads_per_rank, shard.q_heads};
    case TensorKind::kKProj:
    case TensorKind::kVProj: return {shard.kv_heads_per_rank, shard.kv_heads};
    case TensorKind::kGateProj:
    case TensorKind::kUpProj:
    case TensorKind::kDownProj: return {shard.mlp_rows_per_rank, shard.mlp_rows};
    case TensorKind::kExpertsGateUp:
    case TensorKind::kExpertsDown:
      if (shard.experts > 0) return {shard.experts_per_rank, shard.experts};
      return {1, 1};
    default: return {1, 1};
  }
}

struct RankBytes {
  RankMemory memory;
  int64_t largest_device_tensor_bytes = 0;   // the host's staging buffer while weights are uploaded
  int64_t host_table_bytes = 0;
  int64_t host_activation_bytes = 0;
};

bool is_accelerator(const Target& target) { return target.kind != TargetKind::kCpu; }

int prefill_rows(const PlanOptions& options) {
  const int64_t wanted = std::min<int64_t>(options.prefill_chunk_tokens, static_cast<int64_t>(options.context_tokens) * options.batch);
  return static_cast<int>(std::max<int64_t>(options.batch, wanted));
}

// Keys a query row of this layer attends: the window on sliding layers, the whole context on full ones.
int64_t attended_keys(const LayerConfig& geometry, const PlanOptions& options) {
  return geometry.is_sliding() ? std::min(options.context_tokens, geometry.sliding_window) : options.context_tokens;
}

RankBytes compute_rank_bytes(const ModelConfig& config, const ShardPlan& shards, const Target& target, const PlanOptions& options) {
  const bool accelerator = is_accelerator(target);
  const int64_t hidden = config.hidden_size;
  const int64_t vocab_rows = shards.max_vocab_rows_per_rank();
  RankBytes bytes;
  RankMemory& memory = bytes.memory;
  memory.tp = shards.tp();

  auto device_tensor = [&](int64_t tensor_bytes_on_rank) {
    bytes.largest_device_tensor_bytes = std::max(bytes.largest_device_tensor_bytes, tensor_bytes_on_rank);
  };
  for (const TensorSpec& tensor : checkpoint_tensors(config)) {
    const int64_t values = tensor.element_count();
    if (tensor.layer >= 0) {
      const auto [numerator, denominator] = layer_tensor_share(shards.layer(tensor.layer), tensor.kind);
      const int64_t on_rank = tensor_bytes(values / denominator * numerator, tensor.role, options.dtype);
      memory.decoder_layer_bytes += on_rank;
      device_tensor(on_rank);
    } else if (tensor.kind == TensorKind::kTokenEmbedding) {
      const int64_t table = values * kStoredTableBytesPerValue;
      bytes.host_table_bytes += table;
      const int64_t head_rows = config.tie_word_embeddings ? vocab_rows : 0;
      if (accelerator) {
        memory.lm_head_bytes += linear_bytes(head_rows * hidden, options.dtype);
        device_tensor(memory.lm_head_bytes);
      } else {
        memory.other_weight_bytes += table;
        // The engine multiplies by the mmap'd table itself unless the weights are converted.
        if (options.dtype != WeightFormat::kBF16) memory.lm_head_bytes += linear_bytes(head_rows * hidden, options.dtype);
      }
    } else if (tensor.kind == TensorKind::kPerLayerEmbedding) {
      const int64_t table = values * kStoredTableBytesPerValue;
      bytes.host_table_bytes += table;
      if (!accelerator) memory.other_weight_bytes += table;
    } else if (tensor.kind == TensorKind::kLmHead) {
      memory.lm_head_bytes += linear_bytes(vocab_rows * hidden, options.dtype);
      device_tensor(memory.lm_head_bytes);
    } else {
      const int64_t replicated = tensor_bytes(values, tensor.role, options.dtype);
      memory.other_weight_bytes += replicated;
      device_tensor(replicated);
    }
  }
  memory.weight_bytes = memory.decoder_layer_bytes + memory.lm_head_bytes + memory.other_weight_bytes;

  // KV cache: only layers that compute their own K/V; a sliding layer's ring holds the window plus the
  // rest of a prefill chunk (kv_cache.cc), unless asked to keep every position as a full layer does.
  const int64_t kv_value_bytes = options.dtype == WeightFormat::kF32 ? 4 : 2;
  const int64_t window_extra = options.prefill_chunk_tokens - 1;
  for (const LayerShard& shard : shards.layers()) {
    if (!shard.owns_kv) continue;
    const LayerConfig& geometry = config.layers[static_cast<size_t>(shard.layer)];
    const int64_t slots = shard.sliding && !options.full_sliding_cache
                              ? std::min<int64_t>(options.context_tokens, geometry.sliding_window + window_extra)
                              : options.context_tokens;
    // gemma4rt caches one tensor on K=V layers (keys are rebuilt from values); the Neuron port caches both.
    const int64_t tensors = geometry.k_eq_v && target.kind != TargetKind::kNeuron ? 1 : 2;
    memory.kv_cache_bytes += static_cast<int64_t>(options.batch) * slots * shard.kv_heads_per_rank * shard.head_dim * tensors * kv_value_bytes;
  }

  // Activations, fp32 scratch for one prefill chunk through the largest layer (decode needs less).
  const int64_t rows = prefill_rows(options);
  int64_t largest_layer = 0;
  for (const LayerShard& shard : shards.layers()) {
    const LayerConfig& geometry = config.layers[static_cast<size_t>(shard.layer)];
    int64_t values = 3 * rows * hidden                                        // residual, normed input, branch
                     + 2 * rows * shard.q_heads_per_rank * shard.head_dim     // queries, attention output
                     + 2 * rows * shard.kv_heads_per_rank * shard.head_dim    // keys, values of the chunk
                     + 2 * rows * shard.mlp_rows_per_rank;                    // gate, up
    if (shard.experts > 0) values += rows * (shard.experts + 2 * config.moe_intermediate_size + hidden);
    // Neuron runs eager attention (the remedy that compiles, see on_chip_issues): the score matrix of the
    // chunk against every key it attends is materialised in HBM. GPU and CPU kernels stream the keys.
    if (target.kind == TargetKind::kNeuron) {
      values += static_cast<int64_t>(shard.q_heads_per_rank) * rows *
                std::min<int64_t>(options.context_tokens, attended_keys(geometry, options) + rows - 1);
    }
    largest_layer = std::max(largest_layer, values);
  }
  const int64_t per_layer_inputs = rows * config.num_layers * config.hidden_size_per_layer_input;
  const int64_t logits = static_cast<int64_t>(options.batch) * (vocab_rows + config.vocab_size);  // slice + gathered
  memory.activation_bytes = 4 * (largest_layer + per_layer_inputs + logits);
  memory.total_bytes = memory.weight_bytes + memory.kv_cache_bytes + memory.activation_bytes;

  // What the host computes and sends: the gathered embedding and PLE rows, and the gathered logits.
  bytes.host_activation_bytes = 4 * (rows * (hidden + config.num_layers * config.hidden_size_per_layer_input) +
                                     static_cast<int64_t>(options.batch) * config.vocab_size);
  return bytes;
}

// Binary search over the context: a rank's total never shrinks as the context grows (KV rings, full-layer
// caches, prefill rows and score matrices only grow), so the fitting contexts are a prefix.
std::optional<int> longest_fitting_context(const ModelConfig& config, const ShardPlan& shards, const Target& target,
                                           PlanOptions options) {
  const int64_t usable = target.usable_per_rank_bytes();
  const auto fits_at = [&](int context) {
    options.context_tokens = context;
    return compute_rank_bytes(config, shards, target, options).memory.total_bytes <= usable;
  };
  // Without a model limit, the longest RoPE context any released variant has, twice over.
  const int ceiling = config.max_position_embeddings > 0 ? config.max_position_embeddings : 524288;
  if (!fits_at(1)) return std::nullopt;
  if (fits_at(ceiling)) return ceiling;
  int fits = 1, fails = ceiling;
  while (fails - fits > 1) {
    const int middle = fits + (fails - fits) / 2;
    (fits_at(middle) ? fits : fails) = middle;
  }
  return fits;
}

int64_t host_bytes_needed(const RankBytes& bytes, const Target& target) {
  if (!is_accelerator(target)) return bytes.memory.total_bytes;  // the CPU rank is the host
  return bytes.host_table_bytes + bytes.largest_device_tensor_bytes + bytes.host_activation_bytes;
}

// Our model of the operands an untiled fused-attention (SDPA) custom call keeps in the state buffer for
// one 128-row query tile: per partition the tile's query rows (heads x head_dim), the keys and values of
// the attended span expanded to the rank's query heads (spread over the partitions), and the row's fp32
// scores and probabilities. It is a reconstruction, not the compiler's documented lowering; it agrees
// with the published port: 12B (window 1024, 8 query heads per rank at TP=2) overflowed at 200 KiB of
// 192, E4B (window 512, 4 heads per rank) fit at 52 KiB.
int64_t attention_bytes_per_partition(int q_heads_per_rank, int head_dim, int64_t keys, const OnChipBuffer& buffer) {
  const int64_t queries = static_cast<int64_t>(q_heads_per_rank) * head_dim * 4;
  const int64_t keys_values = 2 * static_cast<int64_t>(q_heads_per_rank) * keys * head_dim * 4 / buffer.partitions;
  const int64_t scores = 2 * static_cast<int64_t>(q_heads_per_rank) * keys * 4;
  return queries + keys_values + scores;
}

std::vector<OnChipIssue> on_chip_issues(const ModelConfig& config, const ShardPlan& shards, const Target& target,
                                        const PlanOptions& options) {
  std::vector<OnChipIssue> issues;
  if (!target.on_chip_buffer) return issues;
  const OnChipBuffer& buffer = *target.on_chip_buffer;

  // The final softcap: a tanh custom call puts each logits row (position) on a partition and does not
  // tile along the vocabulary, so one partition holds the rank's whole vocabulary slice in fp32. For 12B
  // at TP=2 that is 131072 x 4 = 524288 B, the compiler's "128x524288 ... vs 196608 B/partition".
  if (config.final_logit_softcapping) {
    const int64_t rows = shards.max_vocab_rows_per_rank();
    const int64_t per_partition = rows * 4;
    if (per_partition > buffer.bytes_per_partition) {
      std::optional<int> fitting_tp;
      for (int degree : valid_tp_degrees(config)) {
        if (ShardPlan other = make_shard_plan(config, degree); other.max_vocab_rows_per_rank() * 4 <= buffer.bytes_per_partition) {
          fitting_tp = degree;
          break;
        }
      }
      OnChipIssue issue;
      issue.op = "final_softcap_tanh";
      issue.detail = fmt::format("{:g}*tanh(x/{:g}) over {} vocabulary logits per position (fp32): {} partitions x {} B",
                                 *config.final_logit_softcapping, *config.final_logit_softcapping, rows, buffer.partitions,
                                 per_partition);
      issue.bytes_per_partition = per_partition;
      issue.limit_bytes_per_partition = buffer.bytes_per_partition;
      issue.remedy = "greedy without the device softcap: the cap is monotonic, so the argmax of the raw logits is the "
                     "same token; the host applies it only when sampling";
      if (fitting_tp) issue.remedy += fmt::format(" (or TP >= {}, where a rank's vocabulary slice fits)", *fitting_tp);
      issues.push_back(issue);
    }
  }

  // Attention score tiles, the worst layer of each attention type.
  for (const bool sliding : {true, false}) {
    int64_t worst = 0;
    const LayerShard* worst_layer = nullptr;
    int64_t worst_keys = 0;
    for (const LayerShard& shard : shards.layers()) {
      if (shard.sliding != sliding) continue;
      const int64_t keys = attended_keys(config.layers[static_cast<size_t>(shard.layer)], options);
      const int64_t bytes = attention_bytes_per_partition(shard.q_heads_per_rank, shard.head_dim, keys, buffer);
      if (bytes > worst) {
        worst = bytes;
        worst_layer = &shard;
        worst_keys = keys;
      }
    }
    if (worst_layer == nullptr || worst <= buffer.bytes_per_partition) continue;
    OnChipIssue issue;
    issue.op = sliding ? "sliding_attention_scores" : "full_attention_scores";
    issue.detail = fmt::format("fused attention over {} keys ({}), {} query heads per rank, head_dim {}: {} B per partition",
                               worst_keys, sliding ? fmt::format("sliding window {}", config.layers[static_cast<size_t>(worst_layer->layer)].sliding_window)
                                                   : std::string("the whole context"),
                               worst_layer->q_heads_per_rank, worst_layer->head_dim, worst);
    issue.bytes_per_partition = worst;
    issue.limit_bytes_per_partition = buffer.bytes_per_partition;
    issue.remedy = "eager attention: the scores become explicit matmuls the compiler tiles through the buffer (the "
                   "score matrix then lives in HBM and is counted in the activations)";
    issues.push_back(issue);
  }
  return issues;
}

std::string rank_word(const Target& target, int count) {
  switch (target.kind) {
    case TargetKind::kNeuron: return fmt::format("{} NeuronCore{}", count, count == 1 ? "" : "s");
    case TargetKind::kGpu: return fmt::format("{} {} GPU{}", count, target.name, count == 1 ? "" : "s");
    case TargetKind::kCpu: return fmt::format("{} rank{}", count, count == 1 ? "" : "s");
  }
  return std::to_string(count);
}

std::string gigabytes(int64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace

int64_t Target::usable_per_rank_bytes() const {
  return static_cast<int64_t>(std::floor(static_cast<double>(memory_per_rank_bytes) * usable_fraction));
}

std::optional<int64_t> Target::usable_host_bytes() const {
  if (!host_memory_bytes) return std::nullopt;
  // The host also runs the OS and the runtime; the same allowance as the devices.
  const double fraction = kind == TargetKind::kCpu ? usable_fraction : kAcceleratorUsableFraction;
  return static_cast<int64_t>(std::floor(static_cast<double>(*host_memory_bytes) * fraction));
}

const std::vector<Target>& known_targets() { return kTargets; }

Target parse_target(const std::string& name) {
  for (const Target& target : kTargets) {
    if (target.name == name) return target;
  }
  if (name.starts_with("cpu:")) {
    const std::string amount = name.substr(4);
    double gib = 0.0;
    size_t used = 0;
    try {
      gib = std::stod(amount, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != amount.size() || !(gib > 0.0) || !std::isfinite(gib)) {
      fail("target \"{}\": cpu:<GiB> needs a positive number of GiB, e.g. cpu:64", name);
    }
    Target target;
    target.name = name;
    target.kind = TargetKind::kCpu;
    target.description = fmt::format("one CPU rank with {:g} GiB of memory", gib);
    target.ranks = 1;
    target.memory_per_rank_bytes = static_cast<int64_t>(gib * static_cast<double>(kGiB));
    target.usable_fraction = 1.0;  // the budget the user grants, already net of what else runs
    target.host_memory_bytes = target.memory_per_rank_bytes;
    return target;
  }
  fail("unknown target \"{}\" (known targets: {})", name, target_names());
}

WeightFormat parse_weight_dtype(const std::string& name) {
  if (const std::optional<WeightFormat> format = parse_weight_format(name)) return *format;
  fail("unknown weight dtype \"{}\" (expected f32, bf16, q8 or q4)", name);
}

RankMemory rank_memory(const ModelConfig& config, const ShardPlan& shards, const Target& target, const PlanOptions& options) {
  return compute_rank_bytes(config, shards, target, options).memory;
}

int64_t decoder_layer_bytes(const ModelConfig& config, WeightFormat dtype) {
  PlanOptions options;
  options.dtype = dtype;
  return rank_memory(config, make_shard_plan(config, 1), parse_target("cpu:1"), options).decoder_layer_bytes;
}

const RankMemory& DeploymentPlan::at(int degree) const {
  for (const RankMemory& memory : by_tp) {
    if (memory.tp == degree) return memory;
  }
  fail("no plan for tensor-parallel degree {}", degree);
}

DeploymentPlan make_deployment_plan(const ModelConfig& config, const std::string& model_name, const Target& target,
                                    const PlanOptions& options) {
  if (options.context_tokens < 1) fail("the context must be at least 1 token, got {}", options.context_tokens);
  if (config.max_position_embeddings > 0 && options.context_tokens > config.max_position_embeddings) {
    fail("a context of {} tokens exceeds the model's max_position_embeddings ({})", options.context_tokens,
         config.max_position_embeddings);
  }
  if (options.batch < 1) fail("the batch must be at least 1 sequence, got {}", options.batch);
  if (options.prefill_chunk_tokens < 1) fail("the prefill chunk must be at least 1 token, got {}", options.prefill_chunk_tokens);
  if (options.tp) make_shard_plan(config, *options.tp);  // a clear error for an impossible --tp
  if (target.kind == TargetKind::kCpu && options.tp.value_or(1) != 1) {
    // Ranks on one machine share its memory, so a per-rank budget means nothing there.
    fail("target {} is one rank; tensor parallelism is planned for accelerator targets", target.name);
  }

  DeploymentPlan plan;
  plan.model = model_name;
  plan.target = target;
  plan.options = options;
  plan.parameter_count = parameter_count(config);
  plan.max_position_embeddings = config.max_position_embeddings;

  const int64_t usable = target.usable_per_rank_bytes();
  std::vector<RankBytes> details;
  const std::vector<int> degrees = target.kind == TargetKind::kCpu ? std::vector<int>{1} : valid_tp_degrees(config);
  for (int degree : degrees) {
    const ShardPlan shards = make_shard_plan(config, degree);
    RankBytes bytes = compute_rank_bytes(config, shards, target, options);
    bytes.memory.fits = bytes.memory.total_bytes <= usable;
    bytes.memory.max_context_tokens = longest_fitting_context(config, shards, target, options);
    bytes.memory.within_target = degree <= target.ranks;
    plan.host_table_bytes = bytes.host_table_bytes;
    if (bytes.memory.fits && !plan.smallest_fitting_tp) plan.smallest_fitting_tp = degree;
    plan.by_tp.push_back(bytes.memory);
    details.push_back(bytes);
  }

  // The degree to judge: the one asked for, else the smallest that fits, else the most the target has.
  if (options.tp) {
    plan.tp = *options.tp;
  } else if (plan.smallest_fitting_tp) {
    plan.tp = *plan.smallest_fitting_tp;
  } else {
    plan.tp = 1;
    for (const RankMemory& memory : plan.by_tp) {
      if (memory.within_target) plan.tp = memory.tp;
    }
  }
  const auto detail_at = [&](int degree) -> const RankBytes& {
    for (const RankBytes& bytes : details) {
      if (bytes.memory.tp == degree) return bytes;
    }
    fail("no plan for tensor-parallel degree {}", degree);
  };
  const RankBytes& chosen = detail_at(plan.tp);
  plan.host_memory_bytes = host_bytes_needed(chosen, target);
  if (const auto host = target.usable_host_bytes()) plan.host_fits = plan.host_memory_bytes <= *host;
  plan.fits = chosen.memory.fits && chosen.memory.within_target && plan.host_fits.value_or(true);

  // Neuron: the smallest listed instance of the family with enough cores and host memory for that degree.
  if (target.kind == TargetKind::kNeuron && chosen.memory.fits) {
    std::vector<Target> family;
    for (const Target& candidate : kTargets) {
      if (candidate.family == target.family) family.push_back(candidate);
    }
    std::stable_sort(family.begin(), family.end(), [](const Target& a, const Target& b) {
      return a.ranks != b.ranks ? a.ranks < b.ranks : *a.host_memory_bytes < *b.host_memory_bytes;
    });
    for (const Target& candidate : family) {
      if (candidate.ranks >= plan.tp && plan.host_memory_bytes <= candidate.usable_host_bytes().value_or(0)) {
        plan.instance = candidate.name;
        break;
      }
    }
  }

  plan.on_chip_issues = on_chip_issues(config, make_shard_plan(config, plan.tp), target, options);

  if (!plan.fits) {
    if (plan.smallest_fitting_tp && (!chosen.memory.fits || !chosen.memory.within_target)) {
      const int degree = *plan.smallest_fitting_tp;
      std::string where;
      if (target.kind == TargetKind::kNeuron) {
        where = plan.instance ? fmt::format(": {} ({} NeuronCores)", *plan.instance, degree) : "";
      } else {
        where = fmt::format(" across {}", rank_word(target, degree));
      }
      plan.remedies.push_back(fmt::format("more TP: TP={} fits{}", degree, where));
    }
    if (options.dtype == WeightFormat::kF32) {
      PlanOptions smaller = options;
      smaller.dtype = WeightFormat::kBF16;
      smaller.tp.reset();
      const DeploymentPlan bf16 = make_deployment_plan(config, model_name, target, smaller);
      if (bf16.smallest_fitting_tp) {
        plan.remedies.push_back(fmt::format("bf16 weights: {} per rank at TP={} (smallest TP that fits in bf16)",
                                            gigabytes(bf16.at(*bf16.smallest_fitting_tp).weight_bytes), *bf16.smallest_fitting_tp));
      }
    }
    if (target.kind == TargetKind::kCpu && options.dtype != WeightFormat::kQ8) {
      PlanOptions smaller = options;
      smaller.dtype = WeightFormat::kQ8;
      smaller.tp.reset();
      const DeploymentPlan q8 = make_deployment_plan(config, model_name, target, smaller);
      if (q8.fits) plan.remedies.push_back(fmt::format("q8 weights: {} in all", gigabytes(q8.at(1).total_bytes)));
      else plan.remedies.push_back(fmt::format("more memory: {} at TP=1 ({} in q8)", gigabytes(chosen.memory.total_bytes), gigabytes(q8.at(1).total_bytes)));
    }
    if (chosen.memory.fits && chosen.memory.within_target && plan.host_fits == false) {
      plan.remedies.push_back(fmt::format("more host memory: {} needed, {} usable on {}", gigabytes(plan.host_memory_bytes),
                                          gigabytes(target.usable_host_bytes().value_or(0)), target.name));
    }
  }
  return plan;
}

nlohmann::json to_json(const ShardPlan& plan) {
  using nlohmann::json;
  auto range = [](const Range& r) { return json{{"first", r.first}, {"count", r.count}}; };
  json result;
  result["tp"] = plan.tp();
  result["vocab_size"] = plan.vocab_size();
  json vocab = json::array();
  for (int rank = 0; rank < plan.tp(); ++rank) {
    json rows = range(plan.vocab_rows(rank));
    rows["rank"] = rank;
    vocab.push_back(rows);
  }
  result["vocab_rows"] = vocab;
  json layers = json::array();
  for (const LayerShard& shard : plan.layers()) {
    json ranks = json::array();
    for (int rank = 0; rank < plan.tp(); ++rank) {
      ranks.push_back({{"rank", rank},
                       {"q_heads", range(plan.q_heads(shard.layer, rank))},
                       {"kv_heads", range(plan.kv_heads(shard.layer, rank))},
                       {"mlp_rows", range(plan.mlp_rows(shard.layer, rank))},
                       {"experts", range(plan.experts(shard.layer, rank))}});
    }
    layers.push_back({{"layer", shard.layer},
                      {"type", shard.sliding ? "sliding" : "full"},
                      {"head_dim", shard.head_dim},
                      {"q_heads", shard.q_heads},
                      {"q_heads_per_rank", shard.q_heads_per_rank},
                      {"owns_kv", shard.owns_kv},
                      {"kv_source_layer", shard.kv_source_layer},
                      {"kv_heads", shard.kv_heads},
                      {"kv_heads_per_rank", shard.kv_heads_per_rank},
                      {"kv_replicated", shard.kv_replicated},
                      {"kv_replicas", shard.kv_replicas},
                      {"groups_per_rank", shard.groups_per_rank},
                      {"mlp_rows", shard.mlp_rows},
                      {"mlp_rows_per_rank", shard.mlp_rows_per_rank},
                      {"experts", shard.experts},
                      {"experts_per_rank", shard.experts_per_rank},
                      {"ranks", ranks}});
  }
  result["layers"] = layers;
  return result;
}

nlohmann::json to_json(const DeploymentPlan& plan) {
  using nlohmann::json;
  const Target& target = plan.target;
  json target_json = {{"name", target.name},
                      {"kind", target.kind == TargetKind::kNeuron ? "neuron" : target.kind == TargetKind::kGpu ? "gpu" : "cpu"},
                      {"description", target.description},
                      {"ranks", target.ranks},
                      {"memory_per_rank_bytes", target.memory_per_rank_bytes},
                      {"usable_per_rank_bytes", target.usable_per_rank_bytes()},
                      {"host_memory_bytes", target.host_memory_bytes ? json(*target.host_memory_bytes) : json(nullptr)}};
  if (target.on_chip_buffer) {
    target_json["on_chip_buffer"] = {{"partitions", target.on_chip_buffer->partitions},
                                     {"bytes_per_partition", target.on_chip_buffer->bytes_per_partition}};
  }
  json options = {{"dtype", format_name(plan.options.dtype)},
                  {"kv_dtype", plan.options.dtype == WeightFormat::kF32 ? "f32" : "bf16"},
                  {"context_tokens", plan.options.context_tokens},
                  {"batch", plan.options.batch},
                  {"prefill_chunk_tokens", plan.options.prefill_chunk_tokens},
                  {"full_sliding_cache", plan.options.full_sliding_cache}};
  auto memory_json = [](const RankMemory& memory) {
    return json{{"tp", memory.tp},
                {"decoder_layer_bytes", memory.decoder_layer_bytes},
                {"lm_head_bytes", memory.lm_head_bytes},
                {"other_weight_bytes", memory.other_weight_bytes},
                {"weight_bytes", memory.weight_bytes},
                {"kv_cache_bytes", memory.kv_cache_bytes},
                {"activation_bytes", memory.activation_bytes},
                {"total_bytes", memory.total_bytes},
                {"fits", memory.fits},
                {"within_target", memory.within_target},
                {"max_context_tokens", memory.max_context_tokens ? json(*memory.max_context_tokens) : json(nullptr)}};
  };
  json by_tp = json::array();
  for (const RankMemory& memory : plan.by_tp) by_tp.push_back(memory_json(memory));
  json issues = json::array();
  for (const OnChipIssue& issue : plan.on_chip_issues) {
    issues.push_back({{"op", issue.op},
                      {"detail", issue.detail},
                      {"bytes_per_partition", issue.bytes_per_partition},
                      {"limit_bytes_per_partition", issue.limit_bytes_per_partition},
                      {"remedy", issue.remedy}});
  }
  return {{"model", plan.model},
          {"target", target_json},
          {"options", options},
          {"parameter_count", plan.parameter_count},
          {"max_position_embeddings", plan.max_position_embeddings},
          {"host_side", {{"tensors", json::array({"embed_tokens", "embed_tokens_per_layer"})},
                         {"bytes", plan.host_table_bytes},
                         {"why", "gathered per token from the mmap'd checkpoint and sent as activations"}}},
          {"by_tp", by_tp},
          {"smallest_fitting_tp", plan.smallest_fitting_tp ? json(*plan.smallest_fitting_tp) : json(nullptr)},
          {"tp", plan.tp},
          {"per_rank", memory_json(plan.at(plan.tp))},
          {"fits", plan.fits},
          {"instance", plan.instance ? json(*plan.instance) : json(nullptr)},
          {"host_memory_bytes", plan.host_memory_bytes},
          {"host_fits", plan.host_fits ? json(*plan.host_fits) : json(nullptr)},
          {"on_chip_issues", issues},
          {"remedies", plan.remedies}};
}

}  // namespace gemma4rt::planning
