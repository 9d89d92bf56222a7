// `gemma4rt run` end to end: the golden checkpoints through --prompt-ids --json, and the trained
// coherence models answering every listed question through --chat, --prompt and --prompt-ids.
#include <algorithm>
#include <cstdlib>

#include <gtest/gtest.h>

#include "test_support.h"

namespace gemma4rt::testing {
namespace {

const std::filesystem::path kGolden = std::filesystem::path(GEMMA4RT_TEST_DATA) / "golden";
const std::filesystem::path kModels = GEMMA4RT_MODELS;


nlohmann::json run_json(const std::vector<std::string>& arguments) {
  std::vector<std::string> full = {"run"};
  full.insert(full.end(), arguments.begin(), arguments.end());
  full.push_back("--json");
  const CommandResult result = run_gemma4rt(full);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  if (result.exit_code != 0) return nlohmann::json::object();
  // Exactly one JSON object on stdout.
  return nlohmann::json::parse(result.out);
}

class RunGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(RunGolden, PromptIdsJsonGivesReferenceGreedyTokens) {
  const auto model_dir = kGolden / GetParam();
  const nlohmann::json golden = read_json_file(model_dir / "golden.json");
  for (const auto& prompt : golden["prompts"]) {
    SCOPED_TRACE(prompt["name"].get<std::string>());
    const auto expected = prompt["greedy"]["tokens"].get<std::vector<int>>();
    const nlohmann::json output = run_json({"--model", model_dir.string(), "--prompt-ids", join_ids(prompt["input_ids"].get<std::vector<int>>()),
                                            "--ignore-eos", "--max-tokens", std::to_string(expected.size()), "--ctx", "128", "--reference"});
    ASSERT_TRUE(output.contains("tokens"));
    EXPECT_EQ(output["prompt_tokens"], prompt["input_ids"]);
    EXPECT_EQ(output["tokens"].get<std::vector<int>>(), expected);
    EXPECT_EQ(output["finish_reason"], "length");
    EXPECT_TRUE(output["timings"]["prefill_ms"].is_number());
    EXPECT_TRUE(output["timings"]["decode_ms"].is_number());
    EXPECT_GT(output["timings"]["decode_tokens_per_s"].get<double>(), 0.0);
  }
}

// --backend reference is what --reference names; --backend cpu with f32 weights and KV holds the goldens too.
TEST_P(RunGolden, BackendFlagSelectsTheBackend) {
  const auto model_dir = kGolden / GetParam();
  const nlohmann::json golden = read_json_file(model_dir / "golden.json");
  const auto& prompt = golden["prompts"][0];
  const auto expected = prompt["greedy"]["tokens"].get<std::vector<int>>();
  const std::vector<std::string> common = {"--model", model_dir.string(), "--prompt-ids", join_ids(prompt["input_ids"].get<std::vector<int>>()),
                                           "--ignore-eos", "--max-tokens", std::to_string(expected.size()), "--ctx", "128"};
  for (const std::vector<std::string>& backend : {std::vector<std::string>{"--backend", "reference"},
                                                  std::vector<std::string>{"--backend", "cpu", "--dtype", "f32", "--kv", "f32"}}) {
    SCOPED_TRACE(backend[1]);
    std::vector<std::string> arguments = common;
    arguments.insert(arguments.end(), backend.begin(), backend.end());
    const nlohmann::json output = run_json(arguments);
    ASSERT_TRUE(output.contains("tokens"));
    EXPECT_EQ(output["tokens"].get<std::vector<int>>(), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, RunGolden,
                         ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"), string_param_name);

// The trained models through the CLI on the default path (the Vulkan backend's answers are checked in
// process, one engine per model: tests/golden/fast_path_agreement_test.cc).
class Coherence : public ::testing::TestWithParam<std::string> {};

// Capital questions through --chat (the chat format renders and tokenizes them), completions through
// --prompt; the answer's tokens, stop token included, and its text are exactly the reference's.
TEST_P(Coherence, AnswersEveryListedPrompt) {
  const auto model_dir = kModels / GetParam();
  const nlohmann::json fixture = read_json_file(model_dir / "coherence.json");
  int answered = 0;
  for (const auto& prompt : fixture["prompts"]) {
    const std::string kind = prompt["kind"];
    SCOPED_TRACE(prompt["id"].get<std::string>() + " " + kind);
    std::vector<std::string> arguments = {"--model", model_dir.string(), "--max-tokens", "40"};
    if (kind == "raw_completion") {
      arguments.insert(arguments.end(), {"--prompt", prompt["text"].get<std::string>()});
    } else if (kind == "chat_capital_of_country" || kind == "chat_country_of_capital") {
      ASSERT_EQ(prompt["messages"].size(), 1u);
      arguments.insert(arguments.end(), {"--chat", prompt["messages"][0]["content"].get<std::string>()});
    } else {
      // Thinking and tool-call turns: rendering them from messages is the server's job.
      arguments.insert(arguments.end(), {"--prompt-ids", join_ids(prompt["input_ids"].get<std::vector<int>>())});
    }
    const nlohmann::json output = run_json(arguments);
    ASSERT_TRUE(output.contains("tokens"));
    EXPECT_EQ(output["prompt_tokens"], prompt["input_ids"]);
    EXPECT_EQ(output["tokens"], prompt["output_ids"]);
    EXPECT_EQ(output["text"], prompt["output_text"]);
    EXPECT_EQ(output["finish_reason"], "stop");
    if (output["tokens"] == prompt["output_ids"] && output["text"] == prompt["output_text"]) ++answered;
  }
  EXPECT_EQ(answered, static_cast<int>(fixture["prompts"].size()));
}

INSTANTIATE_TEST_SUITE_P(TrainedModels, Coherence,
                         ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b", "tiny-e2b-agent"), string_param_name);

// Without a Vulkan driver, --backend vulkan fails with one clear line; the binary itself still runs.
TEST(VulkanBackend, NoDriverIsOneClearError) {
  setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json", 1);
  setenv("VK_DRIVER_FILES", "/nonexistent/icd.json", 1);
  const CommandResult result =
      run_gemma4rt({"run", "--model", (kModels / "tiny-e2b").string(), "--backend", "vulkan", "--prompt-ids", "2,17", "--max-tokens", "2"});
  const CommandResult devices = run_gemma4rt({"devices"});
  unsetenv("VK_ICD_FILENAMES");
  unsetenv("VK_DRIVER_FILES");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_TRUE(result.err.starts_with("gemma4rt: error: Vulkan")) << result.err;
  EXPECT_EQ(devices.exit_code, 1) << devices.err;
  const CommandResult cpu = run_gemma4rt({"run", "--model", (kModels / "tiny-e2b").string(), "--chat", "What is the capital of France?"});
  EXPECT_EQ(cpu.exit_code, 0) << cpu.err;
}

// A CPU device (lavapipe) is not picked unless named; a named device that does not exist is an error;
// tensor parallelism is refused.
TEST(VulkanBackend, DeviceChoiceAndRefusals) {
  const CommandResult listed = run_gemma4rt({"devices", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  const nlohmann::json devices = nlohmann::json::parse(listed.out)["devices"];
  ASSERT_FALSE(devices.empty());
  for (const auto& device : devices) {
    EXPECT_TRUE(device["push_descriptor"].get<bool>()) << device.dump();
    if (device["type"] == "cpu") {
      EXPECT_FALSE(device["default"].get<bool>()) << device.dump();
    }
  }
  const std::string model = (kModels / "tiny-e2b").string();
  const CommandResult missing = run_gemma4rt({"run", "--model", model, "--backend", "vulkan", "--device", "99", "--prompt-ids", "2", "--max-tokens", "1"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("Vulkan device 99 does not exist"), std::string::npos) << missing.err;
  // verify takes --device for the backend under test as the other commands do.
  const CommandResult verify_missing = run_gemma4rt({"verify", "--model", model, "--backend", "vulkan", "--device", "99", "-n", "1"});
  EXPECT_EQ(verify_missing.exit_code, 1);
  EXPECT_NE(verify_missing.err.find("Vulkan device 99 does not exist"), std::string::npos) << verify_missing.err;
  const CommandResult sharded = run_gemma4rt({"run", "--model", model, "--backend", "vulkan", "--device", std::to_string(vulkan_test_device()),
                                              "--tp", "2", "--prompt-ids", "2", "--max-tokens", "1"});
  EXPECT_EQ(sharded.exit_code, 1);
  EXPECT_NE(sharded.err.find("does not run tensor parallelism"), std::string::npos) << sharded.err;
}

// doctor's one-token forward and bench run on the device named with --device; bench's roofline is the
// device's own bandwidth probe.
TEST(VulkanBackend, DoctorAndBenchOnTheDevice) {
  const std::string device = std::to_string(vulkan_test_device());
  const CommandResult doctor = run_gemma4rt({"doctor", "--model", (kModels / "tiny-12b").string(), "--backend", "vulkan", "--device", device});
  EXPECT_EQ(doctor.exit_code, 0) << doctor.out << doctor.err;
  EXPECT_NE(doctor.out.find("PASS  forward: one <bos> on the vulkan backend"), std::string::npos) << doctor.out;
  const CommandResult bench = run_gemma4rt({"bench", "--model", (kModels / "tiny-12b").string(), "--backend", "vulkan", "--device", device,
                                            "-p", "16", "-n", "4", "--json"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json figures = nlohmann::json::parse(bench.out);
  EXPECT_EQ(figures["backend"], "vulkan");
  EXPECT_GT(figures["roofline_decode_tokens_per_s"].get<double>(), figures["decode_tokens_per_s"].get<double>()) << figures.dump();
  EXPECT_GT(figures["read_bandwidth_gb_s"].get<double>(), 0.0) << figures.dump();
}

// The agent model also answers thinking-off capital questions rendered by the chat format itself.
TEST(CoherenceAgent, ThinkingPromptRenderedFromChatFlag) {
  const auto model_dir = kModels / "tiny-e2b-agent";
  const nlohmann::json fixture = read_json_file(model_dir / "coherence.json");
  for (const auto& prompt : fixture["prompts"]) {
    if (prompt["kind"] != "chat_thinking") continue;
    const nlohmann::json output = run_json({"--model", model_dir.string(), "--chat", prompt["messages"][0]["content"].get<std::string>(),
                                            "--thinking", "--max-tokens", "40"});
    EXPECT_EQ(output["prompt_tokens"], prompt["input_ids"]);
    EXPECT_EQ(output["tokens"], prompt["output_ids"]);
    break;  // one is enough here: the rendering of every case is covered by the chat format tests
  }
}

// --thinking keeps the reasoning apart: its own stream (stderr) when streaming, a "reasoning" field in
// --json; the answer alone is the text. --logprobs N gives each token's log-probability and N alternatives.
TEST(RunCommand, ThinkingApartAndLogprobs) {
  const auto model_dir = kModels / "tiny-e2b-agent";
  const nlohmann::json fixture = read_json_file(model_dir / "coherence.json");
  for (const auto& prompt : fixture["prompts"]) {
    if (prompt["kind"] != "chat_thinking") continue;
    const std::string question = prompt["messages"][0]["content"];
    const nlohmann::json output =
        run_json({"--model", model_dir.string(), "--chat", question, "--thinking", "--max-tokens", "60", "--logprobs", "2"});
    EXPECT_EQ(output["tokens"], prompt["output_ids"]);
    const std::string with_special = prompt["output_text_with_special_tokens"];
    const size_t open = with_special.find("thought\n") + 8, close = with_special.find("<channel|>");
    EXPECT_EQ(output["reasoning"], with_special.substr(open, close - open));
    EXPECT_EQ(output["text"], with_special.substr(close + 10, with_special.find("<turn|>") - close - 10));
    ASSERT_EQ(output["logprobs"].size(), output["tokens"].size());
    for (size_t i = 0; i < output["tokens"].size(); ++i) {
      const auto& entry = output["logprobs"][i];
      EXPECT_EQ(entry["id"], output["tokens"][i]);
      ASSERT_EQ(entry["top_logprobs"].size(), 2u);
      EXPECT_EQ(entry["top_logprobs"][0]["id"], entry["id"]);  // greedy: the chosen token is the most likely
      EXPECT_LE(entry["logprob"].get<double>(), 0.0);
      EXPECT_GE(entry["top_logprobs"][0]["logprob"].get<double>(), entry["top_logprobs"][1]["logprob"].get<double>());
    }
    const CommandResult streamed = run_gemma4rt({"run", "--model", model_dir.string(), "--chat", question, "--thinking", "--max-tokens", "60"});
    ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
    EXPECT_EQ(streamed.out, output["text"].get<std::string>() + "\n");
    EXPECT_NE(streamed.err.find(output["reasoning"].get<std::string>()), std::string::npos) << streamed.err;
    break;
  }
}

// --version, and every --help shows the defaults of its options.
TEST(RunCommand, VersionAndDefaultsInHelp) {
  const CommandResult version = run_gemma4rt({"--version"});
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_TRUE(version.out.starts_with("gemma4rt ")) << version.out;
  const CommandResult run_help = run_gemma4rt({"run", "--help"});
  EXPECT_NE(run_help.out.find("--ctx INT:>= 1=4096"), std::string::npos) << run_help.out;
  EXPECT_NE(run_help.out.find("=256"), std::string::npos) << run_help.out;  // --max-tokens
  const CommandResult serve_help = run_gemma4rt({"serve", "--help"});
  EXPECT_NE(serve_help.out.find("=8080"), std::string::npos) << serve_help.out;  // --port
}

TEST(RunCommand, StreamsTextWithoutJson) {
  const CommandResult result = run_gemma4rt({"run", "--model", (kModels / "tiny-e2b").string(), "--chat", "What is the capital of France?"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "The capital of France is Paris.\n");
}

TEST(RunCommand, SamplingIsReproducibleWithASeed) {
  const std::vector<std::string> arguments = {"--model", (kModels / "tiny-e4b").string(), "--prompt", "The capital of", "--temperature", "1.5",
                                              "--top-k", "50", "--top-p", "0.95", "--seed", "7", "--max-tokens", "12", "--ignore-eos"};
  const nlohmann::json first = run_json(arguments);
  const nlohmann::json second = run_json(arguments);
  EXPECT_EQ(first["tokens"], second["tokens"]);
  EXPECT_EQ(first["tokens"].size(), 12u);
}

// --seed -1 draws a seed (as llama.cpp reads it) and prints it, so that run can be repeated exactly.
TEST(RunCommand, SeedMinusOneDrawsOneAndSaysWhich) {
  std::vector<std::string> arguments = {"run", "--model", (kModels / "tiny-e4b").string(), "--prompt", "The capital of", "--temperature", "1.5",
                                        "--max-tokens", "12", "--ignore-eos", "--json", "--seed", "-1"};
  auto drawn_seed = [](const CommandResult& result) {
    const size_t at = result.err.find("seed: ");
    EXPECT_NE(at, std::string::npos) << result.err;
    return at == std::string::npos ? std::string() : result.err.substr(at + 6, result.err.find('\n', at) - at - 6);
  };
  const CommandResult first = run_gemma4rt(arguments), second = run_gemma4rt(arguments);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const std::string seed = drawn_seed(first);
  EXPECT_NE(seed, drawn_seed(second));
  arguments.back() = seed;
  const CommandResult repeated = run_gemma4rt(arguments);
  ASSERT_EQ(repeated.exit_code, 0) << repeated.err;
  EXPECT_EQ(repeated.err.find("seed: "), std::string::npos) << repeated.err;  // a given seed is not echoed
  EXPECT_EQ(nlohmann::json::parse(repeated.out)["tokens"], nlohmann::json::parse(first.out)["tokens"]);
}

// bench --sequences runs steps of several sequences beside single-sequence ones and reports both.
TEST(BenchCommand, StepsOfSeveralSequences) {
  const CommandResult bench = run_gemma4rt(
      {"bench", "--model", (kModels / "tiny-e2b").string(), "-p", "4", "-n", "9", "--sequences", "5", "--json", "--threads", "1"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json batched = nlohmann::json::parse(bench.out).at("batched");
  EXPECT_EQ(batched["sequences"], 5);
  EXPECT_GT(batched["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(batched["single_tokens_per_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(batched["speedup"].get<double>(), batched["tokens_per_s"].get<double>() / batched["single_tokens_per_s"].get<double>());
  const CommandResult refused = run_gemma4rt({"bench", "--model", (kModels / "tiny-e2b").string(), "--sequences", "0"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--sequences"), std::string::npos) << refused.err;
}

// The decode roofline comes from probes taken between the timed steps: the bandwidth it used lies
// within the slowest and fastest of them, and roofline x bytes per token is that bandwidth.
TEST(BenchCommand, DecodeRooflineFromProbesAroundTheSteps) {
  const CommandResult bench = run_gemma4rt({"bench", "--model", (kModels / "tiny-e2b").string(), "-p", "4", "-n", "7", "--json", "--threads", "2"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json figures = nlohmann::json::parse(bench.out);
  const double slowest = figures["read_bandwidth_probes_gb_s"][0], fastest = figures["read_bandwidth_probes_gb_s"][1];
  const double used = figures["read_bandwidth_gb_s"];
  EXPECT_GT(slowest, 0.0) << figures.dump();
  EXPECT_LE(slowest, used * (1 + 1e-9)) << figures.dump();
  EXPECT_LE(used, fastest * (1 + 1e-9)) << figures.dump();
  EXPECT_NEAR(figures["roofline_decode_tokens_per_s"].get<double>() * figures["weight_bytes_per_token"].get<double>() / 1e9, used, used * 1e-9);
  EXPECT_NEAR(figures["decode_percent_of_roofline"].get<double>(),
              100.0 * figures["decode_tokens_per_s"].get<double>() / figures["roofline_decode_tokens_per_s"].get<double>(), 1e-6);
}

TEST(TokenizeCommand, EncodesAndDecodes) {
  const auto model_dir = kModels / "tiny-e2b";
  const nlohmann::json fixture = read_json_file(model_dir / "coherence.json");
  const auto& prompt = fixture["prompts"][0];
  CommandResult result = run_gemma4rt({"tokenize", "--model", model_dir.string(), "--text", prompt["text"].get<std::string>()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out), prompt["input_ids"]);
  result = run_gemma4rt({"tokenize", "--model", model_dir.string(), "--decode", join_ids(prompt["output_ids"].get<std::vector<int>>()),
                         "--skip-special"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, prompt["output_text"].get<std::string>() + "\n");
}

}  // namespace
}  // namespace gemma4rt::testing

namespace gemma4rt::testing {
namespace {

// `quantize` writes q8 or q4 weights that load without a quantisation pass and compute exactly what
// `--dtype q8` / `--dtype q4` computes from the original checkpoint (the same quantisation, done once).
class QuantizeCommand : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeCommand, WrittenCheckpointMatchesQuantisingAtLoad) {
  const std::string dtype = GetParam();
  const auto source = kModels / "tiny-26b-a4b";
  const auto out = fresh_work_dir("quantized-26b-" + dtype);
  const CommandResult written = run_gemma4rt({"quantize", "--model", source.string(), "--out", out.string(), "--dtype", dtype, "--force"});
  ASSERT_EQ(written.exit_code, 0) << written.err;
  const nlohmann::json config = read_json_file(out / "config.json");
  EXPECT_EQ(config["quantization_config"]["quant_method"], "gemma4rt_" + dtype);
  const nlohmann::json fixture = read_json_file(source / "coherence.json");
  for (int index : {0, 1, 2}) {
    const auto& prompt = fixture["prompts"][index];
    const std::string ids = join_ids(prompt["input_ids"].get<std::vector<int>>());
    const nlohmann::json from_file = run_json({"--model", out.string(), "--prompt-ids", ids, "--max-tokens", "40", "--logprobs", "2"});
    const nlohmann::json at_load = run_json({"--model", source.string(), "--prompt-ids", ids, "--max-tokens", "40", "--dtype", dtype, "--logprobs", "2"});
    EXPECT_EQ(from_file["tokens"], at_load["tokens"]);
    EXPECT_EQ(from_file["logprobs"], at_load["logprobs"]);
    EXPECT_EQ(from_file["tokens"], prompt["output_ids"]);
  }
  // The stored matrices are int8 (q8) or packed nibbles (q4) with their block scales beside them.
  const SafetensorsImage image = SafetensorsImage::load(out / "model.safetensors");
  const SafetensorsImage original = SafetensorsImage::load(source / "model.safetensors");
  const std::string gate_name = "model.language_model.layers.0.mlp.gate_proj.weight";
  const nlohmann::json& gate = image.header[gate_name];
  const nlohmann::json& scales = image.header[gate_name + "_scale"];
  const int64_t columns = original.header[gate_name]["shape"][1];
  EXPECT_EQ(gate["dtype"], dtype == "q4" ? "U8" : "I8");
  EXPECT_EQ(gate["shape"][1], dtype == "q4" ? (columns + 31) / 32 * 16 : columns);  // 16 bytes per block of 32
  EXPECT_EQ(scales["dtype"], dtype == "q4" ? "F16" : "F32");
  EXPECT_EQ(scales["shape"][1], (columns + 31) / 32);
  EXPECT_EQ(image.header["lm_head.weight"]["dtype"], gate["dtype"]);
  EXPECT_EQ(image.header["model.language_model.embed_tokens.weight"]["dtype"], "BF16");
  // q4 files name their layout; one that names another (an older gemma4rt's) is refused, not misread.
  if (dtype == "q4") {
    EXPECT_EQ(image.header["__metadata__"]["gemma4rt_q4_layout"], "superblocks-512");
    const auto older = fresh_work_dir("quantized-26b-q4-older-layout");
    std::filesystem::copy(out, older, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
    std::string bytes = read_text_file(older / "model.safetensors");
    const size_t at = bytes.find("superblocks-512");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 15, "nibble-groups64");  // same length: the header stays valid
    write_text_file(older / "model.safetensors", bytes);
    const std::string ids = join_ids(fixture["prompts"][0]["input_ids"].get<std::vector<int>>());
    const CommandResult refused = run_gemma4rt({"run", "--model", older.string(), "--prompt-ids", ids, "--max-tokens", "4"});
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_NE(refused.err.find("gemma4rt_q4_layout"), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("model.safetensors"), std::string::npos) << refused.err;
  }
  // plan sizes a quantised checkpoint in its own format unless told otherwise.
  const CommandResult plan = run_gemma4rt({"plan", "--model", out.string(), "--target", "cpu:64", "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(nlohmann::json::parse(plan.out)["options"]["dtype"], dtype) << plan.out;
  const CommandResult plan_bf16 = run_gemma4rt({"plan", "--model", out.string(), "--target", "cpu:64", "--json", "--dtype", "bf16"});
  ASSERT_EQ(plan_bf16.exit_code, 0) << plan_bf16.err;
  EXPECT_EQ(nlohmann::json::parse(plan_bf16.out)["options"]["dtype"], "bf16") << plan_bf16.out;
  // A quantised checkpoint is not quantised again.
  const CommandResult again = run_gemma4rt({"quantize", "--model", out.string(), "--out", out.string() + "-again", "--dtype", dtype, "--force"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find("is already"), std::string::npos) << again.err;
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeCommand, ::testing::Values("q8", "q4"), string_param_name);

// quantize never writes over the checkpoint it reads (however --out is spelled), and a failure part-way
// (here a value q4's f16 scales cannot hold) leaves --out as it was, with no half-written file.
TEST(QuantizeCommandRefusals, KeepsTheSourceAndTheOutputIntact) {
  const auto source = fresh_work_dir("quantize-refusals/source");
  copy_checkpoint(kModels / "tiny-e2b", source);
  const std::string source_bytes = read_text_file(source / "model.safetensors");
  for (const std::string& out : {source.string(), source.string() + "/", (source / ".").string()}) {
    const CommandResult same = run_gemma4rt({"quantize", "--model", source.string(), "--out", out, "--dtype", "q4", "--force"});
    EXPECT_EQ(same.exit_code, 1) << out;
    EXPECT_NE(same.err.find("is the checkpoint being read"), std::string::npos) << same.err;
  }
  EXPECT_TRUE(read_text_file(source / "model.safetensors") == source_bytes) << "the source checkpoint changed";

  const auto out = fresh_work_dir("quantize-refusals/out");
  ASSERT_EQ(run_gemma4rt({"quantize", "--model", source.string(), "--out", out.string(), "--dtype", "q8", "--force"}).exit_code, 0);
  const std::string written = read_text_file(out / "model.safetensors");
  const auto huge = fresh_work_dir("quantize-refusals/huge");
  copy_checkpoint(source, huge);
  const std::string down = "model.language_model.layers.1.mlp.down_proj.weight";
  SafetensorsImage::edit(huge / "model.safetensors", [&](SafetensorsImage& image) {
    ASSERT_EQ(image.header[down]["dtype"], "BF16");
    const size_t at = image.header[down]["data_offsets"][0].get<size_t>();
    image.data[at] = '\x7f', image.data[at + 1] = '\x7f';  // bf16 3.4e38: its q4 scale overflows an f16
  });
  const CommandResult failed = run_gemma4rt({"quantize", "--model", huge.string(), "--out", out.string(), "--dtype", "q4", "--force"});
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  EXPECT_NE(failed.err.find(down), std::string::npos) << failed.err;
  EXPECT_TRUE(read_text_file(out / "model.safetensors") == written) << "the earlier output changed";
  EXPECT_FALSE(std::filesystem::exists(out / "model.safetensors.partial"));
  const CommandResult still = run_gemma4rt({"run", "--model", out.string(), "--chat", "What is the capital of France?", "--max-tokens", "12"});
  EXPECT_EQ(still.exit_code, 0) << still.err;
  EXPECT_NE(still.out.find("Paris"), std::string::npos) << still.out;

  // --force over a sharded checkpoint: its shards and index go, so no reader takes them for the copy.
  const auto sharded = fresh_work_dir("quantize-refusals/sharded");
  ASSERT_EQ(run_gemma4rt({"make-model", "--config", (kModels / "tiny-e2b" / "config.json").string(), "--shard-size-gb", "0.0005", "--out",
                          sharded.string()}).exit_code, 0);
  ASSERT_TRUE(std::filesystem::exists(sharded / "model.safetensors.index.json"));
  ASSERT_EQ(run_gemma4rt({"quantize", "--model", source.string(), "--out", sharded.string(), "--dtype", "q4", "--force"}).exit_code, 0);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(sharded)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}));
}

}  // namespace
}  // namespace gemma4rt::testing

namespace gemma4rt::testing {
namespace {

// run --json-object / --json-schema: the CLI's structured output (the server's is in structured_output.test.mjs).
TEST(RunCommand, StructuredOutput) {
  const std::string model = (kModels / "tiny-e2b-agent").string();
  const std::string question = "What is the capital of France?";
  const nlohmann::json object = run_json({"--model", model, "--chat", question, "--json-object", "--max-tokens", "80"});
  ASSERT_EQ(object["finish_reason"], "stop") << object.dump();
  EXPECT_TRUE(nlohmann::json::parse(object["text"].get<std::string>()).is_object()) << object.dump();

  const auto dir = fresh_work_dir("run_structured_output");
  write_text_file(dir / "const.json", R"({"const": {"city": "Paris", "n": [1, 2.5e3]}})");
  const nlohmann::json constant = run_json({"--model", model, "--chat", question, "--json-schema", (dir / "const.json").string()});
  EXPECT_EQ(constant["finish_reason"], "stop");
  EXPECT_EQ(constant["text"], R"({"city":"Paris","n":[1,2500.0]})");

  write_text_file(dir / "pattern.json", R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}})");
  CommandResult refused = run_gemma4rt({"run", "--model", model, "--chat", question, "--json-schema", (dir / "pattern.json").string()});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("'pattern'"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("#/properties/id"), std::string::npos) << refused.err;
  refused = run_gemma4rt({"run", "--model", model, "--chat", question, "--json-object", "--ignore-eos"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("--ignore-eos"), std::string::npos) << refused.err;

  // bench times the masks of a constrained generation next to the free decode rate.
  const CommandResult bench = run_gemma4rt({"bench", "--model", model, "-p", "4", "-n", "16", "--json-object", "--json", "--threads", "1"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json figures = nlohmann::json::parse(bench.out).at("structured_output");
  EXPECT_EQ(figures["steps"], 16);
  EXPECT_GT(figures["worst_ms"].get<double>(), 0.0);
  EXPECT_GE(figures["worst_ms"].get<double>(), figures["median_ms"].get<double>());
  EXPECT_GT(figures["constrained_ms_per_token"].get<double>(), 0.0);
}

}  // namespace
}  // namespace gemma4rt::testing
