// The scheduler keeps a failure to the request that causes it: when a step throws, each sequence is
// retried alone, and only the ones that fail alone end with "error". Logprobs of batched sequences are
// the log-softmax of their logits, whatever logit_bias did to the choice. A prompt that starts like the
// previous sequence of its slot starts from that sequence's K/V exactly when the sliding rings still
// hold what it reads. A sequence stops counting as running before its finish callback answers.
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/batch_scheduler.h"
#include "model/weights.h"

namespace gemma4rt {
namespace {

constexpr int32_t kPoison = 17;  // a prompt holding this token makes the step throw

// log(sum(exp(logits))), in double: what the reported log-probabilities are measured against.
double log_normaliser_of(std::span<const float> logits) {
  double maximum = logits[0];
  for (float logit : logits) maximum = std::max<double>(maximum, logit);
  double total = 0.0;
  for (float logit : logits) total += std::exp(static_cast<double>(logit) - maximum);
  return maximum + std::log(total);
}

EngineOptions engine_options(int sequences) {
  EngineOptions options;
  options.context_tokens = 64;
  options.sequences = sequences;
  return options;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string reason, error;
};

std::map<std::string, Outcome> serve(const Model& model, const std::map<std::string, std::vector<int32_t>>& prompts) {
  Transformer transformer(model, engine_options(4));
  BatchScheduler::Options scheduler_options;
  scheduler_options.before_forward = [](std::span<const BatchRow> rows, std::span<const int>) {
    for (const BatchRow& row : rows) {
      if (row.token == kPoison) fail("a row the engine cannot run");
    }
  };
  BatchScheduler scheduler(transformer, scheduler_options);
  std::mutex mutex;
  std::map<std::string, Outcome> outcomes;
  for (const auto& [name, prompt] : prompts) {
    SequenceRequest request;
    request.prompt = prompt;
    request.max_tokens = 5;
    request.ignore_eos = true;
    request.on_token = [&, name = name](const TokenEvent& event) {
      std::lock_guard<std::mutex> lock(mutex);
      outcomes[name].tokens.push_back(event.token);
      return true;
    };
    request.on_finish = [&, name = name](const std::string& reason, const std::string& error) {
      std::lock_guard<std::mutex> lock(mutex);
      outcomes[name].reason = reason;
      outcomes[name].error = error;
    };
    EXPECT_NE(scheduler.submit(std::move(request)), nullptr);
  }
  scheduler.drain();
  return outcomes;
}

TEST(BatchScheduler, AFailingRequestEndsAloneAndTheOthersAreUndisturbed) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  const std::vector<int32_t> first = {2, 100, 200, 300}, second = {2, 400, 500}, poisoned = {2, 50, kPoison, 60};
  const auto together = serve(*model, {{"first", first}, {"poisoned", poisoned}, {"second", second}});
  const auto alone = serve(*model, {{"first", first}, {"second", second}});
  EXPECT_EQ(together.at("poisoned").reason, "error");
  EXPECT_NE(together.at("poisoned").error.find("a row the engine cannot run"), std::string::npos);
  EXPECT_TRUE(together.at("poisoned").tokens.empty());
  for (const char* name : {"first", "second"}) {
    EXPECT_EQ(together.at(name).reason, "length") << name << ": " << together.at(name).error;
    EXPECT_EQ(together.at(name).tokens.size(), 5u) << name;
    EXPECT_EQ(together.at(name).tokens, alone.at(name).tokens) << name;
  }
}

// The normaliser comes from the device with the logits; each reported log-probability must equal the
// log-softmax, in double, of the logits of a sequence run alone on the same tokens.
TEST(BatchScheduler, LogprobsOfBatchedSequencesAreTheLogSoftmaxOfTheirLogits) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  Transformer transformer(*model, engine_options(3));
  BatchScheduler scheduler(transformer, {});
  const std::vector<std::vector<int32_t>> prompts = {{2, 100, 200, 300}, {2, 400, 500}, {2, 7, 8, 9, 10, 11}};
  std::mutex mutex;
  std::vector<std::vector<TokenEvent>> events(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceRequest request;
    request.prompt = prompts[i];
    request.max_tokens = 6;
    request.ignore_eos = true;
    request.top_logprobs = 3;
    request.on_token = [&, i](const TokenEvent& event) {
      std::lock_guard<std::mutex> lock(mutex);
      events[i].push_back(event);
      return true;
    };
    ASSERT_NE(scheduler.submit(std::move(request)), nullptr);
  }
  scheduler.drain();

