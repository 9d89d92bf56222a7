// ModelConfig: one description of every Gemma-4 text variant, read from a Hugging Face config.json.
// The forward pass branches only on these fields (per-layer attention type, head dims, KV heads,
// KV source layer, MLP width, MoE, PLE), never on a variant's name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gemma4rt {

enum class AttentionType { kSliding, kFull };

struct RopeConfig {
  std::string type = "default";   // "default" or "proportional"
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;            // divides the inverse frequencies when present
};

// Per-layer geometry, resolved once from the raw config (architecture doc §1.2, §4).
struct LayerConfig {
  AttentionType attention = AttentionType::kSliding;
  int head_dim = 0;
  int num_query_heads = 0;
  int num_kv_heads = 0;
  bool k_eq_v = false;            // full layers of K=V models: V comes from the raw k_proj output
  int kv_source_layer = 0;        // == own index for layers that compute their own K/V
  int sliding_window = 0;         // keys visible to a query, itself included; 0 on full layers
  int mlp_intermediate_size = 0;

  bool owns_kv(int layer_index) const { return kv_source_layer == layer_index; }
  bool is_sliding() const { return attention == AttentionType::kSliding; }
};

struct ModelConfig {
  std::string model_type;         // top-level model_type as written (gemma4, gemma4_unified, ...)
  int hidden_size = 0;
  int num_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  std::optional<int> num_global_key_value_heads;
  int head_dim = 0;
  int global_head_dim = 0;
  bool attention_k_eq_v = false;
  int intermediate_size = 0;
  bool use_double_wide_mlp = false;
  int vocab_size = 0;
  int hidden_size_per_layer_input = 0;   // PLE width; 0 = no per-layer embeddings
  int vocab_size_per_layer_input = 0;
  int num_kv_shared_layers = 0;
  int sliding_window = 0;
  std::vector<AttentionType> layer_types;
  RopeConfig rope_sliding;
  RopeConfig rope_full;
  double rms_norm_eps = 1e-6;
  std::optional<double> final_logit_softcapping;
  bool enable_moe_block = false;
  int num_experts = 0;
  int top_k_experts = 0;
  int moe_intermediate_size = 0;
  bool tie_word_embeddings = true;
  std::string hidden_activation = "gelu_pytorch_tanh";
  int max_position_embeddings = 0;
  int bos_token_id = 2;
  int pad_token_id = 0;
  std::vector<int> eos_token_ids;        // config.json, extended by generation_config.json

  std::vector<LayerConfig> layers;       // resolved per-layer geometry

  bool has_per_layer_inputs() const { return hidden_size_per_layer_input > 0; }
  const RopeConfig& rope_for(AttentionType type) const {
    return type == AttentionType::kSliding ? rope_sliding : rope_full;
  }
  int first_kv_shared_layer() const { return num_layers - num_kv_shared_layers; }
};

// Parses config.json text. `source` names the file in error messages. A missing key falls back to the
// reference implementation's default; a present key of the wrong type or an impossible value is an error.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source);

// Reads <dir>/config.json and, when present, <dir>/generation_config.json (for extra eos ids).
ModelConfig load_model_config(const std::filesystem::path& model_dir);

}  // namespace gemma4rt
