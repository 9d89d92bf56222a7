#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/vector_ops.h"

namespace gemma4rt {

// Everything one decoder layer needs at run time: norm weights as floats, prepared linear weights.
struct Transformer::LayerState {
  std::vector<float> input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  std::vector<float> q_norm, k_norm;
  std::vector<float> router_scale, per_expert_scale, pre_feedforward_norm_2, post_feedforward_norm_1, post_feedforward_norm_2;
  std::vector<float> per_layer_post_norm;
  float layer_scalar = 1.0f;
  Linear q, k, v, o, gate, up, down;
  Linear per_layer_gate, per_layer_projection;
  Linear router;
  std::vector<Linear> expert_gate_up, expert_down;
};

namespace {

std::vector<float> to_floats(const TensorView& tensor) {
  std::vector<float> values;
  if (tensor.empty()) return values;
  values.resize(static_cast<size_t>(tensor.element_count()));
  tensor.read_floats(0, tensor.element_count(), values.data());
  return values;
}

// The checkpoint's own format: q8 for a `gemma4rt quantize` output, f32 for f32 files, else bf16.
WeightFormat default_weight_format(const TensorView& sample) {
  if (sample.dtype == DType::kQ8) return WeightFormat::kQ8;
  return sample.dtype == DType::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16;
}

// In-process tensor parallelism shares the cores among the ranks.
int threads_per_rank(const EngineOptions& options) {
  if (options.tensor_parallel <= 1 || options.communicator != nullptr) return options.threads;
  const int total = options.threads > 0 ? options.threads : available_cores();
  return std::max(1, total / options.tensor_parallel);
}

// Rows [first, first + count) of a [rows, ...] weight: a view into the same memory.
TensorView rows_view(const TensorView& view, int64_t first, int64_t count) {
  if (first == 0 && count == view.shape[0]) return view;
  TensorView part = view;
  const int64_t row_elements = view.element_count() / view.shape[0];
  part.shape[0] = count;
  part.data = view.data + static_cast<size_t>(first * row_elements) * dtype_size_bytes(view.dtype);
  if (view.q8_scales != nullptr) part.q8_scales = view.q8_scales + first * ((view.shape.back() + kQ8BlockValues - 1) / kQ8BlockValues);
  return part;
}

// Columns [first, first + count) of a 2-D weight, copied to floats held in `storage` (the row-parallel
// products o_proj and down_proj read a column block, which is not contiguous in the checkpoint).
TensorView columns_copy(const TensorView& view, int64_t first, int64_t count, std::vector<float>& storage) {
  const int64_t rows = view.shape[0];
  const int64_t columns = view.shape[1];
  storage.resize(static_cast<size_t>(rows * count));
  std::vector<float> row(static_cast<size_t>(columns));
  for (int64_t r = 0; r < rows; ++r) {
    view.read_floats(r * columns, columns, row.data());
    std::copy_n(row.data() + first, count, storage.data() + r * count);
  }
  TensorView part;
  part.name = view.name;
  part.dtype = DType::kF32;
  part.shape = {rows, count};
  part.data = reinterpret_cast<const std::byte*>(storage.data());
  return part;
}

constexpr int64_t kMatmulRowsPerTask = 16;
// Below this many multiply-adds a matrix product runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelMultiplyAdds = int64_t{1} << 16;

}  // namespace

Transformer::Transformer(const Model& model, const EngineOptions& options)
    : model_(model),
      config_(model.config()),
      weights_(model.weights()),
      options_(options),
      pool_(threads_per_rank(options)),
      rope_sliding_(model.config().rope_sliding, model.config().head_dim),
      rope_full_(model.config().rope_full, model.config().global_head_dim > 0 ? model.config().global_head_dim : model.config().head_dim) {
  if (options_.max_chunk_tokens <= 0) options_.max_chunk_tokens = options_.reference ? 64 : 256;
  weight_format_ = options_.reference ? WeightFormat::kF32 : options_.weight_format.value_or(default_weight_format(weights_.layers.front().attention.q_proj));

  // Tensor parallelism: in process, this engine is rank 0 and builds the other ranks itself.
  communicator_ = options_.communicator;
  if (!communicator_ && options_.tensor_parallel > 1) {
    group_ = std::make_unique<parallel::InProcessGroup>(options_.tensor_parallel);
    for (int rank = 0; rank < options_.tensor_parallel; ++rank) group_communicators_.push_back(group_->communicator(rank));
    communicator_ = group_communicators_[0].get();
  }
  if (communicator_ && communicator_->size() > 1) partition_ = partition_for_rank(config_, communicator_->rank(), communicator_->size());
  std::vector<int> kv_heads;
  if (partition_) {
    for (const LayerPartition& layer : partition_->layers) kv_heads.push_back(layer.kv_heads.count);
  }
  cache_ = std::make_unique<KvCache>(config_, options_.context_tokens, options_.max_chunk_tokens, options_.sequences,
                                     options_.kv_format.value_or(options_.reference ? KvFormat::kF32 : KvFormat::kBF16), kv_heads);
  if (options_.reference && cache_->format() != KvFormat::kF32) fail("the reference kernels keep the KV cache in f32");

  auto prepare = [&](const TensorView& view) {
    return options_.reference ? reference_linear(view) : make_linear(view, weight_format_, pool_);
  };
  sliced_weights_.reserve(static_cast<size_t>(config_.num_layers) * 2);
  for (size_t index = 0; index < weights_.layers.size(); ++index) {
    const LayerWeights& layer = weights_.layers[index];
    const LayerConfig& geometry = config_.layers[index];
    auto state = std::make_unique<LayerState>();
    // This rank's share: column-parallel products keep rows, row-parallel ones keep input columns.
    auto own_rows = [&](const TensorView& view, Slice slice, int64_t rows_per_unit) {
      return partition_ ? rows_view(view, slice.first * rows_per_unit, slice.count * rows_per_unit) : view;
    };
    auto own_columns = [&](const TensorView& view, Slice slice, int64_t columns_per_unit) {
      if (!partition_) return view;
      sliced_weights_.emplace_back();
      return columns_copy(view, slice.first * columns_per_unit, slice.count * columns_per_unit, sliced_weights_.back());
    };
    const LayerPartition part = partition_ ? partition_->layers[index] : LayerPartition{};
    state->input_norm = to_floats(layer.input_norm);
    state->post_attention_norm = to_floats(layer.post_attention_norm);
    state->pre_feedforward_norm = to_floats(layer.pre_feedforward_norm);
    state->post_feedforward_norm = to_floats(layer.post_feedforward_norm);
    state->q_norm = to_floats(layer.attention.q_norm);
    state->k_norm = to_floats(layer.attention.k_norm);
    state->layer_scalar = layer.layer_scalar.at(0);
    state->q = prepare(own_rows(layer.attention.q_proj, part.query_heads, geometry.head_dim));
    state->o = prepare(own_columns(layer.attention.o_proj, part.query_heads, geometry.head_dim));
    if (!layer.attention.k_proj.empty()) state->k = prepare(own_rows(layer.attention.k_proj, part.kv_heads, geometry.head_dim));
    if (!layer.attention.v_proj.empty()) state->v = prepare(own_rows(layer.attention.v_proj, part.kv_heads, geometry.head_dim));
    state->gate = prepare(own_rows(layer.mlp.gate_proj, part.mlp_rows, 1));
    state->up = prepare(own_rows(layer.mlp.up_proj, part.mlp_rows, 1));
    state->down = prepare(own_columns(layer.mlp.down_proj, part.mlp_rows, 1));
    if (layer.moe) {
      const MoeWeights& moe = *layer.moe;
      state->router_scale = to_floats(moe.router_scale);
      state->per_expert_scale = to_floats(moe.per_expert_scale);
      state->pre_feedforward_norm_2 = to_floats(moe.pre_feedforward_norm_2);
      state->post_feedforward_norm_1 = to_floats(moe.post_feedforward_norm_1);
      state->post_feedforward_norm_2 = to_floats(moe.post_feedforward_norm_2);
      // The router decides which experts run: keep it in f32 on every path.
      state->router = options_.reference ? reference_linear(moe.router_proj) : make_linear(moe.router_proj, WeightFormat::kF32, pool_);
      // Expert parallelism: a rank prepares only its experts; the others stay empty here.
      state->expert_gate_up.resize(config_.num_experts);
      state->expert_down.resize(config_.num_experts);
      for (int expert = 0; expert < config_.num_experts; ++expert) {
        if (partition_ && (expert < part.experts.first || expert >= part.experts.end())) continue;
        state->expert_gate_up[expert] = prepare(moe.gate_up_proj.slice(expert));
        state->expert_down[expert] = prepare(moe.down_proj.slice(expert));
      }
    }
    if (layer.per_layer_input) {
      state->per_layer_post_norm = to_floats(layer.per_layer_input->post_norm);
      state->per_layer_gate = prepare(layer.per_layer_input->input_gate);
      state->per_layer_projection = prepare(layer.per_layer_input->projection);
    }
    layers_.push_back(std::move(state));
  }
  lm_head_ = prepare(partition_ ? rows_view(weights_.lm_head, partition_->vocab_rows.first, partition_->vocab_rows.count) : weights_.lm_head);
  if (config_.has_per_layer_inputs()) per_layer_model_projection_ = prepare(weights_.per_layer_model_projection);
  final_norm_ = to_floats(weights_.final_norm);
  per_layer_projection_norm_ = to_floats(weights_.per_layer_projection_norm);

  // The reference casts sqrt(width) to the embedding's compute dtype before multiplying: exact in fp32,
  // rounded (39.25 for E2B) when the model computes in bf16.
  embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size)));
  per_layer_embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size_per_layer_input)));
  if (weight_format_ != WeightFormat::kF32) {
    embed_scale_ = round_to_bf16(embed_scale_);
    per_layer_embed_scale_ = round_to_bf16(per_layer_embed_scale_);
  }

  int max_head_dim = 0, max_kv_row = 0, max_mlp = 0, max_group = 1;
  for (const LayerConfig& layer : config_.layers) {
    max_head_dim = std::max(max_head_dim, layer.head_dim);
    max_kv_row = std::max(max_kv_row, layer.num_kv_heads * layer.head_dim);
    max_mlp = std::max(max_mlp, layer.mlp_intermediate_size);
    max_group = std::max(max_group, layer.num_query_heads / layer.num_kv_heads);
  }
  const size_t rows = static_cast<size_t>(options_.max_chunk_tokens);
  const size_t hidden = static_cast<size_t>(config_.hidden_size);
  const size_t packed_per_layer = static_cast<size_t>(config_.num_layers) * config_.hidden_size_per_layer_input;
  hidden_.resize(rows * hidden);
  normed_.resize(rows * hidden);
  branch_.resize(rows * hidden);
  ffn_out_.resize(rows * hidden);
  moe_out_.resize(rows * hidden);
  expert_input_.resize(rows * hidden);
  query_.resize(rows * config_.num_attention_heads * max_head_dim);
  attention_out_.resize(query_.size());
  key_.resize(rows * max_kv_row);
  value_.resize(rows * max_kv_row);
  gate_.resize(rows * max_mlp);
  up_.resize(rows * max_mlp);
  per_layer_inputs_.resize(rows * packed_per_layer);
  per_layer_scratch_.resize(rows * packed_per_layer);
  rope_cos_.resize(max_head_dim);
  rope_sin_.resize(max_head_dim);
  logits_.resize(config_.vocab_size);
  thread_scores_.resize(static_cast<size_t>(pool_.size()) * max_group * options_.context_tokens);
  thread_slots_.resize(static_cast<size_t>(pool_.size()) * options_.context_tokens);
  if (config_.enable_moe_block) {
    const size_t experts = config_.num_experts, top_k = config_.top_k_experts;
    router_inputs_.resize(rows * hidden);
    router_logits_.resize(rows * experts);
    chosen_experts_.resize(rows * top_k);
    chosen_weights_.resize(rows * top_k);
    expert_rows_.resize(rows * top_k);
    expert_gathered_.resize(rows * hidden);
    expert_hidden_.resize(rows * 2 * config_.moe_intermediate_size);
    expert_output_.resize(rows * hidden);
  }
  if (partition_) local_logits_.resize(rows * static_cast<size_t>(partition_->vocab_rows.count));

  // In-process tensor parallelism: the other ranks are engines of their own, run in lockstep.
  if (group_) {
    for (int rank = 1; rank < options_.tensor_parallel; ++rank) {
      EngineOptions peer_options = options_;
      peer_options.tensor_parallel = 1;
      peer_options.communicator = group_communicators_[rank].get();
      peer_options.threads = threads_per_rank(options_);
      peers_.push_back(std::make_unique<Transformer>(model_, peer_options));
      peer_logits_.emplace_back();
    }
    rank_threads_ = std::make_unique<ThreadPool>(options_.tensor_parallel);
  }
}

