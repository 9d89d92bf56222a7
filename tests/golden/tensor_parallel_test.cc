// In-process tensor parallelism: TP=2 and TP=4 give exactly the TP=1 greedy tokens and logits within
// 1e-4 of TP=1, for every golden variant. Global layers with one KV head exercise the replicate rule.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/transformer.h"
#include "test_support.h"

namespace gemma4rt {
namespace {

const std::string kGoldenDir = GEMMA4RT_TEST_DATA "/golden/";

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // per step
};

GreedyRun greedy(const Model& model, const std::vector<int32_t>& prompt, int steps, int tensor_parallel) {
  EngineOptions options;
  options.backend = "reference";
  options.context_tokens = 128;
  options.max_chunk_tokens = 16;
  options.tensor_parallel = tensor_parallel;
  Transformer transformer(model, options);
  GreedyRun run;
  std::span<const float> logits = transformer.forward(prompt, 0);
  int position = static_cast<int>(prompt.size());
  for (int step = 0; step < steps; ++step) {
    run.logits.emplace_back(logits.begin(), logits.end());
    const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(token);
    logits = transformer.forward(std::span<const int32_t>(&token, 1), position++);
  }
  return run;
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallel, MatchesSingleRank) {
  const auto& [name, degree] = GetParam();
  auto model = Model::load(kGoldenDir + name);
  const nlohmann::json golden = testing::read_json_file(kGoldenDir + name + "/golden.json");
  for (const auto& prompt : golden["prompts"]) {
    SCOPED_TRACE(prompt["name"].get<std::string>());
    const auto input_ids = prompt["input_ids"].get<std::vector<int32_t>>();
    const GreedyRun single = greedy(*model, input_ids, 24, 1);
    const GreedyRun sharded = greedy(*model, input_ids, 24, degree);
    EXPECT_EQ(sharded.tokens, single.tokens);
    EXPECT_EQ(single.tokens, prompt["greedy"]["tokens"].get<std::vector<int32_t>>());
    float worst = 0.0f;
    for (size_t step = 0; step < single.logits.size(); ++step) {
      for (size_t i = 0; i < single.logits[step].size(); ++i) worst = std::max(worst, std::fabs(single.logits[step][i] - sharded.logits[step][i]));
    }
    EXPECT_LE(worst, 1e-4f);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, TensorParallel,
                         ::testing::Combine(::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return testing::test_identifier(std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param)));
                         });

TEST(TensorParallelErrors, DegreeMustDivideTheHeads) {
  auto model = Model::load(kGoldenDir + "tiny-e2b");
  EngineOptions options;
  options.backend = "reference";
  options.context_tokens = 16;
  options.tensor_parallel = 3;
  try {
    Transformer transformer(*model, options);
    FAIL() << "TP=3 on 4 query heads must be refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("3"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace gemma4rt
