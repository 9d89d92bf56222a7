// The generation loop: prefill the prompt, then one token per decode step until a stop token, the
// token budget or the end of the context.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "constrain/matcher.h"
#include "engine/sampler.h"
#include "engine/transformer.h"

namespace gemma4rt {

struct GenerationOptions {
  int max_tokens = 256;
  SamplingOptions sampling;
  bool ignore_eos = false;
  std::vector<int> stop_token_ids;   // usually the checkpoint's eos ids
  int top_logprobs = -1;             // >= 0: each token's log-probability and that many alternatives
  // Structured output: tokens the matcher does not allow are never chosen (its end tokens should be
  // stop_token_ids). Null: free text.
  std::shared_ptr<constrain::Matcher> constraint;
};

// A generated token's log-probability under the model (softcapped logits, before temperature) and
// the most likely alternatives at that step.
struct GeneratedLogprobs {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct GenerationResult {
  std::vector<int32_t> tokens;       // generated ids, the stop token included when one ended generation
  std::vector<GeneratedLogprobs> logprobs;  // one per token, when options.top_logprobs >= 0
  std::string finish_reason;         // "stop" or "length"
  double prefill_ms = 0.0;
  double decode_ms = 0.0;
  int decode_steps = 0;              // forward passes after the prefill
  double decode_tokens_per_second() const { return decode_ms > 0 ? decode_steps * 1000.0 / decode_ms : 0.0; }
};

// Calls on_token for each generated id as soon as it is chosen (the stop token included); returning false
// from it stops generation with finish_reason "stop". Throws Error when the prompt does not fit the context.
GenerationResult generate(Transformer& transformer, std::span<const int32_t> prompt, const GenerationOptions& options,
                          const std::function<bool(int32_t)>& on_token = {});

}  // namespace gemma4rt