Transformer::~Transformer() = default;

void Transformer::visit_linears(const std::function<void(const Linear&, double share)>& visit) const {
  auto visit_present = [&](const Linear& linear, double share) {
    if (!linear.view.empty()) visit(linear, share);
  };
  visit_present(lm_head_, 1.0);
  visit_present(per_layer_model_projection_, 1.0);
  // Each token reads top_k of the experts.
  const double expert_share = config_.enable_moe_block ? static_cast<double>(config_.top_k_experts) / config_.num_experts : 0.0;
  for (const auto& layer : layers_) {
    for (const Linear* linear : {&layer->q, &layer->k, &layer->v, &layer->o, &layer->gate, &layer->up, &layer->down,
                                 &layer->per_layer_gate, &layer->per_layer_projection, &layer->router}) {
      visit_present(*linear, 1.0);
    }
    for (size_t e = 0; e < layer->expert_gate_up.size(); ++e) {
      visit_present(layer->expert_gate_up[e], expert_share);
      visit_present(layer->expert_down[e], expert_share);
    }
  }
}

double Transformer::weight_bytes_per_token() const {
  double total = 0.0;
  visit_linears([&](const Linear& linear, double share) {
    total += share * static_cast<double>(options_.reference ? linear.view.size_bytes() : linear.fast_bytes());
  });
  return total;
}

