#include "serve/metrics.h"

#include <fmt/format.h>

namespace gemma4rt::serve {

void Histogram::observe(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bucket = 0;
  while (bucket < bounds_.size() && seconds > bounds_[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += seconds;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t bucket = 0; bucket < bounds_.size(); ++bucket) {
    cumulative += counts_[bucket];
    text += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[bucket], cumulative);
  }
  text += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {:.6f}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return text;
}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{route, status}];
}

std::string Metrics::render(const SchedulerStats* stats, bool ready, bool draining) const {
  std::string text;
  text += "# HELP gemma4rt_requests_total HTTP requests by route and status code.\n# TYPE gemma4rt_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, count] : requests_) {
      text += fmt::format("gemma4rt_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
    }
  }
  text += fmt::format(
      "# HELP gemma4rt_prompt_tokens_total Prompt tokens of accepted requests.\n# TYPE gemma4rt_prompt_tokens_total counter\n"
      "gemma4rt_prompt_tokens_total {}\n"
      "# HELP gemma4rt_completion_tokens_total Generated tokens.\n# TYPE gemma4rt_completion_tokens_total counter\n"
      "gemma4rt_completion_tokens_total {}\n",
      prompt_tokens_.load(), completion_tokens_.load());
  text += fmt::format("# HELP gemma4rt_generation_tokens_total Generated tokens (vLLM's name).\n# TYPE gemma4rt_generation_tokens_total counter\n"
                      "gemma4rt_generation_tokens_total {}\n",
                      completion_tokens_.load());
  text += time_to_first_token_.render("gemma4rt_time_to_first_token_seconds", "Seconds from a request's arrival to its first generated token.");
  text += inter_token_latency_.render("gemma4rt_inter_token_latency_seconds", "Seconds between successive tokens of a request.");
  text += request_latency_.render("gemma4rt_e2e_request_latency_seconds", "Seconds from a request's arrival to the end of its response.");
  text += fmt::format("# HELP gemma4rt_ready 1 when the model is loaded and requests are accepted.\n# TYPE gemma4rt_ready gauge\ngemma4rt_ready {}\n",
                      ready && !draining ? 1 : 0);
  if (stats != nullptr) {
    text += fmt::format(
        "# HELP gemma4rt_queue_depth Requests waiting for a KV slot.\n# TYPE gemma4rt_queue_depth gauge\ngemma4rt_queue_depth {}\n"
        "# HELP gemma4rt_sequences_in_flight Sequences being prefilled or decoded.\n# TYPE gemma4rt_sequences_in_flight gauge\n"
        "gemma4rt_sequences_in_flight {}\n"
        "# HELP gemma4rt_kv_slots_in_use KV cache slots held by running sequences.\n# TYPE gemma4rt_kv_slots_in_use gauge\n"
        "gemma4rt_kv_slots_in_use {}\n"
        "# HELP gemma4rt_kv_slots KV cache slots allocated (--parallel).\n# TYPE gemma4rt_kv_slots gauge\ngemma4rt_kv_slots {}\n"
        "# HELP gemma4rt_tokens_per_second Tokens sampled per second in the latest engine step.\n# TYPE gemma4rt_tokens_per_second gauge\n"
        "gemma4rt_tokens_per_second {:.3f}\n"
        "# HELP gemma4rt_prompt_tokens_cached_total Prompt tokens whose K/V an earlier request left in a slot (not computed again).\n"
        "# TYPE gemma4rt_prompt_tokens_cached_total counter\ngemma4rt_prompt_tokens_cached_total {}\n",
        stats->queued, stats->running, stats->running, stats->kv_slots, stats->recent_tokens_per_second, stats->cached_prompt_tokens);
  }
  return text;
}

}  // namespace gemma4rt::serve
