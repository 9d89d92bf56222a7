#include "model/model_shapes.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace gemma4rt {
namespace {

using nlohmann::json;

// One row of the architecture doc's §1.1 table. Fields shared by every variant (vocabulary, RoPE, norm
// eps, softcap, head dims) are written once in reference_config.
struct VariantShape {
  const char* name;
  bool unified;                          // the 12B is the gemma4_unified model type
  int hidden_size;
  int num_layers;
  int num_attention_heads;
  int num_key_value_heads;
  std::optional<int> num_global_key_value_heads;
  bool attention_k_eq_v;
  int intermediate_size;
  bool use_double_wide_mlp;
  int hidden_size_per_layer_input;       // 0 = no PLE
  int num_kv_shared_layers;
  int sliding_window;
  int layer_type_period;                 // layer i is full iff i % period == period - 1
  int max_position_embeddings;
  bool vision_bidirectional;             // use_bidirectional_attention "vision" (text-only: causal anyway)
  int num_experts;                       // 0 = no MoE block
  int top_k_experts;
  int moe_intermediate_size;
};

const VariantShape kVariants[] = {
    // name      unified  H     L   heads kv  global_kv     k=v    inter  2xMLP  PLE  shared  W    period  max_pos  vision  MoE
    {"e2b",     false,  1536, 35,  8,   1,  std::nullopt, false,  6144, true,  256, 20,     512,  5, 131072, false, 0,   0, 0},
    {"e4b",     false,  2560, 42,  8,   2,  std::nullopt, false, 10240, false, 256, 18,     512,  6, 131072, false, 0,   0, 0},
    {"12b",     true,   3840, 48, 16,   8,  1,            true,  15360, false, 0,   0,     1024,  6, 262144, true,  0,   0, 0},
    {"31b",     false,  5376, 60, 32,  16,  4,            true,  21504, false, 0,   0,     1024,  6, 262144, true,  0,   0, 0},
    {"26b-a4b", false,  2816, 30, 16,   8,  2,            true,   2112, false, 0,   0,     1024,  6, 262144, true,  128, 8, 704},
};

constexpr int kVocabSize = 262144;

const VariantShape& find_variant(const std::string& shape) {
  for (const VariantShape& variant : kVariants) {
    if (shape == variant.name) return variant;
  }
  fail("unknown model shape \"{}\" (known shapes: {})", shape, fmt::join(known_model_shapes(), ", "));
}

// KV sharing for a shallower model: the real fraction of shared layers, but every shared layer needs an
// earlier non-shared layer of its type, so the non-shared prefix must reach the first full layer.
int scaled_kv_shared_layers(const VariantShape& variant, int layers) {
  if (variant.num_kv_shared_layers == 0) return 0;
  if (layers == variant.num_layers) return variant.num_kv_shared_layers;
  const int most = layers - variant.layer_type_period;  // non-shared prefix keeps layers 0..period-1
  if (most < 1) return 0;
  const int scaled = static_cast<int>(std::lround(static_cast<double>(variant.num_kv_shared_layers) * layers / variant.num_layers));
  return std::clamp(scaled, 1, most);
}

json nullable(int value) { return value > 0 ? json(value) : json(nullptr); }

}  // namespace

std::vector<std::string> known_model_shapes() {
  std::vector<std::string> names;
  for (const VariantShape& variant : kVariants) names.emplace_back(variant.name);
  return names;
}

