// Typed views of every tensor the forward pass reads, checked against the config at load time.
// Nothing is copied: views point into the memory-mapped safetensors files.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace gemma4rt {

struct AttentionWeights {
  TensorView q_proj, o_proj, q_norm;
  TensorView k_proj, v_proj, k_norm;  // empty on KV-shared layers; v_proj also empty on K=V layers
};

struct MlpWeights {
  TensorView gate_proj, up_proj, down_proj;
};

struct MoeWeights {
  TensorView router_proj;             // [experts, H]
  TensorView router_scale;            // [H]
  TensorView per_expert_scale;        // [experts]
  TensorView gate_up_proj;            // [experts, 2 * moe_intermediate, H]: gate rows first, then up
  TensorView down_proj;               // [experts, H, moe_intermediate]
  TensorView pre_feedforward_norm_2;  // expert input norm
  TensorView post_feedforward_norm_1; // dense branch output norm
  TensorView post_feedforward_norm_2; // expert branch output norm
};

struct PerLayerInputWeights {
  TensorView input_gate;              // [P, H]
  TensorView projection;              // [H, P]
  TensorView post_norm;               // [H]
};

struct LayerWeights {
  TensorView input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  AttentionWeights attention;
  MlpWeights mlp;
  std::optional<MoeWeights> moe;
  std::optional<PerLayerInputWeights> per_layer_input;
  TensorView layer_scalar;            // [1]
};

struct ModelWeights {
  std::string key_prefix;             // "model.language_model.", "model." or ""
  TensorView embed_tokens;            // [vocab, H]
  TensorView lm_head;                 // the embedding table itself when tied
  bool lm_head_tied = true;
  TensorView final_norm;
  TensorView embed_tokens_per_layer;          // [vocab_per_layer, L * P], PLE models only
  TensorView per_layer_model_projection;      // [L * P, H]
  TensorView per_layer_projection_norm;       // [P]
  std::vector<LayerWeights> layers;
  std::vector<std::string> unused_tensors;    // language-model tensors the forward pass never reads
};

// Resolves and checks every tensor; all missing or mis-shaped tensors are reported in one Error.
ModelWeights load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config, const std::string& source);
// The key prefix of the checkpoint's language-model tensors: "model.language_model." (released
// checkpoints), "model." or "", whichever holds the token embedding.
std::string detect_key_prefix(const Checkpoint& checkpoint);

// A loaded checkpoint: config, mapped files and weight views, alive together.
class Model {
 public:
  static std::unique_ptr<Model> load(const std::filesystem::path& model_dir);
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const std::filesystem::path& directory() const { return directory_; }

 private:
  std::filesystem::path directory_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  ModelWeights weights_;
};

}  // namespace gemma4rt
