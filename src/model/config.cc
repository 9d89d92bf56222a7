#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/json_input.h"

namespace gemma4rt {
namespace {

using nlohmann::json;

// Reads typed fields of one JSON object, naming the file and the key path in every error.
class FieldReader {
 public:
  FieldReader(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  int integer(const char* key, int fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_number_integer()) fail("{}: field {}{} must be an integer, got {}", source_, prefix_, key, json_excerpt(value));
    return value.get<int>();
  }
  std::optional<int> optional_integer(const char* key) const {
    if (!has(key)) return std::nullopt;
    return integer(key, 0);
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_number()) fail("{}: field {}{} must be a number, got {}", source_, prefix_, key, json_excerpt(value));
    return value.get<double>();
  }
  std::optional<double> optional_number(const char* key) const {
    if (!has(key)) return std::nullopt;
    return number(key, 0.0);
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_boolean()) fail("{}: field {}{} must be true or false, got {}", source_, prefix_, key, json_excerpt(value));
    return value.get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_string()) fail("{}: field {}{} must be a string, got {}", source_, prefix_, key, json_excerpt(value));
    return value.get<std::string>();
  }
  // eos_token_id may be one id or a list of ids.
  std::vector<int> id_list(const char* key) const {
    std::vector<int> ids;
    if (!has(key)) return ids;
    const json& value = object_.at(key);
    auto take = [&](const json& item) {
      if (!item.is_number_integer()) fail("{}: field {}{} must hold token ids, got {}", source_, prefix_, key, json_excerpt(value));
      ids.push_back(item.get<int>());
    };
    if (value.is_array()) {
      for (const json& item : value) take(item);
    } else {
      take(value);
    }
    return ids;
  }
  const json& object() const { return object_; }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

const std::set<std::string> kTopLevelTypes = {"gemma4", "gemma4_unified"};
const std::set<std::string> kTextTypes = {"gemma4_text", "gemma4_unified_text"};

RopeConfig parse_rope(const json& parameters, const std::string& source, const std::string& path, RopeConfig fallback) {
  if (parameters.is_null()) return fallback;
  if (!parameters.is_object()) fail("{}: field {} must be an object", source, path);
  FieldReader reader(parameters, source, path + ".");
  RopeConfig rope;
  rope.type = reader.string("rope_type", fallback.type);
  if (rope.type != "default" && rope.type != "proportional") {
    fail("{}: field {}.rope_type \"{}\" is not supported (expected \"default\" or \"proportional\")", source, path, rope.type);
  }
  rope.theta = reader.number("rope_theta", fallback.theta);
  rope.partial_rotary_factor = reader.number("partial_rotary_factor", rope.type == "proportional" ? fallback.partial_rotary_factor : 1.0);
  rope.factor = reader.number("factor", 1.0);
  if (rope.theta <= 0 || rope.factor <= 0 || rope.partial_rotary_factor <= 0 || rope.partial_rotary_factor > 1) {
    fail("{}: field {} has an impossible value: {}", source, path, json_excerpt(parameters));
  }
  return rope;
}

void resolve_layers(ModelConfig& config, const std::string& source) {
  const int first_shared = config.first_kv_shared_layer();
  config.layers.clear();
  for (int index = 0; index < config.num_layers; ++index) {
    LayerConfig layer;
    layer.attention = config.layer_types[index];
    const bool sliding = layer.is_sliding();
    layer.head_dim = (!sliding && config.global_head_dim > 0) ? config.global_head_dim : config.head_dim;
    layer.num_query_heads = config.num_attention_heads;
    layer.k_eq_v = config.attention_k_eq_v && !sliding;
    layer.num_kv_heads = (layer.k_eq_v && config.num_global_key_value_heads) ? *config.num_global_key_value_heads
                                                                              : config.num_key_value_heads;
    layer.sliding_window = sliding ? config.sliding_window : 0;
    const bool shared = config.num_kv_shared_layers > 0 && index >= first_shared;
    layer.kv_source_layer = index;
    if (shared) {
      // The last non-shared layer of the same attention type provides this layer's K/V.
      int source_layer = -1;
      for (int candidate = first_shared - 1; candidate >= 0; --candidate) {
        if (config.layer_types[candidate] == layer.attention) {
          source_layer = candidate;
          break;
        }
      }
      if (source_layer < 0) {
        fail("{}: layer {} is KV-shared (num_kv_shared_layers {}) but no earlier non-shared layer has its attention type",
             source, index, config.num_kv_shared_layers);
      }
      layer.kv_source_layer = source_layer;
    }
    layer.mlp_intermediate_size = config.intermediate_size * ((config.use_double_wide_mlp && shared) ? 2 : 1);
    if (layer.num_kv_heads <= 0 || layer.num_query_heads % layer.num_kv_heads != 0) {
      fail("{}: layer {}: num_attention_heads {} is not a multiple of its KV head count {}", source, index,
           layer.num_query_heads, layer.num_kv_heads);
    }
    // A shared layer reads its source's K/V, so their geometry must agree.
    if (shared) {
      const LayerConfig& source_geometry = config.layers[layer.kv_source_layer];
      if (source_geometry.head_dim != layer.head_dim || source_geometry.num_kv_heads != layer.num_kv_heads) {
        fail("{}: layer {} shares K/V of layer {} but their head geometry differs", source, index, layer.kv_source_layer);
      }
    }
    config.layers.push_back(layer);
  }
}

}  // namespace