double Transformer::matmul_flops_per_token() const {
  double total = 0.0;
  visit_linears([&](const Linear& linear, double share) { total += share * 2.0 * static_cast<double>(linear.view.element_count()); });
  return total;
}

double Transformer::attention_flops_per_token(int position) const {
  double total = 0.0;
  for (const LayerConfig& layer : config_.layers) {
    const int keys = layer.is_sliding() ? std::min(position + 1, layer.sliding_window) : position + 1;
    total += 4.0 * layer.num_query_heads * layer.head_dim * keys;  // q.k and p.v, a multiply and an add each
  }
  return total;
}

size_t Transformer::owned_weight_bytes() const {
  size_t total = 0;
  visit_linears([&](const Linear& linear, double) {
    total += linear.owned_bf16.size() * 2 + linear.owned_f32.size() * 4 + linear.owned_q8.size() + linear.owned_scales.size() * 4;
  });
  return total;
}

// ---- kernel dispatch: the only place that differs between the reference and the fast path ----

void Transformer::linear(const float* x, int rows, const Linear& weight, float* y) {
  if (options_.reference) {
    // Split by output features: each value is still one thread's double sum, so --threads never changes it.
    const int64_t out = weight.view.shape[0];
    pool_.parallel_for(out, kMatmulRowsPerTask, [&](int64_t first, int64_t last) {
      reference::matmul(x, rows, weight.view, y, first, last);
    });
    return;
  }
  prepared_.prepare(x, rows, weight.matrix.cols, weight.matrix.format);
  const int64_t out = weight.matrix.rows;
  if (out * weight.matrix.cols * rows < kMinParallelMultiplyAdds) {
    kernels::matmul(prepared_, weight.matrix, y, out, 0, out);
    return;
  }
  pool_.parallel_for(out, kMatmulRowsPerTask, [&](int64_t first, int64_t last) {
    kernels::matmul(prepared_, weight.matrix, y, out, first, last);
  });
}

