// `gemma4rt doctor` as a library: checks that a checkpoint directory is complete and self-consistent
// before anyone compares runtimes on it. Every published Gemma-4 port had a bug that an equality check
// could not see because the *input* was broken (no tokenizer.json, chat markers tokenized as text, a
// layer_scalar buffer left at 1.0, PLE tables stripped), so these checks look at the input itself.
//
// Each check catches its own errors: a broken file gives a FAIL whose message is the Error text (which
// names the file, tensor or field), never an exception out of run_checkpoint_checks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/config.h"

namespace gemma4rt {

enum class CheckStatus { kPass, kInfo, kWarn, kFail };

// "PASS", "INFO", "WARN", "FAIL".
const char* check_status_name(CheckStatus status);

struct CheckResult {
  std::string name;  // short and stable, e.g. "tensors", "layer_scalar", "special tokens"
  CheckStatus status = CheckStatus::kPass;
  std::string message;  // one line
};

struct DoctorReport {
  std::vector<CheckResult> checks;

  bool ok() const;  // no FAIL
  int count(CheckStatus status) const;
  const CheckResult* find(const std::string& name) const;
};

struct DoctorOptions {
  bool run_forward = true;  // the one-token forward pass (loads the weights into the fast path)
  bool scan_values = true;  // the NaN/inf scan of every stored value the forward pass reads
  int threads = 0;          // for that forward pass; 0 = one per hardware thread
  std::string backend = "cpu";  // where that forward pass runs
  int device = -1;              // GPU backends: the device index; -1: the backend's own choice
};

// Runs every check on a Hugging Face checkpoint directory. Never throws for a broken checkpoint.
DoctorReport run_checkpoint_checks(const std::filesystem::path& model_dir, const DoctorOptions& options = {});

// Parameter counts, by the definition the model names use ("E2B", "26B-A4B"):
//   total:     every tensor the forward pass reads (parameter_count(config)); the tied LM head once, and
//              the per-layer layer_scalar buffers, which Hugging Face's num_parameters() leaves out.
//   effective: total minus the per-layer embedding table (embed_tokens_per_layer: a lookup, one row per
//              token, that can live off the accelerator) minus the share of the MoE expert stacks that a
//              token does not use ((num_experts - top_k) / num_experts of experts.gate_up_proj and
//              experts.down_proj). The main embedding table and every dense weight stay in.
struct ParameterCounts {
  int64_t total = 0;
  int64_t effective = 0;
  int64_t per_layer_embedding = 0;  // the PLE table left out of `effective`
  int64_t inactive_experts = 0;     // the expert share left out of `effective`
};
ParameterCounts count_parameters(const ModelConfig& config);

// Gemma-4's fixed ids of the chat-format control tokens (architecture doc §8.1).
inline constexpr int32_t kTurnOpenId = 105;      // <|turn>
inline constexpr int32_t kTurnCloseId = 106;     // <turn|>
inline constexpr int32_t kChannelOpenId = 100;   // <|channel>
inline constexpr int32_t kChannelCloseId = 101;  // <channel|>
inline constexpr int32_t kEosId = 1;             // <eos>

}  // namespace gemma4rt
