#include "engine/batch_scheduler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace gemma4rt {

struct BatchScheduler::Sequence {
  SequenceRequest request;
  std::shared_ptr<SequenceHandle> handle;
  std::unique_ptr<Sampler> sampler;
  int slot = -1;
  int position = 0;                 // next position to run
  size_t prompt_done = 0;           // prompt tokens already in the cache
  int32_t last_token = 0;           // the token the next decode row feeds
  int generated = 0;
  std::unordered_map<int32_t, int> counts;  // generated token -> occurrences (penalties)
  std::vector<int32_t> cached;      // the tokens at positions [0, position): what its slot will hold
  bool finished = false;
  bool failed = false;              // ended with "error": a half-run step may have left its slot's K/V stale
  bool prefilling() const { return prompt_done < request.prompt.size(); }
};

BatchScheduler::BatchScheduler(Transformer& transformer, const Options& options) : transformer_(transformer), options_(options) {
  options_.prefill_chunk = std::max(1, options_.prefill_chunk);
  for (int slot = 0; slot < transformer.sequences(); ++slot) free_slots_.push_back(slot);
  slot_tokens_.resize(static_cast<size_t>(transformer.sequences()));
  const int max_rows = transformer.max_chunk_tokens();
  if (max_rows < transformer.sequences()) {
    fail("the engine's chunk of {} rows cannot hold one decode row for each of {} sequences", max_rows, transformer.sequences());
  }
  logits_.resize(static_cast<size_t>(transformer.sequences()) * transformer.config().vocab_size);
  log_normalisers_.resize(static_cast<size_t>(transformer.sequences()));
  engine_thread_ = std::thread([this] { engine_loop(); });
}

BatchScheduler::~BatchScheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  engine_thread_.join();
}

std::shared_ptr<SequenceHandle> BatchScheduler::submit(SequenceRequest request) {
  if (request.prompt.empty()) fail("the prompt is empty");
  if (static_cast<int64_t>(request.prompt.size()) > transformer_.context_tokens()) {
    fail("the prompt has {} tokens but the context holds {}", request.prompt.size(), transformer_.context_tokens());
  }
  auto sequence = std::make_unique<Sequence>();
  sequence->handle = std::make_shared<SequenceHandle>();
  sequence->sampler = std::make_unique<Sampler>(request.sampling);
  sequence->request = std::move(request);
  auto handle = sequence->handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || draining_) return nullptr;
    const int waiting_allowed = options_.max_queue + static_cast<int>(free_slots_.size());
    if (static_cast<int>(queue_.size()) >= waiting_allowed) return nullptr;
    queue_.push_back(std::move(sequence));
  }
  wake_.notify_all();
  return handle;
}

void BatchScheduler::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  wake_.notify_all();
  idle_.wait(lock, [this] { return queue_.empty() && running_count_ == 0; });
}

SchedulerStats BatchScheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SchedulerStats stats;
  stats.queued = static_cast<int>(queue_.size());
  stats.running = running_count_;
  stats.kv_slots = transformer_.sequences();
  stats.generated_tokens = generated_tokens_.load();
  stats.prompt_tokens = prompt_tokens_.load();
  stats.cached_prompt_tokens = cached_prompt_tokens_.load();
  stats.recent_tokens_per_second = recent_tokens_per_second_.load();
  return stats;
}

void BatchScheduler::finish(Sequence& sequence, const std::string& reason, const std::string& error) {
  if (sequence.finished) return;
  sequence.finished = true;
  sequence.failed = reason == "error";
  if (sequence.slot >= 0) --running_count_;
  if (sequence.request.on_finish) sequence.request.on_finish(reason, error);
}

void BatchScheduler::assign_slot(Sequence& sequence) {
  const std::vector<int32_t>& prompt = sequence.request.prompt;
  size_t choice = 0;
  int reused = 0;
  const bool reuse = options_.reuse_prefixes && sequence.request.reuse_prefix;
  for (size_t i = 0; reuse && i < free_slots_.size(); ++i) {
    const std::vector<int32_t>& cached = slot_tokens_[free_slots_[i]];
    // The prompt's last token is always computed: its logits choose the first token.
    const size_t limit = std::min(cached.size(), prompt.size() - 1);
    const int common = static_cast<int>(std::mismatch(prompt.begin(), prompt.begin() + limit, cached.begin()).first - prompt.begin());
    const int usable = transformer_.kv_cache().reusable_prefix(static_cast<int>(cached.size()), common);
    if (usable > reused) {
      reused = usable;
      choice = i;
    }
  }
  sequence.slot = free_slots_[choice];
  free_slots_.erase(free_slots_.begin() + static_cast<ptrdiff_t>(choice));
  slot_tokens_[sequence.slot].clear();
  sequence.prompt_done = static_cast<size_t>(reused);
  sequence.position = reused;
  sequence.cached.assign(prompt.begin(), prompt.begin() + reused);
  sequence.handle->set_cached_prompt_tokens(reused);
  cached_prompt_tokens_ += reused;
}

