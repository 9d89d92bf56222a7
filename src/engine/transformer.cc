#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/reference.h"

namespace gemma4rt {


namespace {

std::vector<float> to_floats(const TensorView& tensor) {
  std::vector<float> values;
  if (tensor.empty()) return values;
  values.resize(static_cast<size_t>(tensor.element_count()));
  tensor.read_floats(0, tensor.element_count(), values.data());
  return values;
}

}  // namespace

Transformer::Transformer(const Model& model, const TransformerOptions& options)
    : model_(model),
      config_(model.config()),
      weights_(model.weights()),
      options_(options),
      cache_(model.config(), options.context_tokens, std::max(1, options.max_chunk_tokens)),
      rope_sliding_(model.config().rope_sliding, model.config().head_dim),
      rope_full_(model.config().rope_full, model.config().global_head_dim > 0 ? model.config().global_head_dim : model.config().head_dim) {
  if (options_.context_tokens <= 0) fail("context length must be positive, got {}", options_.context_tokens);
  options_.max_chunk_tokens = std::max(1, options_.max_chunk_tokens);

  for (const LayerWeights& layer : weights_.layers) {
    LayerVectors vectors;
    vectors.input_norm = to_floats(layer.input_norm);
    vectors.post_attention_norm = to_floats(layer.post_attention_norm);
    vectors.pre_feedforward_norm = to_floats(layer.pre_feedforward_norm);
    vectors.post_feedforward_norm = to_floats(layer.post_feedforward_norm);
    vectors.q_norm = to_floats(layer.attention.q_norm);
    vectors.k_norm = to_floats(layer.attention.k_norm);
    vectors.layer_scalar = layer.layer_scalar.at(0);
    if (layer.moe) {
      vectors.router_scale = to_floats(layer.moe->router_scale);
      vectors.per_expert_scale = to_floats(layer.moe->per_expert_scale);
      vectors.pre_feedforward_norm_2 = to_floats(layer.moe->pre_feedforward_norm_2);
      vectors.post_feedforward_norm_1 = to_floats(layer.moe->post_feedforward_norm_1);
      vectors.post_feedforward_norm_2 = to_floats(layer.moe->post_feedforward_norm_2);
    }
    if (layer.per_layer_input) vectors.per_layer_post_norm = to_floats(layer.per_layer_input->post_norm);
    layer_vectors_.push_back(std::move(vectors));
  }
  final_norm_ = to_floats(weights_.final_norm);
  per_layer_projection_norm_ = to_floats(weights_.per_layer_projection_norm);
  // The reference casts sqrt(width) to the activation dtype before multiplying; in fp32 that is exact.
  embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size)));
  per_layer_embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size_per_layer_input)));

  int max_head_dim = 0, max_kv_rows = 0, max_mlp = 0;
  for (const LayerConfig& layer : config_.layers) {
    max_head_dim = std::max(max_head_dim, layer.head_dim);
    max_kv_rows = std::max(max_kv_rows, layer.num_kv_heads * layer.head_dim);
    max_mlp = std::max(max_mlp, layer.mlp_intermediate_size);
  }
  if (config_.enable_moe_block) max_mlp = std::max(max_mlp, 2 * config_.moe_intermediate_size);
  const size_t rows = static_cast<size_t>(options_.max_chunk_tokens);
  const size_t hidden = static_cast<size_t>(config_.hidden_size);
  const size_t packed_per_layer = static_cast<size_t>(config_.num_layers) * config_.hidden_size_per_layer_input;
  hidden_.resize(rows * hidden);
  normed_.resize(rows * hidden);
  branch_.resize(rows * hidden);
  ffn_out_.resize(rows * hidden);
  moe_out_.resize(rows * hidden);
  expert_input_.resize(hidden);
  query_.resize(rows * config_.num_attention_heads * max_head_dim);
  attention_out_.resize(query_.size());
  key_.resize(rows * max_kv_rows);
  value_.resize(rows * max_kv_rows);
  gate_.resize(rows * max_mlp);
  up_.resize(rows * max_mlp);
  per_layer_inputs_.resize(rows * packed_per_layer);
  per_layer_scratch_.resize(std::max(rows * packed_per_layer, hidden));
  rope_cos_.resize(max_head_dim);
  rope_sin_.resize(max_head_dim);
  scores_.resize(options_.context_tokens);
  slots_.resize(options_.context_tokens);
  logits_.resize(config_.vocab_size);
  router_logits_.resize(std::max(config_.num_experts, 1));
}

void Transformer::linear(const float* x, int rows, const TensorView& weight, float* y) const {
  reference::matmul(x, rows, weight, y);
}

