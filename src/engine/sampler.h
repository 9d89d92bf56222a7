// Picks the next token from logits. Temperature 0 is greedy (argmax, lowest id on ties); otherwise
// temperature, top-k, top-p and min-p filter a softmax that is sampled with a seeded generator, so the
// same seed and logits give the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace gemma4rt {

struct SamplingOptions {
  float temperature = 0.0f;   // 0 = greedy
  int top_k = 0;              // 0 = no limit
  float top_p = 1.0f;         // 1 = no nucleus cut
  float min_p = 0.0f;         // drop tokens below min_p * p(best)
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
};

int32_t argmax(std::span<const float> logits);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The `count` most likely tokens of `logits` as log-probabilities, most likely first (ties: the lower
// id first), given log_normaliser = log(sum(exp(logits))) (the device computes it with the logits):
// log p(t) = logits[t] - log_normaliser.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count, float log_normaliser);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // `logits` must already carry the final softcap when sampling (it changes the distribution).
  int32_t sample(std::span<const float> logits);
  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  std::mt19937_64 random_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace gemma4rt
