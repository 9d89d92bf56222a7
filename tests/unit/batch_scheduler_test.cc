// The scheduler keeps a failure to the request that causes it: when a step throws, each sequence is
// retried alone, and only the ones that fail alone end with "error".
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

struct Outcome {
  std::vector<int32_t> tokens;
  std::string reason, error;
};

std::map<std::string, Outcome> serve(const Model& model, const std::map<std::string, std::vector<int32_t>>& prompts) {
  EngineOptions options;
  options.context_tokens = 64;
  options.sequences = 4;
  Transformer transformer(model, options);
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

}  // namespace
}  // namespace gemma4rt
