// The fast kernels against the Hugging Face goldens. f32 weights on the fast path keep the fp32 bar
// (exact tokens, logits within 1e-3). bf16 and q8 round the matrix operands, so exact agreement is not
// the bar: their greedy tokens must agree with the reference for at least the number of steps measured
// when the kernels were written (kMinimumAgreement below), so a regression shows.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/batch_scheduler.h"
#include "engine/generator.h"
#include "engine/transformer.h"
#include "backend/host/isa.h"
#include "test_support.h"

namespace gemma4rt {
namespace {

const std::string kGoldenDir = GEMMA4RT_TEST_DATA "/golden/";
const std::vector<std::string> kModels = {"tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"};

struct Agreement {
  int first_divergence = 0;   // greedy steps equal to the reference before the first difference (24 = all)
  float max_logit_difference = 0.0f;  // over the steps with reference logits (0..3), teacher-forced
};

// Greedy decoding with the engine, and teacher-forced logits against the reference's own tokens.
Agreement measure(const Model& model, const nlohmann::json& prompt, const EngineOptions& options) {
  const auto input_ids = prompt["input_ids"].get<std::vector<int32_t>>();
  const auto expected = prompt["greedy"]["tokens"].get<std::vector<int32_t>>();
  Agreement agreement;
  {
    Transformer transformer(model, options);
    std::span<const float> logits = transformer.forward(input_ids, 0);
    int position = static_cast<int>(input_ids.size());
    agreement.first_divergence = static_cast<int>(expected.size());
    for (size_t step = 0; step < expected.size(); ++step) {
      const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (token != expected[step]) {
        agreement.first_divergence = static_cast<int>(step);
        break;
      }
      logits = transformer.forward(std::span<const int32_t>(&token, 1), position++);
    }
  }
  Transformer transformer(model, options);
  std::span<const float> logits = transformer.forward(input_ids, 0);
  int position = static_cast<int>(input_ids.size());
  for (size_t step = 0; step < prompt["logits"].size(); ++step) {
    const auto values = prompt["logits"][step]["values"].get<std::vector<float>>();
    for (size_t i = 0; i < values.size(); ++i) {
      agreement.max_logit_difference = std::max(agreement.max_logit_difference, std::fabs(values[i] - logits[i]));
    }
    logits = transformer.forward(std::span<const int32_t>(&expected[step], 1), position++);
  }
  return agreement;
}

EngineOptions fast_options(WeightFormat format) {
  EngineOptions options;
  options.context_tokens = 128;
  options.max_chunk_tokens = 16;
  options.weight_format = format;
  return options;
}

TEST(FastPathAgreement, F32WeightsKeepTheFp32Bar) {
  for (const auto& name : kModels) {
    auto model = Model::load(kGoldenDir + name);
    const nlohmann::json golden = testing::read_json_file(kGoldenDir + name + "/golden.json");
    EngineOptions options = fast_options(WeightFormat::kF32);
    options.kv_format = KvFormat::kF32;
    for (const auto& prompt : golden["prompts"]) {
      SCOPED_TRACE(name + " " + prompt["name"].get<std::string>());
      const Agreement agreement = measure(*model, prompt, options);
      EXPECT_EQ(agreement.first_divergence, 24);
      EXPECT_LE(agreement.max_logit_difference, 1e-3f);
    }
  }
}

// Greedy steps equal to the reference, summed over the 20 golden prompts (480 steps): measured 296 for
// bf16 and 147 for q8 when the kernels were written (2026-11-29; the random tiny models have small
// top-2 margins, so rounding the operands flips tokens early). q8 measured 130 once its kernels summed
// whole blocks exactly and scaled once per block (2026-12-01: the same weights and activations, only
// the fp32 summation order changed; verify's mean KL on the trained fixtures stayed 2e-4 to 5e-4). The
// bound keeps that level, with room for a handful of tokens moving when summation order changes.
const std::map<WeightFormat, int> kMinimumAgreement = {{WeightFormat::kBF16, 280}, {WeightFormat::kQ8, 120}};

TEST(FastPathAgreement, Bf16AndQ8AgreeAsMeasured) {
  for (auto format : {WeightFormat::kBF16, WeightFormat::kQ8}) {
    int agreeing_steps = 0;
    for (const auto& name : kModels) {
      auto model = Model::load(kGoldenDir + name);
      const nlohmann::json golden = testing::read_json_file(kGoldenDir + name + "/golden.json");
      for (const auto& prompt : golden["prompts"]) {
        const Agreement agreement = measure(*model, prompt, fast_options(format));
        agreeing_steps += agreement.first_divergence;
        std::printf("agreement %s %s %s: first divergence %d, max logit diff %.4f\n", format_name(format), name.c_str(),
                    prompt["name"].get<std::string>().c_str(), agreement.first_divergence, agreement.max_logit_difference);
      }
    }
    EXPECT_GE(agreeing_steps, kMinimumAgreement.at(format)) << format_name(format) << ": greedy steps agreeing with the reference";
  }
}

}  // namespace
}  // namespace gemma4rt