void Transformer::norm_rows(const float* x, int rows, int width, const float* weight, float* out) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (int row = 0; row < rows; ++row) {
    const float* in = x + static_cast<int64_t>(row) * width;
    float* result = out + static_cast<int64_t>(row) * width;
    if (options_.reference) {
      reference::rms_norm(in, width, weight, eps, result);
    } else {
      kernels::rms_norm(in, width, weight, eps, result);
    }
  }
}

void Transformer::gelu_multiply(float* gate, const float* up, int64_t count) {
  if (options_.reference) {
    for (int64_t i = 0; i < count; ++i) gate[i] = reference::gelu_tanh(gate[i]) * up[i];
  } else {
    kernels::gelu_tanh_multiply(gate, up, count);
  }
}

void Transformer::add_rows(float* y, const float* x, int64_t count) {
  if (options_.reference) {
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
  } else {
    kernels::add(y, x, count);
  }
}

void Transformer::store_kv(const float* source, int64_t count, std::byte* destination) {
  kernels::store_kv_row(source, count, cache_->format(), destination);
}

// ---- the forward pass ----

std::span<const float> Transformer::forward(std::span<const int32_t> tokens, int position, bool apply_softcap, int sequence) {
  if (tokens.empty()) fail("forward needs at least one token");
  row_scratch_.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) row_scratch_[i] = {sequence, position + static_cast<int>(i), tokens[i]};
  const int last = static_cast<int>(tokens.size()) - 1;
  forward(row_scratch_, std::span<const int>(&last, 1), logits_.data(), apply_softcap);
  return logits_;
}

