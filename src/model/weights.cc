#include "model/weights.h"

#include <set>

#include "core/error.h"

namespace gemma4rt {
namespace {

// Collects every problem before failing, so one load names all missing or mis-shaped tensors.
class TensorResolver {
 public:
  TensorResolver(const Checkpoint& checkpoint, std::string prefix) : checkpoint_(checkpoint), prefix_(std::move(prefix)) {}

  TensorView require(const std::string& key, const std::vector<int64_t>& shape) { return get(prefix_ + key, shape, true); }
  TensorView optional(const std::string& key, const std::vector<int64_t>& shape) { return get(prefix_ + key, shape, false); }
  TensorView require_unprefixed(const std::string& name, const std::vector<int64_t>& shape) { return get(name, shape, true); }
  bool has(const std::string& key) const { return checkpoint_.find(prefix_ + key) != nullptr; }

  const std::vector<std::string>& problems() const { return problems_; }
  const std::set<std::string>& used() const { return used_; }

 private:
  TensorView get(const std::string& name, const std::vector<int64_t>& shape, bool required) {
    const StoredTensor* stored = checkpoint_.find(name);
    if (stored == nullptr) {
      if (required) problems_.push_back(fmt::format("missing tensor {}", name));
      return {};
    }
    used_.insert(name);
    if (stored->shape != shape) {
      problems_.push_back(fmt::format("tensor {} has shape {} but the config needs {}", name, shape_to_string(stored->shape),
                                      shape_to_string(shape)));
      return {};
    }
    try {
      TensorView view = Checkpoint::view(*stored);
      if (view.dtype == DType::kQ8) attach_q8_scales(view);
      return view;
    } catch (const Error& error) {
      problems_.push_back(error.what());
      return {};
    }
  }

  // A q8 tensor NAME stores its block scales as F32 tensor NAME_scale: [..., ceil(last dim / 32)].
  void attach_q8_scales(TensorView& view) {
    const std::string scale_name = view.name + "_scale";
    const StoredTensor* scales = checkpoint_.find(scale_name);
    std::vector<int64_t> expected = view.shape;
    expected.back() = (expected.back() + kQ8BlockValues - 1) / kQ8BlockValues;
    if (scales == nullptr) fail("q8 tensor {} has no block scales {}", view.name, scale_name);
    if (scales->dtype_name != "F32" || scales->shape != expected) {
      fail("q8 block scales {} must be F32 of shape {}, got {} {}", scale_name, shape_to_string(expected), scales->dtype_name,
           shape_to_string(scales->shape));
    }
    used_.insert(scale_name);
    view.q8_scales = reinterpret_cast<const float*>(scales->data);
  }

