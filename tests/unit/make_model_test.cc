// make-model: the variant table (reference_config, parameter_count), the streaming checkpoint writer and
// the CLI. Full-size checkpoints are far too large for a unit test, so writer tests shrink the widths
// and vocabulary of a reference config and keep its layer structure (types, KV sharing, MoE, PLE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "core/progress.h"
#include "engine/transformer.h"
#include "model/checkpoint_writer.h"
#include "model/model_shapes.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_support.h"

namespace gemma4rt {
namespace {

using nlohmann::json;
using testing::read_json_file;
using testing::read_text_file;
using testing::run_gemma4rt;

const std::vector<std::string> kShapes = {"e2b", "e4b", "12b", "31b", "26b-a4b"};

ModelConfig parse(const json& config) { return parse_model_config(config, "reference config"); }

std::vector<int> full_layers(const ModelConfig& config) {
  std::vector<int> layers;
  for (int index = 0; index < config.num_layers; ++index) {
    if (!config.layers[index].is_sliding()) layers.push_back(index);
  }
  return layers;
}

std::string test_name(const std::string& shape) { return testing::test_identifier(shape); }

// The same layer structure with small widths and vocabulary, so a checkpoint is a few hundred kB.
json shrink(json config) {
  json& text = config["text_config"];
  text["hidden_size"] = 64;
  text["intermediate_size"] = 96;
  text["head_dim"] = 16;
  text["global_head_dim"] = 32;
  text["vocab_size"] = 512;
  text["vocab_size_per_layer_input"] = 512;
  text["sliding_window"] = 8;
  if (text["hidden_size_per_layer_input"].get<int>() > 0) text["hidden_size_per_layer_input"] = 16;
  if (text["enable_moe_block"].get<bool>()) {
    text["num_experts"] = 8;
    text["top_k_experts"] = 2;
    text["moe_intermediate_size"] = 32;
  }
  return config;
}

// ---- The variant table --------------------------------------------------------------------------------

TEST(ModelShapes, KnownShapes) { EXPECT_EQ(known_model_shapes(), kShapes); }

TEST(ModelShapes, UnknownShapeNamesTheKnownOnes) {
  try {
    reference_config("7b");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("7b"), std::string::npos) << message;
    for (const auto& shape : kShapes) EXPECT_NE(message.find(shape), std::string::npos) << message;
  }
}

TEST(ModelShapes, LayerCountOutOfRange) {
  EXPECT_THROW(reference_config("e2b", 1), Error);
  EXPECT_THROW(reference_config("e2b", 0), Error);
  EXPECT_THROW(reference_config("e2b", 36), Error);
  EXPECT_NO_THROW(reference_config("e2b", 35));
  EXPECT_EQ(reference_config("e2b", 35), reference_config("e2b"));
}

TEST(ModelShapes, SharedFieldsOfEveryVariant) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(shape);
    const json config = reference_config(shape);
    const json& text = config.at("text_config");
    EXPECT_EQ(config.at("eos_token_id"), json({1, 106}));
    EXPECT_EQ(config.at("dtype"), "bfloat16");
    EXPECT_EQ(config.at("tie_word_embeddings"), true);
    EXPECT_EQ(text.at("final_logit_softcapping"), 30.0);
    EXPECT_EQ(text.at("rope_parameters").at("full_attention").at("rope_type"), "proportional");
    EXPECT_EQ(text.at("rope_parameters").at("full_attention").at("partial_rotary_factor"), 0.25);
    EXPECT_EQ(text.at("rope_parameters").at("sliding_attention").at("rope_theta"), 10000.0);
    const ModelConfig parsed = parse(config);
    EXPECT_EQ(parsed.vocab_size, 262144);
    EXPECT_EQ(parsed.head_dim, 256);
    EXPECT_EQ(parsed.global_head_dim, 512);
    EXPECT_DOUBLE_EQ(parsed.final_logit_softcapping.value_or(0), 30.0);
    EXPECT_TRUE(parsed.tie_word_embeddings);
    EXPECT_EQ(parsed.eos_token_ids, (std::vector<int>{1, 106, 1}));  // top level, then text_config's <eos>
    EXPECT_EQ(parsed.layer_types.back(), AttentionType::kFull);
    for (const LayerConfig& layer : parsed.layers) EXPECT_EQ(layer.head_dim, layer.is_sliding() ? 256 : 512);
  }
}