void Transformer::forward(std::span<const BatchRow> rows, std::span<const int> logit_rows, float* logits, bool apply_softcap) {
  if (peers_.empty()) {
    forward_local(rows, logit_rows, logits, apply_softcap);
    return;
  }
  // Every rank runs the same rows; collectives inside keep them in step. Rank 0's logits are returned.
  const size_t logit_values = logit_rows.size() * static_cast<size_t>(config_.vocab_size);
  std::exception_ptr failure;
  std::mutex failure_mutex;
  rank_threads_->run([&](int rank, int) {
    try {
      if (rank == 0) {
        forward_local(rows, logit_rows, logits, apply_softcap);
      } else {
        peer_logits_[rank - 1].resize(logit_values);
        peers_[rank - 1]->forward_local(rows, logit_rows, peer_logits_[rank - 1].data(), apply_softcap);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  });
  if (failure) std::rethrow_exception(failure);
}

void Transformer::forward_local(std::span<const BatchRow> rows, std::span<const int> logit_rows, float* logits, bool apply_softcap) {
  if (rows.empty()) fail("forward needs at least one token");
  for (const BatchRow& row : rows) {
    if (row.sequence < 0 || row.sequence >= options_.sequences) fail("sequence {} does not exist ({} KV slots)", row.sequence, options_.sequences);
    if (row.position < 0 || row.position >= options_.context_tokens) {
      fail("position {} does not fit the context of {} tokens (--ctx)", row.position, options_.context_tokens);
    }
    if (row.token < 0 || row.token >= config_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", row.token, config_.vocab_size - 1);
  }
  for (size_t i = 1; i < logit_rows.size(); ++i) {
    if (logit_rows[i] <= logit_rows[i - 1]) fail("logit rows must be in increasing order");
  }
  const int vocab = config_.vocab_size;
  const int hidden = config_.hidden_size;
  size_t next_logit = 0;
  for (size_t first = 0; first < rows.size(); first += options_.max_chunk_tokens) {
    const size_t count = std::min<size_t>(options_.max_chunk_tokens, rows.size() - first);
    forward_chunk(rows.subspan(first, count));

    // Logits for the requested rows of this chunk: final norm, then the (tied) head, read once for all.
    const size_t begin_logit = next_logit;
    while (next_logit < logit_rows.size() && static_cast<size_t>(logit_rows[next_logit]) < first + count) {
      const int row = logit_rows[next_logit] - static_cast<int>(first);
      norm_rows(hidden_.data() + static_cast<int64_t>(row) * hidden, 1, hidden, final_norm_.data(),
                normed_.data() + static_cast<int64_t>(next_logit - begin_logit) * hidden);
      ++next_logit;
    }
    const int wanted = static_cast<int>(next_logit - begin_logit);
    if (wanted == 0) continue;
    float* out = logits + static_cast<int64_t>(begin_logit) * vocab;
    if (partition_) {
      // Each rank scores its vocabulary rows; the full logits are gathered on every rank.
      const int64_t local_vocab = partition_->vocab_rows.count;
      linear(normed_.data(), wanted, lm_head_, local_logits_.data());
      for (int row = 0; row < wanted; ++row) {
        communicator_->all_gather(local_logits_.data() + row * local_vocab, partition_->vocab_counts, out + static_cast<int64_t>(row) * vocab);
      }
    } else {
      linear(normed_.data(), wanted, lm_head_, out);
    }
    if (apply_softcap && config_.final_logit_softcapping) {
      const float cap = static_cast<float>(*config_.final_logit_softcapping);
      const int64_t values = static_cast<int64_t>(wanted) * vocab;
      if (options_.reference) {
        for (int64_t i = 0; i < values; ++i) out[i] = std::tanh(out[i] / cap) * cap;
      } else {
        kernels::softcap(out, values, cap);
      }
    }
  }
  if (next_logit != logit_rows.size()) fail("logit row {} is not one of the {} rows", logit_rows[next_logit], rows.size());
}

void Transformer::forward_chunk(std::span<const BatchRow> rows) {
  const int count = static_cast<int>(rows.size());
  const int hidden = config_.hidden_size;
  const int64_t values = static_cast<int64_t>(count) * hidden;
  embed(rows);
  if (config_.has_per_layer_inputs()) compute_per_layer_inputs(rows);

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    const LayerState& state = *layers_[layer];
    // Attention block: pre-norm, attention, post-norm, residual.
    norm_rows(hidden_.data(), count, hidden, state.input_norm.data(), normed_.data());
    attention(layer, rows);
    norm_rows(branch_.data(), count, hidden, state.post_attention_norm.data(), branch_.data());
    add_rows(hidden_.data(), branch_.data(), values);

    feed_forward(layer, count);
    if (config_.has_per_layer_inputs()) per_layer_input_block(layer, count);

    // layer_scalar scales the whole residual stream, not only this layer's contribution.
    for (int64_t i = 0; i < values; ++i) hidden_[i] *= state.layer_scalar;
  }
}

void Transformer::embed(std::span<const BatchRow> rows) {
  const int hidden = config_.hidden_size;
  for (size_t t = 0; t < rows.size(); ++t) {
    float* row = hidden_.data() + t * hidden;
    weights_.embed_tokens.read_floats(static_cast<int64_t>(rows[t].token) * hidden, hidden, row);
    for (int i = 0; i < hidden; ++i) row[i] *= embed_scale_;
  }
}

// Per-Layer Embeddings (architecture doc §2.2): a token-identity part gathered from the packed table and a
// context part projected from the scaled main embedding, each layer's slice normalised separately.
void Transformer::compute_per_layer_inputs(std::span<const BatchRow> rows) {
  const int count = static_cast<int>(rows.size());
  const int hidden = config_.hidden_size;
  const int width = config_.hidden_size_per_layer_input;
  const int64_t packed = static_cast<int64_t>(config_.num_layers) * width;
  float* projected = per_layer_scratch_.data();
  linear(hidden_.data(), count, per_layer_model_projection_, projected);
  const float projection_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hidden)));
  const float combine_scale = static_cast<float>(1.0 / std::sqrt(2.0));
  for (int t = 0; t < count; ++t) {
    const int32_t token = rows[t].token;
    if (token >= config_.vocab_size_per_layer_input) {
      fail("token id {} is outside the per-layer embedding table ({} rows)", token, config_.vocab_size_per_layer_input);
    }
    float* context_part = projected + t * packed;
    for (int64_t i = 0; i < packed; ++i) context_part[i] *= projection_scale;
    norm_rows(context_part, config_.num_layers, width, per_layer_projection_norm_.data(), context_part);
    float* out = per_layer_inputs_.data() + t * packed;
    // Gathered straight from the memory-mapped table: the table is never copied or converted.
    weights_.embed_tokens_per_layer.read_floats(static_cast<int64_t>(token) * packed, packed, out);
    for (int64_t i = 0; i < packed; ++i) out[i] = (context_part[i] + out[i] * per_layer_embed_scale_) * combine_scale;
  }
}