void Transformer::norm_rows(const float* x, int rows, int width, const float* weight, float* out) const {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (int row = 0; row < rows; ++row) {
    reference::rms_norm(x + static_cast<int64_t>(row) * width, width, weight, eps, out + static_cast<int64_t>(row) * width);
  }
}

std::span<const float> Transformer::forward(std::span<const int32_t> tokens, int position, bool apply_softcap) {
  if (tokens.empty()) fail("forward needs at least one token");
  if (position < 0 || position + static_cast<int64_t>(tokens.size()) > options_.context_tokens) {
    fail("positions {}..{} do not fit the context of {} tokens (--ctx)", position, position + tokens.size() - 1,
         options_.context_tokens);
  }
  for (int32_t token : tokens) {
    if (token < 0 || token >= config_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", token, config_.vocab_size - 1);
  }
  for (size_t first = 0; first < tokens.size(); first += options_.max_chunk_tokens) {
    const size_t count = std::min<size_t>(options_.max_chunk_tokens, tokens.size() - first);
    forward_chunk(tokens.subspan(first, count), position + static_cast<int>(first));
  }

  // Only the last position's logits are needed for generation.
  const int last = static_cast<int>((tokens.size() - 1) % options_.max_chunk_tokens);
  const int hidden = config_.hidden_size;
  norm_rows(hidden_.data() + static_cast<int64_t>(last) * hidden, 1, hidden, final_norm_.data(), normed_.data());
  linear(normed_.data(), 1, weights_.lm_head, logits_.data());
  if (apply_softcap && config_.final_logit_softcapping) {
    const float cap = static_cast<float>(*config_.final_logit_softcapping);
    for (float& logit : logits_) logit = std::tanh(logit / cap) * cap;
  }
  return logits_;
}

void Transformer::forward_chunk(std::span<const int32_t> tokens, int position) {
  const int count = static_cast<int>(tokens.size());
  const int hidden = config_.hidden_size;
  const int64_t values = static_cast<int64_t>(count) * hidden;
  embed(tokens);
  if (config_.has_per_layer_inputs()) compute_per_layer_inputs(tokens);

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    const LayerVectors& vectors = layer_vectors_[layer];
    // Attention block: pre-norm, attention, post-norm, residual.
    norm_rows(hidden_.data(), count, hidden, vectors.input_norm.data(), normed_.data());
    attention(layer, count, position);
    norm_rows(branch_.data(), count, hidden, vectors.post_attention_norm.data(), branch_.data());
    for (int64_t i = 0; i < values; ++i) hidden_[i] += branch_[i];

    feed_forward(layer, count);
    if (config_.has_per_layer_inputs()) per_layer_input_block(layer, count);

    // layer_scalar scales the whole residual stream, not only this layer's contribution.
    for (int64_t i = 0; i < values; ++i) hidden_[i] *= vectors.layer_scalar;
  }
}

void Transformer::embed(std::span<const int32_t> tokens) {
  const int hidden = config_.hidden_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    float* row = hidden_.data() + t * hidden;
    weights_.embed_tokens.read_floats(static_cast<int64_t>(tokens[t]) * hidden, hidden, row);
    for (int i = 0; i < hidden; ++i) row[i] *= embed_scale_;
  }
}

// Per-Layer Embeddings (architecture doc §2.2): a token-identity part gathered from the packed table and a
// context part projected from the scaled main embedding, each layer's slice normalised separately.
void Transformer::compute_per_layer_inputs(std::span<const int32_t> tokens) {
  const int count = static_cast<int>(tokens.size());
  const int hidden = config_.hidden_size;
  const int width = config_.hidden_size_per_layer_input;
  const int64_t packed = static_cast<int64_t>(config_.num_layers) * width;
  float* projected = per_layer_scratch_.data();
  linear(hidden_.data(), count, weights_.per_layer_model_projection, projected);
  const float projection_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hidden)));
  const float combine_scale = static_cast<float>(1.0 / std::sqrt(2.0));
  std::vector<float> token_part(static_cast<size_t>(packed));
  for (int t = 0; t < count; ++t) {
    const int32_t token = tokens[t];
    if (token >= config_.vocab_size_per_layer_input) {
      fail("token id {} is outside the per-layer embedding table ({} rows)", token, config_.vocab_size_per_layer_input);
    }
    weights_.embed_tokens_per_layer.read_floats(static_cast<int64_t>(token) * packed, packed, token_part.data());
    float* context_part = projected + t * packed;
    for (int64_t i = 0; i < packed; ++i) context_part[i] *= projection_scale;
    norm_rows(context_part, config_.num_layers, width, per_layer_projection_norm_.data(), context_part);
    float* out = per_layer_inputs_.data() + t * packed;
    for (int64_t i = 0; i < packed; ++i) out[i] = (context_part[i] + token_part[i] * per_layer_embed_scale_) * combine_scale;
  }
}

