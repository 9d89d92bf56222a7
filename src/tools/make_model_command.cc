// gemma4rt make-model: writes a random-weight checkpoint with the real config and tensor shapes of a
// Gemma-4 variant (or of any config.json), so the engine can be benchmarked at full size without
// downloading weights. Progress goes to stderr, a one-line summary to stdout.
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_input.h"
#include "core/progress.h"
#include "model/checkpoint_writer.h"
#include "model/model_shapes.h"
#include "tools/commands.h"

namespace gemma4rt::tools {
namespace {

struct MakeModelFlags {
  std::string shape;
  std::string config_file;
  int layers = 0;                 // 0 = the variant's real depth
  std::string dtype = "bf16";
  uint64_t seed = 0;
  double shard_size_gb = 4.0;     // GiB, like the default of 4 GiB
  std::string tokenizer_file;
  std::string out_dir;
  bool force = false;
};

// 4628569379 -> "4,628,569,379"
std::string group_digits(int64_t value) {
  std::string digits = std::to_string(value);
  for (int position = static_cast<int>(digits.size()) - 3; position > 0; position -= 3) digits.insert(static_cast<size_t>(position), ",");
  return digits;
}

int make_model(const MakeModelFlags& flags) {
  nlohmann::json config_json;
  std::string description;
  if (!flags.config_file.empty()) {
    if (flags.layers != 0) fail("--layers applies to --shape; edit num_hidden_layers in the --config file instead");
    config_json = parse_json_file(flags.config_file);
    description = flags.config_file;
  } else {
    config_json = reference_config(flags.shape, flags.layers > 0 ? std::optional<int>(flags.layers) : std::nullopt);
    description = flags.layers > 0 ? fmt::format("{} ({} layers)", flags.shape, flags.layers) : flags.shape;
  }

  CheckpointWriterOptions options;
  if (flags.dtype == "bf16") {
    options.dtype = DType::kBF16;
  } else if (flags.dtype == "f32") {
    options.dtype = DType::kF32;
  } else {
    fail("--dtype must be bf16 or f32, got \"{}\"", flags.dtype);
  }
  options.seed = flags.seed;
  if (!(flags.shard_size_gb > 0) || !std::isfinite(flags.shard_size_gb)) fail("--shard-size-gb must be positive, got {}", flags.shard_size_gb);
  options.max_shard_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(flags.shard_size_gb * static_cast<double>(1ull << 30)));

  // Everything that can be checked is checked before gigabytes are written.
  const ModelConfig config = parse_model_config(config_json, description);
  const CheckpointPlan plan = plan_checkpoint(config, options);
  const std::filesystem::path out_dir = flags.out_dir;
  std::error_code error;
  if (std::filesystem::exists(out_dir, error)) {
    if (!std::filesystem::is_directory(out_dir, error)) fail("{}: exists and is not a directory", out_dir.string());
    if (!std::filesystem::is_empty(out_dir, error) && !flags.force) {
      fail("{}: directory is not empty; choose another --out or add --force to overwrite its checkpoint files", out_dir.string());
    }
  }
  uint64_t tokenizer_bytes = 0;
  if (!flags.tokenizer_file.empty()) {
    if (!std::filesystem::is_regular_file(flags.tokenizer_file, error)) fail("{}: tokenizer file not found", flags.tokenizer_file);
    tokenizer_bytes = std::filesystem::file_size(flags.tokenizer_file);
  }
  check_free_space(out_dir, checkpoint_disk_bytes(plan) + tokenizer_bytes);

  ProgressBar progress("make-model", plan.tensor_bytes);
  options.on_progress = [&progress](uint64_t done, uint64_t) { progress.update(done); };
  CheckpointSummary summary = write_random_checkpoint(config_json, out_dir, options);
  progress.finish();

  if (!flags.tokenizer_file.empty()) {
    const auto target = out_dir / "tokenizer.json";
    // A --tokenizer already at its place in --out stays as it is (copying a file onto itself fails).
    if (!std::filesystem::equivalent(flags.tokenizer_file, target, error)) {
      std::filesystem::copy_file(flags.tokenizer_file, target, std::filesystem::copy_options::overwrite_existing, error);
      if (error) fail("{}: cannot copy the tokenizer: {}", target.string(), error.message());
    }
    summary.files.push_back(target);
    summary.bytes_written += tokenizer_bytes;
  }

  const double rate = summary.seconds > 0 ? static_cast<double>(summary.bytes_written) / summary.seconds / 1e6 : 0.0;
  fmt::print("wrote {} to {}: {} parameters ({:.2f} B), {} in {} files ({} safetensors shard{}), {:.1f} s, {:.0f} MB/s\n",
             description, out_dir.string(), group_digits(summary.parameters), static_cast<double>(summary.parameters) / 1e9,
             format_bytes(summary.bytes_written), summary.files.size(), plan.shards.size(), plan.shards.size() == 1 ? "" : "s",
             summary.seconds, rate);
  return 0;
}

}  // namespace

Action add_make_model_command(CLI::App& app) {
  auto flags = std::make_shared<MakeModelFlags>();
  std::string shapes;
  for (const std::string& shape : known_model_shapes()) shapes += (shapes.empty() ? "" : "|") + shape;
  CLI::App* command = app.add_subcommand(
      "make-model", "Write a random-weight checkpoint with the real config and tensor shapes of a Gemma-4 variant");
  auto* shape = command->add_option("--shape", flags->shape, "Variant to copy: " + shapes);
  auto* config = command->add_option("--config", flags->config_file, "Use this config.json instead of a --shape");
  shape->excludes(config);
  command->add_option("--layers", flags->layers, "Keep only the first N layers (N >= 2), real per-layer shapes")
      ->check(CLI::Range(2, 1000));
  command->add_option("--dtype", flags->dtype, "Weight dtype: bf16 (default) or f32");
  command->add_option("--seed", flags->seed, "Random seed (same seed, same bytes; default 0)");
  command->add_option("--shard-size-gb", flags->shard_size_gb, "Largest safetensors shard in GiB (default 4)");
  command->add_option("--tokenizer", flags->tokenizer_file, "Copy this tokenizer.json into the checkpoint");
  command->add_option("--out", flags->out_dir, "Checkpoint directory to create")->required();
  command->add_flag("--force", flags->force, "Write into a non-empty directory, replacing its checkpoint files");
  command->callback([command] {
    if (command->count("--shape") + command->count("--config") != 1) {
      throw CLI::ValidationError("make-model", "give --shape or --config");
    }
  });
  return [flags] { return make_model(*flags); };
}

}  // namespace gemma4rt::tools
