// Broken checkpoints and impossible requests: each ends with one clear error line naming the file,
// tensor or field, and a non-zero exit; never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "test_support.h"

namespace gemma4rt::testing {
namespace {

const std::filesystem::path kSource = std::filesystem::path(GEMMA4RT_TEST_DATA) / "golden" / "tiny-e2b";
const std::string kPrefix = "model.language_model.";

// Runs the model and checks the failure: exit 1 (not a signal), one line on stderr holding every `needle`.
void expect_clear_failure(const std::filesystem::path& model_dir, const std::vector<std::string>& needles,
                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> arguments = {"run", "--model", model_dir.string(), "--prompt-ids", "2,17,300", "--max-tokens", "2"};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  const CommandResult result = run_gemma4rt(arguments);
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_TRUE(result.err.starts_with("gemma4rt: error: ")) << result.err;
  for (const auto& needle : needles) EXPECT_NE(result.err.find(needle), std::string::npos) << "missing '" << needle << "' in: " << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
}

std::filesystem::path broken_copy(const std::string& name) {
  const auto dir = fresh_work_dir("broken/" + name);
  copy_checkpoint(kSource, dir);
  return dir;
}

// A copy whose model.safetensors `edit` has changed.
std::filesystem::path copy_with_header_edit(const std::string& name, const std::function<void(SafetensorsImage&)>& edit) {
  const auto dir = broken_copy(name);
  SafetensorsImage::edit(dir / "model.safetensors", edit);
  return dir;
}

TEST(BadInput, MissingConfig) {
  const auto dir = broken_copy("missing_config");
  std::filesystem::remove(dir / "config.json");
  expect_clear_failure(dir, {"config.json", "not found"});
}

TEST(BadInput, UnknownModelType) {
  const auto dir = broken_copy("unknown_model_type");
  nlohmann::json config = read_json_file(dir / "config.json");
  config["model_type"] = "llama";
  write_text_file(dir / "config.json", config.dump());
  expect_clear_failure(dir, {"config.json", "model_type", "llama"});
}

TEST(BadInput, WrongFieldType) {
  const auto dir = broken_copy("wrong_field_type");
  nlohmann::json config = read_json_file(dir / "config.json");
  config["text_config"]["hidden_size"] = "sixty-four";
  write_text_file(dir / "config.json", config.dump());
  expect_clear_failure(dir, {"config.json", "text_config.hidden_size"});
}

TEST(BadInput, TruncatedSafetensors) {
  const auto dir = broken_copy("truncated");
  const std::string bytes = read_text_file(dir / "model.safetensors");
  write_text_file(dir / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_clear_failure(dir, {"model.safetensors", "past the end"});
}

TEST(BadInput, TruncatedInsideHeader) {
  const auto dir = broken_copy("truncated_header");
  const std::string bytes = read_text_file(dir / "model.safetensors");
  write_text_file(dir / "model.safetensors", bytes.substr(0, 100));
  expect_clear_failure(dir, {"model.safetensors", "truncated"});
}

TEST(BadInput, OverlappingOffsets) {
  const auto dir = copy_with_header_edit("overlap", [](SafetensorsImage& image) {
    // Point the final norm at bytes another tensor of the same size already uses.
    auto& norm = image.header[kPrefix + "norm.weight"];
    const auto& other = image.header[kPrefix + "layers.0.input_layernorm.weight"];
    norm["data_offsets"] = other["data_offsets"];
  });
  expect_clear_failure(dir, {"model.safetensors", "overlap", kPrefix + "norm.weight"});
}

TEST(BadInput, OffsetsPastTheEnd) {
  const auto dir = copy_with_header_edit("past_end", [](SafetensorsImage& image) {
    auto& norm = image.header[kPrefix + "norm.weight"];
    const uint64_t size = norm["data_offsets"][1].get<uint64_t>() - norm["data_offsets"][0].get<uint64_t>();
    norm["data_offsets"] = {image.data.size() - size / 2, image.data.size() + size / 2};
  });
  expect_clear_failure(dir, {"model.safetensors", kPrefix + "norm.weight", "past the end"});
}

TEST(BadInput, MissingTensor) {
  const auto dir = copy_with_header_edit("missing_tensor", [](SafetensorsImage& image) {
    image.header.erase(kPrefix + "layers.3.mlp.down_proj.weight");
  });
  expect_clear_failure(dir, {"missing tensor " + kPrefix + "layers.3.mlp.down_proj.weight"});
}

TEST(BadInput, WrongShape) {
  const auto dir = copy_with_header_edit("wrong_shape", [](SafetensorsImage& image) {
    auto& gate = image.header[kPrefix + "layers.2.mlp.gate_proj.weight"];
    const auto shape = gate["shape"].get<std::vector<int64_t>>();
    gate["shape"] = {shape[1], shape[0]};  // same byte count, transposed
  });
  expect_clear_failure(dir, {kPrefix + "layers.2.mlp.gate_proj.weight", "shape"});
}

TEST(BadInput, SizeDisagreesWithShape) {
  const auto dir = copy_with_header_edit("size_mismatch", [](SafetensorsImage& image) {
    image.header[kPrefix + "norm.weight"]["shape"] = {1000};
  });
  expect_clear_failure(dir, {"model.safetensors", kPrefix + "norm.weight", "bytes"});
}

// NaN weights (all bits set is NaN in f32 and bf16) leave no finite logit: an error on every decoding
// path (the device's argmax, sampling, logprobs; CPU and reference backends), not id 0 over and over.
TEST(BadInput, NanWeightsAreAnErrorNotTokens) {
  const auto dir = copy_with_header_edit("nan_weights", [](SafetensorsImage& image) {
    const auto& offsets = image.header[kPrefix + "layers.1.mlp.down_proj.weight"]["data_offsets"];
    std::fill(image.data.begin() + offsets[0].get<int64_t>(), image.data.begin() + offsets[1].get<int64_t>(), '\xff');
  });
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {}, {"--temperature", "0.8"}, {"--logprobs", "2"}, {"--reference"}, {"--dtype", "q8"}}) {
    SCOPED_TRACE(extra.empty() ? "greedy" : extra[0]);
    expect_clear_failure(dir, {"no finite logit", "NaN", "gemma4rt doctor"}, extra);
  }
}

TEST(BadInput, MissingLayerScalarIsAnErrorNotOne) {
  const auto dir = copy_with_header_edit("missing_layer_scalar", [](SafetensorsImage& image) {
    image.header.erase(kPrefix + "layers.7.layer_scalar");
  });
  expect_clear_failure(dir, {"missing tensor " + kPrefix + "layers.7.layer_scalar"});
}

TEST(BadInput, MissingShardOfIndex) {
  const auto dir = broken_copy("missing_shard");
  std::filesystem::rename(dir / "model.safetensors", dir / "model-00001-of-00002.safetensors");
  nlohmann::json index = {{"weight_map", {{kPrefix + "norm.weight", "model-00002-of-00002.safetensors"}}}};
  write_text_file(dir / "model.safetensors.index.json", index.dump());
  expect_clear_failure(dir, {"model-00002-of-00002.safetensors", "missing"});
}

TEST(BadInput, PromptLongerThanContext) {
  expect_clear_failure(kSource, {"--ctx"}, {"--ctx", "2"});
}

TEST(BadInput, TokenIdOutsideVocabulary) {
  const CommandResult result =
      run_gemma4rt({"run", "--model", kSource.string(), "--prompt-ids", "2,999999", "--max-tokens", "2"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("999999"), std::string::npos) << result.err;
}

TEST(BadInput, MalformedTokenList) {
  const CommandResult result = run_gemma4rt({"run", "--model", kSource.string(), "--prompt-ids", "2,abc", "--max-tokens", "2"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--prompt-ids"), std::string::npos) << result.err;
}

TEST(BadInput, TextPromptWithoutTokenizer) {
  const CommandResult result = run_gemma4rt({"run", "--model", kSource.string(), "--prompt", "hello"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("tokenizer.json"), std::string::npos) << result.err;
}

TEST(BadInput, MissingModelDirectory) {
  const CommandResult result = run_gemma4rt({"run", "--model", "/nonexistent/model", "--prompt-ids", "2"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("/nonexistent/model"), std::string::npos) << result.err;
}

// Flag mistakes are user mistakes too: one line naming the flag and the bound, status 1, nothing run.
TEST(BadInput, FlagOutOfRange) {
  expect_clear_failure(kSource, {"--max-tokens", "0 or more", "\"-1\"", "gemma4rt run --help"}, {"--max-tokens", "-1"});
  expect_clear_failure(kSource, {"--ctx", "at least 1", "\"0\""}, {"--ctx", "0"});
  expect_clear_failure(kSource, {"--threads", "0 to 512", "\"100000\""}, {"--threads", "100000"});
  expect_clear_failure(kSource, {"--top-p", "from 0 to 1", "\"nan\""}, {"--top-p", "nan"});
  expect_clear_failure(kSource, {"--min-p", "from 0 to 1", "\"1.5\""}, {"--min-p", "1.5"});
  expect_clear_failure(kSource, {"--temperature", "\"warm\""}, {"--temperature", "warm"});
  expect_clear_failure(kSource, {"--backend", "tpu", "cpu", "reference"}, {"--backend", "tpu"});
  expect_clear_failure(kSource, {"--backend reference", "--dtype q8"}, {"--backend", "reference", "--dtype", "q8"});
  expect_clear_failure(kSource, {"--seed", "from -1 to 9223372036854775807", "\"-2\""}, {"--seed", "-2"});
  expect_clear_failure(kSource, {"--seed", "\"9223372036854775808\""}, {"--seed", "9223372036854775808"});
  // A device index means a GPU; the CPU backends have none to pick, so it is refused, not ignored.
  expect_clear_failure(kSource, {"--device 0", "cpu backend", "--backend vulkan"}, {"--device", "0"});
  expect_clear_failure(kSource, {"--device 1", "reference backend"}, {"--reference", "--device", "1"});
  const CommandResult doctor = run_gemma4rt({"doctor", "--model", kSource.string(), "--device", "0"});
  EXPECT_EQ(doctor.exit_code, 1);
  EXPECT_NE(doctor.err.find("--device 0 picks a GPU, but the cpu backend"), std::string::npos) << doctor.err;
  const CommandResult plan = run_gemma4rt({"plan", "--shape", "e2b", "--target", "h200", "--batch", "0"});
  EXPECT_EQ(plan.exit_code, 1);
  EXPECT_NE(plan.err.find("gemma4rt: error: --batch: expected a number of at least 1, got \"0\""), std::string::npos) << plan.err;
  const CommandResult help = run_gemma4rt({"plan", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--ctx"), std::string::npos);
}


// JSON nested far deeper than any checkpoint file needs ends the load with one line; it does not
// reach a recursive walk (error messages, rendering) that would overflow the stack.
TEST(BadInput, DeeplyNestedConfig) {
  const auto dir = broken_copy("deep_config");
  nlohmann::json config = read_json_file(dir / "config.json");
  std::string text = config.dump();
  const std::string deep = std::string(100000, '[') + "1" + std::string(100000, ']');
  const std::string field = "\"hidden_size\":";
  const size_t at = text.find(field);
  ASSERT_NE(at, std::string::npos);
  const size_t value_end = text.find_first_of(",}", at + field.size());
  text.replace(at + field.size(), value_end - at - field.size(), deep);
  write_text_file(dir / "config.json", text);
  expect_clear_failure(dir, {"config.json", "nested more than 128 levels", "hidden_size"});
}

// A number no double holds names the field it was given for.
TEST(BadInput, NumberOutOfRangeInConfig) {
  const auto dir = broken_copy("huge_number");
  std::string text = read_json_file(dir / "config.json").dump();
  const std::string field = "\"rms_norm_eps\":";
  const size_t at = text.find(field);
  ASSERT_NE(at, std::string::npos);
  const size_t value_end = text.find_first_of(",}", at + field.size());
  text.replace(at + field.size(), value_end - at - field.size(), "1e400");
  write_text_file(dir / "config.json", text);
  expect_clear_failure(dir, {"config.json", "out of range", "rms_norm_eps"});
}

// A header whose length leaves the data misaligned for 2-byte elements is refused (reading it in
// place would be undefined behaviour), naming the tensor.
TEST(BadInput, MisalignedTensorData) {
  const auto dir = broken_copy("misaligned");
  // The same header one byte longer and unpadded: every tensor's data moves to an odd file offset.
  std::string bytes = read_text_file(dir / "model.safetensors");
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  std::string header = bytes.substr(8, header_size);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  if (header.size() % 2 == 0) header += ' ';
  const uint64_t odd = header.size();
  std::string rewritten(8, '\0');
  std::memcpy(rewritten.data(), &odd, 8);
  rewritten += header + bytes.substr(8 + header_size);
  write_text_file(dir / "model.safetensors", rewritten);
  expect_clear_failure(dir, {"model.safetensors", "not a multiple of 2"});
}

// Shapes whose element count overflows 64 bits are refused, not wrapped around into a small size.
TEST(BadInput, ShapeThatOverflows) {
  const auto dir = copy_with_header_edit("overflowing_shape", [](SafetensorsImage& image) {
    image.header[kPrefix + "norm.weight"]["shape"] = {uint64_t{1} << 40, uint64_t{1} << 40};
  });
  expect_clear_failure(dir, {"model.safetensors", "norm.weight", "more elements than any file can hold"});
}

// An empty prompt would run from <bos> and make up text; inf is no temperature; a context beyond
// the model's trained positions is refused before anything is allocated.
TEST(BadInput, EmptyPromptsInfiniteNumbersAndHugeContexts) {
  const std::string model = (std::filesystem::path(GEMMA4RT_MODELS) / "tiny-e2b").string();
  for (const std::vector<std::string>& arguments :
       {std::vector<std::string>{"--prompt", ""}, std::vector<std::string>{"--chat", ""}, std::vector<std::string>{"--prompt-ids", ""}}) {
    std::vector<std::string> command = {"run", "--model", model};
    command.insert(command.end(), arguments.begin(), arguments.end());
    const CommandResult result = run_gemma4rt(command);
    EXPECT_EQ(result.exit_code, 1) << arguments[0] << ": " << result.err;
    EXPECT_NE(result.err.find(arguments[0]), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("is empty"), std::string::npos) << result.err;
  }
  expect_clear_failure(kSource, {"--temperature", "\"inf\""}, {"--temperature", "inf"});
  expect_clear_failure(kSource, {"--temperature", "\"nan\""}, {"--temperature", "nan"});
  expect_clear_failure(kSource, {"200000", "max_position_embeddings 131072"}, {"--ctx", "200000"});
}

}  // namespace
}  // namespace gemma4rt::testing