void Transformer::attention(int layer, int count, int position) {
  const LayerConfig& geometry = config_.layers[layer];
  const AttentionWeights& weights = weights_.layers[layer].attention;
  const LayerVectors& vectors = layer_vectors_[layer];
  const int head_dim = geometry.head_dim;
  const int query_heads = geometry.num_query_heads;
  const int kv_heads = geometry.num_kv_heads;
  const int groups = query_heads / kv_heads;
  const int64_t query_row = static_cast<int64_t>(query_heads) * head_dim;
  const int64_t kv_row = static_cast<int64_t>(kv_heads) * head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const RopeTable& rope = geometry.is_sliding() ? rope_sliding_ : rope_full_;

  linear(normed_.data(), count, weights.q_proj, query_.data());
  if (geometry.owns_kv(layer)) {
    linear(normed_.data(), count, weights.k_proj, key_.data());
    if (geometry.k_eq_v) {
      // K=V layers: V is the raw k_proj output, taken before k_norm and RoPE touch K.
      std::copy(key_.begin(), key_.begin() + count * kv_row, value_.begin());
    } else {
      linear(normed_.data(), count, weights.v_proj, value_.data());
    }
  }

  float* cache_keys = cache_.keys(layer);
  float* cache_values = cache_.values(layer);
  for (int t = 0; t < count; ++t) {
    const int token_position = position + t;
    rope.angles(token_position, rope_cos_.data(), rope_sin_.data());
    for (int head = 0; head < query_heads; ++head) {
      float* q = query_.data() + t * query_row + static_cast<int64_t>(head) * head_dim;
      reference::rms_norm(q, head_dim, vectors.q_norm.data(), eps, q);
      reference::apply_rope(q, head_dim, rope_cos_.data(), rope_sin_.data());
    }
    if (!geometry.owns_kv(layer)) continue;
    const int slot = cache_.slot(layer, token_position);
    for (int head = 0; head < kv_heads; ++head) {
      float* k = key_.data() + t * kv_row + static_cast<int64_t>(head) * head_dim;
      float* v = value_.data() + t * kv_row + static_cast<int64_t>(head) * head_dim;
      reference::rms_norm(k, head_dim, vectors.k_norm.data(), eps, k);
      reference::apply_rope(k, head_dim, rope_cos_.data(), rope_sin_.data());
      reference::rms_norm(v, head_dim, nullptr, eps, v);  // v_norm has no weight
    }
    std::copy(key_.begin() + t * kv_row, key_.begin() + (t + 1) * kv_row, cache_keys + slot * kv_row);
    std::copy(value_.begin() + t * kv_row, value_.begin() + (t + 1) * kv_row, cache_values + slot * kv_row);
  }

  // Every query sees keys up to itself; sliding layers only the last sliding_window of them.
  for (int t = 0; t < count; ++t) {
    const int token_position = position + t;
    const int first_key = geometry.is_sliding() ? std::max(0, token_position - geometry.sliding_window + 1) : 0;
    const int key_count = token_position - first_key + 1;
    for (int k = 0; k < key_count; ++k) slots_[k] = cache_.slot(layer, first_key + k);
    const std::span<const int32_t> slots(slots_.data(), key_count);
    for (int head = 0; head < query_heads; ++head) {
      const int kv_head = head / groups;
      reference::attend(query_.data() + t * query_row + static_cast<int64_t>(head) * head_dim, head_dim,
                        cache_keys + static_cast<int64_t>(kv_head) * head_dim, cache_values + static_cast<int64_t>(kv_head) * head_dim,
                        kv_row, slots, scores_.data(),
                        attention_out_.data() + t * query_row + static_cast<int64_t>(head) * head_dim);
    }
  }
  linear(attention_out_.data(), count, weights.o_proj, branch_.data());
}

