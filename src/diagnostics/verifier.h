// `gemma4rt verify` as a library: the fast path against the scalar fp32 reference path on the same
// checkpoint, plus coherence probes. Agreement alone proves little: both paths read the same tokenizer,
// config and tensors, so a broken input makes them agree on a wrong answer. The probes ("this question's
// answer must contain this text") catch what agreement cannot.
//
// Comparison of one prompt: the reference decodes `steps` tokens greedily (end-of-sequence ignored); the
// fast path is fed the reference's tokens (teacher forcing) and its logits are compared at every step.
// Because both paths see identical inputs up to the first step where the fast path's argmax differs,
// that step is exactly where a free-running fast decode would first diverge, and the logit difference is
// measured on every step rather than only on the shared prefix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/transformer.h"
#include "tokenizer/tokenizer.h"

namespace gemma4rt {

// What the fast path must achieve against the reference, chosen by its least precise format (weights or
// KV cache). Logits are compared after the final softcap, so they lie in (-30, 30) on Gemma-4.
//   f32 weights and f32 KV: max |logit diff| <= 1e-3 and every token equal. Only summation order differs
//     from the reference (the fixtures show <= 1.4e-4); this is the bar the golden tests hold the
//     reference path to against Hugging Face.
//   bf16 (weights or KV): the median over steps of the per-step max |logit diff| <= 1.0, and no token
//     flip where the reference's top-2 margin exceeds 2.0.
//   q8 weights: median <= 2.0, no flip above a margin of 4.0 (block-wise int8 weights on top of bf16).
//   q4 weights: median <= 6.0, no flip above a margin of 8.0. A q4 step is 1/8 of its block's largest
//     value against q8's 1/127, so its rounding noise is ~16x q8's; the bounds grow less than that
//     because most of a logit's difference comes from the activations and the KV cache, which q4
//     shares with q8.
// Each prompt's mean KL(reference || fast) over its steps is bounded too: bf16 0.1, q8 0.5, q4 1.0 nats.
// Measured on the trained fixtures (docs/benchmarks.md): bf16 <= 1.9e-4, q8 <= 2.1e-3, q4 <= 0.21; on the
// random goldens bf16 <= 0.031 and q8 <= 0.11, while q4 is far outside (KL 2-4, as every step of those
// near-tie random models flips), which is why the random checkpoints are no measure of q4.
// Rounding noise moves every logit a little and can flip a near-tie; an isolated step can also jump (an
// MoE router choosing a different expert of almost equal score), so the maximum is reported but only the
// typical (median) step is bounded. A real forward-pass bug moves logits by whole units on most steps
// or flips decisive choices. On the trained coherence fixtures healthy kernels stay at least 3x inside
// these bounds (bf16: median <= 0.28, flips only below a margin of 0.19; q8: median <= 0.39). Random-weight
// checkpoints (tests/data/golden) have near-zero margins and chaotic MoE routing, so bf16/q8 verdicts on
// them mean little: bf16 is not a reference there. The coherence probes catch what agreement cannot.
struct VerifyTolerance {
  std::string name;                      // "f32", "bf16", "q8", "q4"
  double max_logit_difference = 0.0;     // bound on the largest difference (infinity: unbounded)
  double median_logit_difference = 0.0;  // bound on the median over steps of each step's largest difference
  double decisive_margin = 0.0;          // a flip where the reference's top-2 margin exceeds this fails
  double mean_kl = 0.0;                  // bound on a prompt's mean KL(reference || fast), nats (infinity: unbounded)
  bool require_sequence_match = false;
  std::string description;  // one line for the report
};
VerifyTolerance verify_tolerance(WeightFormat weights, KvFormat kv);

struct VerifyPrompt {
  std::string name;
  std::string text;             // empty for built-in id sequences
  std::vector<int32_t> tokens;  // what both paths are fed, <bos> first
};

struct PromptComparison {
  std::string name;
  int prompt_tokens = 0;
  int steps = 0;
  std::vector<int32_t> reference_tokens;  // greedy on the reference path
  std::vector<int32_t> fast_tokens;       // the fast path's argmax at each step, on the reference's prefix
  bool sequence_match = false;            // SEQ_MATCH: every step's argmax equal
  std::optional<int> first_divergent_step;
  double reference_margin_at_divergence = 0.0;  // reference top-2 logit gap at that step
  double max_logit_difference = 0.0;            // over every step and vocabulary entry; infinity for NaN
  double median_logit_difference = 0.0;         // median over steps of each step's max |logit diff|
  int flips = 0;                                // steps whose argmax differs (on the reference's prefix)
  int largest_flip_step = 0;
  double largest_flip_margin = 0.0;       // largest reference top-2 margin among those steps
  std::vector<double> step_differences;   // max |logit diff| of each step
  std::vector<double> reference_margins;  // reference top-2 logit gap of each step
  // KL(reference || fast) of each step's next-token distribution (softmax of the final logits, i.e.
  // sampling at temperature 1), in nats; its mean and largest value over the steps.
  std::vector<double> step_kl;
  double mean_kl = 0.0, max_kl = 0.0;
  double top1_agreement = 0.0;  // fraction of steps whose argmax equals the reference's
  int max_difference_step = 0;
  bool within_tolerance = false;
  std::string verdict;  // why it is (not) within tolerance
};

// KL(p || q) in nats of p = softmax(reference) and q = softmax(fast), computed in double; infinity when
// the fast logits are not finite.
double kl_divergence(std::span<const float> reference, std::span<const float> fast);

// Runs one prompt through both engines (each restarted at position 0; their contexts must hold
// prompt + steps tokens).
PromptComparison compare_paths(Transformer& reference, Transformer& fast, const VerifyPrompt& prompt, int steps,
                               const VerifyTolerance& tolerance);

// Built-in prompts: with a tokenizer, a raw completion, a chat turn and a plain sentence, plus one text
// longer than two sliding windows (repeated until it has more than 2 * sliding_window + 16 tokens) so
// that ring-buffer wrap-around and the window mask are exercised; without one, deterministic id sequences
// of the same lengths.
std::vector<VerifyPrompt> builtin_verify_prompts(const ModelConfig& config, const Tokenizer* tokenizer,
                                                 const std::filesystem::path& model_dir);

// Text encoded as run --prompt does it: exactly one <bos> in front.
std::vector<int32_t> encode_with_bos(const Tokenizer& tokenizer, const ModelConfig& config, const std::string& text);
// One user turn rendered with the checkpoint's chat format (generation prompt style detected from its
// template) and encoded.
std::vector<int32_t> encode_chat_turn(const Tokenizer& tokenizer, const ModelConfig& config, const std::filesystem::path& model_dir,
                                      const std::string& user_text);

// A coherence probe, from the command line's "PROMPT=TEXT" (split at the last '=', since a question is
// likelier to hold an '=' than a short expected answer).
struct CoherenceProbe {
  std::string prompt;
  std::string expected;
};
CoherenceProbe parse_coherence_probe(const std::string& argument);

struct ProbeResult {
  std::string prompt;
  std::string expected;
  std::string output;            // fast path's answer, special tokens skipped
  std::string reference_output;  // the reference path's answer to the same chat turn
  bool passed = false;           // output contains expected
};

// Greedy answer to one chat turn, stopping on the checkpoint's eos ids or after max_tokens.
std::string greedy_chat_answer(Transformer& transformer, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt, int max_tokens);

struct VerifyOptions {
  // The path under test (backend, device, weight and KV formats, threads, in-process tensor-parallel
  // ranks), against the reference backend with the same threads. Its context is set from the prompts.
  EngineOptions fast;
  int steps = 32;           // greedy steps per prompt
  int probe_tokens = 64;    // most tokens of a probe's answer
  bool builtin_prompts = true;
  std::vector<std::string> prompt_texts;  // --prompts FILE, one per line
  std::vector<CoherenceProbe> probes;
};

struct VerifyReport {
  std::string backend;       // the backend under test
  std::string fast_weights;  // "bf16", ...
  std::string fast_kv;
  int tensor_parallel = 1;
  VerifyTolerance tolerance;
  int steps = 0;
  std::vector<PromptComparison> prompts;
  std::vector<ProbeResult> probes;

  bool ok() const;  // every prompt within tolerance and every probe passed
  // Over every step of every prompt: the mean KL(reference || fast) and the fraction of equal argmaxes.
  double mean_kl() const;
  double top1_agreement() const;
};

// Called as each result is ready, so a slow run on a real checkpoint shows progress.
struct VerifyObserver {
  std::function<void(const VerifyReport&)> on_start;  // tolerance and formats are known
  std::function<void(const PromptComparison&)> on_prompt;
  std::function<void(const ProbeResult&)> on_probe;
};

// Throws Error for unusable requests (text prompts or probes without a tokenizer.json, an empty prompt).
VerifyReport run_verification(const Model& model, const VerifyOptions& options, const VerifyObserver& observer = {});

}  // namespace gemma4rt