TEST(ModelShapes, E2BMatchesArchitectureDoc) {
  const json config = reference_config("e2b");
  EXPECT_EQ(config.at("model_type"), "gemma4");
  EXPECT_EQ(config.at("architectures"), json({"Gemma4ForConditionalGeneration"}));
  const ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.hidden_size, 1536);
  EXPECT_EQ(parsed.num_layers, 35);
  EXPECT_EQ(parsed.num_attention_heads, 8);
  EXPECT_EQ(parsed.num_key_value_heads, 1);
  EXPECT_FALSE(parsed.attention_k_eq_v);
  EXPECT_EQ(parsed.hidden_size_per_layer_input, 256);
  EXPECT_EQ(parsed.vocab_size_per_layer_input, 262144);
  EXPECT_EQ(parsed.num_kv_shared_layers, 20);
  EXPECT_EQ(parsed.sliding_window, 512);
  EXPECT_EQ(parsed.max_position_embeddings, 131072);
  EXPECT_FALSE(parsed.enable_moe_block);
  EXPECT_EQ(full_layers(parsed), (std::vector<int>{4, 9, 14, 19, 24, 29, 34}));
  for (int index = 0; index < 35; ++index) {
    SCOPED_TRACE(index);
    const LayerConfig& layer = parsed.layers[index];
    EXPECT_EQ(layer.num_kv_heads, 1);
    if (index < 15) {
      EXPECT_TRUE(layer.owns_kv(index));
      EXPECT_EQ(layer.mlp_intermediate_size, 6144);
    } else {
      EXPECT_EQ(layer.kv_source_layer, layer.is_sliding() ? 13 : 14);
      EXPECT_EQ(layer.mlp_intermediate_size, 12288);  // double-wide MLP on the KV-shared layers
    }
  }
}

TEST(ModelShapes, E4BMatchesArchitectureDoc) {
  const ModelConfig parsed = parse(reference_config("e4b"));
  EXPECT_EQ(parsed.model_type, "gemma4");
  EXPECT_EQ(parsed.hidden_size, 2560);
  EXPECT_EQ(parsed.num_layers, 42);
  EXPECT_EQ(parsed.num_kv_shared_layers, 18);
  EXPECT_EQ(parsed.num_key_value_heads, 2);
  EXPECT_EQ(parsed.intermediate_size, 10240);
  EXPECT_FALSE(parsed.use_double_wide_mlp);
  EXPECT_EQ(parsed.hidden_size_per_layer_input, 256);
  EXPECT_EQ(full_layers(parsed), (std::vector<int>{5, 11, 17, 23, 29, 35, 41}));
  for (int index = 24; index < 42; ++index) {
    EXPECT_EQ(parsed.layers[index].kv_source_layer, parsed.layers[index].is_sliding() ? 22 : 23) << index;
    EXPECT_EQ(parsed.layers[index].mlp_intermediate_size, 10240) << index;
  }
}

TEST(ModelShapes, Gemma12BMatchesArchitectureDoc) {
  const json config = reference_config("12b");
  EXPECT_EQ(config.at("model_type"), "gemma4_unified");
  EXPECT_EQ(config.at("text_config").at("model_type"), "gemma4_unified_text");
  EXPECT_EQ(config.at("architectures"), json({"Gemma4UnifiedForConditionalGeneration"}));
  const ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.hidden_size, 3840);
  EXPECT_EQ(parsed.num_layers, 48);
  EXPECT_EQ(parsed.num_attention_heads, 16);
  EXPECT_EQ(parsed.intermediate_size, 15360);
  EXPECT_EQ(parsed.sliding_window, 1024);
  EXPECT_FALSE(parsed.has_per_layer_inputs());
  EXPECT_EQ(parsed.num_kv_shared_layers, 0);
  EXPECT_EQ(full_layers(parsed).size(), 8u);
  for (int index = 0; index < 48; ++index) {
    const LayerConfig& layer = parsed.layers[index];
    EXPECT_EQ(layer.k_eq_v, !layer.is_sliding()) << index;
    EXPECT_EQ(layer.num_kv_heads, layer.is_sliding() ? 8 : 1) << index;  // one global KV head, K = V
  }
}

TEST(ModelShapes, Gemma26BA4BMatchesArchitectureDoc) {
  const ModelConfig parsed = parse(reference_config("26b-a4b"));
  EXPECT_EQ(parsed.hidden_size, 2816);
  EXPECT_EQ(parsed.num_layers, 30);
  EXPECT_TRUE(parsed.enable_moe_block);
  EXPECT_EQ(parsed.num_experts, 128);
  EXPECT_EQ(parsed.top_k_experts, 8);
  EXPECT_EQ(parsed.moe_intermediate_size, 704);
  EXPECT_EQ(parsed.intermediate_size, 2112);
  EXPECT_EQ(full_layers(parsed), (std::vector<int>{5, 11, 17, 23, 29}));
  EXPECT_EQ(parsed.layers[5].num_kv_heads, 2);
  EXPECT_EQ(parsed.layers[0].num_kv_heads, 8);
  EXPECT_TRUE(parsed.layers[5].k_eq_v);
}