void BatchScheduler::engine_loop() {
  std::vector<std::unique_ptr<Sequence>> running;
  std::vector<std::pair<std::unique_ptr<Sequence>, const char*>> dropped;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !running.empty(); });
      if (stopping_) {
        for (auto& sequence : running) finish(*sequence, "cancelled");
        for (auto& sequence : queue_) finish(*sequence, "cancelled");
        queue_.clear();
        running_count_ = 0;
        idle_.notify_all();
        return;
      }
      // Waiting requests whose client went away or whose deadline passed leave the queue now, not when
      // a slot frees: they would hold queue places (429s for others) and keep their clients waiting.
      const auto now = std::chrono::steady_clock::now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        Sequence& sequence = **it;
        const char* reason = sequence.handle->cancelled()                                        ? "cancelled"
                             : sequence.request.deadline && now > *sequence.request.deadline ? "timeout"
                                                                                               : nullptr;
        if (reason == nullptr) {
          ++it;
          continue;
        }
        dropped.emplace_back(std::move(*it), reason);
        it = queue_.erase(it);
      }
      // Newcomers join at the step boundary, one KV slot each.
      while (!queue_.empty() && !free_slots_.empty()) {
        auto sequence = std::move(queue_.front());
        queue_.pop_front();
        assign_slot(*sequence);
        running.push_back(std::move(sequence));
      }
      running_count_ = static_cast<int>(running.size());
    }
    // Their callbacks run without the lock, like every other finish().
    for (auto& [sequence, reason] : dropped) finish(*sequence, reason);
    dropped.clear();
    if (!running.empty()) {
      try {
        step(running);
      } catch (const std::exception& error) {
        // The forward pass failed before any sequence advanced (positions move only after it returns,
        // and rewriting the same KV slots is harmless): retry each sequence alone, so only those that
        // fail by themselves end with the error and the engine keeps serving the rest.
        if (running.size() == 1) {
          finish(*running.front(), "error", error.what());
        } else {
          for (auto& sequence : running) {
            if (sequence->finished) continue;
            std::vector<std::unique_ptr<Sequence>> alone;
            alone.push_back(std::move(sequence));
            try {
              step(alone);
            } catch (const std::exception& solo) {
              finish(*alone.front(), "error", solo.what());
            }
            sequence = std::move(alone.front());
          }
        }
      }
    }
    // Hand finished sequences' slots back.
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& sequence : running) {
      if (!sequence->finished) continue;
      if (!sequence->failed) slot_tokens_[sequence->slot] = std::move(sequence->cached);
      free_slots_.push_back(sequence->slot);
    }
    std::erase_if(running, [](const auto& sequence) { return sequence->finished; });
    running_count_ = static_cast<int>(running.size());
    if (running.empty() && queue_.empty()) idle_.notify_all();
  }
}

