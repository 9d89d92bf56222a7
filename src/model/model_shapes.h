// The real configuration of every released Gemma-4 variant (architecture doc §1.1), written as the
// Hugging Face config.json each checkpoint ships, and the list of tensors a checkpoint of a config holds.
// This table is the one place variant sizes live: make-model and capacity planning both read it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace gemma4rt {

// Shape names accepted by reference_config: "e2b", "e4b", "12b", "31b", "26b-a4b".
std::vector<std::string> known_model_shapes();

// The full config.json of a variant (nested text_config, as the released ...ForConditionalGeneration
// checkpoints). With `layers`, a shallower model with the real per-layer shapes: the first `layers`
// entries of the layer-type pattern with the last forced full, and KV sharing scaled down so every
// shared layer still has a source. Throws Error for an unknown shape or a layer count outside [2, L].
nlohmann::json reference_config(const std::string& shape, std::optional<int> layers = {});

// What an initialiser needs to know about a tensor's role; the loader does not care.
enum class TensorRole {
  kTokenEmbedding,      // embed_tokens: rows are scaled by sqrt(H) at lookup
  kPerLayerEmbedding,   // embed_tokens_per_layer: rows are scaled by sqrt(P) at lookup
  kLinear,              // [.., out, in] projections, expert stacks and the router included
  kNorm,                // RMSNorm weights and other multiplicative scales (router.scale, per_expert_scale)
  kLayerScalar,         // layers.N.layer_scalar [1]
};

// Which tensor of the model it is. The loader fills ModelWeights by it, the planner shards by it, the
// doctor and make-model read it: the checkpoint's key text is written once, in tensor_key().
enum class TensorKind {
  // outside the decoder layers
  kTokenEmbedding, kPerLayerEmbedding, kPerLayerModelProjection, kPerLayerProjectionNorm, kFinalNorm, kLmHead,
  // one decoder layer
  kInputNorm, kQProj, kQNorm, kKProj, kKNorm, kVProj, kOProj, kPostAttentionNorm,
  kPreFeedforwardNorm, kGateProj, kUpProj, kDownProj, kPostFeedforwardNorm,
  kPostFeedforwardNorm1, kRouterProj, kRouterScale, kPerExpertScale, kPreFeedforwardNorm2, kExpertsGateUp, kExpertsDown,
  kPostFeedforwardNorm2,
  kPerLayerInputGate, kPerLayerProjection, kPostPerLayerInputNorm,
  kLayerScalar,
};

// The key prefix of the language model's tensors in released checkpoints (lm_head.weight has none).
inline constexpr const char* kReleasedKeyPrefix = "model.language_model.";

// The checkpoint key of a tensor without the prefix ("layers.7.self_attn.q_proj.weight"); `layer` is
// ignored for tensors outside the decoder layers.
std::string tensor_key(TensorKind kind, int layer = -1);
// Whether the key takes the language-model prefix (all but an untied lm_head.weight).
bool tensor_key_is_prefixed(TensorKind kind);

struct TensorSpec {
  std::string name;             // full checkpoint key, as released checkpoints spell it
  std::string key;              // without the prefix (tensor_key)
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::kLinear;
  TensorKind kind = TensorKind::kTokenEmbedding;
  int layer = -1;               // decoder layer, -1 outside the layers

  int64_t element_count() const;
  bool is_attention() const;    // q/k/v/o projections and q/k norms
  bool is_expert() const;       // the stacked expert tensors of a MoE layer
};

// Every tensor the loader (model/weights.cc) reads for this config, with the released checkpoints'
// key prefix "model.language_model.", in a stable order: globals first, then layer by layer.
std::vector<TensorSpec> checkpoint_tensors(const ModelConfig& config);

// Total parameters over checkpoint_tensors (embeddings and PLE tables included; the tied LM head once).
int64_t parameter_count(const ModelConfig& config);

}  // namespace gemma4rt