ModelConfig parse_model_config(const json& root, const std::string& source) {
  if (!root.is_object()) fail("{}: expected a JSON object", source);
  FieldReader top(root, source, "");
  if (!top.has("model_type")) fail("{}: field model_type is missing", source);
  ModelConfig config;
  config.model_type = top.string("model_type", "");

  // Multimodal wrappers nest the text model under text_config; the text-only classes are flat.
  const json* text = &root;
  std::string prefix;
  if (kTopLevelTypes.contains(config.model_type)) {
    if (root.contains("text_config") && !root.at("text_config").is_null()) {
      text = &root.at("text_config");
      prefix = "text_config.";
      if (!text->is_object()) fail("{}: field text_config must be an object", source);
    }
  } else if (!kTextTypes.contains(config.model_type)) {
    fail("{}: model_type \"{}\" is not a Gemma-4 text model (expected gemma4, gemma4_text, gemma4_unified or "
         "gemma4_unified_text)", source, config.model_type);
  }
  FieldReader reader(*text, source, prefix);
  if (reader.has("model_type")) {
    const std::string text_type = reader.string("model_type", "");
    if (!kTextTypes.contains(text_type)) {
      fail("{}: field {}model_type \"{}\" is not a Gemma-4 text model type", source, prefix, text_type);
    }
  }

  // Defaults are those of the reference Gemma4TextConfig.
  config.vocab_size = reader.integer("vocab_size", 262144);
  config.hidden_size = reader.integer("hidden_size", 2304);
  config.intermediate_size = reader.integer("intermediate_size", 9216);
  config.num_layers = reader.integer("num_hidden_layers", 30);
  config.num_attention_heads = reader.integer("num_attention_heads", 8);
  config.num_key_value_heads = reader.integer("num_key_value_heads", 4);
  config.head_dim = reader.integer("head_dim", 256);
  config.global_head_dim = reader.integer("global_head_dim", 512);
  config.num_global_key_value_heads = reader.optional_integer("num_global_key_value_heads");
  config.attention_k_eq_v = reader.boolean("attention_k_eq_v", false);
  config.hidden_activation = reader.string("hidden_activation", "gelu_pytorch_tanh");
  config.max_position_embeddings = reader.integer("max_position_embeddings", 131072);
  config.rms_norm_eps = reader.number("rms_norm_eps", 1e-6);
  config.sliding_window = reader.integer("sliding_window", 512);
  config.final_logit_softcapping = reader.optional_number("final_logit_softcapping");
  config.vocab_size_per_layer_input = reader.integer("vocab_size_per_layer_input", 262144);
  config.hidden_size_per_layer_input = reader.integer("hidden_size_per_layer_input", 256);
  config.num_kv_shared_layers = reader.integer("num_kv_shared_layers", 0);
  config.enable_moe_block = reader.boolean("enable_moe_block", false);
  config.use_double_wide_mlp = reader.boolean("use_double_wide_mlp", false);
  config.num_experts = reader.optional_integer("num_experts").value_or(0);
  config.top_k_experts = reader.optional_integer("top_k_experts").value_or(0);
  config.moe_intermediate_size = reader.optional_integer("moe_intermediate_size").value_or(0);
  config.bos_token_id = reader.integer("bos_token_id", 2);
  config.pad_token_id = reader.integer("pad_token_id", 0);
  config.tie_word_embeddings = top.has("tie_word_embeddings") ? top.boolean("tie_word_embeddings", true)
                                                              : reader.boolean("tie_word_embeddings", true);

  if (config.hidden_activation != "gelu_pytorch_tanh" && config.hidden_activation != "gelu_tanh") {
    fail("{}: field {}hidden_activation \"{}\" is not supported (expected gelu_pytorch_tanh)", source, prefix,
         config.hidden_activation);
  }
  auto require_positive = [&](const char* key, int value) {
    if (value <= 0) fail("{}: field {}{} must be positive, got {}", source, prefix, key, value);
  };
  require_positive("vocab_size", config.vocab_size);
  if (config.bos_token_id < 0 || config.bos_token_id >= config.vocab_size) {
    fail("{}: field {}bos_token_id {} is outside the vocabulary ({} ids)", source, prefix, config.bos_token_id, config.vocab_size);
  }
  require_positive("hidden_size", config.hidden_size);
  require_positive("intermediate_size", config.intermediate_size);
  require_positive("num_hidden_layers", config.num_layers);
  require_positive("num_attention_heads", config.num_attention_heads);
  require_positive("num_key_value_heads", config.num_key_value_heads);
  require_positive("head_dim", config.head_dim);
  require_positive("sliding_window", config.sliding_window);
  if (config.hidden_size_per_layer_input < 0) fail("{}: field {}hidden_size_per_layer_input must not be negative", source, prefix);
  if (config.has_per_layer_inputs()) require_positive("vocab_size_per_layer_input", config.vocab_size_per_layer_input);
  if (config.num_kv_shared_layers < 0 || config.num_kv_shared_layers >= config.num_layers) {
    fail("{}: field {}num_kv_shared_layers {} must be in [0, num_hidden_layers)", source, prefix, config.num_kv_shared_layers);
  }
  if (config.enable_moe_block) {
    require_positive("num_experts", config.num_experts);
    require_positive("top_k_experts", config.top_k_experts);
    require_positive("moe_intermediate_size", config.moe_intermediate_size);
    if (config.top_k_experts > config.num_experts) {
      fail("{}: field {}top_k_experts {} exceeds num_experts {}", source, prefix, config.top_k_experts, config.num_experts);
    }
  }
  if (config.final_logit_softcapping && *config.final_logit_softcapping <= 0) config.final_logit_softcapping.reset();

  // layer_types: default is five sliding layers then one full; the last layer is always full.
  if (reader.has("layer_types")) {
    const json& types = text->at("layer_types");
    if (!types.is_array()) fail("{}: field {}layer_types must be a list", source, prefix);
    for (const json& type : types) {
      const std::string name = type.is_string() ? type.get<std::string>() : json_excerpt(type);
      if (name == "sliding_attention") {
        config.layer_types.push_back(AttentionType::kSliding);
      } else if (name == "full_attention") {
        config.layer_types.push_back(AttentionType::kFull);
      } else {
        fail("{}: field {}layer_types has unknown entry {}", source, prefix, name);
      }
    }
    if (static_cast<int>(config.layer_types.size()) != config.num_layers) {
      fail("{}: field {}layer_types has {} entries but num_hidden_layers is {}", source, prefix, config.layer_types.size(),
           config.num_layers);
    }
  } else {
    for (int index = 0; index < config.num_layers; ++index) {
      config.layer_types.push_back((index + 1) % 6 == 0 ? AttentionType::kFull : AttentionType::kSliding);
    }
  }
  config.layer_types.back() = AttentionType::kFull;

  RopeConfig sliding_default;
  RopeConfig full_default{"proportional", 1e6, 0.25, 1.0};
  config.rope_sliding = sliding_default;
  config.rope_full = full_default;
  if (reader.has("rope_parameters")) {
    const json& rope = text->at("rope_parameters");
    if (!rope.is_object()) fail("{}: field {}rope_parameters must be an object", source, prefix);
    if (rope.contains("sliding_attention")) {
      config.rope_sliding = parse_rope(rope.at("sliding_attention"), source, prefix + "rope_parameters.sliding_attention", sliding_default);
    }
    if (rope.contains("full_attention")) {
      config.rope_full = parse_rope(rope.at("full_attention"), source, prefix + "rope_parameters.full_attention", full_default);
    }
  }

  // Stop ids: the instruction-tuned top level lists [1, 106]; the text config names <eos>.
  for (int id : top.id_list("eos_token_id")) config.eos_token_ids.push_back(id);
  if (text != &root) {
    for (int id : reader.id_list("eos_token_id")) config.eos_token_ids.push_back(id);
  }
  if (config.eos_token_ids.empty()) config.eos_token_ids.push_back(1);

  resolve_layers(config, source);
  return config;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / "config.json";
  if (!std::filesystem::exists(path)) fail("{}: file not found (a Hugging Face checkpoint directory needs config.json)", path.string());
  const json root = parse_json_file(path);
  ModelConfig config = parse_model_config(root, path.string());

  const std::filesystem::path generation_path = model_dir / "generation_config.json";
  if (std::filesystem::exists(generation_path)) {
    const json generation = parse_json_file(generation_path);
    if (!generation.is_object()) fail("{}: expected a JSON object", generation_path.string());
    FieldReader reader(generation, generation_path.string(), "");
    for (int id : reader.id_list("eos_token_id")) config.eos_token_ids.push_back(id);
  }
  std::sort(config.eos_token_ids.begin(), config.eos_token_ids.end());
  config.eos_token_ids.erase(std::unique(config.eos_token_ids.begin(), config.eos_token_ids.end()), config.eos_token_ids.end());
  for (int id : config.eos_token_ids) {
    if (id < 0 || id >= config.vocab_size) fail("{}: eos token id {} is outside the vocabulary ({} ids)", path.string(), id, config.vocab_size);
  }
  return config;
}

}  // namespace gemma4rt