TEST(ModelShapes, Gemma31BMatchesArchitectureDoc) {
  const ModelConfig parsed = parse(reference_config("31b"));
  EXPECT_EQ(parsed.hidden_size, 5376);
  EXPECT_EQ(parsed.num_layers, 60);
  EXPECT_EQ(parsed.num_attention_heads, 32);
  EXPECT_EQ(parsed.intermediate_size, 21504);
  EXPECT_EQ(full_layers(parsed).size(), 10u);
  EXPECT_EQ(parsed.layers[0].num_kv_heads, 16);
  EXPECT_EQ(parsed.layers[59].num_kv_heads, 4);
  EXPECT_FALSE(parsed.enable_moe_block);
}

// Counts derived by hand from the §1.2/§7.2 shapes (V = 262144; "own KV" = k_proj + k_norm (+ v_proj)):
//
// E2B (H 1536, L 35, PLE 256): embed V*H = 402,653,184; PLE table V*35*256 = 2,348,810,240;
//   PLE projection 8960*1536 = 13,762,560; PLE norm 256; final norm 1536.
//   Per layer: 4 norms + layer_scalar = 6,145; PLE gate + projection + norm = 787,968.
//   Sliding attention (own KV) 2*2048*1536 + 256 + 2*256*1536 + 256 = 7,078,400 (x12, layers 0-14);
//   full (own KV) 2*4096*1536 + 512 + 2*512*1536 + 512 = 14,156,800 (x3); shared sliding 6,291,712 (x16);
//   shared full 12,583,424 (x4). MLP 3*6144*1536 = 28,311,552 (x15), 3*12288*1536 = 56,623,104 (x20).
//   Total 2,765,227,776 + 35*794,113 + 278,412,288 + 1,557,135,360 = 4,628,569,379. (The published
//   "5.1B" also counts the vision and audio towers, which are not written.)
// E4B (H 2560, L 42, 18 shared): globals 671,088,640 + 2,818,572,288 + 27,525,120 + 256 + 2,560;
//   per layer 10,241 + 1,313,280 (PLE) + 78,643,200 (MLP); attention 20*13,107,712 + 4*26,215,424 +
//   15*10,486,016 + 3*20,972,032 = 587,222,272. Total 7,463,013,418.
// 12B (H 3840, L 48, K=V, 1 global KV head): embed 1,006,632,960 + norm 3,840; per layer 15,361 +
//   176,947,200 (MLP); sliding 47,186,432 (x40); full 2*8192*3840 + 512 + 512*3840 + 512 = 64,881,664 (x8).
//   Total 11,907,350,320.
// 26B-A4B (H 2816, L 30): embed 738,197,504 + norm 2,816; per layer 7 norms + scalar 19,713, dense MLP
//   17,842,176, router 128*2816 + 2816 + 128 = 363,392, experts 128*1408*2816 + 128*2816*704 = 761,266,176;
//   sliding 34,603,520 (x25), full 2*8192*2816 + 512 + 1024*2816 + 512 = 49,021,952 (x5).
//   Total 25,233,141,790.
// 31B (H 5376, L 60): embed 1,409,286,144 + norm 5,376; per layer 21,505 + 346,816,512 (MLP);
//   sliding 132,121,088 (x50), full 2*16384*5376 + 512 + 2048*5376 + 512 = 187,171,840 (x10).
//   Total 30,697,345,340.
TEST(ModelShapes, ParameterCounts) {
  const std::map<std::string, int64_t> expected = {{"e2b", 4'628'569'379},
                                                   {"e4b", 7'463'013'418},
                                                   {"12b", 11'907'350'320},
                                                   {"26b-a4b", 25'233'141'790},
                                                   {"31b", 30'697'345'340}};
  for (const auto& shape : kShapes) {
    const int64_t count = parameter_count(parse(reference_config(shape)));
    std::printf("  %-8s %15lld parameters (%.2f B)\n", shape.c_str(), static_cast<long long>(count), count / 1e9);
    EXPECT_EQ(count, expected.at(shape)) << shape;
  }
  // The PLE and embedding tables are most of E2B: 2,751,463,424 of its parameters.
  const ModelConfig e2b = parse(reference_config("e2b"));
  int64_t tables = 0;
  for (const TensorSpec& tensor : checkpoint_tensors(e2b)) {
    if (tensor.role == TensorRole::kTokenEmbedding || tensor.role == TensorRole::kPerLayerEmbedding) tables += tensor.element_count();
  }
  EXPECT_EQ(tables, 2'751'463'424);
}

TEST(ModelShapes, TensorListMatchesWhatTheLoaderReads) {
  // An untied config also stores lm_head.weight, the one key outside the language-model prefix.
  json config = shrink(reference_config("e2b", 6));
  config["tie_word_embeddings"] = false;
  const ModelConfig parsed = parse(config);
  const auto tensors = checkpoint_tensors(parsed);
  std::set<std::string> names;
  for (const TensorSpec& tensor : tensors) {
    EXPECT_TRUE(names.insert(tensor.name).second) << "duplicate " << tensor.name;
    EXPECT_TRUE(tensor.name == "lm_head.weight" || tensor.name.starts_with("model.language_model.")) << tensor.name;
  }
  EXPECT_TRUE(names.contains("lm_head.weight"));
  EXPECT_TRUE(names.contains("model.language_model.layers.5.layer_scalar"));
  EXPECT_FALSE(names.contains("model.language_model.layers.5.self_attn.k_proj.weight"));  // KV-shared layer
}

class TruncatedConfig : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TruncatedConfig, KeepsRealLayerShapesAndValidSharing) {
  const auto& [shape, layers] = GetParam();
  const ModelConfig real = parse(reference_config(shape));
  const ModelConfig config = parse(reference_config(shape, layers));
  ASSERT_EQ(config.num_layers, layers);
  ASSERT_EQ(config.layers.size(), static_cast<size_t>(layers));
  EXPECT_EQ(config.layer_types.back(), AttentionType::kFull);
  EXPECT_EQ(config.hidden_size, real.hidden_size);
  const int first_shared = config.first_kv_shared_layer();
  for (int index = 0; index < layers; ++index) {
    SCOPED_TRACE(index);
    const LayerConfig& layer = config.layers[index];
    if (index + 1 < layers) { EXPECT_EQ(layer.attention, real.layer_types[index]); }  // the real pattern, last forced full
    // Same geometry as a real layer of the same attention type.
    const auto same_type = std::find_if(real.layers.begin(), real.layers.end(), [&](const LayerConfig& other) { return other.attention == layer.attention; });
    ASSERT_NE(same_type, real.layers.end());
    EXPECT_EQ(layer.head_dim, same_type->head_dim);
    EXPECT_EQ(layer.num_kv_heads, same_type->num_kv_heads);
    EXPECT_EQ(layer.k_eq_v, same_type->k_eq_v);
    const bool shared = !layer.owns_kv(index);
    EXPECT_EQ(shared, index >= first_shared && config.num_kv_shared_layers > 0);
    EXPECT_EQ(layer.mlp_intermediate_size, real.intermediate_size * (shared && real.use_double_wide_mlp ? 2 : 1));
    if (shared) {
      const int source = layer.kv_source_layer;
      ASSERT_GE(source, 0);
      ASSERT_LT(source, first_shared);
      EXPECT_TRUE(config.layers[source].owns_kv(source));
      EXPECT_EQ(config.layers[source].attention, layer.attention);
    }
  }
  // KV sharing survives whenever the layer count leaves room for a source of each type.
  if (real.num_kv_shared_layers > 0) {
    int period = 0;
    while (real.layer_types[period] != AttentionType::kFull) ++period;
    ++period;
    if (layers > period) {
      EXPECT_GE(config.num_kv_shared_layers, 1);
    } else {
      EXPECT_EQ(config.num_kv_shared_layers, 0);
    }
    if (config.num_kv_shared_layers > 0) { EXPECT_GE(first_shared, period); }
  }
}

INSTANTIATE_TEST_SUITE_P(AllShapes, TruncatedConfig,
                         ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Values(2, 3, 4, 6, 8, 12, 16)),
                         [](const auto& info) {
                           return test_name(std::get<0>(info.param)) + "_" + std::to_string(std::get<1>(info.param));
                         });

TEST(ModelShapes, TruncatedSharingCounts) {
  // round(20 * N / 35), at least one, leaving layers 0-4 (both types) unshared.
  EXPECT_EQ(reference_config("e2b", 6)["text_config"]["num_kv_shared_layers"], 1);
  EXPECT_EQ(reference_config("e2b", 8)["text_config"]["num_kv_shared_layers"], 3);
  EXPECT_EQ(reference_config("e2b", 14)["text_config"]["num_kv_shared_layers"], 8);
  EXPECT_EQ(reference_config("e2b", 4)["text_config"]["num_kv_shared_layers"], 0);
  EXPECT_EQ(reference_config("e4b", 12)["text_config"]["num_kv_shared_layers"], 5);
}

// ---- The writer ---------------------------------------------------------------------------------------

// Every shard's tensors, read back through the reader.
std::map<std::string, std::string> tensor_bytes(const std::filesystem::path& dir) {
  const Checkpoint checkpoint(dir);
  std::map<std::string, std::string> bytes;
  for (const auto& [name, tensor] : checkpoint.tensors()) {
    bytes[name] = std::string(reinterpret_cast<const char*>(tensor.data), tensor.size_bytes);
  }
  return bytes;
}

class CheckpointWriterShapes : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointWriterShapes, ShardedCheckpointLoads) {
  const auto dir = testing::fresh_work_dir("make_model/sharded_" + test_name(GetParam()));
  const json config = shrink(reference_config(GetParam(), 8));
  CheckpointWriterOptions options;
  options.max_shard_bytes = 64 << 10;
  options.chunk_bytes = 4096;
  uint64_t last_progress = 0;
  options.on_progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_progress);
    EXPECT_LE(done, total);
    last_progress = done;
  };
  const CheckpointSummary summary = write_random_checkpoint(config, dir, options);

  const ModelConfig parsed = parse(config);
  const CheckpointPlan plan = plan_checkpoint(parsed, options);
  ASSERT_GT(plan.shards.size(), 2u);
  EXPECT_EQ(last_progress, plan.tensor_bytes);
  EXPECT_EQ(summary.parameters, parameter_count(parsed));

  auto model = Model::load(dir);
  EXPECT_TRUE(model->weights().unused_tensors.empty());
  EXPECT_EQ(model->config().num_layers, 8);
  EXPECT_EQ(model->config().eos_token_ids, (std::vector<int>{1, 50, 106}));
  EXPECT_EQ(model->checkpoint().files().size(), plan.shards.size());

  const json index = read_json_file(dir / "model.safetensors.index.json");
  const json& weight_map = index.at("weight_map");
  std::set<std::string> planned;
  for (const PlannedTensor& tensor : plan.tensors) planned.insert(tensor.spec.name);
  std::set<std::string> indexed;
  for (const auto& [name, file] : weight_map.items()) indexed.insert(name);
  EXPECT_EQ(indexed, planned);
  uint64_t stored_bytes = 0;
  std::set<std::string> stored;
  for (const auto& [name, tensor] : model->checkpoint().tensors()) {
    stored.insert(name);
    stored_bytes += tensor.size_bytes;
    EXPECT_EQ(tensor.dtype_name, "BF16") << name;
    EXPECT_EQ(weight_map.at(name).get<std::string>(), tensor.file->filename().string()) << name;
  }
  EXPECT_EQ(stored, planned);
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), stored_bytes);
  EXPECT_EQ(stored_bytes, plan.tensor_bytes);
  EXPECT_EQ(index.at("metadata").at("total_parameters").get<int64_t>(), plan.parameters);
  for (size_t shard = 0; shard < plan.shards.size(); ++shard) {
    const auto name = fmt::format("model-{:05}-of-{:05}.safetensors", shard + 1, plan.shards.size());
    EXPECT_EQ(std::filesystem::file_size(dir / name), plan.shards[shard].file_bytes()) << name;
    // A shard holds more than one tensor unless that tensor alone exceeds the shard size.
    EXPECT_TRUE(plan.shards[shard].data_bytes <= options.max_shard_bytes || plan.shards[shard].tensors.size() == 1);
  }
}

