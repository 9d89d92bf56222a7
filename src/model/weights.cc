#include "model/weights.h"

#include <set>

#include "core/error.h"
#include "model/model_shapes.h"
#include "model/quantized_tensors.h"

namespace gemma4rt {
namespace {

// Collects every problem before failing, so one load names all missing or mis-shaped tensors.
class TensorResolver {
 public:
  TensorResolver(const Checkpoint& checkpoint, std::string prefix) : checkpoint_(checkpoint), prefix_(std::move(prefix)) {}

  TensorView require(const std::string& key, const std::vector<int64_t>& shape) { return get(prefix_ + key, shape); }
  TensorView require_unprefixed(const std::string& name, const std::vector<int64_t>& shape) { return get(name, shape); }

  const std::vector<std::string>& problems() const { return problems_; }
  const std::set<std::string>& used() const { return used_; }

 private:
  TensorView get(const std::string& name, const std::vector<int64_t>& shape) {
    const StoredTensor* stored = checkpoint_.find(name);
    if (stored == nullptr) {
      problems_.push_back(fmt::format("missing tensor {}", name));
      return {};
    }
    used_.insert(name);
    if (stored->dtype_name == "U8") {
      const std::string file = stored->file != nullptr ? stored->file->string() : "";
      if (const std::string problem = q4_layout_problem(*stored); !problem.empty()) {
        if (old_q4_files_.insert(file).second) problems_.push_back(problem);  // reported once per file
        return {};
      }
    }
    const std::vector<int64_t> stored_shape = stored_shape_of(stored->dtype_name, shape);
    if (stored->shape != stored_shape) {
      problems_.push_back(fmt::format("tensor {} has shape {} but the config needs {}{}", name, shape_to_string(stored->shape),
                                      shape_to_string(shape),
                                      stored_shape != shape ? fmt::format(" (stored as {}: {})", stored->dtype_name, shape_to_string(stored_shape)) : ""));
      return {};
    }
    const StoredTensor* scales = nullptr;  // a quantised tensor's, checked by block_scales_problem
    if (is_quantized_dtype(stored->dtype_name)) {
      if (const std::string problem = block_scales_problem(checkpoint_, *stored, shape); !problem.empty()) {
        problems_.push_back(problem);
        return {};
      }
      scales = checkpoint_.find(name + "_scale");
      used_.insert(scales->name);
    }
    try {
      TensorView view = Checkpoint::view(*stored);
      view.shape = shape;  // q4's view takes the logical shape
      if (view.dtype == DType::kQ8) view.q8_scales = reinterpret_cast<const float*>(scales->data);
      if (view.dtype == DType::kQ4) view.q4_scales = reinterpret_cast<const uint16_t*>(scales->data);
      return view;
    } catch (const Error& error) {
      problems_.push_back(error.what());
      return {};
    }
  }

  const Checkpoint& checkpoint_;
  std::string prefix_;
  std::vector<std::string> problems_;
  std::set<std::string> used_;
  std::set<std::string> old_q4_files_;
};

// Where a tensor of the table (model/model_shapes.h) goes in ModelWeights.
TensorView& destination(ModelWeights& weights, const TensorSpec& spec) {
  LayerWeights* layer = spec.layer >= 0 ? &weights.layers[static_cast<size_t>(spec.layer)] : nullptr;
  auto moe = [&]() -> MoeWeights& { return layer->moe ? *layer->moe : layer->moe.emplace(); };
  auto ple = [&]() -> PerLayerInputWeights& { return layer->per_layer_input ? *layer->per_layer_input : layer->per_layer_input.emplace(); };
  switch (spec.kind) {
    case TensorKind::kTokenEmbedding: return weights.embed_tokens;
    case TensorKind::kPerLayerEmbedding: return weights.embed_tokens_per_layer;
    case TensorKind::kPerLayerModelProjection: return weights.per_layer_model_projection;
    case TensorKind::kPerLayerProjectionNorm: return weights.per_layer_projection_norm;
    case TensorKind::kFinalNorm: return weights.final_norm;
    case TensorKind::kLmHead: return weights.lm_head;
    case TensorKind::kInputNorm: return layer->input_norm;
    case TensorKind::kQProj: return layer->attention.q_proj;
    case TensorKind::kQNorm: return layer->attention.q_norm;
    case TensorKind::kKProj: return layer->attention.k_proj;
    case TensorKind::kKNorm: return layer->attention.k_norm;
    case TensorKind::kVProj: return layer->attention.v_proj;
    case TensorKind::kOProj: return layer->attention.o_proj;
    case TensorKind::kPostAttentionNorm: return layer->post_attention_norm;
    case TensorKind::kPreFeedforwardNorm: return layer->pre_feedforward_norm;
    case TensorKind::kGateProj: return layer->mlp.gate_proj;
    case TensorKind::kUpProj: return layer->mlp.up_proj;
    case TensorKind::kDownProj: return layer->mlp.down_proj;
    case TensorKind::kPostFeedforwardNorm: return layer->post_feedforward_norm;
    case TensorKind::kPostFeedforwardNorm1: return moe().post_feedforward_norm_1;
    case TensorKind::kRouterProj: return moe().router_proj;
    case TensorKind::kRouterScale: return moe().router_scale;
    case TensorKind::kPerExpertScale: return moe().per_expert_scale;
    case TensorKind::kPreFeedforwardNorm2: return moe().pre_feedforward_norm_2;
    case TensorKind::kExpertsGateUp: return moe().gate_up_proj;
    case TensorKind::kExpertsDown: return moe().down_proj;
    case TensorKind::kPostFeedforwardNorm2: return moe().post_feedforward_norm_2;
    case TensorKind::kPerLayerInputGate: return ple().input_gate;
    case TensorKind::kPerLayerProjection: return ple().projection;
    case TensorKind::kPostPerLayerInputNorm: return ple().post_norm;
    case TensorKind::kLayerScalar: return layer->layer_scalar;
  }
  fail("tensor {} has no place in the model's weights", spec.name);
}

}  // namespace

ModelWeights load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config, const std::string& source) {
  ModelWeights weights;
  weights.key_prefix = detect_key_prefix(checkpoint);
  TensorResolver resolver(checkpoint, weights.key_prefix);
  weights.layers.resize(static_cast<size_t>(config.num_layers));
  // Every tensor of the config's table; a stored lm_head.weight is used even when the config ties it.
  const TensorSpec* untied_head = nullptr;
  const std::vector<TensorSpec> tensors = checkpoint_tensors(config);
  for (const TensorSpec& spec : tensors) {
    if (spec.kind == TensorKind::kLmHead) {
      untied_head = &spec;
      continue;
    }
    destination(weights, spec) = resolver.require(spec.key, spec.shape);
  }
  const std::string head_key = tensor_key(TensorKind::kLmHead);
  if (untied_head != nullptr || checkpoint.find(head_key) != nullptr) {
    weights.lm_head = resolver.require_unprefixed(head_key, {config.vocab_size, config.hidden_size});
    weights.lm_head_tied = false;
  } else {
    weights.lm_head = weights.embed_tokens;
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

std::string detect_key_prefix(const Checkpoint& checkpoint) {
  const std::string embedding = tensor_key(TensorKind::kTokenEmbedding);
  for (const char* prefix : {kReleasedKeyPrefix, "model.", ""}) {
    if (checkpoint.find(prefix + embedding) != nullptr) return prefix;
  }
  return kReleasedKeyPrefix;  // what released checkpoints use; errors will name keys with it
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
