// ModelConfig resolution against what the reference instantiated (golden.json resolved_layers), RoPE
// tables against the reference's inverse frequencies, and the config defaults and errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/rope.h"
#include "model/config.h"
#include "test_support.h"

namespace gemma4rt {
namespace {

using testing::read_json_file;
const std::filesystem::path kGolden = std::filesystem::path(GEMMA4RT_TEST_DATA) / "golden";

class ResolvedConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(ResolvedConfig, LayersMatchReference) {
  const ModelConfig config = load_model_config(kGolden / GetParam());
  const nlohmann::json golden = read_json_file(kGolden / GetParam() / "golden.json");
  const auto& layers = golden["resolved_layers"];
  ASSERT_EQ(config.layers.size(), layers.size());
  for (size_t index = 0; index < layers.size(); ++index) {
    SCOPED_TRACE("layer " + std::to_string(index));
    const auto& expected = layers[index];
    const LayerConfig& layer = config.layers[index];
    EXPECT_EQ(layer.is_sliding(), expected["layer_type"] == "sliding_attention");
    EXPECT_EQ(layer.head_dim, expected["head_dim"].get<int>());
    EXPECT_EQ(layer.num_query_heads, expected["num_attention_heads"].get<int>());
    EXPECT_EQ(layer.num_kv_heads, expected["num_key_value_heads"].get<int>());
    EXPECT_EQ(layer.kv_source_layer, expected["kv_source_layer"].get<int>());
    EXPECT_EQ(!layer.owns_kv(static_cast<int>(index)), expected["is_kv_shared_layer"].get<bool>());
    EXPECT_EQ(layer.k_eq_v, expected["attention_k_eq_v (no v_proj, V = K before k_norm/RoPE)"].get<bool>());
    EXPECT_EQ(layer.mlp_intermediate_size, expected["mlp_intermediate_size"].get<int>());
    EXPECT_EQ(layer.sliding_window, expected["sliding_window"].is_null() ? 0 : expected["sliding_window"].get<int>());
  }
  EXPECT_EQ(config.enable_moe_block, layers[0]["moe"].get<bool>());
}

TEST_P(ResolvedConfig, RopeInverseFrequenciesMatchReference) {
  const ModelConfig config = load_model_config(kGolden / GetParam());
  const nlohmann::json golden = read_json_file(kGolden / GetParam() / "golden.json");
  const RopeTable sliding(config.rope_sliding, config.head_dim);
  const RopeTable full(config.rope_full, config.global_head_dim);
  const auto expected_sliding = golden["rope_inv_freq"]["sliding_attention"].get<std::vector<float>>();
  const auto expected_full = golden["rope_inv_freq"]["full_attention"].get<std::vector<float>>();
  ASSERT_EQ(sliding.inverse_frequencies().size(), expected_sliding.size());
  ASSERT_EQ(full.inverse_frequencies().size(), expected_full.size());
  for (size_t i = 0; i < expected_sliding.size(); ++i) EXPECT_FLOAT_EQ(sliding.inverse_frequencies()[i], expected_sliding[i]) << i;
  for (size_t i = 0; i < expected_full.size(); ++i) EXPECT_FLOAT_EQ(full.inverse_frequencies()[i], expected_full[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ResolvedConfig,
                         ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"),
                         testing::string_param_name);

TEST(ModelConfig, FlatTextConfigAndReferenceDefaults) {
  // A text-only (Gemma4ForCausalLM) config: flat, with most keys left to the reference defaults.
  const nlohmann::json flat = {{"model_type", "gemma4_text"}, {"num_hidden_layers", 12}};
  const ModelConfig config = parse_model_config(flat, "config.json");
  EXPECT_EQ(config.hidden_size, 2304);
  EXPECT_EQ(config.vocab_size, 262144);
  EXPECT_EQ(config.head_dim, 256);
  EXPECT_EQ(config.global_head_dim, 512);
  EXPECT_EQ(config.sliding_window, 512);
  EXPECT_EQ(config.hidden_size_per_layer_input, 256);
  EXPECT_FALSE(config.final_logit_softcapping.has_value());
  // Default pattern: five sliding layers, then one full; the last layer is always full.
  for (int i = 0; i < 12; ++i) EXPECT_EQ(config.layers[i].is_sliding(), (i + 1) % 6 != 0) << i;
  EXPECT_EQ(config.rope_full.type, "proportional");
  EXPECT_DOUBLE_EQ(config.rope_full.partial_rotary_factor, 0.25);
}

TEST(ModelConfig, LastLayerIsForcedFull) {
  const nlohmann::json flat = {{"model_type", "gemma4_text"},
                               {"num_hidden_layers", 2},
                               {"layer_types", {"sliding_attention", "sliding_attention"}}};
  const ModelConfig config = parse_model_config(flat, "config.json");
  EXPECT_TRUE(config.layers[0].is_sliding());
  EXPECT_FALSE(config.layers[1].is_sliding());
}

TEST(ModelConfig, KvSharingSourcesAndDoubleWideMlp) {
  // E2B's real layout: 35 layers, period 5, the last 20 read layers 13 (sliding) and 14 (full).
  nlohmann::json text = {{"model_type", "gemma4_text"}, {"num_hidden_layers", 35}, {"num_kv_shared_layers", 20},
                         {"intermediate_size", 6144}, {"use_double_wide_mlp", true}, {"num_key_value_heads", 1}};
  text["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < 35; ++i) text["layer_types"].push_back(i % 5 == 4 ? "full_attention" : "sliding_attention");
  const ModelConfig config = parse_model_config({{"model_type", "gemma4"}, {"text_config", text}}, "config.json");
  for (int i = 0; i < 35; ++i) {
    const LayerConfig& layer = config.layers[i];
    if (i < 15) {
      EXPECT_EQ(layer.kv_source_layer, i);
      EXPECT_EQ(layer.mlp_intermediate_size, 6144);
    } else {
      EXPECT_EQ(layer.kv_source_layer, layer.is_sliding() ? 13 : 14) << i;
      EXPECT_EQ(layer.mlp_intermediate_size, 12288);
    }
  }
}

TEST(ModelConfig, KEqVUsesGlobalKvHeadsOnFullLayersOnly) {
  const nlohmann::json flat = {{"model_type", "gemma4_text"}, {"num_hidden_layers", 6}, {"num_attention_heads", 32},
                               {"num_key_value_heads", 16}, {"num_global_key_value_heads", 4}, {"attention_k_eq_v", true}};
  const ModelConfig config = parse_model_config(flat, "config.json");
  EXPECT_EQ(config.layers[0].num_kv_heads, 16);
  EXPECT_FALSE(config.layers[0].k_eq_v);
  EXPECT_EQ(config.layers[5].num_kv_heads, 4);
  EXPECT_TRUE(config.layers[5].k_eq_v);
  EXPECT_EQ(config.layers[5].head_dim, 512);
}

TEST(ModelConfig, ErrorsNameTheField) {
  auto message_of = [](const nlohmann::json& config) {
    try {
      parse_model_config(config, "some/config.json");
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of({{"model_type", "llama"}}).find("model_type \"llama\""), std::string::npos);
  EXPECT_NE(message_of({{"hidden_size", 4}}).find("model_type is missing"), std::string::npos);
  EXPECT_NE(message_of({{"model_type", "gemma4"}, {"text_config", {{"num_attention_heads", 3}, {"num_key_value_heads", 2}}}})
                .find("num_attention_heads 3"),
            std::string::npos);
  EXPECT_NE(message_of({{"model_type", "gemma4_text"}, {"layer_types", {"sliding_attention"}}, {"num_hidden_layers", 3}})
                .find("layer_types has 1 entries"),
            std::string::npos);
  EXPECT_NE(message_of({{"model_type", "gemma4_text"}, {"rope_parameters", {{"full_attention", {{"rope_type", "yarn"}}}}}})
                .find("rope_parameters.full_attention.rope_type"),
            std::string::npos);
  EXPECT_NE(message_of({{"model_type", "gemma4_text"}, {"sliding_window", "big"}}).find("sliding_window"), std::string::npos);
  EXPECT_NE(message_of({{"model_type", "gemma4_text"}, {"vocab_size", 1024}, {"bos_token_id", 1024}})
                .find("some/config.json: field bos_token_id 1024 is outside the vocabulary (1024 ids)"),
            std::string::npos)
      << message_of({{"model_type", "gemma4_text"}, {"vocab_size", 1024}, {"bos_token_id", 1024}});
}

}  // namespace
}  // namespace gemma4rt