json reference_config(const std::string& shape, std::optional<int> layers) {
  const VariantShape& variant = find_variant(shape);
  const int num_layers = layers.value_or(variant.num_layers);
  if (num_layers < 2 || num_layers > variant.num_layers) {
    fail("{}: the layer count must be between 2 and {} (the real depth), got {}", shape, variant.num_layers, num_layers);
  }
  json layer_types = json::array();
  for (int index = 0; index < num_layers; ++index) {
    const bool full = index % variant.layer_type_period == variant.layer_type_period - 1 || index == num_layers - 1;
    layer_types.push_back(full ? "full_attention" : "sliding_attention");
  }
  const bool moe = variant.num_experts > 0;

  json text;
  text["model_type"] = variant.unified ? "gemma4_unified_text" : "gemma4_text";
  text["dtype"] = "bfloat16";
  text["vocab_size"] = kVocabSize;
  text["hidden_size"] = variant.hidden_size;
  text["intermediate_size"] = variant.intermediate_size;
  text["num_hidden_layers"] = num_layers;
  text["num_attention_heads"] = variant.num_attention_heads;
  text["num_key_value_heads"] = variant.num_key_value_heads;
  text["num_global_key_value_heads"] = variant.num_global_key_value_heads ? json(*variant.num_global_key_value_heads) : json(nullptr);
  text["head_dim"] = 256;
  text["global_head_dim"] = 512;
  text["attention_k_eq_v"] = variant.attention_k_eq_v;
  text["attention_bias"] = false;
  text["attention_dropout"] = 0.0;
  text["use_double_wide_mlp"] = variant.use_double_wide_mlp;
  text["hidden_size_per_layer_input"] = variant.hidden_size_per_layer_input;
  text["vocab_size_per_layer_input"] = kVocabSize;
  text["num_kv_shared_layers"] = scaled_kv_shared_layers(variant, num_layers);
  text["sliding_window"] = variant.sliding_window;
  text["layer_types"] = layer_types;
  text["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
      {"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}}},
  };
  text["rms_norm_eps"] = 1e-6;
  text["final_logit_softcapping"] = 30.0;
  text["hidden_activation"] = "gelu_pytorch_tanh";
  text["tie_word_embeddings"] = true;
  text["enable_moe_block"] = moe;
  text["num_experts"] = nullable(variant.num_experts);
  text["top_k_experts"] = nullable(variant.top_k_experts);
  text["moe_intermediate_size"] = nullable(variant.moe_intermediate_size);
  text["max_position_embeddings"] = variant.max_position_embeddings;
  text["use_bidirectional_attention"] = variant.vision_bidirectional ? json("vision") : json(nullptr);
  text["use_cache"] = true;
  text["initializer_range"] = 0.02;
  text["pad_token_id"] = 0;
  text["bos_token_id"] = 2;
  text["eos_token_id"] = 1;

  json config;
  config["architectures"] = {variant.unified ? "Gemma4UnifiedForConditionalGeneration" : "Gemma4ForConditionalGeneration"};
  config["model_type"] = variant.unified ? "gemma4_unified" : "gemma4";
  config["dtype"] = "bfloat16";
  config["text_config"] = std::move(text);
  config["vision_config"] = nullptr;  // text-only checkpoints: the towers are not written
  config["audio_config"] = nullptr;
  config["tie_word_embeddings"] = true;
  config["eos_token_id"] = {1, 106};  // instruction-tuned: <eos>, <turn|>
  config["initializer_range"] = 0.02;
  // Multimodal placeholder ids, as the released configs carry them.
  config["image_token_id"] = 258880;
  config["audio_token_id"] = 258881;
  config["video_token_id"] = 258884;
  config["boi_token_id"] = 255999;
  config["eoi_token_id"] = 258882;
  config["boa_token_id"] = 256000;
  config["eoa_token_index"] = 258883;
  return config;
}

int64_t TensorSpec::element_count() const {
  int64_t count = 1;
  for (int64_t dimension : shape) count *= dimension;
  return count;
}

bool TensorSpec::is_attention() const {
  switch (kind) {
    case TensorKind::kQProj: case TensorKind::kQNorm: case TensorKind::kKProj: case TensorKind::kKNorm:
    case TensorKind::kVProj: case TensorKind::kOProj:
      return true;
    default:
      return false;
  }
}

bool TensorSpec::is_expert() const { return kind == TensorKind::kExpertsGateUp || kind == TensorKind::kExpertsDown; }

std::string tensor_key(TensorKind kind, int layer) {
  const auto in_layer = [layer](const char* name) { return fmt::format("layers.{}.{}", layer, name); };
  switch (kind) {
    case TensorKind::kTokenEmbedding: return "embed_tokens.weight";
    case TensorKind::kPerLayerEmbedding: return "embed_tokens_per_layer.weight";
    case TensorKind::kPerLayerModelProjection: return "per_layer_model_projection.weight";
    case TensorKind::kPerLayerProjectionNorm: return "per_layer_projection_norm.weight";
    case TensorKind::kFinalNorm: return "norm.weight";
    case TensorKind::kLmHead: return "lm_head.weight";
    case TensorKind::kInputNorm: return in_layer("input_layernorm.weight");
    case TensorKind::kQProj: return in_layer("self_attn.q_proj.weight");
    case TensorKind::kQNorm: return in_layer("self_attn.q_norm.weight");
    case TensorKind::kKProj: return in_layer("self_attn.k_proj.weight");
    case TensorKind::kKNorm: return in_layer("self_attn.k_norm.weight");
    case TensorKind::kVProj: return in_layer("self_attn.v_proj.weight");
    case TensorKind::kOProj: return in_layer("self_attn.o_proj.weight");
    case TensorKind::kPostAttentionNorm: return in_layer("post_attention_layernorm.weight");
    case TensorKind::kPreFeedforwardNorm: return in_layer("pre_feedforward_layernorm.weight");
    case TensorKind::kGateProj: return in_layer("mlp.gate_proj.weight");
    case TensorKind::kUpProj: return in_layer("mlp.up_proj.weight");
    case TensorKind::kDownProj: return in_layer("mlp.down_proj.weight");
    case TensorKind::kPostFeedforwardNorm: return in_layer("post_feedforward_layernorm.weight");
    case TensorKind::kPostFeedforwardNorm1: return in_layer("post_feedforward_layernorm_1.weight");
    case TensorKind::kRouterProj: return in_layer("router.proj.weight");
    case TensorKind::kRouterScale: return in_layer("router.scale");
    case TensorKind::kPerExpertScale: return in_layer("router.per_expert_scale");
    case TensorKind::kPreFeedforwardNorm2: return in_layer("pre_feedforward_layernorm_2.weight");
    case TensorKind::kExpertsGateUp: return in_layer("experts.gate_up_proj");
    case TensorKind::kExpertsDown: return in_layer("experts.down_proj");
    case TensorKind::kPostFeedforwardNorm2: return in_layer("post_feedforward_layernorm_2.weight");
    case TensorKind::kPerLayerInputGate: return in_layer("per_layer_input_gate.weight");
    case TensorKind::kPerLayerProjection: return in_layer("per_layer_projection.weight");
    case TensorKind::kPostPerLayerInputNorm: return in_layer("post_per_layer_input_norm.weight");
    case TensorKind::kLayerScalar: return in_layer("layer_scalar");
  }
  return "?";
}

bool tensor_key_is_prefixed(TensorKind kind) { return kind != TensorKind::kLmHead; }

std::vector<TensorSpec> checkpoint_tensors(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  std::vector<TensorSpec> tensors;
  int current_layer = -1;
  auto add = [&](TensorKind kind, std::vector<int64_t> shape, TensorRole role) {
    std::string key = tensor_key(kind, current_layer);
    std::string name = tensor_key_is_prefixed(kind) ? kReleasedKeyPrefix + key : key;
    tensors.push_back({std::move(name), std::move(key), std::move(shape), role, kind, current_layer});
  };

  add(TensorKind::kTokenEmbedding, {config.vocab_size, hidden}, TensorRole::kTokenEmbedding);
  if (config.has_per_layer_inputs()) {
    const int64_t width = config.hidden_size_per_layer_input;
    const int64_t packed = config.num_layers * width;
    add(TensorKind::kPerLayerEmbedding, {config.vocab_size_per_layer_input, packed}, TensorRole::kPerLayerEmbedding);
    add(TensorKind::kPerLayerModelProjection, {packed, hidden}, TensorRole::kLinear);
    add(TensorKind::kPerLayerProjectionNorm, {width}, TensorRole::kNorm);
  }
  add(TensorKind::kFinalNorm, {hidden}, TensorRole::kNorm);
  // Released checkpoints tie the LM head to the embedding and do not store it.
  if (!config.tie_word_embeddings) add(TensorKind::kLmHead, {config.vocab_size, hidden}, TensorRole::kLinear);

  for (int index = 0; index < config.num_layers; ++index) {
    current_layer = index;
    const LayerConfig& geometry = config.layers.at(index);
    const int64_t head_dim = geometry.head_dim;
    const int64_t q_rows = static_cast<int64_t>(geometry.num_query_heads) * head_dim;
    const int64_t kv_rows = static_cast<int64_t>(geometry.num_kv_heads) * head_dim;
    const int64_t intermediate = geometry.mlp_intermediate_size;

    add(TensorKind::kInputNorm, {hidden}, TensorRole::kNorm);
    add(TensorKind::kQProj, {q_rows, hidden}, TensorRole::kLinear);
    add(TensorKind::kQNorm, {head_dim}, TensorRole::kNorm);
    // KV-shared layers read their source's K/V and have no projections of their own.
    if (geometry.owns_kv(index)) {
      add(TensorKind::kKProj, {kv_rows, hidden}, TensorRole::kLinear);
      add(TensorKind::kKNorm, {head_dim}, TensorRole::kNorm);
      if (!geometry.k_eq_v) add(TensorKind::kVProj, {kv_rows, hidden}, TensorRole::kLinear);
    }
    add(TensorKind::kOProj, {hidden, q_rows}, TensorRole::kLinear);
    add(TensorKind::kPostAttentionNorm, {hidden}, TensorRole::kNorm);
    add(TensorKind::kPreFeedforwardNorm, {hidden}, TensorRole::kNorm);
    add(TensorKind::kGateProj, {intermediate, hidden}, TensorRole::kLinear);
    add(TensorKind::kUpProj, {intermediate, hidden}, TensorRole::kLinear);
    add(TensorKind::kDownProj, {hidden, intermediate}, TensorRole::kLinear);
    if (config.enable_moe_block) {
      const int64_t experts = config.num_experts;
      const int64_t expert_width = config.moe_intermediate_size;
      add(TensorKind::kPostFeedforwardNorm1, {hidden}, TensorRole::kNorm);
      add(TensorKind::kRouterProj, {experts, hidden}, TensorRole::kLinear);
      add(TensorKind::kRouterScale, {hidden}, TensorRole::kNorm);
      add(TensorKind::kPerExpertScale, {experts}, TensorRole::kNorm);
      add(TensorKind::kPreFeedforwardNorm2, {hidden}, TensorRole::kNorm);
      add(TensorKind::kExpertsGateUp, {experts, 2 * expert_width, hidden}, TensorRole::kLinear);
      add(TensorKind::kExpertsDown, {experts, hidden, expert_width}, TensorRole::kLinear);
      add(TensorKind::kPostFeedforwardNorm2, {hidden}, TensorRole::kNorm);
    }
    add(TensorKind::kPostFeedforwardNorm, {hidden}, TensorRole::kNorm);
    if (config.has_per_layer_inputs()) {
      const int64_t width = config.hidden_size_per_layer_input;
      add(TensorKind::kPerLayerInputGate, {width, hidden}, TensorRole::kLinear);
      add(TensorKind::kPerLayerProjection, {hidden, width}, TensorRole::kLinear);
      add(TensorKind::kPostPerLayerInputNorm, {hidden}, TensorRole::kNorm);
    }
    add(TensorKind::kLayerScalar, {1}, TensorRole::kLayerScalar);
  }
  return tensors;
}

int64_t parameter_count(const ModelConfig& config) {
  int64_t total = 0;
  for (const TensorSpec& tensor : checkpoint_tensors(config)) total += tensor.element_count();
  return total;
}

}  // namespace gemma4rt