void Transformer::attention(int layer, std::span<const BatchRow> rows) {
  const int count = static_cast<int>(rows.size());
  const LayerConfig& geometry = config_.layers[layer];
  const LayerState& state = *layers_[layer];
  const int head_dim = geometry.head_dim;
  // This rank's heads: all of them without tensor parallelism. Query head q uses KV head q / groups,
  // computed from the unsharded counts, whether this rank holds a share of the KV heads or all of them.
  const int groups = geometry.num_query_heads / geometry.num_kv_heads;
  const Slice query_slice = partition_ ? partition_->layers[layer].query_heads : Slice{0, geometry.num_query_heads};
  const Slice kv_slice = partition_ ? partition_->layers[layer].kv_heads : Slice{0, geometry.num_kv_heads};
  const int query_heads = query_slice.count;
  const int kv_heads = kv_slice.count;
  const int64_t query_row = static_cast<int64_t>(query_heads) * head_dim;
  const int64_t kv_row = static_cast<int64_t>(kv_heads) * head_dim;
  const RopeTable& rope = geometry.is_sliding() ? rope_sliding_ : rope_full_;
  const bool owns_kv = geometry.owns_kv(layer);
  const size_t element_bytes = cache_->element_bytes();

  linear(normed_.data(), count, state.q, query_.data());
  if (owns_kv) {
    linear(normed_.data(), count, state.k, key_.data());
    if (geometry.k_eq_v) {
      // K=V layers: V is the raw k_proj output, taken before k_norm and RoPE touch K.
      std::copy(key_.begin(), key_.begin() + count * kv_row, value_.begin());
    } else {
      linear(normed_.data(), count, state.v, value_.data());
    }
  }

  for (int t = 0; t < count; ++t) {
    const BatchRow& row = rows[t];
    rope.angles(row.position, rope_cos_.data(), rope_sin_.data());
    float* queries = query_.data() + t * query_row;
    norm_rows(queries, query_heads, head_dim, state.q_norm.data(), queries);
    if (options_.reference) {
      for (int head = 0; head < query_heads; ++head) reference::apply_rope(queries + head * head_dim, head_dim, rope_cos_.data(), rope_sin_.data());
    } else {
      kernels::apply_rope(queries, query_heads, head_dim, rope_cos_.data(), rope_sin_.data());
    }
    if (!owns_kv) continue;
    float* keys = key_.data() + t * kv_row;
    float* values = value_.data() + t * kv_row;
    norm_rows(keys, kv_heads, head_dim, state.k_norm.data(), keys);
    if (options_.reference) {
      for (int head = 0; head < kv_heads; ++head) reference::apply_rope(keys + head * head_dim, head_dim, rope_cos_.data(), rope_sin_.data());
    } else {
      kernels::apply_rope(keys, kv_heads, head_dim, rope_cos_.data(), rope_sin_.data());
    }
    norm_rows(values, kv_heads, head_dim, nullptr, values);  // v_norm has no weight
    const int64_t offset = static_cast<int64_t>(cache_->slot(layer, row.position)) * kv_row * element_bytes;
    store_kv(keys, kv_row, cache_->keys(row.sequence, layer) + offset);
    store_kv(values, kv_row, cache_->values(row.sequence, layer) + offset);
  }

  // Every query sees its sequence's keys up to itself; sliding layers only the last sliding_window.
  // One task per (row, KV head): the group of query heads sharing that KV head reads its rows once.
  const int context = options_.context_tokens;
  const int64_t tasks = static_cast<int64_t>(count) * kv_heads;
  auto attend_tasks = [&](int thread, int threads) {
    float* scores = thread_scores_.data() + static_cast<size_t>(thread) * thread_scores_.size() / pool_.size();
    int32_t* slots = thread_slots_.data() + static_cast<size_t>(thread) * context;
    for (int64_t task = thread; task < tasks; task += threads) {
      const int t = static_cast<int>(task / kv_heads);
      const int kv_head = static_cast<int>(task % kv_heads);
      const BatchRow& row = rows[t];
      const int first_key = geometry.is_sliding() ? std::max(0, row.position - geometry.sliding_window + 1) : 0;
      const int key_count = row.position - first_key + 1;
      for (int k = 0; k < key_count; ++k) slots[k] = cache_->slot(layer, first_key + k);
      const std::span<const int32_t> slot_list(slots, key_count);
      const std::byte* keys = cache_->keys(row.sequence, layer) + static_cast<int64_t>(kv_head) * head_dim * element_bytes;
      const std::byte* values = cache_->values(row.sequence, layer) + static_cast<int64_t>(kv_head) * head_dim * element_bytes;
      // The query heads of this rank that read this KV head: a contiguous run.
      const int global_kv = kv_slice.first + kv_head;
      const int first_query = std::max(global_kv * groups, query_slice.first) - query_slice.first;
      const int last_query = std::min((global_kv + 1) * groups, query_slice.end()) - query_slice.first;
      if (first_query >= last_query) continue;
      const int group = last_query - first_query;
      const float* queries = query_.data() + t * query_row + static_cast<int64_t>(first_query) * head_dim;
      float* out = attention_out_.data() + t * query_row + static_cast<int64_t>(first_query) * head_dim;
      if (options_.reference) {
        for (int g = 0; g < group; ++g) {
          reference::attend(queries + g * head_dim, head_dim, reinterpret_cast<const float*>(keys), reinterpret_cast<const float*>(values),
                            kv_row, slot_list, scores, out + g * head_dim);
        }
      } else {
        kernels::attend_group(queries, group, head_dim, keys, values, cache_->format(), kv_row, slot_list, scores, out);
      }
    }
  };
  // Short contexts of small models are cheaper on one thread than waking the pool.
  const int64_t work = tasks * groups * head_dim * (rows.back().position + 1);
  if (work < kMinParallelMultiplyAdds) {
    attend_tasks(0, 1);
  } else {
    pool_.run(attend_tasks);
  }
  linear(attention_out_.data(), count, state.o, branch_.data());
  all_reduce(branch_.data(), static_cast<int64_t>(count) * config_.hidden_size);  // o_proj is row-parallel
}

