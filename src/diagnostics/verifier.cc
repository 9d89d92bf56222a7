#include "diagnostics/verifier.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "tokenizer/chat_format.h"

namespace gemma4rt {
namespace {

// Every built-in long prompt exceeds two sliding windows by this many tokens.
constexpr int kLongPromptMargin = 16;

double top2_margin(std::span<const float> logits) {
  float best = -std::numeric_limits<float>::infinity(), second = best;
  for (float value : logits) {
    if (value > best) {
      second = best;
      best = value;
    } else if (value > second) {
      second = value;
    }
  }
  return static_cast<double>(best) - second;
}

// Largest |a - b|; NaN or infinity anywhere counts as an infinite difference.
double max_abs_difference(std::span<const float> a, std::span<const float> b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double difference = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!std::isfinite(difference)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, difference);
  }
  return worst;
}

// Deterministic ids in [3, vocab): fixed so that two runs of verify compare the same inputs.
std::vector<int32_t> id_sequence(const ModelConfig& config, int length, uint32_t seed) {
  std::vector<int32_t> ids = {config.bos_token_id};
  uint32_t state = seed;
  const uint32_t span = static_cast<uint32_t>(std::max(1, config.vocab_size - 3));
  while (static_cast<int>(ids.size()) < length) {
    state = state * 1664525u + 1013904223u;
    ids.push_back(static_cast<int32_t>(3 + (state >> 8) % span));
  }
  return ids;
}

}  // namespace

double kl_divergence(std::span<const float> reference, std::span<const float> fast) {
  auto log_normalizer = [](std::span<const float> logits) {
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (float value : logits) sum += std::exp(static_cast<double>(value) - top);
    return top + std::log(sum);
  };
  const double reference_log_z = log_normalizer(reference), fast_log_z = log_normalizer(fast);
  if (!std::isfinite(fast_log_z)) return std::numeric_limits<double>::infinity();
  double kl = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double log_p = reference[i] - reference_log_z;
    const double log_q = fast[i] - fast_log_z;
    if (!std::isfinite(log_q)) return std::numeric_limits<double>::infinity();
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(0.0, kl);  // rounding can leave a tiny negative sum for equal distributions
}

VerifyTolerance verify_tolerance(WeightFormat weights, KvFormat kv) {
  constexpr double kUnbounded = std::numeric_limits<double>::infinity();
  if (weights == WeightFormat::kQ4) {
    return {"q4",
            kUnbounded,
            6.0,
            8.0,
            1.0,
            false,
            "q4: median over steps of the max |logit diff| <= 6; no token flip where the reference's top-2 margin exceeds 8; "
            "mean KL <= 1 nat (isolated spikes are reported, not failed)"};
  }
  if (weights == WeightFormat::kQ8) {
    return {"q8",
            kUnbounded,
            2.0,
            4.0,
            0.5,
            false,
            "q8: median over steps of the max |logit diff| <= 2; no token flip where the reference's top-2 margin exceeds 4; "
            "mean KL <= 0.5 nat (isolated spikes are reported, not failed)"};
  }
  if (weights == WeightFormat::kBF16 || kv == KvFormat::kBF16) {
    return {"bf16",
            kUnbounded,
            1.0,
            2.0,
            0.1,
            false,
            "bf16: median over steps of the max |logit diff| <= 1; no token flip where the reference's top-2 margin exceeds 2; "
            "mean KL <= 0.1 nat (isolated spikes are reported, not failed)"};
  }
  return {"f32", 1e-3, 1e-3, 0.0, kUnbounded, true, "f32: max |logit diff| <= 0.001 at every step and every token equal"};
}