void Transformer::feed_forward(int layer, int count) {
  const LayerConfig& geometry = config_.layers[layer];
  const LayerWeights& weights = weights_.layers[layer];
  const LayerVectors& vectors = layer_vectors_[layer];
  const int hidden = config_.hidden_size;
  const int64_t values = static_cast<int64_t>(count) * hidden;
  const int64_t width = geometry.mlp_intermediate_size;

  norm_rows(hidden_.data(), count, hidden, vectors.pre_feedforward_norm.data(), normed_.data());
  linear(normed_.data(), count, weights.mlp.gate_proj, gate_.data());
  linear(normed_.data(), count, weights.mlp.up_proj, up_.data());
  for (int64_t i = 0; i < count * width; ++i) gate_[i] = reference::gelu_tanh(gate_[i]) * up_[i];
  linear(gate_.data(), count, weights.mlp.down_proj, ffn_out_.data());

  if (weights.moe) {
    // The dense MLP and the experts run side by side on the same residual, each with its own norms.
    norm_rows(ffn_out_.data(), count, hidden, vectors.post_feedforward_norm_1.data(), ffn_out_.data());
    mixture_of_experts(layer, count, moe_out_.data());
    norm_rows(moe_out_.data(), count, hidden, vectors.post_feedforward_norm_2.data(), moe_out_.data());
    for (int64_t i = 0; i < values; ++i) ffn_out_[i] += moe_out_[i];
  }
  norm_rows(ffn_out_.data(), count, hidden, vectors.post_feedforward_norm.data(), ffn_out_.data());
  for (int64_t i = 0; i < values; ++i) hidden_[i] += ffn_out_[i];
}

// MoE (architecture doc §5): the router reads the raw residual; softmax over all experts, top-k,
// renormalise, then the per-expert scale. Experts read their own pre-norm of the residual.
void Transformer::mixture_of_experts(int layer, int count, float* out) {
  const MoeWeights& moe = *weights_.layers[layer].moe;
  const LayerVectors& vectors = layer_vectors_[layer];
  const int hidden = config_.hidden_size;
  const int experts = config_.num_experts;
  const int top_k = config_.top_k_experts;
  const int64_t expert_width = config_.moe_intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float router_input_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hidden)));
  std::vector<float> router_input(hidden), expert_output(hidden);
  std::vector<int> order(experts);

  for (int t = 0; t < count; ++t) {
    const float* residual = hidden_.data() + static_cast<int64_t>(t) * hidden;
    reference::rms_norm(residual, hidden, nullptr, eps, router_input.data());
    for (int i = 0; i < hidden; ++i) router_input[i] = router_input[i] * vectors.router_scale[i] * router_input_scale;
    linear(router_input.data(), 1, moe.router_proj, router_logits_.data());
    reference::softmax(router_logits_.data(), experts);

    // Top-k by probability; equal probabilities prefer the lower expert index.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
      return router_logits_[a] != router_logits_[b] ? router_logits_[a] > router_logits_[b] : a < b;
    });
    std::vector<int> chosen(order.begin(), order.begin() + top_k);
    float chosen_total = 0.0f;
    for (int expert : chosen) chosen_total += router_logits_[expert];
    std::sort(chosen.begin(), chosen.end());  // experts are applied in ascending index order

    reference::rms_norm(residual, hidden, vectors.pre_feedforward_norm_2.data(), eps, expert_input_.data());
    float* token_out = out + static_cast<int64_t>(t) * hidden;
    std::fill(token_out, token_out + hidden, 0.0f);
    for (int expert : chosen) {
      const float weight = router_logits_[expert] / chosen_total * vectors.per_expert_scale[expert];
      linear(expert_input_.data(), 1, moe.gate_up_proj.slice(expert), gate_.data());
      for (int64_t i = 0; i < expert_width; ++i) gate_[i] = reference::gelu_tanh(gate_[i]) * gate_[expert_width + i];
      linear(gate_.data(), 1, moe.down_proj.slice(expert), expert_output.data());
      for (int i = 0; i < hidden; ++i) token_out[i] += expert_output[i] * weight;
    }
  }
}

void Transformer::per_layer_input_block(int layer, int count) {
  const PerLayerInputWeights& weights = *weights_.layers[layer].per_layer_input;
  const LayerVectors& vectors = layer_vectors_[layer];
  const int hidden = config_.hidden_size;
  const int width = config_.hidden_size_per_layer_input;
  const int64_t packed = static_cast<int64_t>(config_.num_layers) * width;
  float* gate = per_layer_scratch_.data();
  linear(hidden_.data(), count, weights.input_gate, gate);
  for (int t = 0; t < count; ++t) {
    const float* per_layer_input = per_layer_inputs_.data() + t * packed + static_cast<int64_t>(layer) * width;
    for (int i = 0; i < width; ++i) gate[t * width + i] = reference::gelu_tanh(gate[t * width + i]) * per_layer_input[i];
  }
  linear(gate, count, weights.projection, branch_.data());
  norm_rows(branch_.data(), count, hidden, vectors.per_layer_post_norm.data(), branch_.data());
  for (int64_t i = 0; i < static_cast<int64_t>(count) * hidden; ++i) hidden_[i] += branch_[i];
}

}  // namespace gemma4rt