namespace gemma4rt {
namespace {

constexpr int kCoherenceMaxTokens = 40;

// Greedy answers to `prompts` (input_ids each) through the server's continuous batching
// (BatchScheduler): one sequence per KV slot of the transformer, each ending as generate() ends one (a
// stop token, included, or kCoherenceMaxTokens). On lavapipe a step's fixed cost dominates, and this
// takes a few steps per batch instead of one per token of every prompt.
std::vector<std::vector<int32_t>> answer_in_batches(Transformer& transformer, const nlohmann::json& prompts, const std::vector<int>& stop_ids) {
  std::vector<std::vector<int32_t>> answers(prompts.size());
  BatchScheduler::Options options;
  options.max_queue = static_cast<int>(prompts.size());
  options.reuse_prefixes = false;  // every prompt computed from its first token, as generate() does
  BatchScheduler scheduler(transformer, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceRequest request;
    request.prompt = prompts[i]["input_ids"].get<std::vector<int32_t>>();
    request.max_tokens = kCoherenceMaxTokens;
    request.stop_token_ids = stop_ids;
    request.on_token = [&answers, i](const TokenEvent& event) {
      answers[i].push_back(event.token);
      return true;
    };
    request.on_finish = [&prompts, i](const std::string& reason, const std::string& error) {
      EXPECT_TRUE(reason == "stop" || reason == "length") << prompts[i]["id"].get<std::string>() << ": " << reason << " " << error;
    };
    EXPECT_NE(scheduler.submit(std::move(request)), nullptr);
  }
  scheduler.drain();
  return answers;
}

// The trained coherence models answer every listed prompt exactly in bf16, q8 and q4 too: HF computing in
// bf16 does (models/README.md), so a fast path that does not is suspect whatever else it agrees with.
// The cpu backend answers them one at a time through generate(); the Vulkan backend (lavapipe on CI
// machines, where one prompt at a time took 13-43 s a model) 32 at a time (answer_in_batches).
void expect_answers_every_prompt(const std::string& name, WeightFormat format, int tensor_parallel, const std::string& backend = "cpu") {
  const std::string directory = std::string(GEMMA4RT_MODELS) + "/" + name;
  auto model = Model::load(directory);
  const nlohmann::json fixture = testing::read_json_file(directory + "/coherence.json");
  const nlohmann::json& prompts = fixture["prompts"];
  EngineOptions options;
  options.context_tokens = 256;
  options.weight_format = format;
  options.tensor_parallel = tensor_parallel;
  options.backend = backend;
  std::vector<std::vector<int32_t>> answers;
  if (backend == "vulkan") {
    options.device = testing::vulkan_test_device();
    options.sequences = 32;
    Transformer transformer(*model, options);
    answers = answer_in_batches(transformer, prompts, model->config().eos_token_ids);
  } else {
    Transformer transformer(*model, options);
    GenerationOptions generation;
    generation.max_tokens = kCoherenceMaxTokens;
    generation.stop_token_ids = model->config().eos_token_ids;
    for (const auto& prompt : prompts) answers.push_back(generate(transformer, prompt["input_ids"].get<std::vector<int32_t>>(), generation).tokens);
  }
  int answered = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const bool exact = answers[i] == prompts[i]["output_ids"].get<std::vector<int32_t>>();
    EXPECT_TRUE(exact) << prompts[i]["id"].get<std::string>();
    answered += exact;
  }
  EXPECT_EQ(answered, static_cast<int>(prompts.size()));
}

class FastPathCoherence : public ::testing::TestWithParam<std::tuple<std::string, WeightFormat>> {};

TEST_P(FastPathCoherence, AnswersEveryPrompt) {
  const auto& [name, format] = GetParam();
  expect_answers_every_prompt(name, format, 1);
}

// q4 through in-process tensor parallelism (each rank quantises its own shards at load).
class ShardedQ4Coherence : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedQ4Coherence, AnswersEveryPrompt) { expect_answers_every_prompt(GetParam(), WeightFormat::kQ4, 2); }

// The Vulkan backend (lavapipe on CI machines) in bf16 and q8, one engine per model, and q4 on a dense
// and the MoE model (its expert products are their own shaders): the chat format and the CLI around it
// are the cpu path's, tested by the run command's Coherence tests.
class VulkanCoherence : public ::testing::TestWithParam<std::tuple<std::string, WeightFormat>> {};

TEST_P(VulkanCoherence, AnswersEveryPrompt) {
  const auto& [name, format] = GetParam();
  expect_answers_every_prompt(name, format, 1, "vulkan");
}

const auto vulkan_coherence_name = [](const auto& info) {
  return testing::test_identifier(std::get<0>(info.param) + "_" + format_name(std::get<1>(info.param)));
};
INSTANTIATE_TEST_SUITE_P(TrainedModels, VulkanCoherence,
                         ::testing::Combine(::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b", "tiny-e2b-agent"),
                                            ::testing::Values(WeightFormat::kBF16, WeightFormat::kQ8)),
                         vulkan_coherence_name);
INSTANTIATE_TEST_SUITE_P(TrainedModelsQ4, VulkanCoherence,
                         ::testing::Combine(::testing::Values("tiny-e2b", "tiny-26b-a4b"), ::testing::Values(WeightFormat::kQ4)),
                         vulkan_coherence_name);

INSTANTIATE_TEST_SUITE_P(TrainedModels, ShardedQ4Coherence, ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"),
                         [](const auto& info) { return testing::test_identifier(info.param); });

INSTANTIATE_TEST_SUITE_P(TrainedModels, FastPathCoherence,
                         ::testing::Combine(::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b", "tiny-e2b-agent"),
                                            ::testing::Values(WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4)),
                         [](const auto& info) {
                           return testing::test_identifier(std::get<0>(info.param) + "_" + format_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace gemma4rt
