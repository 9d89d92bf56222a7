#include "tools/structured_output_bench.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include "constrain/matcher.h"
#include "constrain/token_table.h"
#include "engine/sampler.h"

namespace gemma4rt::tools {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

// This thread's CPU time: a step that another process preempts is not charged for the wait.
double thread_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec * 1e3 + now.tv_nsec / 1e6;
}

struct Run {
  std::vector<double> mask_ms;      // per step, wall clock
  std::vector<double> mask_cpu_ms;  // per step, this thread's CPU time
  double ms_per_token = 0.0;
  int outputs_completed = 0;
};

Run constrained_run(Transformer& transformer, const std::shared_ptr<const constrain::Grammar>& grammar,
                    const std::shared_ptr<const constrain::TokenTable>& table, const std::vector<int32_t>& ends, int tokens,
                    const SamplingOptions& sampling) {
  Run run;
  Sampler sampler(sampling);
  auto matcher = std::make_unique<constrain::Matcher>(grammar, table, ends);
  std::vector<float> logits;
  int32_t token = 2;  // <bos>
  const auto start = Clock::now();
  for (int position = 0; position < tokens; ++position) {
    const std::span<const float> output = transformer.forward(std::span<const int32_t>(&token, 1), position);
    logits.assign(output.begin(), output.end());
    const auto mask_start = Clock::now();
    const double cpu_start = thread_cpu_ms();
    matcher->mask_logits(logits);
    run.mask_cpu_ms.push_back(thread_cpu_ms() - cpu_start);
    run.mask_ms.push_back(ms_since(mask_start));
    token = sampler.sample(logits);
    if (!matcher->accept(token)) fail("bench: the constrained sampler chose a token the mask forbids");
    if (matcher->ended()) {
      ++run.outputs_completed;
      matcher = std::make_unique<constrain::Matcher>(grammar, table, ends);
      token = 2;
    }
  }
  run.ms_per_token = ms_since(start) / tokens;
  return run;
}

nlohmann::json summary(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) { return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))]; };
  double total = 0.0;
  for (double value : values) total += value;
  return {{"median_ms", at(0.5)}, {"p99_ms", at(0.99)}, {"worst_ms", values.back()}, {"mean_ms", total / values.size()}};
}

}  // namespace

nlohmann::json bench_structured_output(Transformer& transformer, const Tokenizer& tokenizer,
                                       const std::shared_ptr<const constrain::Grammar>& grammar, int tokens, double free_ms_per_token) {
  const auto table_start = Clock::now();
  const auto table = std::make_shared<constrain::TokenTable>(tokenizer, transformer.config().vocab_size);
  const double table_ms = ms_since(table_start);
  const std::vector<int32_t> ends(transformer.config().eos_token_ids.begin(), transformer.config().eos_token_ids.end());

  SamplingOptions sampled;
  sampled.temperature = 1.0f;
  sampled.seed = 1;
  const Run masks = constrained_run(transformer, grammar, table, ends, tokens, sampled);
  const Run greedy = constrained_run(transformer, grammar, table, ends, tokens, SamplingOptions{});
  nlohmann::json result = summary(masks.mask_ms);
  result["cpu"] = summary(masks.mask_cpu_ms);
  result["steps"] = tokens;
  result["vocabulary"] = transformer.config().vocab_size;
  result["token_table_ms"] = table_ms;
  result["outputs_completed"] = masks.outputs_completed;
  result["greedy_mask"] = summary(greedy.mask_ms);
  result["greedy_mask"]["cpu"] = summary(greedy.mask_cpu_ms);
  result["free_ms_per_token"] = free_ms_per_token;
  result["constrained_ms_per_token"] = greedy.ms_per_token;
  result["constrained_rate_percent"] = 100.0 * free_ms_per_token / greedy.ms_per_token;
  result["mask_median_percent_of_step"] = 100.0 * result["median_ms"].get<double>() / free_ms_per_token;
  return result;
}

}  // namespace gemma4rt::tools