PromptComparison compare_paths(Transformer& reference, Transformer& fast, const VerifyPrompt& prompt, int steps,
                               const VerifyTolerance& tolerance) {
  if (prompt.tokens.empty()) fail("prompt {}: no tokens", prompt.name);
  if (steps < 1) fail("at least one step must be compared, got {}", steps);
  const int needed = static_cast<int>(prompt.tokens.size()) + steps;
  if (needed > reference.context_tokens() || needed > fast.context_tokens()) {
    fail("prompt {}: {} tokens plus {} steps do not fit the engines' context of {}", prompt.name, prompt.tokens.size(), steps,
         std::min(reference.context_tokens(), fast.context_tokens()));
  }
  PromptComparison comparison;
  comparison.name = prompt.name;
  comparison.prompt_tokens = static_cast<int>(prompt.tokens.size());
  comparison.steps = steps;

  std::span<const float> reference_logits = reference.forward(prompt.tokens, 0);
  std::span<const float> fast_logits = fast.forward(prompt.tokens, 0);
  int position = comparison.prompt_tokens;
  for (int step = 0; step < steps; ++step) {
    const double difference = max_abs_difference(reference_logits, fast_logits);
    comparison.step_differences.push_back(difference);
    comparison.reference_margins.push_back(top2_margin(reference_logits));
    comparison.step_kl.push_back(kl_divergence(reference_logits, fast_logits));
    if (step == 0 || difference > comparison.max_logit_difference) {
      comparison.max_logit_difference = difference;
      comparison.max_difference_step = step;
    }
    const int32_t reference_token = argmax(reference_logits);
    const int32_t fast_token = argmax(fast_logits);
    comparison.reference_tokens.push_back(reference_token);
    comparison.fast_tokens.push_back(fast_token);
    if (fast_token != reference_token) {
      const double margin = comparison.reference_margins.back();
      if (!comparison.first_divergent_step) {
        comparison.first_divergent_step = step;
        comparison.reference_margin_at_divergence = margin;
      }
      if (comparison.flips == 0 || margin > comparison.largest_flip_margin) {
        comparison.largest_flip_margin = margin;
        comparison.largest_flip_step = step;
      }
      ++comparison.flips;
    }
    if (step + 1 == steps) break;
    // Both paths continue on the reference's token (teacher forcing).
    reference_logits = reference.forward(std::span<const int32_t>(&reference_token, 1), position);
    fast_logits = fast.forward(std::span<const int32_t>(&reference_token, 1), position);
    ++position;
  }
  comparison.sequence_match = !comparison.first_divergent_step.has_value();
  for (double kl : comparison.step_kl) {
    comparison.mean_kl += kl / steps;
    comparison.max_kl = std::max(comparison.max_kl, kl);
  }
  comparison.top1_agreement = static_cast<double>(steps - comparison.flips) / steps;
  std::vector<double> sorted = comparison.step_differences;
  std::sort(sorted.begin(), sorted.end());
  comparison.median_logit_difference =
      sorted.size() % 2 == 1 ? sorted[sorted.size() / 2] : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;

  comparison.within_tolerance = false;
  if (!std::isfinite(comparison.max_logit_difference)) {
    comparison.verdict = fmt::format("the fast path's logits are not finite at step {}", comparison.max_difference_step);
  } else if (comparison.max_logit_difference > tolerance.max_logit_difference) {
    comparison.verdict = fmt::format("max |logit diff| {:.4g} exceeds the {} bound {:g}", comparison.max_logit_difference, tolerance.name,
                                     tolerance.max_logit_difference);
  } else if (comparison.median_logit_difference > tolerance.median_logit_difference) {
    comparison.verdict = fmt::format("the median step's max |logit diff| {:.4g} exceeds the {} bound {:g}: the paths differ at every step",
                                     comparison.median_logit_difference, tolerance.name, tolerance.median_logit_difference);
  } else if (comparison.mean_kl > tolerance.mean_kl) {
    comparison.verdict = fmt::format("the mean KL(reference || fast) {:.4g} exceeds the {} bound {:g}", comparison.mean_kl, tolerance.name,
                                     tolerance.mean_kl);
  } else if (tolerance.require_sequence_match && !comparison.sequence_match) {
    comparison.verdict =
        fmt::format("tokens differ from step {}; {} requires every token equal", *comparison.first_divergent_step, tolerance.name);
  } else if (comparison.flips > 0 && comparison.largest_flip_margin > tolerance.decisive_margin) {
    comparison.verdict = fmt::format(
        "at step {} the fast path picks id {} where the reference prefers id {} by {:.3g}, more than rounding "
        "can flip ({} bound {:g})",
        comparison.largest_flip_step, comparison.fast_tokens[comparison.largest_flip_step],
        comparison.reference_tokens[comparison.largest_flip_step], comparison.largest_flip_margin, tolerance.name,
        tolerance.decisive_margin);
  } else {
    comparison.within_tolerance = true;
    comparison.verdict = comparison.sequence_match
                             ? "within tolerance"
                             : fmt::format("within tolerance ({} near-tie flip{}, reference margin at most {:.3g})", comparison.flips,
                                           comparison.flips == 1 ? "" : "s", comparison.largest_flip_margin);
  }
  return comparison;
}

