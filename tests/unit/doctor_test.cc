// gemma4rt doctor: passes on every untouched coherence fixture, and on broken copies of them (built here,
// under GEMMA4RT_TEST_WORK) exits 1 with a FAIL line that names the problem: the tensor, the file or the
// token. Every broken copy below is a bug some published Gemma-4 port shipped with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>

#include "diagnostics/checkpoint_checks.h"
#include "model/model_shapes.h"
#include "test_support.h"

namespace gemma4rt::testing {
namespace {

const std::filesystem::path kModels = GEMMA4RT_MODELS;
const std::filesystem::path kGolden = std::filesystem::path(GEMMA4RT_TEST_DATA) / "golden";
const std::string kPrefix = "model.language_model.";

std::filesystem::path broken_copy(const std::string& name, const std::filesystem::path& source = kModels / "tiny-e2b") {
  const auto dir = fresh_work_dir("doctor/" + name);
  copy_checkpoint(source, dir);
  return dir;
}

// The line of one check, e.g. "FAIL  tensors: ..."; empty when the check is not printed.
std::string check_line(const std::string& out, const std::string& name) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > 6 && line.substr(6).starts_with(name + ": ")) return line;
  }
  return "";
}

// Runs doctor and expects exit 1 with `check` failing and its line holding every needle.
std::string expect_doctor_failure(const std::filesystem::path& dir, const std::string& check, const std::vector<std::string>& needles) {
  const CommandResult result = run_gemma4rt({"doctor", "--model", dir.string()});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_TRUE(result.err.empty()) << result.err;
  const std::string line = check_line(result.out, check);
  EXPECT_TRUE(line.starts_with("FAIL  ")) << "check " << check << " in:\n" << result.out;
  for (const auto& needle : needles) EXPECT_NE(line.find(needle), std::string::npos) << "missing '" << needle << "' in: " << line;
  EXPECT_NE(result.out.find("FAILED"), std::string::npos) << result.out;
  return result.out;
}

// Byte range of a tensor inside SafetensorsImage::data.
std::pair<size_t, size_t> tensor_bytes(const SafetensorsImage& image, const std::string& name) {
  const auto& offsets = image.header.at(name).at("data_offsets");
  return {offsets[0].get<size_t>(), offsets[1].get<size_t>()};
}

class DoctorFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DoctorFixture, PassesOnUntouchedModel) {
  const CommandResult result = run_gemma4rt({"doctor", "--model", (kModels / GetParam()).string()});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(result.out.find("FAIL  "), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("WARN  "), std::string::npos) << result.out;
  for (const char* check : {"config", "safetensors", "tensors", "per-layer embeddings", "layer_scalar", "kv sharing", "tokenizer.json",
                            "values", "vocabulary", "round trip", "special tokens", "chat format", "eos ids", "weights", "forward", "parameters"}) {
    EXPECT_FALSE(check_line(result.out, check).empty()) << "no line for " << check << " in:\n" << result.out;
  }
  EXPECT_TRUE(check_line(result.out, "parameters").starts_with("INFO  ")) << result.out;
  EXPECT_NE(result.out.find(": OK\n"), std::string::npos) << result.out;
}