void Transformer::feed_forward(int layer, int count) {
  const LayerConfig& geometry = config_.layers[layer];
  const LayerState& state = *layers_[layer];
  const int hidden = config_.hidden_size;
  const int64_t values = static_cast<int64_t>(count) * hidden;
  const int64_t width = partition_ ? partition_->layers[layer].mlp_rows.count : geometry.mlp_intermediate_size;

  norm_rows(hidden_.data(), count, hidden, state.pre_feedforward_norm.data(), normed_.data());
  linear(normed_.data(), count, state.gate, gate_.data());
  linear(normed_.data(), count, state.up, up_.data());
  gelu_multiply(gate_.data(), up_.data(), count * width);
  linear(gate_.data(), count, state.down, ffn_out_.data());
  all_reduce(ffn_out_.data(), values);  // down_proj is row-parallel

  if (config_.enable_moe_block) {
    // The dense MLP and the experts run side by side on the same residual, each with its own norms.
    norm_rows(ffn_out_.data(), count, hidden, state.post_feedforward_norm_1.data(), ffn_out_.data());
    mixture_of_experts(layer, count);
    all_reduce(moe_out_.data(), values);  // each rank added its own experts' contributions
    norm_rows(moe_out_.data(), count, hidden, state.post_feedforward_norm_2.data(), moe_out_.data());
    add_rows(ffn_out_.data(), moe_out_.data(), values);
  }
  norm_rows(ffn_out_.data(), count, hidden, state.post_feedforward_norm.data(), ffn_out_.data());
  add_rows(hidden_.data(), ffn_out_.data(), values);
}

