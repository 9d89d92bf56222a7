#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace gemma4rt {

GenerationResult generate(Transformer& transformer, std::span<const int32_t> prompt, const GenerationOptions& options,
                          const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) fail("the prompt is empty: nothing to generate from");
  const int context = transformer.context_tokens();
  if (static_cast<int64_t>(prompt.size()) > context) {
    fail("the prompt has {} tokens but the context holds {} (raise the context length)", prompt.size(), context);
  }
  if (options.max_tokens < 0) fail("max tokens must not be negative, got {}", options.max_tokens);

  using Clock = std::chrono::steady_clock;
  auto elapsed_ms = [](Clock::time_point since) { return std::chrono::duration<double, std::milli>(Clock::now() - since).count(); };
  Sampler sampler(options.sampling);
  // Greedy decoding takes the argmax on the device (only the id comes back); sampling and logprobs need
  // the logits.
  const bool logprobs = options.top_logprobs >= 0;
  const bool argmax_only = options.sampling.greedy() && !logprobs && !options.constraint;
  GenerationResult result;
  std::vector<float> masked;
  auto next = [&](std::span<const int32_t> tokens, int at) {
    if (argmax_only) return transformer.forward_greedy(tokens, at);
    float log_normaliser = 0.0f;
    const std::span<const float> logits = transformer.forward(tokens, at, 0, logprobs ? &log_normaliser : nullptr);
    int32_t token = 0;
    if (options.constraint) {
      masked.assign(logits.begin(), logits.end());
      options.constraint->mask_logits(masked);
      token = sampler.sample(masked);
      if (!options.constraint->accept(token)) fail("structured output: no token can continue the constrained text");
    } else {
      token = sampler.sample(logits);
    }
    if (logprobs) {
      GeneratedLogprobs entry;
      entry.top = top_logprobs(logits, options.top_logprobs, log_normaliser);
      entry.logprob = logits[static_cast<size_t>(token)] - log_normaliser;
      result.logprobs.push_back(std::move(entry));
    }
    return token;
  };
  result.finish_reason = "length";
  if (options.max_tokens == 0) return result;
  if (options.top_logprobs > 20) fail("at most 20 alternative log-probabilities per token, asked for {}", options.top_logprobs);

  auto start = Clock::now();
  int32_t token = next(prompt, 0);
  result.prefill_ms = elapsed_ms(start);

  int position = static_cast<int>(prompt.size());
  start = Clock::now();
  while (true) {
    result.tokens.push_back(token);
    const bool is_stop = !options.ignore_eos &&
                         std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) != options.stop_token_ids.end();
    const bool keep_going = on_token ? on_token(token) : true;
    if (is_stop || !keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= options.max_tokens || position >= context) break;
    token = next(std::span<const int32_t>(&token, 1), position++);
    ++result.decode_steps;
  }
  result.decode_ms = elapsed_ms(start);
  return result;
}

}  // namespace gemma4rt