TEST_P(CheckpointWriterShapes, ForwardPassGivesModerateFiniteLogits) {
  const auto dir = testing::fresh_work_dir("make_model/forward_" + test_name(GetParam()));
  // The real depth (KV sharing, double-wide MLP and all), small widths: activations must stay sane.
  json config = shrink(reference_config(GetParam()));
  write_random_checkpoint(config, dir, {});
  auto model = Model::load(dir);
  EngineOptions engine_options;
  engine_options.context_tokens = 64;
  engine_options.backend = "reference";
  engine_options.threads = 1;
  Transformer transformer(*model, engine_options);
  const std::vector<int32_t> tokens = {2, 100, 200, 300, 17};
  const std::span<const float> logits = transformer.forward(tokens, 0);
  ASSERT_EQ(logits.size(), 512u);
  double sum_squares = 0;
  for (float logit : logits) {
    ASSERT_TRUE(std::isfinite(logit));
    sum_squares += static_cast<double>(logit) * logit;
  }
  const double rms = std::sqrt(sum_squares / static_cast<double>(logits.size()));
  std::printf("  %s: logit rms %.3f\n", GetParam().c_str(), rms);
  EXPECT_GT(rms, 0.05);   // not collapsed
  EXPECT_LT(rms, 20.0);   // not saturating the softcap of 30
}

