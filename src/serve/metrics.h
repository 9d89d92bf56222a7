// Prometheus counters of the server: requests by route and status, tokens in and out. Gauges (queue
// depth, sequences in flight, KV slots in use, tokens/s) come from the scheduler when scraped.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "engine/batch_scheduler.h"

namespace gemma4rt::serve {

class Metrics {
 public:
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
};

}  // namespace gemma4rt::serve
