// Continuous batching. One engine thread owns the Transformer and runs steps; each step takes one
// decode row from every running sequence plus a chunk of prompt rows from sequences still prefilling,
// so every weight is read once for all of them and a newcomer's long prompt stalls running streams
// for at most one chunk. Requests join at step boundaries, each in its own KV slot; beyond the slots
// they wait in a bounded queue.
// A finished sequence's K/V stays in its slot: a newcomer whose prompt starts with the same tokens (the
// next turn of a chat resends the whole conversation) takes that slot and computes only the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "constrain/matcher.h"
#include "engine/sampler.h"
#include "engine/transformer.h"

namespace gemma4rt {

// What the engine reports for each generated token, on the engine thread.
struct TokenEvent {
  int32_t token = 0;
  bool is_stop_token = false;             // one of the request's stop ids (not part of the answer)
  std::optional<float> logprob;           // when requested: log p(token) under the model (softcapped logits)
  std::vector<TokenLogprob> top_logprobs; // when requested: the most likely alternatives
};

struct SequenceRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 256;
  SamplingOptions sampling;
  float presence_penalty = 0.0f;          // subtracted once from tokens already generated
  float frequency_penalty = 0.0f;         // subtracted per earlier occurrence
  // Added to these tokens' logits before the penalties, the constraint and sampling (OpenAI's
  // logit_bias: -100 bans a token, +100 all but forces it). Logprobs still report the model's own values.
  std::map<int32_t, float> logit_bias;
  bool ignore_eos = false;
  bool reuse_prefix = true;               // may start from the K/V an earlier sequence left in a free slot
  std::vector<int> stop_token_ids;
  int top_logprobs = -1;                  // -1: no logprobs; 0..20: logprob of the token plus that many alternatives
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Structured output: tokens the matcher does not allow get -inf before sampling or argmax (its end
  // tokens should be stop_token_ids). Null: free text, at no cost.
  std::shared_ptr<constrain::Matcher> constraint;
  // Called on the engine thread for every token; return false to stop the sequence (e.g. a stop string).
  std::function<bool(const TokenEvent&)> on_token;
  // Called once on the engine thread when the sequence ends: "stop", "length", "cancelled", "timeout" or "error".
  std::function<void(const std::string& finish_reason, const std::string& error)> on_finish;
};

class SequenceHandle {
 public:
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  // Prompt tokens whose K/V an earlier sequence left in the slot (not computed again); set by the
  // scheduler when the sequence starts, before its first token.
  int cached_prompt_tokens() const { return cached_prompt_tokens_.load(); }
  void set_cached_prompt_tokens(int count) { cached_prompt_tokens_.store(count); }

 private:
  std::atomic<bool> cancelled_{false};
  std::atomic<int> cached_prompt_tokens_{0};
};

struct SchedulerStats {
  int queued = 0;
  int running = 0;
  int kv_slots = 0;
  int64_t generated_tokens = 0;
  int64_t prompt_tokens = 0;         // prompt tokens computed
  int64_t cached_prompt_tokens = 0;  // prompt tokens found in a slot and not computed again
  double recent_tokens_per_second = 0.0;
};

class BatchScheduler {
 public:
  struct Options {
    int max_queue = 64;          // waiting requests beyond the running ones; more are refused
    int prefill_chunk = 64;      // prompt rows one sequence may add to a step
    bool reuse_prefixes = true;  // start a prompt from the K/V a finished sequence left in a free slot
    // Called on the engine thread with each step's rows just before the forward pass, so other
    // tensor-parallel processes can run the same step (see engine/step_mirror.h).
    std::function<void(std::span<const BatchRow>, std::span<const int>)> before_forward;
  };
  BatchScheduler(Transformer& transformer, const Options& options);
  ~BatchScheduler();  // stops the engine thread; unfinished sequences end as "cancelled"

  // Queues a request. Returns nullptr when the queue is full (the caller answers 429). Throws Error for
  // a request that can never run (empty prompt, prompt longer than the context).
  std::shared_ptr<SequenceHandle> submit(SequenceRequest request);
  // Lets running and queued sequences finish, then returns; later submits are refused.
  void drain();
  SchedulerStats stats() const;

 private:
  struct Sequence;
  void engine_loop();
  void step(std::vector<std::unique_ptr<Sequence>>& running);
  // One sampled row's token: logprobs, penalties, sampling (or the device's argmax), callbacks. With
  // logits comes their log normaliser (log-sum-exp, from the device).
  void emit(Sequence& sequence, float* logits, float log_normaliser, const int32_t* greedy_id);
  void finish(Sequence& sequence, const std::string& reason, const std::string& error = {});
  // Takes the free slot whose cached tokens save `sequence` the most prompt rows (else the one freed
  // longest ago, keeping recent conversations for their next turn) and starts the sequence after them.
  void assign_slot(Sequence& sequence);

  Transformer& transformer_;
  Options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::vector<int> free_slots_;                   // the slot freed longest ago first
  std::vector<std::vector<int32_t>> slot_tokens_;  // by slot: the tokens whose K/V it holds, from position 0
  // Sequences holding a slot. finish() counts one down before its callback answers the client, so a
  // metrics scrape that follows the answer never still counts it.
  std::atomic<int> running_count_{0};
  bool stopping_ = false;
  bool draining_ = false;
  std::atomic<int64_t> generated_tokens_{0};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> cached_prompt_tokens_{0};
  std::atomic<double> recent_tokens_per_second_{0.0};
  std::thread engine_thread_;
  std::vector<float> logits_;
  std::vector<float> log_normalisers_;
  std::vector<int32_t> greedy_ids_;
  std::vector<BatchRow> rows_;
  std::vector<int> logit_rows_;
};

}  // namespace gemma4rt