INSTANTIATE_TEST_SUITE_P(AllShapes, CheckpointWriterShapes, ::testing::ValuesIn(kShapes),
                         [](const auto& info) { return test_name(info.param); });

TEST(CheckpointWriter, BytesDependOnSeedOnly) {
  const json config = shrink(reference_config("26b-a4b", 3));
  CheckpointWriterOptions options;
  options.seed = 7;
  options.max_shard_bytes = 100 << 10;
  const auto first = testing::fresh_work_dir("make_model/seed_a");
  write_random_checkpoint(config, first, options);

  // Another chunk size and shard layout: identical tensor bytes.
  CheckpointWriterOptions regrouped = options;
  regrouped.chunk_bytes = 4096 + 8;
  regrouped.max_shard_bytes = 1ull << 30;
  const auto second = testing::fresh_work_dir("make_model/seed_b");
  write_random_checkpoint(config, second, regrouped);
  EXPECT_FALSE(std::filesystem::exists(second / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(second / "model.safetensors"));
  const auto reference = tensor_bytes(first);
  EXPECT_EQ(tensor_bytes(second), reference);

  // The same options twice: identical files.
  const auto third = testing::fresh_work_dir("make_model/seed_c");
  write_random_checkpoint(config, third, options);
  for (const auto& entry : std::filesystem::directory_iterator(first)) {
    EXPECT_EQ(read_text_file(entry.path()), read_text_file(third / entry.path().filename())) << entry.path();
  }

  // Another seed: every tensor differs.
  CheckpointWriterOptions reseeded = options;
  reseeded.seed = 8;
  const auto fourth = testing::fresh_work_dir("make_model/seed_d");
  write_random_checkpoint(config, fourth, reseeded);
  const auto other = tensor_bytes(fourth);
  ASSERT_EQ(other.size(), reference.size());
  for (const auto& [name, bytes] : reference) EXPECT_NE(other.at(name), bytes) << name;
}

TEST(CheckpointWriter, WeightStatistics) {
  json config = shrink(reference_config("e2b", 6));
  config["text_config"]["hidden_size"] = 256;
  config["text_config"]["intermediate_size"] = 512;
  const auto dir = testing::fresh_work_dir("make_model/statistics");
  CheckpointWriterOptions options;
  options.dtype = DType::kF32;
  write_random_checkpoint(config, dir, options);
  auto model = Model::load(dir);
  EXPECT_EQ(read_json_file(dir / "config.json").at("text_config").at("dtype"), "float32");

  auto moments = [](const TensorView& view) {
    std::vector<float> values(static_cast<size_t>(view.element_count()));
    view.read_floats(0, view.element_count(), values.data());
    double sum = 0, squares = 0;
    float low = values[0], high = values[0];
    for (float value : values) {
      sum += value;
      squares += static_cast<double>(value) * value;
      low = std::min(low, value);
      high = std::max(high, value);
    }
    const double mean = sum / static_cast<double>(values.size());
    return std::tuple<double, double, float, float>{mean, std::sqrt(squares / static_cast<double>(values.size()) - mean * mean), low, high};
  };
  const ModelWeights& weights = model->weights();
  EXPECT_EQ(weights.embed_tokens.dtype, DType::kF32);
  {
    const auto [mean, deviation, low, high] = moments(weights.embed_tokens);  // 1 / sqrt(256)
    EXPECT_NEAR(mean, 0.0, 0.002);
    EXPECT_NEAR(deviation, 1.0 / 16, 0.002);
  }
  {
    const auto [mean, deviation, low, high] = moments(weights.embed_tokens_per_layer);  // 1 / sqrt(16)
    EXPECT_NEAR(deviation, 0.25, 0.005);
  }
  {
    const auto [mean, deviation, low, high] = moments(weights.layers[5].mlp.down_proj);  // fan-in 1024 (double wide)
    EXPECT_NEAR(mean, 0.0, 0.001);
    EXPECT_NEAR(deviation, 1.0 / 32, 0.001);
    EXPECT_LT(std::abs(high), 3.5 / 32);  // Irwin-Hall(4) is bounded at sqrt(12) deviations
  }
  {
    const auto [mean, deviation, low, high] = moments(weights.layers[0].attention.q_proj);  // fan-in 256
    EXPECT_NEAR(deviation, 1.0 / 16, 0.002);
  }
  for (const LayerWeights& layer : weights.layers) {
    for (const TensorView* norm : {&layer.input_norm, &layer.post_feedforward_norm}) {
      const auto [mean, deviation, low, high] = moments(*norm);
      EXPECT_GE(low, 0.5f);
      EXPECT_LT(high, 1.5f);
      if (norm->element_count() >= 256) { EXPECT_NEAR(mean, 1.0, 0.1); }
    }
    // q/k norms near head_dim^-1/4 keep attention scores' deviation near 1 (Gemma-4 scales them by 1).
    const double head_scale = std::pow(static_cast<double>(layer.attention.q_norm.element_count()), -0.25);
    const auto [q_mean, q_deviation, q_low, q_high] = moments(layer.attention.q_norm);
    EXPECT_GE(q_low, 0.8 * head_scale * 0.99);  // bf16 storage rounds by up to 0.4%
    EXPECT_LT(q_high, 1.2 * head_scale * 1.01);
    const float scalar = layer.layer_scalar.at(0);
    EXPECT_GE(scalar, 0.05f);
    EXPECT_LT(scalar, 0.07f);
  }
}

TEST(CheckpointWriter, ReplacesStaleCheckpointFiles) {
  const auto dir = testing::fresh_work_dir("make_model/replace");
  const json config = shrink(reference_config("31b", 2));
  CheckpointWriterOptions sharded;
  sharded.max_shard_bytes = 32 << 10;
  write_random_checkpoint(config, dir, sharded);
  testing::write_text_file(dir / "notes.txt", "kept");
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));

  write_random_checkpoint(config, dir, {});  // one file now: the old index and shards must go
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors", "notes.txt"}));
  EXPECT_NO_THROW(Model::load(dir));
}

