// gemma4rt plan: what a model needs on a target before anything is compiled or rented. With --target, the
// bytes per tensor-parallel rank at every degree, whether it fits, the smallest degree that does, the host
// memory and the Neuron on-chip-buffer problems with their remedies; with --show-shards, which rank holds
// which heads, rows, experts and vocabulary rows (parallel/shard_plan.h). --json prints one object.
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_input.h"
#include "model/model_shapes.h"
#include "planning/deployment_plan.h"
#include "parallel/shard_plan.h"
#include "tools/commands.h"

namespace gemma4rt::tools {
namespace {

using planning::DeploymentPlan;
using parallel::LayerShard;
using parallel::ShardPlan;

struct PlanFlags {
  std::string model_dir;
  std::string shape;
  std::string target;
  std::optional<int> tp;
  std::string dtype;  // "": the checkpoint's own
  std::string context = "4096";  // a number of tokens, or "max" for the model's max_position_embeddings
  int batch = 1;
  bool full_sliding_cache = false;
  bool show_shards = false;
  bool json = false;
};

// The weight format a checkpoint loads in by default: what `gemma4rt quantize` recorded in its config.json
// (quantization_config.quant_method gemma4rt_q8 or gemma4rt_q4), else bf16.
std::string checkpoint_dtype(const std::string& model_dir) {
  const nlohmann::json config = parse_json_file(std::filesystem::path(model_dir) / "config.json");
  const nlohmann::json* method = nullptr;
  if (config.contains("quantization_config") && config["quantization_config"].is_object()) {
    const nlohmann::json& quantization = config["quantization_config"];
    if (quantization.contains("quant_method")) method = &quantization["quant_method"];
  }
  if (method != nullptr && *method == "gemma4rt_q8") return "q8";
  if (method != nullptr && *method == "gemma4rt_q4") return "q4";
  return "bf16";
}

std::string gb(int64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }
// Instance memory the way AWS quotes it.
std::string capacity(int64_t bytes) { return fmt::format("{:g} GiB", static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30)); }

void print_shards(const ShardPlan& plan, const std::string& model) {
  const Range first = plan.vocab_rows(0);
  const Range last = plan.vocab_rows(plan.tp() - 1);
  fmt::print("shard plan: {} at TP={}; LM head split by vocabulary: {} rows on rank 0 ... {} on rank {} (argmax / logits gathered)\n",
             model, plan.tp(), first.count, last.count, plan.tp() - 1);
  fmt::print("embeddings and PLE: gathered on the host; q/gate/up column-parallel, o/down row-parallel + all-reduce\n\n");
  fmt::print("{:>5}  {:<7}  {:>8}  {:>12}  {:<30}  {:>11}  {:>15}  {:>12}\n", "layer", "type", "head_dim", "q heads/rank",
             "KV heads/rank", "groups/rank", "MLP rows/rank", "experts/rank");
  for (const LayerShard& shard : plan.layers()) {
    std::string kv = fmt::format("{} of {}", shard.kv_heads_per_rank, shard.kv_heads);
    if (shard.kv_replicated) kv += fmt::format(", replicated x{}", shard.kv_replicas);
    if (!shard.owns_kv) kv += fmt::format(", from layer {}", shard.kv_source_layer);
    const std::string experts = shard.experts > 0 ? fmt::format("{} of {}", shard.experts_per_rank, shard.experts) : "-";
    fmt::print("{:>5}  {:<7}  {:>8}  {:>12}  {:<30}  {:>11}  {:>15}  {:>12}\n", shard.layer, shard.sliding ? "sliding" : "full",
               shard.head_dim, fmt::format("{} of {}", shard.q_heads_per_rank, shard.q_heads), kv, shard.groups_per_rank,
               fmt::format("{} of {}", shard.mlp_rows_per_rank, shard.mlp_rows), experts);
  }
}

void print_deployment(const DeploymentPlan& plan) {
  const planning::Target& target = plan.target;
  fmt::print("gemma4rt plan: {} ({:.2f} B parameters, every one counted) on {}\n", plan.model,
             static_cast<double>(plan.parameter_count) / 1e9, target.name);
  fmt::print("  target: {}; usable per rank {} ({:.0f}%){}\n", target.description, gb(target.usable_per_rank_bytes()),
             target.usable_fraction * 100.0, target.host_memory_bytes ? fmt::format(", host {}", capacity(*target.host_memory_bytes)) : "");
  fmt::print("  weights {}, KV cache {}{}, context {} tokens, batch {}, prefill chunk {} tokens\n",
             format_name(plan.options.dtype), plan.options.dtype == WeightFormat::kF32 ? "f32" : "bf16",
             plan.options.full_sliding_cache ? " (full on sliding layers)" : "", plan.options.context_tokens, plan.options.batch,
             plan.options.prefill_chunk_tokens);
  if (target.kind != planning::TargetKind::kCpu) {
    fmt::print("  host-side: token embedding and PLE tables, {}, gathered per token from the mmap\n", gb(plan.host_table_bytes));
  }
  fmt::print("\n{:>4}  {:>15}  {:>10}  {:>13}  {:>10}  {:>12}  {:>11}  {:>12}  {}\n", "TP", "decoder layers", "LM head",
             "weights/rank", "KV cache", "activations", "total/rank", "max context", "fits");
  for (const planning::RankMemory& memory : plan.by_tp) {
    std::string verdict = memory.fits ? "yes" : "no";
    if (!memory.within_target) verdict += fmt::format(" (more than the target's {})", target.ranks);
    const std::string longest = memory.max_context_tokens ? fmt::format("{}", *memory.max_context_tokens) : "-";
    fmt::print("{:>4}  {:>15}  {:>10}  {:>13}  {:>10}  {:>12}  {:>11}  {:>12}  {}\n", memory.tp, gb(memory.decoder_layer_bytes),
               gb(memory.lm_head_bytes), gb(memory.weight_bytes), gb(memory.kv_cache_bytes), gb(memory.activation_bytes),
               gb(memory.total_bytes), longest, verdict);
  }
  fmt::print("max context: the longest context per sequence that still fits a rank at that TP (model limit {})\n\n",
             plan.max_position_embeddings);
  if (plan.smallest_fitting_tp) {
    fmt::print("smallest TP that fits: {}{}\n", *plan.smallest_fitting_tp,
               plan.instance ? fmt::format(" -> {} NeuronCores: {}", *plan.smallest_fitting_tp, *plan.instance) : "");
  } else {
    fmt::print("smallest TP that fits: none (no degree this model allows fits {} per rank)\n", gb(target.usable_per_rank_bytes()));
  }
  fmt::print("host memory needed at TP={}: {}{}\n", plan.tp, gb(plan.host_memory_bytes),
             plan.host_fits ? (*plan.host_fits ? " (fits)" : " (does not fit)") : "");
  fmt::print("verdict: {} {} at TP={}\n", plan.fits ? "fits" : "does not fit", target.name, plan.tp);
  for (const std::string& remedy : plan.remedies) fmt::print("  remedy: {}\n", remedy);
  if (target.on_chip_buffer) {
    fmt::print("on-chip buffer ({} partitions x {} B) at TP={}: {}\n", target.on_chip_buffer->partitions,
               target.on_chip_buffer->bytes_per_partition, plan.tp,
               plan.on_chip_issues.empty() ? "every op checked fits" : "ops that do not fit, and what works instead");
    for (const planning::OnChipIssue& issue : plan.on_chip_issues) {
      fmt::print("  {}: {} > {} B\n    remedy: {}\n", issue.op, issue.detail, issue.limit_bytes_per_partition, issue.remedy);
    }
  }
}

int context_tokens(const std::string& value, const ModelConfig& config) {
  if (value == "max") {
    if (config.max_position_embeddings <= 0) fail("--ctx max: the config does not state max_position_embeddings; give --ctx N");
    return config.max_position_embeddings;
  }
  size_t used = 0;
  long long tokens = 0;
  try {
    tokens = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || tokens < 1 || tokens > std::numeric_limits<int>::max()) {
    fail("--ctx \"{}\": expected a positive number of tokens or \"max\"", value);
  }
  return static_cast<int>(tokens);
}

int plan(const PlanFlags& flags) {
  std::string model_name;
  ModelConfig config;
  if (!flags.shape.empty()) {
    model_name = flags.shape;
    config = parse_model_config(reference_config(flags.shape), "shape " + flags.shape);
  } else {
    model_name = flags.model_dir;
    config = load_model_config(flags.model_dir);
  }

  nlohmann::json result;
  std::optional<DeploymentPlan> deployment;
  if (!flags.target.empty()) {
    planning::PlanOptions options;
    options.dtype = planning::parse_weight_dtype(!flags.dtype.empty() ? flags.dtype : flags.model_dir.empty() ? "bf16" : checkpoint_dtype(flags.model_dir));
    options.context_tokens = context_tokens(flags.context, config);
    options.batch = flags.batch;
    options.full_sliding_cache = flags.full_sliding_cache;
    options.tp = flags.tp;
    deployment = planning::make_deployment_plan(config, model_name, planning::parse_target(flags.target), options);
    result = planning::to_json(*deployment);
  }
  std::optional<ShardPlan> shards;
  if (flags.show_shards) {
    shards = parallel::make_shard_plan(config, flags.tp.value_or(deployment ? deployment->tp : 1));
    if (flags.json) result["shards"] = planning::to_json(*shards);
  }

  if (flags.json) {
    if (deployment == std::nullopt) result["model"] = model_name;
    fmt::print("{}\n", result.dump(2));
    return 0;
  }
  if (deployment) print_deployment(*deployment);
  if (shards) {
    if (deployment) fmt::print("\n");
    print_shards(*shards, model_name);
  }
  return 0;
}

}  // namespace