void BatchScheduler::step(std::vector<std::unique_ptr<Sequence>>& running) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& sequence : running) {
    if (sequence->handle->cancelled()) finish(*sequence, "cancelled");
    else if (sequence->request.deadline && now > *sequence->request.deadline) finish(*sequence, "timeout");
  }

  // Rows: a decode row for every sequence past its prompt, then prompt chunks while rows remain.
  const int max_rows = transformer_.max_chunk_tokens();
  rows_.clear();
  logit_rows_.clear();
  std::vector<Sequence*> sampled;
  std::vector<Sequence*> decoding;
  for (auto& sequence : running) {
    if (sequence->finished || sequence->prefilling()) continue;
    rows_.push_back({sequence->slot, sequence->position, sequence->last_token});
    logit_rows_.push_back(static_cast<int>(rows_.size()) - 1);
    sampled.push_back(sequence.get());
    decoding.push_back(sequence.get());
  }
  std::vector<std::pair<Sequence*, int>> prefilled;  // sequence, rows added
  for (auto& sequence : running) {
    if (sequence->finished || !sequence->prefilling()) continue;
    const int room = max_rows - static_cast<int>(rows_.size());
    if (room <= 0) break;
    const int take = static_cast<int>(std::min<size_t>({static_cast<size_t>(options_.prefill_chunk), static_cast<size_t>(room),
                                                        sequence->request.prompt.size() - sequence->prompt_done}));
    for (int i = 0; i < take; ++i) {
      rows_.push_back({sequence->slot, sequence->position + i, sequence->request.prompt[sequence->prompt_done + i]});
    }
    prefilled.emplace_back(sequence.get(), take);
    if (sequence->prompt_done + take == sequence->request.prompt.size()) {
      logit_rows_.push_back(static_cast<int>(rows_.size()) - 1);
      sampled.push_back(sequence.get());
    }
  }
  if (rows_.empty()) return;
  // Logit rows must be increasing: decode rows come first, then prompt ends in row order.
  const auto start = std::chrono::steady_clock::now();
  if (options_.before_forward) options_.before_forward(rows_, logit_rows_);
  // A step whose every sampled row decodes greedily, without logprobs, biases, penalties or a constraint, needs
  // only the argmax ids back from the device; any other row needs the softcapped logits.
  const bool argmax_only = std::all_of(sampled.begin(), sampled.end(), [](const Sequence* sequence) {
    const SequenceRequest& request = sequence->request;
    return sequence->sampler->options().greedy() && request.top_logprobs < 0 && request.presence_penalty == 0.0f &&
           request.frequency_penalty == 0.0f && request.logit_bias.empty() && !request.constraint;
  });
  if (argmax_only) {
    greedy_ids_.resize(logit_rows_.size());
    transformer_.forward_greedy(rows_, logit_rows_, greedy_ids_.data());
  } else {
    const bool logprobs = std::any_of(sampled.begin(), sampled.end(), [](const Sequence* sequence) { return sequence->request.top_logprobs >= 0; });
    transformer_.forward(rows_, logit_rows_, logits_.data(), logprobs ? log_normalisers_.data() : nullptr);
  }
  // The rows are in the cache now: each decode row advanced its sequence by one position.
  for (Sequence* sequence : decoding) {
    sequence->cached.push_back(sequence->last_token);
    ++sequence->position;
  }
  for (auto& [sequence, take] : prefilled) {
    const auto first = sequence->request.prompt.begin() + static_cast<ptrdiff_t>(sequence->prompt_done);
    sequence->cached.insert(sequence->cached.end(), first, first + take);
    sequence->prompt_done += take;
    sequence->position += take;
    prompt_tokens_ += take;
  }

  const int vocab = transformer_.config().vocab_size;
  for (size_t index = 0; index < sampled.size(); ++index) {
    Sequence& sequence = *sampled[index];
    // From here on a failure belongs to this sequence alone (its sampler, its callbacks).
    try {
      if (argmax_only) emit(sequence, nullptr, 0.0f, &greedy_ids_[index]);
      else emit(sequence, logits_.data() + index * vocab, log_normalisers_[index], nullptr);
    } catch (const std::exception& error) {
      if (!sequence.finished) finish(sequence, "error", error.what());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (seconds > 0) recent_tokens_per_second_.store(static_cast<double>(sampled.size()) / seconds);
}

void BatchScheduler::emit(Sequence& sequence, float* logits, float log_normaliser, const int32_t* greedy_id) {
  const int vocab = transformer_.config().vocab_size;
  const SequenceRequest& request = sequence.request;
  TokenEvent event;
  if (request.top_logprobs >= 0) {
    // Log-probabilities of the model itself: the softcapped logits, before penalties and temperature.
    event.top_logprobs = top_logprobs(std::span<const float>(logits, vocab), request.top_logprobs, log_normaliser);
    event.logprob = log_normaliser;  // replaced by the chosen token's value below
  }
  for (const auto& [token, bias] : request.logit_bias) logits[token] += bias;
  if (request.presence_penalty != 0.0f || request.frequency_penalty != 0.0f) {
    for (const auto& [token, count] : sequence.counts) {
      logits[token] -= request.presence_penalty + request.frequency_penalty * static_cast<float>(count);
    }
  }
  if (request.constraint) request.constraint->mask_logits(std::span<float>(logits, vocab));
  const int32_t token = greedy_id ? *greedy_id : sequence.sampler->sample(std::span<const float>(logits, vocab));
  if (request.constraint && !request.constraint->accept(token)) {
    fail("structured output: no token can continue the constrained text");
  }
  if (event.logprob) {
    // Recover log p(token) from the model's own value: biases and penalties only touched some tokens.
    float raw = logits[token];
    if (auto found = sequence.counts.find(token); found != sequence.counts.end()) {
      raw += request.presence_penalty + request.frequency_penalty * static_cast<float>(found->second);
    }
    if (auto found = request.logit_bias.find(token); found != request.logit_bias.end()) raw -= found->second;
    event.logprob = raw - *event.logprob;
  }
  event.token = token;
  event.is_stop_token = !request.ignore_eos &&
                        std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) != request.stop_token_ids.end();
  ++sequence.generated;
  ++sequence.counts[token];
  generated_tokens_++;
  const bool keep_going = request.on_token ? request.on_token(event) : true;
  if (event.is_stop_token || !keep_going) {
    finish(sequence, "stop");
  } else if (sequence.generated >= request.max_tokens || sequence.position >= transformer_.context_tokens()) {
    finish(sequence, "length");
  } else {
    sequence.last_token = token;  // fed at sequence.position by the next step's decode row
  }
}

}  // namespace gemma4rt