  Transformer alone(*model, engine_options(1));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    ASSERT_EQ(events[i].size(), 6u);
    std::vector<int32_t> tokens = prompts[i];
    for (const TokenEvent& event : events[i]) {
      const std::span<const float> logits = alone.forward(tokens, 0);
      const double log_normaliser = log_normaliser_of(logits);
      ASSERT_TRUE(event.logprob.has_value());
      EXPECT_NEAR(*event.logprob, logits[static_cast<size_t>(event.token)] - log_normaliser, 1e-4);
      ASSERT_EQ(event.top_logprobs.size(), 3u);
      EXPECT_EQ(event.top_logprobs[0].token, event.token);  // greedy: the most likely token
      for (const TokenLogprob& top : event.top_logprobs) {
        EXPECT_NEAR(top.logprob, logits[static_cast<size_t>(top.token)] - log_normaliser, 1e-4) << "token " << top.token;
      }
      tokens.push_back(event.token);
    }
  }
}

// logit_bias moves the choice (here: +100 on one token, sampled, and -100 on the greedy choice), while
// the reported log-probabilities stay those of the model's own logits.
TEST(BatchScheduler, LogitBiasMovesTheChoiceNotTheLogprobs) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  Transformer transformer(*model, engine_options(2));
  const std::vector<int32_t> prompt = {2, 100, 200, 300};
  const std::span<const float> forward_logits = transformer.forward(prompt, 0);
  const std::vector<float> first_logits(forward_logits.begin(), forward_logits.end());  // the scheduler's steps reuse the buffer
  std::vector<float> logits = first_logits;
  const int32_t greedy = argmax(logits);
  logits[static_cast<size_t>(greedy)] = -std::numeric_limits<float>::infinity();
  const int32_t runner_up = argmax(logits);
  const int32_t forced = greedy == 424 ? 425 : 424;

  BatchScheduler scheduler(transformer, {});
  std::mutex mutex;
  std::vector<std::vector<TokenEvent>> events(2);
  for (int i = 0; i < 2; ++i) {
    SequenceRequest request;
    request.prompt = prompt;
    request.max_tokens = i == 0 ? 3 : 1;
    request.ignore_eos = true;
    request.top_logprobs = 1;
    if (i == 0) {
      request.sampling.temperature = 0.8f;
      request.logit_bias = {{forced, 100.0f}};
    } else {
      request.logit_bias = {{greedy, -100.0f}};
    }
    request.on_token = [&, i](const TokenEvent& event) {
      std::lock_guard<std::mutex> lock(mutex);
      events[static_cast<size_t>(i)].push_back(event);
      return true;
    };
    ASSERT_NE(scheduler.submit(std::move(request)), nullptr);
  }
  scheduler.drain();
  ASSERT_EQ(events[0].size(), 3u);
  for (const TokenEvent& event : events[0]) EXPECT_EQ(event.token, forced);
  ASSERT_EQ(events[1].size(), 1u);
  EXPECT_EQ(events[1][0].token, runner_up);
  ASSERT_EQ(events[1][0].top_logprobs.size(), 1u);
  EXPECT_EQ(events[1][0].top_logprobs[0].token, greedy) << "the alternatives are the model's own";
  const double log_normaliser = log_normaliser_of(first_logits);
  ASSERT_TRUE(events[1][0].logprob.has_value());
  EXPECT_NEAR(*events[1][0].logprob, first_logits[static_cast<size_t>(runner_up)] - log_normaliser, 1e-4);
  ASSERT_TRUE(events[0][0].logprob.has_value());
  EXPECT_NEAR(*events[0][0].logprob, first_logits[static_cast<size_t>(forced)] - log_normaliser, 1e-4);
}