  const Checkpoint& checkpoint_;
  std::string prefix_;
  std::vector<std::string> problems_;
  std::set<std::string> used_;
};

std::string detect_prefix(const Checkpoint& checkpoint) {
  for (const char* prefix : {"model.language_model.", "model.", ""}) {
    if (checkpoint.find(std::string(prefix) + "embed_tokens.weight") != nullptr) return prefix;
  }
  return "model.language_model.";  // what released checkpoints use; errors will name keys with it
}

}  // namespace

ModelWeights load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config, const std::string& source) {
  ModelWeights weights;
  weights.key_prefix = detect_prefix(checkpoint);
  TensorResolver resolver(checkpoint, weights.key_prefix);
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;

  weights.embed_tokens = resolver.require("embed_tokens.weight", {vocab, hidden});
  weights.final_norm = resolver.require("norm.weight", {hidden});
  if (checkpoint.find("lm_head.weight") != nullptr) {
    weights.lm_head = resolver.require_unprefixed("lm_head.weight", {vocab, hidden});
    weights.lm_head_tied = false;
  } else {
    weights.lm_head = weights.embed_tokens;
  }
  if (config.has_per_layer_inputs()) {
    const int64_t packed = static_cast<int64_t>(config.num_layers) * config.hidden_size_per_layer_input;
    weights.embed_tokens_per_layer = resolver.require("embed_tokens_per_layer.weight", {config.vocab_size_per_layer_input, packed});
    weights.per_layer_model_projection = resolver.require("per_layer_model_projection.weight", {packed, hidden});
    weights.per_layer_projection_norm = resolver.require("per_layer_projection_norm.weight", {config.hidden_size_per_layer_input});
  }

  for (int index = 0; index < config.num_layers; ++index) {
    const LayerConfig& geometry = config.layers[index];
    const std::string layer = fmt::format("layers.{}.", index);
    LayerWeights lw;
    lw.input_norm = resolver.require(layer + "input_layernorm.weight", {hidden});
    lw.post_attention_norm = resolver.require(layer + "post_attention_layernorm.weight", {hidden});
    lw.pre_feedforward_norm = resolver.require(layer + "pre_feedforward_layernorm.weight", {hidden});
    lw.post_feedforward_norm = resolver.require(layer + "post_feedforward_layernorm.weight", {hidden});
    lw.layer_scalar = resolver.require(layer + "layer_scalar", {1});

    const int64_t head_dim = geometry.head_dim;
    const int64_t q_rows = geometry.num_query_heads * head_dim;
    const int64_t kv_rows = geometry.num_kv_heads * head_dim;
    AttentionWeights& attention = lw.attention;
    attention.q_proj = resolver.require(layer + "self_attn.q_proj.weight", {q_rows, hidden});
    attention.o_proj = resolver.require(layer + "self_attn.o_proj.weight", {hidden, q_rows});
    attention.q_norm = resolver.require(layer + "self_attn.q_norm.weight", {head_dim});
    if (geometry.owns_kv(index)) {
      attention.k_proj = resolver.require(layer + "self_attn.k_proj.weight", {kv_rows, hidden});
      attention.k_norm = resolver.require(layer + "self_attn.k_norm.weight", {head_dim});
      if (!geometry.k_eq_v) attention.v_proj = resolver.require(layer + "self_attn.v_proj.weight", {kv_rows, hidden});
    }

    const int64_t intermediate = geometry.mlp_intermediate_size;
    lw.mlp.gate_proj = resolver.require(layer + "mlp.gate_proj.weight", {intermediate, hidden});
    lw.mlp.up_proj = resolver.require(layer + "mlp.up_proj.weight", {intermediate, hidden});
    lw.mlp.down_proj = resolver.require(layer + "mlp.down_proj.weight", {hidden, intermediate});

    if (config.enable_moe_block) {
      const int64_t experts = config.num_experts;
      const int64_t expert_width = config.moe_intermediate_size;
      MoeWeights moe;
      moe.router_proj = resolver.require(layer + "router.proj.weight", {experts, hidden});
      moe.router_scale = resolver.require(layer + "router.scale", {hidden});
      moe.per_expert_scale = resolver.require(layer + "router.per_expert_scale", {experts});
      moe.gate_up_proj = resolver.require(layer + "experts.gate_up_proj", {experts, 2 * expert_width, hidden});
      moe.down_proj = resolver.require(layer + "experts.down_proj", {experts, hidden, expert_width});
      moe.pre_feedforward_norm_2 = resolver.require(layer + "pre_feedforward_layernorm_2.weight", {hidden});
      moe.post_feedforward_norm_1 = resolver.require(layer + "post_feedforward_layernorm_1.weight", {hidden});
      moe.post_feedforward_norm_2 = resolver.require(layer + "post_feedforward_layernorm_2.weight", {hidden});
      lw.moe = moe;
    }
    if (config.has_per_layer_inputs()) {
      const int64_t width = config.hidden_size_per_layer_input;
      PerLayerInputWeights ple;
      ple.input_gate = resolver.require(layer + "per_layer_input_gate.weight", {width, hidden});
      ple.projection = resolver.require(layer + "per_layer_projection.weight", {hidden, width});
      ple.post_norm = resolver.require(layer + "post_per_layer_input_norm.weight", {hidden});
      lw.per_layer_input = ple;
    }
    weights.layers.push_back(std::move(lw));
  }

  if (!resolver.problems().empty()) {
    std::string message = fmt::format("{}: {} checkpoint problem{}: ", source, resolver.problems().size(),
                                      resolver.problems().size() == 1 ? "" : "s");
    for (size_t index = 0; index < resolver.problems().size(); ++index) {
      if (index > 0) message += "; ";
      message += resolver.problems()[index];
    }
    throw Error(message);
  }
  // Language-model tensors we do not read: e.g. the stale k/v projections of KV-shared layers.
  for (const auto& [name, tensor] : checkpoint.tensors()) {
    const bool language_model = weights.key_prefix.empty() ? true : name.starts_with(weights.key_prefix);
    const bool other_tower = name.find("vision") != std::string::npos || name.find("audio") != std::string::npos;
    if (language_model && !other_tower && !resolver.used().contains(name)) weights.unused_tensors.push_back(name);
  }
  return weights;
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& model_dir) {
  auto model = std::unique_ptr<Model>(new Model());
  model->directory_ = model_dir;
  if (!std::filesystem::is_directory(model_dir)) fail("{}: not a directory (expected a Hugging Face checkpoint directory)", model_dir.string());
  model->config_ = load_model_config(model_dir);
  model->checkpoint_ = std::make_unique<Checkpoint>(model_dir);
  const std::string source = model->checkpoint_->files().size() == 1 ? model->checkpoint_->files()[0].string() : model_dir.string();
  model->weights_ = load_model_weights(*model->checkpoint_, model->config_, source);
  return model;
}

}  // namespace gemma4rt