// MoE (architecture doc §5): the router reads the raw residual; softmax over all experts, top-k,
// renormalise, then the per-expert scale. Experts read their own pre-norm of the residual. Rows are
// grouped by expert so each selected expert's weights are read once per step.
void Transformer::mixture_of_experts(int layer, int count) {
  const LayerState& state = *layers_[layer];
  const int hidden = config_.hidden_size;
  const int experts = config_.num_experts;
  const int top_k = config_.top_k_experts;
  const int64_t expert_width = config_.moe_intermediate_size;
  const float router_input_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hidden)));

  norm_rows(hidden_.data(), count, hidden, nullptr, router_inputs_.data());
  for (int t = 0; t < count; ++t) {
    float* input = router_inputs_.data() + static_cast<int64_t>(t) * hidden;
    for (int i = 0; i < hidden; ++i) input[i] = input[i] * state.router_scale[i] * router_input_scale;
  }
  linear(router_inputs_.data(), count, state.router, router_logits_.data());
  for (int t = 0; t < count; ++t) {
    float* probabilities = router_logits_.data() + static_cast<int64_t>(t) * experts;
    reference::softmax(probabilities, experts);
    // Top-k by probability; equal probabilities prefer the lower expert index.
    int* chosen = chosen_experts_.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      int best = -1;
      for (int e = 0; e < experts; ++e) {
        if (std::find(chosen, chosen + k, e) != chosen + k) continue;
        if (best < 0 || probabilities[e] > probabilities[best]) best = e;
      }
      chosen[k] = best;
    }
    float total = 0.0f;
    for (int k = 0; k < top_k; ++k) total += probabilities[chosen[k]];
    for (int k = 0; k < top_k; ++k) chosen_weights_[t * top_k + k] = probabilities[chosen[k]] / total * state.per_expert_scale[chosen[k]];
  }

  norm_rows(hidden_.data(), count, hidden, state.pre_feedforward_norm_2.data(), expert_input_.data());
  std::fill(moe_out_.begin(), moe_out_.begin() + static_cast<int64_t>(count) * hidden, 0.0f);
  // Experts in ascending index order, each over the rows that chose it (the reference's accumulation order).
  for (int expert = 0; expert < experts; ++expert) {
    if (state.expert_gate_up[expert].view.empty()) continue;  // another rank's expert
    int rows_for_expert = 0;
    for (int t = 0; t < count; ++t) {
      for (int k = 0; k < top_k; ++k) {
        if (chosen_experts_[t * top_k + k] == expert) expert_rows_[rows_for_expert++] = t * top_k + k;
      }
    }
    if (rows_for_expert == 0) continue;
    for (int r = 0; r < rows_for_expert; ++r) {
      const int t = expert_rows_[r] / top_k;
      std::copy_n(expert_input_.data() + static_cast<int64_t>(t) * hidden, hidden, expert_gathered_.data() + static_cast<int64_t>(r) * hidden);
    }
    linear(expert_gathered_.data(), rows_for_expert, state.expert_gate_up[expert], expert_hidden_.data());
    // gate_up rows hold [gate | up]; compact the activated product to [rows, expert_width].
    for (int r = 0; r < rows_for_expert; ++r) {
      float* gate_up = expert_hidden_.data() + static_cast<int64_t>(r) * 2 * expert_width;
      gelu_multiply(gate_up, gate_up + expert_width, expert_width);
      std::copy_n(gate_up, expert_width, gate_.data() + static_cast<int64_t>(r) * expert_width);
    }
    linear(gate_.data(), rows_for_expert, state.expert_down[expert], expert_output_.data());
    for (int r = 0; r < rows_for_expert; ++r) {
      const int t = expert_rows_[r] / top_k;
      const float weight = chosen_weights_[expert_rows_[r]];
      float* out = moe_out_.data() + static_cast<int64_t>(t) * hidden;
      const float* y = expert_output_.data() + static_cast<int64_t>(r) * hidden;
      for (int i = 0; i < hidden; ++i) out[i] += y[i] * weight;
    }
  }
}

void Transformer::per_layer_input_block(int layer, int count) {
  const LayerState& state = *layers_[layer];
  const int hidden = config_.hidden_size;
  const int width = config_.hidden_size_per_layer_input;
  const int64_t packed = static_cast<int64_t>(config_.num_layers) * width;
  float* gate = per_layer_scratch_.data();
  linear(hidden_.data(), count, state.per_layer_gate, gate);
  for (int t = 0; t < count; ++t) {
    const float* per_layer_input = per_layer_inputs_.data() + t * packed + static_cast<int64_t>(layer) * width;
    gelu_multiply(gate + static_cast<int64_t>(t) * width, per_layer_input, width);
  }
  linear(gate, count, state.per_layer_projection, branch_.data());
  norm_rows(branch_.data(), count, hidden, state.per_layer_post_norm.data(), branch_.data());
  add_rows(hidden_.data(), branch_.data(), static_cast<int64_t>(count) * hidden);
}

}  // namespace gemma4rt
