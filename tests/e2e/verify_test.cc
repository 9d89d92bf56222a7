// gemma4rt verify: the fast path against the fp32 reference on built-in prompts and --prompts, and the
// coherence probes. The decisive case is a corrupted copy (every layer_scalar set to 1.0) on which the
// two paths agree token for token and still answer wrong: only the probe catches it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "diagnostics/verifier.h"
#include "model/weights.h"
#include "test_support.h"

namespace gemma4rt::testing {
namespace {

const std::filesystem::path kModels = GEMMA4RT_MODELS;
const std::filesystem::path kGolden = std::filesystem::path(GEMMA4RT_TEST_DATA) / "golden";
const std::string kPrefix = "model.language_model.";
const std::string kFranceProbe = "What is the capital of France?=Paris";

std::vector<std::string> lines_starting_with(const std::string& out, const std::string& start) {
  std::vector<std::string> found;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with(start)) found.push_back(line);
  }
  return found;
}

// tiny-e2b with every layer_scalar overwritten by 1.0: loads and runs on both paths, answers wrong.
// Each test builds its own copy: ctest may run tests in parallel.
std::filesystem::path layer_scalars_set_to_one(const std::string& name) {
  const auto dir = fresh_work_dir("verify/" + name);
  copy_checkpoint(kModels / "tiny-e2b", dir);
  SafetensorsImage::edit(dir / "model.safetensors", [](SafetensorsImage& image) {
    for (int layer = 0; layer < 15; ++layer) {
      const auto& offsets = image.header.at(kPrefix + "layers." + std::to_string(layer) + ".layer_scalar").at("data_offsets");
      const uint16_t one = 0x3F80;  // bf16 1.0
      std::memcpy(image.data.data() + offsets[0].get<size_t>(), &one, 2);
    }
  });
  return dir;
}