TEST_P(DoctorFixture, JsonReportIsOk) {
  const CommandResult result = run_gemma4rt({"doctor", "--model", (kModels / GetParam()).string(), "--json"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["ok"], true);
  ASSERT_TRUE(report["checks"].is_array());
  for (const auto& check : report["checks"]) {
    EXPECT_TRUE(check["status"] == "pass" || check["status"] == "info") << check.dump();
    EXPECT_FALSE(check["message"].get<std::string>().empty()) << check.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(DoctorModels, DoctorFixture,
                         ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b", "tiny-e2b-agent"),
                         testing::string_param_name);

TEST(Doctor, NotesStaleTensorsOfKvSharedLayers) {
  const CommandResult result = run_gemma4rt({"doctor", "--model", (kModels / "tiny-e2b").string()});
  const std::string line = check_line(result.out, "kv sharing");
  EXPECT_TRUE(line.starts_with("INFO  ")) << line;
  EXPECT_NE(line.find("layers 5-14"), std::string::npos) << line;
  EXPECT_NE(line.find("30 stale"), std::string::npos) << line;
}

TEST(Doctor, PleTensorsRemoved) {
  const auto dir = broken_copy("ple_removed");
  SafetensorsImage image = SafetensorsImage::load(dir / "model.safetensors");
  std::vector<std::string> removed;
  for (const auto& [name, entry] : image.header.items()) {
    if (name.find("per_layer") != std::string::npos) removed.push_back(name);
  }
  ASSERT_EQ(removed.size(), 3u + 15u * 3u);
  for (const auto& name : removed) image.header.erase(name);
  image.save(dir / "model.safetensors");
  const std::string out = expect_doctor_failure(dir, "per-layer embeddings",
                                                {"hidden_size_per_layer_input is 16", kPrefix + "embed_tokens_per_layer.weight",
                                                 kPrefix + "per_layer_model_projection.weight", "48 PLE tensors are missing"});
  EXPECT_NE(check_line(out, "tensors").find("48 of 230 tensors the forward pass reads are missing"), std::string::npos) << out;
  EXPECT_TRUE(check_line(out, "tensors").starts_with("FAIL  ")) << out;
  EXPECT_TRUE(check_line(out, "weights").starts_with("FAIL  ")) << out;
  EXPECT_EQ(check_line(out, "forward"), "WARN  forward: skipped (weights did not load)") << out;
}

TEST(Doctor, PleTableZeroed) {
  const auto dir = broken_copy("ple_zeroed");
  SafetensorsImage::edit(dir / "model.safetensors", [](SafetensorsImage& image) {
    const auto [begin, end] = tensor_bytes(image, kPrefix + "embed_tokens_per_layer.weight");
    std::fill(image.data.begin() + begin, image.data.begin() + end, '\0');
  });
  expect_doctor_failure(dir, "per-layer embeddings", {kPrefix + "embed_tokens_per_layer.weight", "zero"});
}

// One NaN or inf anywhere makes every logit NaN; the forward check sees that, the value scan says where.
TEST(Doctor, NonFiniteValuesAreNamed) {
  const auto dir = broken_copy("non_finite");
  const std::string down = kPrefix + "layers.1.mlp.down_proj.weight";
  const std::string embed = kPrefix + "embed_tokens.weight";
  size_t down_values = 0;
  SafetensorsImage::edit(dir / "model.safetensors", [&](SafetensorsImage& image) {
    // Little-endian bf16: 0x7fc0 is a quiet NaN, 0x7f80 +inf, 0xff80 -inf.
    const auto [down_begin, down_end] = tensor_bytes(image, down);
    down_values = (down_end - down_begin) / 2;
    image.data[down_begin + 2 * 5] = static_cast<char>(0xc0);
    image.data[down_begin + 2 * 5 + 1] = static_cast<char>(0x7f);
    image.data[down_begin + 2 * 9] = static_cast<char>(0x80);  // +inf (0x7f80), after the first
    image.data[down_begin + 2 * 9 + 1] = static_cast<char>(0x7f);
    const size_t embed_begin = tensor_bytes(image, embed).first;
    image.data[embed_begin + 2 * 700] = static_cast<char>(0x80);
    image.data[embed_begin + 2 * 700 + 1] = static_cast<char>(0xff);
  });
  const std::string out = expect_doctor_failure(
      dir, "values", {"2 tensors hold NaN or inf values", down + " (2 of " + std::to_string(down_values) + " values, the first at flat index 5)",
                      embed + " (1 of", "flat index 700)"});
  EXPECT_TRUE(check_line(out, "forward").starts_with("FAIL  ")) << out;
  EXPECT_TRUE(check_line(out, "tensors").starts_with("PASS  ")) << out;

  const CommandResult skipped = run_gemma4rt({"doctor", "--model", dir.string(), "--no-scan", "--no-forward"});
  EXPECT_EQ(skipped.exit_code, 0) << skipped.out;
  EXPECT_EQ(check_line(skipped.out, "values"), "INFO  values: skipped (not requested)") << skipped.out;
}

TEST(Doctor, LayerScalarRemoved) {
  const auto dir = broken_copy("layer_scalar_removed");
  SafetensorsImage::edit(dir / "model.safetensors",
                         [](SafetensorsImage& image) { image.header.erase(kPrefix + "layers.7.layer_scalar"); });
  const std::string out = expect_doctor_failure(dir, "layer_scalar", {kPrefix + "layers.7.layer_scalar", "1 of 15 layers"});
  EXPECT_EQ(check_line(out, "layer_scalar").find("layers.6."), std::string::npos) << out;
  EXPECT_NE(check_line(out, "tensors").find(kPrefix + "layers.7.layer_scalar"), std::string::npos) << out;
}

TEST(Doctor, LayerScalarAllOne) {
  const auto dir = broken_copy("layer_scalar_one");
  SafetensorsImage image = SafetensorsImage::load(dir / "model.safetensors");
  for (int layer = 0; layer < 15; ++layer) {
    const std::string name = kPrefix + "layers." + std::to_string(layer) + ".layer_scalar";
    ASSERT_EQ(image.header[name]["dtype"], "BF16");
    const auto [begin, end] = tensor_bytes(image, name);
    ASSERT_EQ(end - begin, 2u);
    const uint16_t one = 0x3F80;  // bf16 1.0
    std::memcpy(image.data.data() + begin, &one, 2);
  }
  image.save(dir / "model.safetensors");
  const std::string out = expect_doctor_failure(dir, "layer_scalar", {"all 15 layer_scalar values are exactly 1.0"});
  // Nothing else is wrong: the model loads and computes, which is why this bug passes equality checks.
  EXPECT_TRUE(check_line(out, "weights").starts_with("PASS  ")) << out;
  EXPECT_TRUE(check_line(out, "forward").starts_with("PASS  ")) << out;
}

TEST(Doctor, TokenizerMissing) {
  const auto dir = broken_copy("tokenizer_missing");
  std::filesystem::remove(dir / "tokenizer.json");
  const std::string out = expect_doctor_failure(dir, "tokenizer.json", {(dir / "tokenizer.json").string(), "not found"});
  EXPECT_EQ(check_line(out, "special tokens"), "WARN  special tokens: skipped (no usable tokenizer.json)") << out;
  EXPECT_TRUE(check_line(out, "forward").starts_with("PASS  ")) << out;
}

TEST(Doctor, ChatSpecialTokensAreOrdinaryText) {
  const auto dir = broken_copy("tokenizer_plain_markers");
  nlohmann::json tokenizer = read_json_file(dir / "tokenizer.json");
  // Dropped from added_tokens, the markers are only BPE vocabulary entries that no merge ever reaches.
  auto& added = tokenizer["added_tokens"];
  const std::set<std::string> markers = {"<|turn>", "<turn|>", "<|channel>", "<channel|>"};
  added.erase(std::remove_if(added.begin(), added.end(), [&](const nlohmann::json& token) { return markers.contains(token["content"]); }),
              added.end());
  write_text_file(dir / "tokenizer.json", tokenizer.dump());
  expect_doctor_failure(dir, "special tokens",
                        {"<|turn> encodes to", "instead of the single id 105", "<turn|>", "<|channel>", "<channel|>"});
}

TEST(Doctor, PostProcessorAddsBos) {
  const auto dir = broken_copy("tokenizer_double_bos");
  nlohmann::json tokenizer = read_json_file(dir / "tokenizer.json");
  tokenizer["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {2}}, {"tokens", {"<bos>"}}}}}}};
  write_text_file(dir / "tokenizer.json", tokenizer.dump());
  const std::string out = expect_doctor_failure(dir, "chat format", {"post_processor adds <bos> (id 2)", "two <bos>"});
  EXPECT_TRUE(check_line(out, "special tokens").starts_with("PASS  ")) << out;
}

TEST(Doctor, TruncatedSafetensors) {
  const auto dir = broken_copy("truncated");
  const std::string bytes = read_text_file(dir / "model.safetensors");
  write_text_file(dir / "model.safetensors", bytes.substr(0, bytes.size() * 2 / 3));
  const std::string out = expect_doctor_failure(dir, "safetensors", {(dir / "model.safetensors").string(), "past the end"});
  EXPECT_EQ(check_line(out, "tensors"), "WARN  tensors: skipped (the safetensors files did not open)") << out;
  EXPECT_EQ(check_line(out, "forward"), "WARN  forward: skipped (weights did not load)") << out;
  // The tokenizer does not depend on the weights and is still checked.
  EXPECT_TRUE(check_line(out, "special tokens").starts_with("PASS  ")) << out;
}

// The same checkpoint split into two shards with an index; the second shard is cut short.
TEST(Doctor, TruncatedShard) {
  const auto dir = broken_copy("truncated_shard");
  const SafetensorsImage whole = SafetensorsImage::load(dir / "model.safetensors");
  std::filesystem::remove(dir / "model.safetensors");
  SafetensorsImage shards[2];
  nlohmann::json weight_map = nlohmann::json::object();
  int index = 0;
  for (const auto& [name, entry] : whole.header.items()) {
    if (name == "__metadata__") continue;
    SafetensorsImage& shard = shards[index % 2];
    const auto [begin, end] = tensor_bytes(whole, name);
    nlohmann::json moved = entry;
    moved["data_offsets"] = {shard.data.size(), shard.data.size() + (end - begin)};
    shard.header[name] = moved;
    shard.data += whole.data.substr(begin, end - begin);
    weight_map[name] = index % 2 == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    ++index;
  }
  shards[0].save(dir / "model-00001-of-00002.safetensors");
  shards[1].data.resize(shards[1].data.size() / 2);
  shards[1].save(dir / "model-00002-of-00002.safetensors");
  write_text_file(dir / "model.safetensors.index.json",
                  nlohmann::json({{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}).dump());
  expect_doctor_failure(dir, "safetensors", {"model-00002-of-00002.safetensors"});
}

TEST(Doctor, LayerTypesDisagreeWithTensors) {
  const auto dir = broken_copy("layer_types", kModels / "tiny-12b");
  nlohmann::json config = read_json_file(dir / "config.json");
  config["text_config"]["layer_types"][0] = "full_attention";
  write_text_file(dir / "config.json", config.dump());
  expect_doctor_failure(dir, "tensors", {kPrefix + "layers.0.self_attn.q_proj.weight", "layer 0: layer_types says full_attention"});
}

TEST(Doctor, PleConfigDroppedFromConfig) {
  const auto dir = broken_copy("ple_config_dropped");
  nlohmann::json config = read_json_file(dir / "config.json");
  config["text_config"]["hidden_size_per_layer_input"] = 0;
  write_text_file(dir / "config.json", config.dump());
  expect_doctor_failure(dir, "per-layer embeddings", {kPrefix + "embed_tokens_per_layer.weight", "hidden_size_per_layer_input 0"});
}

TEST(Doctor, NoEosConfigured) {
  const auto dir = broken_copy("no_eos");
  nlohmann::json config = read_json_file(dir / "config.json");
  config.erase("eos_token_id");
  config["text_config"].erase("eos_token_id");
  write_text_file(dir / "config.json", config.dump());
  std::filesystem::remove(dir / "generation_config.json");
  expect_doctor_failure(dir, "eos ids", {"no eos_token_id"});
}

TEST(Doctor, MissingDirectoryAndBrokenConfigDoNotCrash) {
  const CommandResult missing = run_gemma4rt({"doctor", "--model", (std::filesystem::path(GEMMA4RT_TEST_WORK) / "no_such_model").string()});
  EXPECT_EQ(missing.exit_code, 1) << missing.out << missing.err;
  EXPECT_TRUE(check_line(missing.out, "config").starts_with("FAIL  ")) << missing.out;

  const auto dir = broken_copy("bad_config");
  write_text_file(dir / "config.json", "{not json");
  const std::string out = expect_doctor_failure(dir, "config", {"config.json", "invalid JSON"});
  EXPECT_EQ(check_line(out, "layer_scalar"), "WARN  layer_scalar: skipped (config.json did not parse)") << out;
}

TEST(Doctor, GoldenCheckpointWithoutTokenizerFailsOnlyThere) {
  const CommandResult result = run_gemma4rt({"doctor", "--model", (kGolden / "tiny-26b-a4b").string(), "--json"});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["ok"], false);
  std::vector<std::string> failed;
  for (const auto& check : report["checks"]) {
    if (check["status"] == "fail") failed.push_back(check["name"]);
  }
  EXPECT_EQ(failed, std::vector<std::string>{"tokenizer.json"}) << result.out;
}

// The real 262144-entry Gemma-4 tokenizer (unpacked by the ctest fixture) beside a 512-id random checkpoint:
// its chat tokens are right, and the vocabulary check names the mismatch.
TEST(Doctor, RealTokenizerOnAMismatchedCheckpoint) {
  const auto tokenizer = std::filesystem::path(GEMMA4RT_TEST_WORK) / "gemma4-tokenizer.json";
  if (!std::filesystem::exists(tokenizer)) GTEST_SKIP() << "run through ctest: the setup.unpack_tokenizer fixture provides " << tokenizer;
  const auto dir = broken_copy("real_tokenizer", kGolden / "tiny-e2b");
  std::filesystem::copy_file(tokenizer, dir / "tokenizer.json");
  const std::string out = expect_doctor_failure(dir, "vocabulary", {"262144 ids", "vocab_size is 512"});
  EXPECT_EQ(check_line(out, "round trip"), "PASS  round trip: \"hello world\" -> [23391, 1902] -> \"hello world\"") << out;
  EXPECT_TRUE(check_line(out, "special tokens").starts_with("PASS  ")) << out;
  EXPECT_TRUE(check_line(out, "chat format").starts_with("PASS  ")) << out;
  // The golden config lists only <eos>: chat answers would not stop at <turn|>.
  EXPECT_TRUE(check_line(out, "eos ids").starts_with("WARN  ")) << out;
}

// Checkpoints written by `quantize` pass doctor; broken block scales or an older q4 layout fail both
// doctor (naming the tensor or the file) and the loader (one clear error line).
class DoctorQuantized : public ::testing::TestWithParam<std::string> {};

TEST_P(DoctorQuantized, PassesOnQuantizedCopyAndNamesBrokenScales) {
  const std::string dtype = GetParam();
  const bool q4 = dtype == "q4";
  const auto quantized = fresh_work_dir("doctor/quantized-" + dtype);
  const CommandResult written =
      run_gemma4rt({"quantize", "--model", (kModels / "tiny-e2b").string(), "--out", quantized.string(), "--dtype", dtype, "--force"});
  ASSERT_EQ(written.exit_code, 0) << written.err;
  const CommandResult clean = run_gemma4rt({"doctor", "--model", quantized.string()});
  EXPECT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  EXPECT_EQ(clean.out.find("FAIL  "), std::string::npos) << clean.out;
  EXPECT_EQ(clean.out.find("WARN  "), std::string::npos) << clean.out;
  EXPECT_TRUE(check_line(clean.out, "tensors").starts_with("PASS  ")) << clean.out;

  const std::string gate = kPrefix + "layers.2.mlp.gate_proj.weight";
  auto broken = [&](const std::string& name, const std::function<void(SafetensorsImage&)>& edit) {
    const auto dir = broken_copy("quantized-" + dtype + "-" + name, quantized);
    SafetensorsImage::edit(dir / "model.safetensors", edit);
    return dir;
  };
  auto expect_load_failure = [](const std::filesystem::path& dir, const std::vector<std::string>& needles) {
    const CommandResult result = run_gemma4rt({"run", "--model", dir.string(), "--prompt-ids", "2,17", "--max-tokens", "1"});
    EXPECT_EQ(result.exit_code, 1) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    for (const auto& needle : needles) EXPECT_NE(result.err.find(needle), std::string::npos) << "missing '" << needle << "' in: " << result.err;
  };

  const auto missing = broken("scales-missing", [&](SafetensorsImage& image) { image.header.erase(gate + "_scale"); });
  expect_doctor_failure(missing, "tensors", {gate + "_scale", "no block scales"});
  expect_load_failure(missing, {gate + "_scale", "no block scales"});

  // Another dtype of the same width, so the file itself stays valid.
  const std::string other_dtype = q4 ? "BF16" : "I32";
  const auto wrong_dtype = broken("scales-dtype", [&](SafetensorsImage& image) { image.header[gate + "_scale"]["dtype"] = other_dtype; });
  expect_doctor_failure(wrong_dtype, "tensors", {gate + "_scale", q4 ? "must be F16" : "must be F32", other_dtype});
  expect_load_failure(wrong_dtype, {gate + "_scale", q4 ? "must be F16" : "must be F32", other_dtype});

  // A matrix stored one block narrower than the config gives.
  const auto narrow = broken("narrow", [&](SafetensorsImage& image) {
    auto& shape = image.header[gate]["shape"];
    const int64_t bytes = shape[1].get<int64_t>() - (q4 ? 16 : 32);
    shape[1] = bytes;
    auto& offsets = image.header[gate]["data_offsets"];
    offsets[1] = offsets[0].get<int64_t>() + shape[0].get<int64_t>() * bytes;
  });
  expect_doctor_failure(narrow, "tensors", {gate, q4 ? "stored as U8" : "config"});
  expect_load_failure(narrow, {gate, "the config needs"});

  // A NaN block scale (f32 for q8, f16 for q4, little-endian) is named by the value scan.
  const auto nan_scale = broken("scale-nan", [&](SafetensorsImage& image) {
    const size_t begin = tensor_bytes(image, gate + "_scale").first;
    const size_t width = q4 ? 2 : 4;
    for (size_t i = 0; i < width; ++i) image.data[begin + 3 * width + i] = static_cast<char>(0xff);
  });
  expect_doctor_failure(nan_scale, "values", {"1 tensor holds NaN or inf values", gate + "_scale (1 of", "flat index 3)"});

  if (q4) {
    const auto older = broken("older-layout", [](SafetensorsImage& image) { image.header["__metadata__"]["gemma4rt_q4_layout"] = "nibble-groups64"; });
    const std::string out = expect_doctor_failure(older, "tensors", {"model.safetensors", "gemma4rt_q4_layout", "quantize the original checkpoint again"});
    EXPECT_EQ(check_line(out, "tensors").find("q4 tensor", check_line(out, "tensors").find("q4 tensor") + 1), std::string::npos)
        << "one line per file, not per tensor: " << out;
    expect_load_failure(older, {"model.safetensors", "gemma4rt_q4_layout"});
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DoctorQuantized, ::testing::Values("q8", "q4"), string_param_name);

// Library level: the report and the effective parameter definition.
TEST(DoctorLibrary, ReportNamesEveryCheckOnce) {
  const DoctorReport report = run_checkpoint_checks(kModels / "tiny-31b");
  EXPECT_TRUE(report.ok());
  std::set<std::string> names;
  for (const CheckResult& check : report.checks) EXPECT_TRUE(names.insert(check.name).second) << check.name;
  ASSERT_NE(report.find("layer_scalar"), nullptr);
  EXPECT_NE(report.find("layer_scalar")->message.find("0.5078 to 0.8828"), std::string::npos) << report.find("layer_scalar")->message;
}

TEST(DoctorLibrary, ParameterCountsMatchTheFixturesAndModelNames) {
  // The fixtures record Hugging Face's parameter count, which leaves out the layer_scalar buffers (one
  // value per layer); total counts them, as they are stored and read.
  for (const char* name : {"tiny-e2b", "tiny-12b", "tiny-26b-a4b"}) {
    const nlohmann::json coherence = read_json_file(kModels / name / "coherence.json");
    const ModelConfig config = load_model_config(kModels / name);
    const ParameterCounts counts = count_parameters(config);
    EXPECT_EQ(counts.total, coherence["weights"]["parameters"].get<int64_t>() + config.num_layers) << name;
  }
  // E2B: about 5.1B stored, about 2B effective once the PLE table is left out; 26B-A4B: about 4B active.
  const ParameterCounts e2b = count_parameters(parse_model_config(reference_config("e2b"), "e2b"));
  EXPECT_EQ(e2b.per_layer_embedding, int64_t{262144} * 35 * 256);
  EXPECT_EQ(e2b.effective, e2b.total - e2b.per_layer_embedding);
  EXPECT_GT(e2b.effective, 1'500'000'000);
  EXPECT_LT(e2b.effective, 2'500'000'000);
  const ParameterCounts moe = count_parameters(parse_model_config(reference_config("26b-a4b"), "26b-a4b"));
  EXPECT_EQ(moe.per_layer_embedding, 0);
  EXPECT_GT(moe.total, 24'000'000'000);
  EXPECT_GT(moe.effective, 3'000'000'000);
  EXPECT_LT(moe.effective, 5'000'000'000);
}

}  // namespace
}  // namespace gemma4rt::testing
