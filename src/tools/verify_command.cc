// gemma4rt verify: the fast path against the fp32 reference path on built-in prompts (one longer than two
// sliding windows) and on --prompts, then coherence probes (--expect "PROMPT=TEXT": the fast path's chat
// answer must contain TEXT). --tp N runs the fast path as N tensor-parallel ranks (threads of this process).
// One line per prompt and probe, then a summary; --json prints one object.
// Exit status 1 when a prompt is beyond the tolerance of the fast path's dtype or a probe fails.
#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "diagnostics/verifier.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace gemma4rt::tools {
namespace {

struct VerifyFlags {
  EngineFlags engine;  // the fast path under test
  std::string model_dir;
  std::string prompts_file;
  std::vector<std::string> expect;
  int max_tokens = 32;
  int probe_tokens = 64;
  bool no_builtin = false;
  bool json = false;
};

std::vector<std::string> read_prompt_lines(const std::string& path) {
  std::ifstream input(path);
  if (!input) fail("{}: --prompts file cannot be read", path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(input, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) fail("{}: --prompts file has no prompts (one per line)", path);
  return lines;
}

std::string divergence_text(const PromptComparison& prompt) {
  if (!prompt.first_divergent_step) return "none";
  return fmt::format("{} (reference top-2 margin {:.3g})", *prompt.first_divergent_step, prompt.reference_margin_at_divergence);
}

void print_prompt(const PromptComparison& prompt) {
  fmt::print(
      "{:<10} {}: {} prompt tokens, {} steps, first divergent step {}, max |logit diff| {:.4g} at step {} (median step {:.4g}), "
      "KL mean {:.3g} max {:.3g}, top-1 {:.1f}%: {}{}\n",
      prompt.sequence_match ? "SEQ_MATCH" : "DIVERGED", prompt.name, prompt.prompt_tokens, prompt.steps, divergence_text(prompt),
      prompt.max_logit_difference, prompt.max_difference_step, prompt.median_logit_difference, prompt.mean_kl, prompt.max_kl,
      100.0 * prompt.top1_agreement, prompt.within_tolerance ? "" : "FAIL: ", prompt.verdict);
  std::fflush(stdout);
}

// JSON string literal, so prompts and answers with quotes or newlines stay on one line.
std::string quoted(const std::string& text) { return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void print_probe(const ProbeResult& probe) {
  std::string note;
  if (!probe.passed) {
    note = probe.reference_output == probe.output
               ? " (the reference path answers the same: both paths share a broken input; run gemma4rt doctor)"
               : fmt::format(" (the reference path answers {})", quoted(probe.reference_output));
  }
  fmt::print("PROBE {}  {} -> {} {} {}{}\n", probe.passed ? "PASS" : "FAIL", quoted(probe.prompt), quoted(probe.output),
             probe.passed ? "contains" : "does not contain", quoted(probe.expected), note);
  std::fflush(stdout);
}

nlohmann::json finite_or_null(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

nlohmann::json to_json(const VerifyReport& report, const std::string& model_dir) {
  nlohmann::json prompts = nlohmann::json::array();
  for (const PromptComparison& prompt : report.prompts) {
    prompts.push_back(
        {{"name", prompt.name},
         {"prompt_tokens", prompt.prompt_tokens},
         {"steps", prompt.steps},
         {"seq_match", prompt.sequence_match},
         {"first_divergent_step", prompt.first_divergent_step ? nlohmann::json(*prompt.first_divergent_step) : nlohmann::json()},
         {"reference_margin_at_divergence",
          prompt.first_divergent_step ? nlohmann::json(prompt.reference_margin_at_divergence) : nlohmann::json()},
         // JSON has no infinity: a NaN/inf logit is reported as null with within_tolerance false.
         {"max_logit_diff", finite_or_null(prompt.max_logit_difference)},
         {"max_logit_diff_step", prompt.max_difference_step},
         {"median_step_logit_diff", finite_or_null(prompt.median_logit_difference)},
         {"flips", prompt.flips},
         {"top1_agreement", prompt.top1_agreement},
         {"mean_kl", finite_or_null(prompt.mean_kl)},
         {"max_kl", finite_or_null(prompt.max_kl)},
         {"step_kl", prompt.step_kl},
         {"largest_flip_margin", prompt.flips > 0 ? nlohmann::json(prompt.largest_flip_margin) : nlohmann::json()},
         {"within_tolerance", prompt.within_tolerance},
         {"verdict", prompt.verdict},
         {"step_max_logit_diff", prompt.step_differences},
         {"reference_top2_margins", prompt.reference_margins},
         {"reference_tokens", prompt.reference_tokens},
         {"fast_tokens_teacher_forced", prompt.fast_tokens}});
  }
  nlohmann::json probes = nlohmann::json::array();
  for (const ProbeResult& probe : report.probes) {
    probes.push_back({{"prompt", probe.prompt},
                      {"expected", probe.expected},
                      {"output", probe.output},
                      {"reference_output", probe.reference_output},
                      {"passed", probe.passed}});
  }
  return {
      {"model", model_dir},
      {"fast_path", {{"backend", report.backend}, {"weights", report.fast_weights}, {"kv", report.fast_kv}, {"tp", report.tensor_parallel}}},
      {"tolerance",
       {{"name", report.tolerance.name},
        // Unbounded limits are null: JSON has no infinity.
        {"max_logit_diff", finite_or_null(report.tolerance.max_logit_difference)},
        {"median_step_logit_diff", report.tolerance.median_logit_difference},
        {"decisive_margin", report.tolerance.require_sequence_match ? nlohmann::json() : nlohmann::json(report.tolerance.decisive_margin)},
        {"mean_kl", finite_or_null(report.tolerance.mean_kl)},
        {"require_seq_match", report.tolerance.require_sequence_match},
        {"description", report.tolerance.description}}},
      {"steps", report.steps},
      {"mean_kl", finite_or_null(report.mean_kl())},
      {"top1_agreement", report.top1_agreement()},
      {"prompts", prompts},
      {"probes", probes},
      {"ok", report.ok()}};
}

int verify(const VerifyFlags& flags) {
  // The reference runs in this process beside the fast path, so the fast path's ranks are threads here.
  if (parallel::launched_size() > 1) {
    fail("verify runs its --tp ranks as threads of one process; start it without mpirun");
  }
  VerifyOptions options;
  options.fast = flags.engine.options();
  options.steps = flags.max_tokens;
  options.probe_tokens = flags.probe_tokens;
  options.builtin_prompts = !flags.no_builtin;
  if (!flags.prompts_file.empty()) options.prompt_texts = read_prompt_lines(flags.prompts_file);
  for (const std::string& argument : flags.expect) options.probes.push_back(parse_coherence_probe(argument));
  if (!options.builtin_prompts && options.prompt_texts.empty() && options.probes.empty()) {
    fail("--no-builtin leaves nothing to verify: give --prompts or --expect");
  }

  auto model = Model::load(flags.model_dir);
  VerifyObserver observer;
  if (!flags.json) {
    observer.on_start = [&](const VerifyReport& report) {
      fmt::print("verify: {}: {} backend ({} weights, {} KV cache{}) against the fp32 reference backend\n", flags.model_dir,
                 report.backend, report.fast_weights, report.fast_kv,
                 report.tensor_parallel > 1 ? fmt::format(", {} tensor-parallel ranks", report.tensor_parallel) : "");
      fmt::print("tolerance {}\n", report.tolerance.description);
      fmt::print(
          "{} greedy steps per prompt (eos ignored); the fast path is fed the reference's tokens and its logits compared at every step\n",
          report.steps);
      std::fflush(stdout);
    };
    observer.on_prompt = print_prompt;
    observer.on_probe = print_probe;
  }
  const VerifyReport report = run_verification(*model, options, observer);

  if (flags.json) {
    fmt::print("{}\n", to_json(report, flags.model_dir).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return report.ok() ? 0 : 1;
  }
  std::vector<std::string> failures;
  for (const PromptComparison& prompt : report.prompts) {
    if (!prompt.within_tolerance) failures.push_back(fmt::format("prompt {}: {}", prompt.name, prompt.verdict));
  }
  for (const ProbeResult& probe : report.probes) {
    if (!probe.passed) failures.push_back(fmt::format("probe {} did not answer {}", quoted(probe.prompt), quoted(probe.expected)));
  }
  const size_t matched =
      std::count_if(report.prompts.begin(), report.prompts.end(), [](const PromptComparison& p) { return p.sequence_match; });
  fmt::print("over all steps: mean KL(reference || fast) {:.4g} nats, top-1 agreement {:.1f}%\n", report.mean_kl(),
             100.0 * report.top1_agreement());
  if (failures.empty()) {
    fmt::print("verify: OK: {} prompts within the {} tolerance ({} SEQ_MATCH), {} of {} probes passed\n", report.prompts.size(),
               report.tolerance.name, matched, report.probes.size(), report.probes.size());
    return 0;
  }
  fmt::print("verify: FAILED: {}\n", fmt::join(failures, "; "));
  return 1;
}

}  // namespace

Action add_verify_command(CLI::App& app) {
  auto flags = std::make_shared<VerifyFlags>();
  CLI::App* command = app.add_subcommand("verify", "Compare the fast path with the fp32 reference path and run coherence probes");
  command->add_option("--model", flags->model_dir, "Checkpoint directory (config.json, *.safetensors, tokenizer.json)")->required();
  flags->engine.add_to(*command, TensorParallelRanks::kThreadsOnly);  // the fast path under test
  command->add_option("--prompts", flags->prompts_file, "Extra prompts, one text per line (raw completions, <bos> added)");
  command->add_option("--expect", flags->expect, "Coherence probe PROMPT=TEXT: the chat answer to PROMPT must contain TEXT (repeatable)");
  command->add_option("--max-tokens,-n", flags->max_tokens, "Greedy steps compared per prompt")->check(at_least_one());
  command->add_option("--probe-tokens", flags->probe_tokens, "Most tokens of a probe's answer")->check(at_least_one());
  command->add_flag("--no-builtin", flags->no_builtin, "Skip the built-in prompts (only --prompts and --expect)");
  command->add_flag("--json", flags->json, "Print one JSON object with every prompt's comparison and every probe");
  return [flags] { return verify(*flags); };
}

}  // namespace gemma4rt::tools