// One KV slot, sliding window 8 (the golden tiny-e2b), chunks of 4 rows: each sliding ring keeps
// 8 + 4 - 1 = 11 positions. A first sequence feeds 21 positions (a 10-token prompt, 11 of its 12 tokens),
// so the ring's slot for position p holds p only for p >= 21 - 11 = 10. A second prompt sharing its
// first c tokens may start at position c when position c's window [c - 7, c] needs nothing older:
// c >= 17. With full_sliding_cache the rings hold every position and any shared prefix is reused.
// Whatever the scheduler reuses, each token's log-probability must equal that of a forward pass over
// the whole text in a fresh engine.
TEST(BatchScheduler, APromptStartsFromItsSlotsCachedPrefixOnlyWhereTheRingsHoldIt) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  const std::vector<int32_t> first_prompt = {2, 11, 22, 33, 44, 55, 66, 77, 88, 99};
  struct Run {
    std::vector<TokenEvent> first, second;
    int cached = -1;
  };
  auto run = [&](const std::vector<int32_t>& second_prompt, bool reuse, bool full_sliding = false) {
    EngineOptions options = engine_options(1);
    options.backend = "reference";
    options.max_chunk_tokens = 4;
    options.full_sliding_cache = full_sliding;
    Transformer transformer(*model, options);
    BatchScheduler::Options scheduler_options;
    scheduler_options.prefill_chunk = 4;
    scheduler_options.reuse_prefixes = reuse;
    BatchScheduler scheduler(transformer, scheduler_options);
    Run result;
    for (const bool second : {false, true}) {
      SequenceRequest request;
      request.prompt = second ? second_prompt : first_prompt;
      request.max_tokens = second ? 4 : 12;
      request.ignore_eos = true;
      request.top_logprobs = 0;
      request.on_token = [&result, second](const TokenEvent& event) {
        (second ? result.second : result.first).push_back(event);
        return true;
      };
      std::promise<void> finished;
      request.on_finish = [&finished](const std::string&, const std::string&) { finished.set_value(); };
      auto handle = scheduler.submit(std::move(request));
      EXPECT_NE(handle, nullptr);
      if (handle) finished.get_future().wait();
      if (second) result.cached = handle->cached_prompt_tokens();
    }
    return result;
  };

  // What the slot holds after the first sequence: its prompt and the 11 tokens it fed back.
  const Run plain = run({2, 5}, false);
  ASSERT_EQ(plain.first.size(), 12u);
  EXPECT_EQ(plain.cached, 0);
  std::vector<int32_t> held = first_prompt;
  for (size_t i = 0; i + 1 < plain.first.size(); ++i) held.push_back(plain.first[i].token);
  ASSERT_EQ(held.size(), 21u);

  EngineOptions fresh_options = engine_options(1);
  fresh_options.backend = "reference";
  Transformer fresh(*model, fresh_options);
  const std::vector<int32_t> tail = {301, 302, 303};
  struct Case {
    int shared, reused_from_rings, reused_from_full;
  };
  for (const Case& item : std::vector<Case>{{21, 21, 21}, {18, 18, 18}, {17, 17, 17}, {16, 0, 16}, {12, 0, 12}, {3, 0, 3}}) {
    for (const bool full_sliding : {false, true}) {
      SCOPED_TRACE("sharing " + std::to_string(item.shared) + " tokens" + (full_sliding ? ", full sliding cache" : ""));
      std::vector<int32_t> prompt(held.begin(), held.begin() + item.shared);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const Run reused = run(prompt, true, full_sliding);
      EXPECT_EQ(reused.cached, full_sliding ? item.reused_from_full : item.reused_from_rings);
      ASSERT_EQ(reused.second.size(), 4u);
      std::vector<int32_t> text = prompt;
      for (const TokenEvent& event : reused.second) {
        const std::span<const float> logits = fresh.forward(text, 0);
        EXPECT_EQ(event.token, argmax(logits));
        ASSERT_TRUE(event.logprob.has_value());
        EXPECT_NEAR(*event.logprob, logits[static_cast<size_t>(event.token)] - log_normaliser_of(logits), 1e-4);
        text.push_back(event.token);
      }
    }
  }
  // The whole held text as the prompt: its last token is computed again, for the logits.
  EXPECT_EQ(run(held, true).cached, 20);
}

// A server answers a request from its finish callback; a metrics scrape right after the answer must not
// count that sequence as running any more (it did until the engine loop reaped its slot).
TEST(BatchScheduler, ASequenceNoLongerCountsAsRunningWhenItsFinishCallbackRuns) {
  auto model = Model::load(std::string(GEMMA4RT_TEST_DATA) + "/golden/tiny-e2b");
  Transformer transformer(*model, engine_options(2));
  BatchScheduler scheduler(transformer, BatchScheduler::Options{});
  std::mutex mutex;
  std::vector<int> running_at_finish;
  std::vector<std::string> reasons;
  for (const int max_tokens : {2, 6}) {
    SequenceRequest request;
    request.prompt = {2, 100, 200};
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    request.on_finish = [&](const std::string& reason, const std::string&) {
      const int running = scheduler.stats().running;
      std::lock_guard<std::mutex> lock(mutex);
      running_at_finish.push_back(running);
      reasons.push_back(reason);
    };
    ASSERT_NE(scheduler.submit(std::move(request)), nullptr);
  }
  scheduler.drain();
  // Whether the second joined before the first ended depends on timing; the last to finish never sees
  // itself, nor the other, as running.
  EXPECT_EQ(reasons, (std::vector<std::string>{"length", "length"}));
  ASSERT_EQ(running_at_finish.size(), 2u);
  EXPECT_LE(running_at_finish[0], 1);
  EXPECT_EQ(running_at_finish[1], 0);
  EXPECT_EQ(scheduler.stats().running, 0);
}

}  // namespace
}  // namespace gemma4rt
