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
    fail("the prompt has {} tokens but the context holds {} (raise --ctx)", prompt.size(), context);
  }
  if (options.max_tokens < 0) fail("max tokens must not be negative, got {}", options.max_tokens);

  using Clock = std::chrono::steady_clock;
  auto elapsed_ms = [](Clock::time_point since) { return std::chrono::duration<double, std::milli>(Clock::now() - since).count(); };
  Sampler sampler(options.sampling);
  // tanh is monotonic, so greedy decoding can skip the softcap; sampling needs the true distribution.
  const bool apply_softcap = !options.sampling.greedy();
  GenerationResult result;
  result.finish_reason = "length";
  if (options.max_tokens == 0) return result;

  auto start = Clock::now();
  std::span<const float> logits = transformer.forward(prompt, 0, apply_softcap);
  result.prefill_ms = elapsed_ms(start);

  int position = static_cast<int>(prompt.size());
  start = Clock::now();
  while (true) {
    const int32_t token = sampler.sample(logits);
    result.tokens.push_back(token);
    const bool is_stop = !options.ignore_eos &&
                         std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) != options.stop_token_ids.end();
    const bool keep_going = on_token ? on_token(token) : true;
    if (is_stop || !keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= options.max_tokens || position >= context) break;
    logits = transformer.forward(std::span<const int32_t>(&token, 1), position++, apply_softcap);
    ++result.decode_steps;
  }
  result.decode_ms = elapsed_ms(start);
  return result;
}

}  // namespace gemma4rt