std::vector<int32_t> encode_with_bos(const Tokenizer& tokenizer, const ModelConfig& config, const std::string& text) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  if (ids.empty() || ids.front() != config.bos_token_id) ids.insert(ids.begin(), config.bos_token_id);
  return ids;
}

std::vector<int32_t> encode_chat_turn(const Tokenizer& tokenizer, const ModelConfig& config, const std::filesystem::path& model_dir,
                                      const std::string& user_text) {
  ChatOptions options;
  // Without a template in the checkpoint, PLE models are the E-series (as `run --chat` decides).
  options.style = detect_generation_prompt_style(
      model_dir, config.has_per_layer_inputs() ? GenerationPromptStyle::kESeries : GenerationPromptStyle::kLargeModel);
  const nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", user_text}}});
  return encode_with_bos(tokenizer, config, render_chat(messages, nullptr, options));
}

std::vector<VerifyPrompt> builtin_verify_prompts(const ModelConfig& config, const Tokenizer* tokenizer,
                                                 const std::filesystem::path& model_dir) {
  const int long_length = 2 * config.sliding_window + kLongPromptMargin;
  std::vector<VerifyPrompt> prompts;
  if (tokenizer == nullptr) {
    prompts.push_back({"ids-5", "", id_sequence(config, 5, 1)});
    prompts.push_back({"ids-20", "", id_sequence(config, 20, 2)});
    prompts.push_back({fmt::format("ids-long-{}", long_length + 1), "", id_sequence(config, long_length + 1, 3)});
    return prompts;
  }
  const std::string completion = "The capital of France is";
  prompts.push_back({"completion", completion, encode_with_bos(*tokenizer, config, completion)});
  const std::string question = "What is the capital of Japan?";
  prompts.push_back({"chat", question, encode_chat_turn(*tokenizer, config, model_dir, question)});
  const std::string sentence = "hello world";
  prompts.push_back({"hello", sentence, encode_with_bos(*tokenizer, config, sentence)});

  const std::string paragraph =
      "The capital of France is Paris. The capital of Japan is Tokyo. The capital of Peru is Lima. "
      "Which country has Canberra as its capital? Australia does. ";
  // Repeats enough for the length at the paragraph's own token count, then tops up in case the joins
  // merge into fewer tokens; a tokenizer that cannot get there is an error rather than an endless loop.
  const size_t paragraph_tokens = tokenizer->encode(paragraph).size();
  if (paragraph_tokens == 0) fail("the tokenizer encodes the built-in long prompt's text to no tokens");
  std::string text;
  for (size_t repeat = 0; repeat < static_cast<size_t>(long_length) / paragraph_tokens + 1; ++repeat) text += paragraph;
  std::vector<int32_t> ids = encode_with_bos(*tokenizer, config, text);
  for (int extra = 0; static_cast<int>(ids.size()) <= long_length; ++extra) {
    if (extra == 8) fail("the built-in long prompt does not reach {} tokens", long_length + 1);
    text += paragraph;
    ids = encode_with_bos(*tokenizer, config, text);
  }
  prompts.push_back({fmt::format("long-{}", ids.size()), text, ids});
  return prompts;
}

CoherenceProbe parse_coherence_probe(const std::string& argument) {
  const size_t split = argument.rfind('=');
  if (split == std::string::npos || split == 0 || split + 1 == argument.size()) {
    fail("--expect \"{}\": expected PROMPT=TEXT with both parts non-empty", argument);
  }
  return {argument.substr(0, split), argument.substr(split + 1)};
}

std::string greedy_chat_answer(Transformer& transformer, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt, int max_tokens) {
  GenerationOptions options;
  options.max_tokens = max_tokens;
  const auto& eos = transformer.config().eos_token_ids;
  options.stop_token_ids.assign(eos.begin(), eos.end());
  GenerationResult result = generate(transformer, prompt, options);
  std::vector<int32_t> tokens = result.tokens;
  if (result.finish_reason == "stop" && !tokens.empty()) tokens.pop_back();
  return tokenizer.decode(tokens, /*skip_special_tokens=*/true);
}