TEST(CheckpointWriter, GenerationConfig) {
  const auto dir = testing::fresh_work_dir("make_model/generation");
  write_random_checkpoint(shrink(reference_config("12b", 2)), dir, {});
  const json generation = read_json_file(dir / "generation_config.json");
  EXPECT_EQ(generation.at("eos_token_id"), json({1, 106, 50}));
  EXPECT_EQ(generation.at("bos_token_id"), 2);
  EXPECT_EQ(generation.at("pad_token_id"), 0);
  EXPECT_EQ(read_json_file(dir / "config.json").at("model_type"), "gemma4_unified");
}

TEST(CheckpointWriter, RejectsF16AndInvalidConfigs) {
  const auto dir = testing::fresh_work_dir("make_model/rejects");
  CheckpointWriterOptions options;
  options.dtype = DType::kF16;
  EXPECT_THROW(write_random_checkpoint(shrink(reference_config("e2b", 2)), dir, options), Error);
  json broken = shrink(reference_config("e2b", 2));
  broken["text_config"]["hidden_size"] = "wide";
  EXPECT_THROW(write_random_checkpoint(broken, dir, {}), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(CheckpointWriter, FullSizePlans) {
  // Planning touches no disk, so the real shapes can be checked: the E2B PLE table alone exceeds 4 GiB
  // and gets a shard to itself.
  const CheckpointPlan e2b = plan_checkpoint(parse(reference_config("e2b")), {});
  EXPECT_EQ(e2b.tensor_bytes, 2ull * 4'628'569'379);
  EXPECT_EQ(e2b.shards.size(), 3u);
  for (const PlannedShard& shard : e2b.shards) EXPECT_TRUE(shard.data_bytes <= (4ull << 30) || shard.tensors.size() == 1);
  for (const PlannedTensor& tensor : e2b.tensors) {
    if (tensor.spec.role == TensorRole::kPerLayerEmbedding) {
      EXPECT_EQ(e2b.shards[tensor.shard].tensors.size(), 1u);
      EXPECT_GT(e2b.shards[tensor.shard].data_bytes, 4ull << 30);
    }
  }
  const CheckpointPlan big = plan_checkpoint(parse(reference_config("31b")), {});
  EXPECT_EQ(big.tensor_bytes, 2ull * 30'697'345'340);
  EXPECT_EQ(big.shards.size(), 15u);
  EXPECT_EQ(big.shards[0].file_name, "model-00001-of-00015.safetensors");
}

TEST(CheckpointWriter, FreeSpaceCheck) {
  const auto dir = testing::fresh_work_dir("make_model/space");
  EXPECT_NO_THROW(check_free_space(dir / "not" / "yet", 1 << 20));
  try {
    check_free_space(dir / "not" / "yet", 1ull << 62);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not enough free disk space"), std::string::npos) << error.what();
  }
}

TEST(CheckpointWriter, ProgressBarPrintsOneLineWhenNotATerminal) {
  std::FILE* stream = std::tmpfile();
  ASSERT_NE(stream, nullptr);
  {
    ProgressBar progress("writing", 3'000'000, stream);
    EXPECT_FALSE(progress.interactive());
    for (uint64_t done = 0; done <= 3'000'000; done += 100'000) progress.update(done);
    progress.finish();
    progress.finish();
  }
  std::rewind(stream);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), stream));
  std::fclose(stream);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_TRUE(text.starts_with("writing: 3.0 MB in ")) << text;
  EXPECT_NE(text.find("MB/s"), std::string::npos) << text;
  EXPECT_EQ(format_bytes(9'257'138'758ull), "9.26 GB");
  EXPECT_EQ(format_bytes(512), "512 B");
}

// ---- The command --------------------------------------------------------------------------------------

TEST(MakeModelCommand, UnknownShape) {
  const auto dir = testing::fresh_work_dir("make_model/cli_unknown");
  const auto result = run_gemma4rt({"make-model", "--shape", "70b", "--out", (dir / "out").string()});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("unknown model shape \"70b\""), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("26b-a4b"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(MakeModelCommand, RefusesNonEmptyOutput) {
  const auto dir = testing::fresh_work_dir("make_model/cli_nonempty");
  testing::write_text_file(dir / "keep.txt", "mine");
  const auto result = run_gemma4rt({"make-model", "--shape", "e2b", "--out", dir.string()});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("not empty"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--force"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "config.json"));
  EXPECT_EQ(read_text_file(dir / "keep.txt"), "mine");
}

TEST(MakeModelCommand, BadFlags) {
  const auto dir = testing::fresh_work_dir("make_model/cli_flags");
  const std::string out = (dir / "out").string();
  EXPECT_NE(run_gemma4rt({"make-model", "--shape", "e2b", "--layers", "1", "--out", out}).exit_code, 0);
  EXPECT_NE(run_gemma4rt({"make-model", "--out", out}).exit_code, 0);  // neither --shape nor --config
  auto result = run_gemma4rt({"make-model", "--shape", "e2b", "--layers", "40", "--out", out});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("between 2 and 35"), std::string::npos) << result.err;
  result = run_gemma4rt({"make-model", "--shape", "e2b", "--dtype", "f16", "--out", out});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--dtype"), std::string::npos) << result.err;
  result = run_gemma4rt({"make-model", "--shape", "e2b", "--tokenizer", (dir / "missing.json").string(), "--out", out});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("missing.json"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(MakeModelCommand, WritesAConfigsCheckpointThatRuns) {
  const auto dir = testing::fresh_work_dir("make_model/cli_config");
  const auto config_path = dir / "tiny-config.json";
  testing::write_text_file(config_path, shrink(reference_config("e2b", 8)).dump());
  const auto tokenizer_path = dir / "tokenizer-source.json";
  testing::write_text_file(tokenizer_path, "{\"not\": \"a real tokenizer\"}");
  const auto out = dir / "model";

  auto result = run_gemma4rt({"make-model", "--config", config_path.string(), "--shard-size-gb", "0.0001", "--seed", "3",
                              "--tokenizer", tokenizer_path.string(), "--out", out.string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("parameters"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("make-model: "), std::string::npos) << result.err;  // the final progress line
  EXPECT_EQ(read_text_file(out / "tokenizer.json"), read_text_file(tokenizer_path));
  EXPECT_TRUE(std::filesystem::exists(out / "model.safetensors.index.json"));
  EXPECT_NO_THROW(Model::load(out));

  // Non-empty now: refused without --force, rewritten with it.
  result = run_gemma4rt({"make-model", "--config", config_path.string(), "--out", out.string()});
  EXPECT_EQ(result.exit_code, 1);
  result = run_gemma4rt({"make-model", "--config", config_path.string(), "--force", "--out", out.string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_FALSE(std::filesystem::exists(out / "model.safetensors.index.json"));
  EXPECT_NO_THROW(Model::load(out));
  // A --tokenizer that already sits in --out is kept as it is (a copy onto itself once failed).
  result = run_gemma4rt({"make-model", "--config", config_path.string(), "--force", "--tokenizer", (out / "tokenizer.json").string(),
                         "--out", out.string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(read_text_file(out / "tokenizer.json"), read_text_file(tokenizer_path));

  std::filesystem::remove(out / "tokenizer.json");  // not a real tokenizer; --prompt-ids needs none
  result = run_gemma4rt({"run", "--model", out.string(), "--prompt-ids", "2,100,200", "--max-tokens", "1", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const json output = json::parse(result.out);
  EXPECT_EQ(output.at("tokens").size(), 1u);
}

}  // namespace
}  // namespace gemma4rt
