// Prometheus counters of the server: requests by route and status, tokens in and out; latency
// histograms (time to first token, inter-token latency, end-to-end request latency, vLLM's names and
// buckets under the gemma4rt_ prefix). Gauges (queue depth, sequences in flight, KV slots in use,
// tokens/s) come from the scheduler when scraped.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/batch_scheduler.h"

namespace gemma4rt::serve {

// Cumulative buckets of a Prometheus histogram of seconds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double seconds);
  std::string render(const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  void observe_time_to_first_token(double seconds) { time_to_first_token_.observe(seconds); }
  void observe_inter_token_latency(double seconds) { inter_token_latency_.observe(seconds); }
  void observe_request_latency(double seconds) { request_latency_.observe(seconds); }
  void count_request(const std::string& route, int status);
  void add_prompt_tokens(int64_t count) { prompt_tokens_ += count; }
  void add_completion_tokens(int64_t count) { completion_tokens_ += count; }
  // Prometheus text exposition format.
  std::string render(const SchedulerStats* stats, bool ready, bool draining) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> completion_tokens_{0};
  Histogram time_to_first_token_{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}};
  Histogram inter_token_latency_{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}};
  Histogram request_latency_{{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0}};
};

}  // namespace gemma4rt::serve