bool VerifyReport::ok() const {
  const bool prompts_ok = std::all_of(prompts.begin(), prompts.end(), [](const PromptComparison& p) { return p.within_tolerance; });
  const bool probes_ok = std::all_of(probes.begin(), probes.end(), [](const ProbeResult& p) { return p.passed; });
  return prompts_ok && probes_ok;
}

double VerifyReport::mean_kl() const {
  double sum = 0.0;
  int steps = 0;
  for (const PromptComparison& prompt : prompts) {
    for (double kl : prompt.step_kl) sum += kl;
    steps += static_cast<int>(prompt.step_kl.size());
  }
  return steps > 0 ? sum / steps : 0.0;
}

double VerifyReport::top1_agreement() const {
  int agreeing = 0, steps = 0;
  for (const PromptComparison& prompt : prompts) {
    agreeing += prompt.steps - prompt.flips;
    steps += prompt.steps;
  }
  return steps > 0 ? static_cast<double>(agreeing) / steps : 1.0;
}

VerifyReport run_verification(const Model& model, const VerifyOptions& options, const VerifyObserver& observer) {
  const ModelConfig& config = model.config();
  if (options.steps < 1) fail("--max-tokens must be at least 1, got {}", options.steps);
  if (options.probe_tokens < 1) fail("--probe-tokens must be at least 1, got {}", options.probe_tokens);

  std::optional<Tokenizer> tokenizer;
  const std::filesystem::path tokenizer_path = model.directory() / "tokenizer.json";
  if (std::filesystem::exists(tokenizer_path)) {
    tokenizer.emplace(Tokenizer::load(tokenizer_path));
  } else if (!options.prompt_texts.empty() || !options.probes.empty()) {
    fail("{}: file not found (needed to tokenize --prompts and --expect)", tokenizer_path.string());
  }

  std::vector<VerifyPrompt> prompts;
  if (options.builtin_prompts) prompts = builtin_verify_prompts(config, tokenizer ? &*tokenizer : nullptr, model.directory());
  for (size_t index = 0; index < options.prompt_texts.size(); ++index) {
    const std::string& text = options.prompt_texts[index];
    prompts.push_back({fmt::format("prompts:{}", index + 1), text, encode_with_bos(*tokenizer, config, text)});
  }
  std::vector<std::vector<int32_t>> probe_prompts;
  for (const CoherenceProbe& probe : options.probes) {
    probe_prompts.push_back(encode_chat_turn(*tokenizer, config, model.directory(), probe.prompt));
  }

  // One context for everything: the longest prompt plus its steps or answer.
  int context = 1;
  for (const VerifyPrompt& prompt : prompts) context = std::max(context, static_cast<int>(prompt.tokens.size()) + options.steps);
  for (const auto& ids : probe_prompts) context = std::max(context, static_cast<int>(ids.size()) + options.probe_tokens);

  EngineOptions reference_options;
  reference_options.backend = "reference";
  reference_options.context_tokens = context;
  reference_options.threads = options.fast.threads;
  EngineOptions fast_options = options.fast;
  fast_options.context_tokens = context;
  Transformer reference(model, reference_options);
  Transformer fast(model, fast_options);

  VerifyReport report;
  report.backend = fast.backend().name();
  report.fast_weights = format_name(fast.weight_format());
  report.fast_kv = format_name(fast.kv_cache().format());
  report.tensor_parallel = fast.tensor_parallel_size();
  report.tolerance = verify_tolerance(fast.weight_format(), fast.kv_cache().format());
  report.steps = options.steps;
  if (observer.on_start) observer.on_start(report);

  for (const VerifyPrompt& prompt : prompts) {
    report.prompts.push_back(compare_paths(reference, fast, prompt, options.steps, report.tolerance));
    if (observer.on_prompt) observer.on_prompt(report.prompts.back());
  }
  for (size_t index = 0; index < options.probes.size(); ++index) {
    ProbeResult probe;
    probe.prompt = options.probes[index].prompt;
    probe.expected = options.probes[index].expected;
    probe.output = greedy_chat_answer(fast, *tokenizer, probe_prompts[index], options.probe_tokens);
    probe.reference_output = greedy_chat_answer(reference, *tokenizer, probe_prompts[index], options.probe_tokens);
    probe.passed = probe.output.find(probe.expected) != std::string::npos;
    report.probes.push_back(probe);
    if (observer.on_probe) observer.on_probe(report.probes.back());
  }
  return report;
}

}  // namespace gemma4rt