Action add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  std::string shapes;
  for (const std::string& shape : known_model_shapes()) shapes += (shapes.empty() ? "" : "|") + shape;
  std::string targets;
  for (const planning::Target& target : planning::known_targets()) targets += target.name + ", ";
  targets += "cpu:<GiB>";
  CLI::App* command = app.add_subcommand("plan", "Bytes per tensor-parallel rank on a target, what fits, and the shard plan");
  auto* model = command->add_option("--model", flags->model_dir, "Checkpoint directory (its config.json is all that is read)");
  auto* shape = command->add_option("--shape", flags->shape, "A released variant instead of a checkpoint: " + shapes);
  model->excludes(shape);
  command->add_option("--target", flags->target, "Where it should run: " + targets);
  command->add_option("--tp", flags->tp, "Tensor-parallel degree to judge or to show shards for (default: the smallest that fits)")
      ->check(at_least_one());
  command->add_option("--dtype", flags->dtype, "Weight dtype: bf16, f32 (KV cache f32 too), q8 or q4 (default: the checkpoint's own, bf16 for real checkpoints and --shape)")
      ->check(CLI::IsMember({"f32", "fp32", "bf16", "q8", "q4"}));
  command->add_option("--ctx", flags->context,
                      "Context tokens per sequence (default 4096, as run and serve), or max for the model's longest");
  command->add_option("--batch", flags->batch, "Sequences served together (default 1)")->check(at_least_one());
  command->add_flag("--full-sliding-cache", flags->full_sliding_cache,
                    "Sliding-window layers cache the whole context (serve --full-sliding-cache), not a ring of the window");
  command->add_flag("--show-shards", flags->show_shards, "Print which rank holds which heads, rows and experts, layer by layer");
  command->add_flag("--json", flags->json, "Print one JSON object");
  command->callback([command] {
    if (command->count("--model") + command->count("--shape") != 1) throw CLI::ValidationError("plan", "give --model or --shape");
    if (command->count("--target") == 0 && command->count("--show-shards") == 0) {
      throw CLI::ValidationError("plan", "give --target (what fits where) or --show-shards (the shard plan), or both");
    }
  });
  return [flags] { return plan(*flags); };
}

}  // namespace gemma4rt::tools
