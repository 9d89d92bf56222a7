// Sampler microbenchmarks (Google Benchmark): one sampled token from a full Gemma-4 vocabulary
// (262,144 logits, a peaked distribution: normal logits plus a few far above the rest), per filter.
//   Sample/<filter>   ms per token; a decode step of E2B takes 40-90 ms on this machine. greedy: the
//                     argmax alone (temperature 0), once per sequence of a step that returns logits.
#include <cmath>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "engine/sampler.h"

namespace gemma4rt {
namespace {

std::vector<float> vocabulary_logits() {
  std::vector<float> logits(262144);
  std::mt19937 random(1);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  for (float& logit : logits) logit = normal(random);
  for (int i = 0; i < 20; ++i) logits[random() % logits.size()] += 12.0f;
  return logits;
}

void Sample(benchmark::State& state, SamplingOptions options) {
  const std::vector<float> logits = vocabulary_logits();
  Sampler sampler(options);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits));
}

const bool kRegistered = [] {
  const std::pair<const char*, SamplingOptions> cases[] = {
      {"Sample/greedy", {}},
      {"Sample/temperature", {.temperature = 1.0f, .seed = 1}},
      {"Sample/top_p:0.95", {.temperature = 1.0f, .top_p = 0.95f, .seed = 1}},
      {"Sample/top_k:40", {.temperature = 1.0f, .top_k = 40, .seed = 1}},
      {"Sample/top_p:0.9,min_p:0.05", {.temperature = 0.7f, .top_p = 0.9f, .min_p = 0.05f, .seed = 1}},
  };
  for (const auto& [name, options] : cases) benchmark::RegisterBenchmark(name, Sample, options)->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
}  // namespace gemma4rt
