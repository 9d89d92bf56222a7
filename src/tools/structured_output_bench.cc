#include "tools/structured_output_bench.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include "constrain/matcher.h"
#include "constrain/token_table.h"
#include "engine/sampler.h"
#include "tools/alternating_blocks.h"

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

// One constrained generation, a step at a time; a fresh matcher starts when an output completes.
class ConstrainedStream {
 public:
  ConstrainedStream(std::shared_ptr<const constrain::Grammar> grammar, std::shared_ptr<const constrain::TokenTable> table,
                    std::vector<int32_t> ends, const SamplingOptions& sampling)
      : grammar_(std::move(grammar)), table_(std::move(table)), ends_(std::move(ends)), sampler_(sampling) {
    restart();
  }

  void step(Transformer& transformer, int position) {
    const std::span<const float> output = transformer.forward(std::span<const int32_t>(&token_, 1), position);
    logits_.assign(output.begin(), output.end());
    const auto mask_start = Clock::now();
    const double cpu_start = thread_cpu_ms();
    matcher_->mask_logits(logits_);
    run.mask_cpu_ms.push_back(thread_cpu_ms() - cpu_start);
    run.mask_ms.push_back(ms_since(mask_start));
    token_ = sampler_.sample(logits_);
    if (!matcher_->accept(token_)) fail("bench: the constrained sampler chose a token the mask forbids");
    if (matcher_->ended()) {
      ++run.outputs_completed;
      restart();
    }
  }

  Run run;

 private:
  void restart() {
    matcher_ = std::make_unique<constrain::Matcher>(grammar_, table_, ends_);
    token_ = 2;  // <bos>
  }

  std::shared_ptr<const constrain::Grammar> grammar_;
  std::shared_ptr<const constrain::TokenTable> table_;
  std::vector<int32_t> ends_;
  Sampler sampler_;
  std::unique_ptr<constrain::Matcher> matcher_;
  std::vector<float> logits_;
  int32_t token_ = 2;
};

// Greedy decoding free (argmax on the device) and constrained (logits, mask, argmax) in alternating
// blocks over the same positions. Returns the free ms per token.
double interleaved_greedy_rates(Transformer& transformer, ConstrainedStream& constrained, int tokens) {
  int32_t free_token = 2;  // <bos>
  const AlternatingSeconds seconds = time_alternating_blocks(
      0, tokens,
      [&](int position) { free_token = transformer.forward_greedy(std::span<const int32_t>(&free_token, 1), position); },
      [&](int position) { constrained.step(transformer, position); });
  constrained.run.ms_per_token = seconds.second * 1000.0 / tokens;
  return seconds.first * 1000.0 / tokens;
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
                                       const std::shared_ptr<const constrain::Grammar>& grammar, int tokens) {
  const auto table_start = Clock::now();
  const auto table = std::make_shared<constrain::TokenTable>(tokenizer, transformer.config().vocab_size);
  const double table_ms = ms_since(table_start);
  const std::vector<int32_t> ends(transformer.config().eos_token_ids.begin(), transformer.config().eos_token_ids.end());

  SamplingOptions sampled;
  sampled.temperature = 1.0f;
  sampled.seed = 1;
  ConstrainedStream sampled_stream(grammar, table, ends, sampled);
  for (int position = 0; position < tokens; ++position) sampled_stream.step(transformer, position);
  const Run& masks = sampled_stream.run;
  ConstrainedStream greedy_stream(grammar, table, ends, SamplingOptions{});
  const double free_ms_per_token = interleaved_greedy_rates(transformer, greedy_stream, tokens);
  const Run& greedy = greedy_stream.run;
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