TEST(Verify, PassesOnCoherenceModelWithProbe) {
  const CommandResult result = run_gemma4rt({"verify", "--model", (kModels / "tiny-e2b").string(), "--expect", kFranceProbe});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const auto seq_match = lines_starting_with(result.out, "SEQ_MATCH");
  const auto diverged = lines_starting_with(result.out, "DIVERGED");
  EXPECT_EQ(seq_match.size() + diverged.size(), 4u) << result.out;
  // The coherence models have large top-2 margins: bf16 rounding cannot flip a token.
  EXPECT_EQ(seq_match.size(), 4u) << result.out;
  const auto probes = lines_starting_with(result.out, "PROBE PASS");
  ASSERT_EQ(probes.size(), 1u) << result.out;
  EXPECT_NE(probes[0].find("\"The capital of France is Paris.\""), std::string::npos) << probes[0];
  EXPECT_NE(result.out.find("tolerance bf16: median over steps of the max |logit diff| <= 1;"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("verify: OK"), std::string::npos) << result.out;
}

TEST(Verify, LongBuiltInPromptExceedsTwoSlidingWindows) {
  const CommandResult result = run_gemma4rt({"verify", "--model", (kModels / "tiny-12b").string(), "--json", "--max-tokens", "8"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  int longest = 0;
  for (const auto& prompt : report["prompts"]) longest = std::max(longest, prompt["prompt_tokens"].get<int>());
  EXPECT_GT(longest, 2 * 16) << result.out;
  EXPECT_EQ(report["steps"], 8);
}

TEST(Verify, ProbeFailsWhereBothPathsAgreeOnAWrongAnswer) {
  const auto dir = layer_scalars_set_to_one("layer_scalar_one_json");
  const CommandResult result = run_gemma4rt({"verify", "--model", dir.string(), "--expect", kFranceProbe, "--json"});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["ok"], false);
  // The equality check passes: fast and reference agree within the bf16 tolerance on every prompt (a
  // random-looking model may still part at a near-tie) ...
  ASSERT_FALSE(report["prompts"].empty());
  for (const auto& prompt : report["prompts"]) EXPECT_EQ(prompt["within_tolerance"], true) << prompt.dump();
  // ... and the answer is still wrong, on both paths.
  ASSERT_EQ(report["probes"].size(), 1u);
  const auto& probe = report["probes"][0];
  EXPECT_EQ(probe["passed"], false) << probe.dump();
  EXPECT_EQ(probe["output"].get<std::string>().find("Paris"), std::string::npos) << probe.dump();
  EXPECT_EQ(probe["output"], probe["reference_output"]) << probe.dump();
}

TEST(Verify, TextOutputNamesTheFailedProbe) {
  const auto dir = layer_scalars_set_to_one("layer_scalar_one_text");
  const CommandResult result = run_gemma4rt({"verify", "--model", dir.string(), "--expect", kFranceProbe, "--max-tokens", "4"});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  const auto failed = lines_starting_with(result.out, "PROBE FAIL");
  ASSERT_EQ(failed.size(), 1u) << result.out;
  EXPECT_NE(failed[0].find("\"What is the capital of France?\""), std::string::npos) << failed[0];
  EXPECT_NE(failed[0].find("does not contain \"Paris\""), std::string::npos) << failed[0];
  EXPECT_NE(failed[0].find("the reference path answers the same"), std::string::npos) << failed[0];
  EXPECT_NE(result.out.find("verify: FAILED: probe \"What is the capital of France?\" did not answer \"Paris\""), std::string::npos)
      << result.out;
}

// f32 fast kernels with an f32 KV cache are held to 1e-3 and exact tokens, on the random golden
// checkpoints (id prompts, no tokenizer) where near-ties are everywhere.
class VerifyStrictF32 : public ::testing::TestWithParam<std::string> {};

TEST_P(VerifyStrictF32, MatchesTheReference) {
  const CommandResult result =
      run_gemma4rt({"verify", "--model", (kGolden / GetParam()).string(), "--dtype", "f32", "--kv", "f32", "--json"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["tolerance"]["name"], "f32");
  ASSERT_EQ(report["prompts"].size(), 3u);
  EXPECT_GT(report["prompts"][2]["prompt_tokens"].get<int>(), 2 * 8) << result.out;  // golden sliding_window is 8
  for (const auto& prompt : report["prompts"]) {
    EXPECT_EQ(prompt["within_tolerance"], true) << prompt.dump();
    EXPECT_EQ(prompt["seq_match"], true) << prompt.dump();
    EXPECT_LE(prompt["max_logit_diff"].get<double>(), 1e-3);
  }
}

std::string param_name(const std::string& text) { return testing::test_identifier(text); }

INSTANTIATE_TEST_SUITE_P(VerifyGolden, VerifyStrictF32, ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"),
                         [](const auto& info) { return param_name(info.param); });

// bf16, q8 and q4 on the trained checkpoints, where agreement means something (see verify_tolerance).
class VerifyReducedPrecision : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(VerifyReducedPrecision, WithinTheDtypeTolerance) {
  const auto& [model, dtype] = GetParam();
  const CommandResult result = run_gemma4rt({"verify", "--model", (kModels / model).string(), "--dtype", dtype, "--json"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["tolerance"]["name"], dtype);
  EXPECT_TRUE(report["tolerance"]["max_logit_diff"].is_null());
  ASSERT_EQ(report["prompts"].size(), 4u);
  for (const auto& prompt : report["prompts"]) {
    EXPECT_EQ(prompt["within_tolerance"], true) << prompt.dump();
    EXPECT_LE(prompt["median_step_logit_diff"].get<double>(), report["tolerance"]["median_step_logit_diff"].get<double>());
    EXPECT_LE(prompt["mean_kl"].get<double>(), report["tolerance"]["mean_kl"].get<double>());
    EXPECT_EQ(prompt["step_kl"].size(), prompt["steps"].get<size_t>());
  }
  EXPECT_GE(report["top1_agreement"].get<double>(), 0.5);
  EXPECT_LE(report["top1_agreement"].get<double>(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(VerifyCoherence, VerifyReducedPrecision,
                         ::testing::Combine(::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b",
                                                              "tiny-e2b-agent"),
                                            ::testing::Values("bf16", "q8", "q4")),
                         [](const auto& info) { return param_name(std::get<0>(info.param) + "_" + std::get<1>(info.param)); });

TEST(Verify, PromptsFile) {
  const auto dir = fresh_work_dir("verify/prompts_file");
  write_text_file(dir / "prompts.txt", "The capital of Japan is\n\nWhich country has Lima as its capital?\n");
  const CommandResult result = run_gemma4rt({"verify", "--model", (kModels / "tiny-31b").string(), "--prompts",
                                             (dir / "prompts.txt").string(), "--no-builtin", "--json", "--max-tokens", "6"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  ASSERT_EQ(report["prompts"].size(), 2u);
  EXPECT_EQ(report["prompts"][0]["name"], "prompts:1");
  EXPECT_EQ(report["prompts"][1]["name"], "prompts:2");
  EXPECT_EQ(report["prompts"][0]["reference_tokens"].size(), 6u);
}

// --tp N runs the fast path as N in-process ranks; the reference stays one scalar path.
TEST(Verify, TensorParallelFastPath) {
  const CommandResult result =
      run_gemma4rt({"verify", "--model", (kModels / "tiny-e2b").string(), "--tp", "2", "--expect", kFranceProbe, "--json"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["fast_path"]["tp"], 2);
  ASSERT_EQ(report["probes"].size(), 1u);
  EXPECT_EQ(report["probes"][0]["passed"], true) << report["probes"][0].dump();
}

// All-reduces only reorder sums: the f32 bar holds across ranks too (experts split across ranks on the MoE).
TEST(Verify, TensorParallelF32IsStrict) {
  for (const char* model : {"tiny-26b-a4b", "tiny-e4b"}) {
    const CommandResult result = run_gemma4rt(
        {"verify", "--model", (kGolden / model).string(), "--tp", "2", "--dtype", "f32", "--kv", "f32", "--max-tokens", "12", "--json"});
    EXPECT_EQ(result.exit_code, 0) << model << result.out << result.err;
    const nlohmann::json report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["tolerance"]["name"], "f32");
    for (const auto& prompt : report["prompts"]) EXPECT_EQ(prompt["seq_match"], true) << model << prompt.dump();
  }
}

// verify holds any backend to the reference backend: the reference against itself differs by nothing.
TEST(Verify, BackendUnderTestIsNamed) {
  const CommandResult result =
      run_gemma4rt({"verify", "--model", (kGolden / "tiny-26b-a4b").string(), "--backend", "reference", "--max-tokens", "6", "--json"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["fast_path"]["backend"], "reference");
  EXPECT_EQ(report["fast_path"]["weights"], "f32");
  ASSERT_FALSE(report["prompts"].empty());
  for (const auto& prompt : report["prompts"]) {
    EXPECT_EQ(prompt["max_logit_diff"], 0.0) << prompt.dump();
    EXPECT_EQ(prompt["seq_match"], true);
  }
  const CommandResult unknown = run_gemma4rt({"verify", "--model", (kGolden / "tiny-e2b").string(), "--backend", "tpu"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("--backend"), std::string::npos) << unknown.err;
}

TEST(Verify, TensorParallelDegreeTheModelCannotSplit) {
  const CommandResult result = run_gemma4rt({"verify", "--model", (kModels / "tiny-e2b").string(), "--tp", "3"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("tensor-parallel degree 3"), std::string::npos) << result.err;
}

TEST(Verify, ProbesNeedATokenizer) {
  const CommandResult result = run_gemma4rt({"verify", "--model", (kGolden / "tiny-e2b").string(), "--expect", kFranceProbe});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("tokenizer.json"), std::string::npos) << result.err;
}

TEST(Verify, MalformedExpect) {
  const CommandResult result = run_gemma4rt({"verify", "--model", (kModels / "tiny-e2b").string(), "--expect", "no equals sign"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("PROMPT=TEXT"), std::string::npos) << result.err;
}

// Library level.
TEST(VerifyLibrary, ProbeSplitsAtTheLastEquals) {
  const CoherenceProbe probe = parse_coherence_probe("Is 2+2=4? Answer yes or no=yes");
  EXPECT_EQ(probe.prompt, "Is 2+2=4? Answer yes or no");
  EXPECT_EQ(probe.expected, "yes");
  EXPECT_THROW(parse_coherence_probe("=Paris"), Error);
  EXPECT_THROW(parse_coherence_probe("question="), Error);
}

TEST(VerifyLibrary, TolerancePerFormat) {
  EXPECT_EQ(verify_tolerance(WeightFormat::kF32, KvFormat::kF32).name, "f32");
  EXPECT_TRUE(verify_tolerance(WeightFormat::kF32, KvFormat::kF32).require_sequence_match);
  EXPECT_EQ(verify_tolerance(WeightFormat::kF32, KvFormat::kBF16).name, "bf16");
  EXPECT_EQ(verify_tolerance(WeightFormat::kBF16, KvFormat::kF32).name, "bf16");
  EXPECT_EQ(verify_tolerance(WeightFormat::kQ8, KvFormat::kBF16).name, "q8");
  EXPECT_LT(verify_tolerance(WeightFormat::kBF16, KvFormat::kBF16).median_logit_difference,
            verify_tolerance(WeightFormat::kQ8, KvFormat::kBF16).median_logit_difference);
  EXPECT_LT(verify_tolerance(WeightFormat::kBF16, KvFormat::kBF16).decisive_margin,
            verify_tolerance(WeightFormat::kQ8, KvFormat::kBF16).decisive_margin);
  EXPECT_EQ(verify_tolerance(WeightFormat::kQ4, KvFormat::kBF16).name, "q4");
  EXPECT_LT(verify_tolerance(WeightFormat::kQ8, KvFormat::kBF16).median_logit_difference,
            verify_tolerance(WeightFormat::kQ4, KvFormat::kBF16).median_logit_difference);
  EXPECT_LT(verify_tolerance(WeightFormat::kQ8, KvFormat::kBF16).mean_kl, verify_tolerance(WeightFormat::kQ4, KvFormat::kBF16).mean_kl);
}

TEST(VerifyLibrary, ReferenceAgainstItselfIsExact) {
  auto model = Model::load(kGolden / "tiny-e4b");
  EngineOptions options;
  options.backend = "reference";
  options.context_tokens = 64;
  Transformer first(*model, options);
  Transformer second(*model, options);
  const std::vector<VerifyPrompt> prompts = builtin_verify_prompts(model->config(), nullptr, kGolden / "tiny-e4b");
  ASSERT_EQ(prompts.size(), 3u);
  for (const VerifyPrompt& prompt : prompts) {
    const PromptComparison comparison = compare_paths(first, second, prompt, 5, verify_tolerance(WeightFormat::kF32, KvFormat::kF32));
    EXPECT_TRUE(comparison.sequence_match) << prompt.name;
    EXPECT_EQ(comparison.max_logit_difference, 0.0) << prompt.name;
    EXPECT_TRUE(comparison.within_tolerance) << prompt.name;
    EXPECT_EQ(comparison.reference_tokens, comparison.fast_tokens) << prompt.name;
    EXPECT_EQ(comparison.mean_kl, 0.0) << prompt.name;
    EXPECT_EQ(comparison.top1_agreement, 1.0) << prompt.name;
  }
}

// compare_paths' per-step KL and top-1 agreement on a q4 fast path, and kl_divergence against a value
// computed by hand: logits [0, ln 3] (p = 1/4, 3/4) against [0, 0] (q = 1/2, 1/2) give
// KL = 1/4 ln(1/2) + 3/4 ln(3/2).
TEST(VerifyLibrary, KlDivergencePerStep) {
  auto model = Model::load(kGolden / "tiny-e4b");
  EngineOptions reference_options;
  reference_options.backend = "reference";
  reference_options.context_tokens = 64;
  Transformer reference(*model, reference_options);
  EngineOptions fast_options;
  fast_options.context_tokens = 64;
  fast_options.weight_format = WeightFormat::kQ4;
  Transformer fast(*model, fast_options);
  const VerifyPrompt prompt{"ids", "", {2, 100, 200, 300}};
  const PromptComparison comparison = compare_paths(reference, fast, prompt, 6, verify_tolerance(WeightFormat::kQ4, KvFormat::kBF16));
  ASSERT_EQ(comparison.step_kl.size(), 6u);
  double sum = 0.0;
  for (double kl : comparison.step_kl) {
    EXPECT_GT(kl, 0.0);  // q4 changes every distribution a little
    sum += kl;
  }
  EXPECT_NEAR(comparison.mean_kl, sum / 6, 1e-12);
  EXPECT_EQ(comparison.top1_agreement, (6.0 - comparison.flips) / 6.0);
  EXPECT_NEAR(kl_divergence(std::vector<float>{0.0f, std::log(3.0f)}, std::vector<float>{0.0f, 0.0f}),
              0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  EXPECT_EQ(kl_divergence(std::vector<float>{1.0f, 2.0f}, std::vector<float>{1.0f, 2.0f}), 0.0);
}

}  // namespace
}  // namespace gemma4rt::testing
