#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>

#include "backend/registry.h"
#include "core/argmax.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "planning/deployment_plan.h"

namespace gemma4rt {

using backend::Buffer;
using backend::Weight;

// Everything one decoder layer needs at run time, in the backend's memory.
struct Transformer::LayerState {
  Buffer input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  Buffer q_norm, k_norm;
  Buffer router_scale, per_expert_scale, pre_feedforward_norm_2, post_feedforward_norm_1, post_feedforward_norm_2;
  Buffer per_layer_post_norm;
  float layer_scalar = 1.0f;
  Weight q, k, v, o, gate, up, down;
  Weight per_layer_gate, per_layer_projection;
  Weight router;
  std::vector<Weight> expert_gate_up, expert_down;
};

namespace {

std::vector<float> to_floats(const TensorView& tensor) {
  std::vector<float> values;
  if (tensor.empty()) return values;
  values.resize(static_cast<size_t>(tensor.element_count()));
  tensor.read_floats(0, tensor.element_count(), values.data());
  return values;
}

// In-process tensor parallelism shares the cores among the ranks.
int threads_per_rank(const EngineOptions& options) {
  if (options.tensor_parallel <= 1 || options.communicator != nullptr) return options.threads;
  const int total = options.threads > 0 ? options.threads : available_cores();
  return std::max(1, total / options.tensor_parallel);
}

// The planner's arithmetic for this engine's cache and chunk, with weights (or, on the host, the KV
// cache's element size) in `dtype`.
planning::PlanOptions plan_options(const EngineOptions& options, WeightFormat dtype) {
  planning::PlanOptions plan;
  plan.dtype = dtype;
  plan.context_tokens = options.context_tokens;
  plan.batch = options.sequences;
  plan.prefill_chunk_tokens = options.max_chunk_tokens;
  plan.full_sliding_cache = options.full_sliding_cache;
  return plan;
}

// What the host allocates beside weights: the KV cache and scratch.
planning::RankMemory host_needs(const ModelConfig& config, const EngineOptions& options, KvFormat kv_format) {
  const planning::PlanOptions plan = plan_options(options, kv_format == KvFormat::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16);
  return planning::rank_memory(config, parallel::make_shard_plan(config, 1), planning::parse_target("cpu:1"), plan);
}

// Bytes of host memory weights may be copied into (Backend::allow_weight_copies): a quarter of what is
// left after the KV cache and scratch, and 2 GiB, stay free for everything else; `ranks` engines of one
// run (in-process ranks, or processes that may share the host) split the rest.
uint64_t weight_copy_budget(const ModelConfig& config, const EngineOptions& options, KvFormat kv_format, int ranks) {
  const planning::RankMemory needed = host_needs(config, options, kv_format);
  const uint64_t allocated = static_cast<uint64_t>(needed.kv_cache_bytes + needed.activation_bytes);
  const uint64_t available = available_host_memory();
  if (available <= kHostMemoryReserve + allocated) return 0;
  return (available - allocated - kHostMemoryReserve) / 4 * 3 / static_cast<uint64_t>(std::max(ranks, 1));
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

}  // namespace

Transformer::Transformer(const Model& model, const EngineOptions& options)
    : Transformer(model, options, backend::make_backend({options.backend, threads_per_rank(options), options.device})) {}

Transformer::Transformer(const Model& model, const EngineOptions& options, std::unique_ptr<backend::Backend> backend)
    : model_(model), config_(model.config()), weights_(model.weights()), options_(options), backend_(std::move(backend)) {
  load();
}

Transformer::~Transformer() = default;

void Transformer::load() {
  backend::Backend& device = *backend_;
  if (options_.max_chunk_tokens <= 0) options_.max_chunk_tokens = device.default_chunk_tokens();
  weight_format_ = options_.weight_format.value_or(device.default_weight_format(weights_.layers.front().attention.q_proj.dtype));
  const KvFormat kv_format = options_.kv_format.value_or(device.default_kv_format());
  device.check_formats(weight_format_, kv_format);
  eps_ = static_cast<float>(config_.rms_norm_eps);

  const bool sharded = options_.tensor_parallel > 1 || (options_.communicator != nullptr && options_.communicator->size() > 1);
  if (sharded && !device.supports_tensor_parallel()) {
    fail("the {} backend does not run tensor parallelism (tensor_parallel {}); use the cpu backend", device.name(),
         options_.communicator ? options_.communicator->size() : options_.tensor_parallel);
  }
  const uint64_t upload_bytes = check_fits(kv_format);

  // Tensor parallelism: in process, this engine is rank 0 and builds the other ranks itself.
  communicator_ = options_.communicator;
  if (!communicator_ && options_.tensor_parallel > 1) {
    group_ = std::make_unique<parallel::InProcessGroup>(options_.tensor_parallel);
    for (int rank = 0; rank < options_.tensor_parallel; ++rank) group_communicators_.push_back(group_->communicator(rank));
    communicator_ = group_communicators_[0].get();
  }
  if (communicator_ && communicator_->size() > 1) partition_ = partition_for_rank(config_, communicator_->rank(), communicator_->size());
  // Weights the host would read in place from the map may be copied into huge pages with what it spares.
  if (device.memory_bytes() == 0) {
    device.allow_weight_copies(weight_copy_budget(config_, options_, kv_format, communicator_ ? communicator_->size() : 1));
  }
  std::vector<int> kv_heads;
  if (partition_) {
    for (const LayerPartition& layer : partition_->layers) kv_heads.push_back(static_cast<int>(layer.kv_heads.count));
  }
  cache_ = std::make_unique<KvCache>(device, config_, options_.context_tokens, options_.max_chunk_tokens, options_.sequences, kv_format, kv_heads,
                                     options_.full_sliding_cache);

  auto prepare = [&](const TensorView& view) {
    const Weight weight = device.prepare_weight(view, weight_format_);
    if (upload_bytes > 0 && options_.on_weight_upload) options_.on_weight_upload(std::min<uint64_t>(device.owned_weight_bytes(), upload_bytes), upload_bytes);
    return weight;
  };
  auto constant = [&](const TensorView& view) { return view.empty() ? Buffer{} : device.upload_constant(to_floats(view)); };
  sliced_weights_.reserve(static_cast<size_t>(config_.num_layers) * 2);
  for (size_t index = 0; index < weights_.layers.size(); ++index) {
    const LayerWeights& layer = weights_.layers[index];
    const LayerConfig& geometry = config_.layers[index];
    auto state = std::make_unique<LayerState>();
    // This rank's share: column-parallel products keep rows, row-parallel ones keep input columns.
    auto own_rows = [&](const TensorView& view, Range slice, int64_t rows_per_unit) {
      return partition_ ? view.rows(slice.first * rows_per_unit, slice.count * rows_per_unit) : view;
    };
    auto own_columns = [&](const TensorView& view, Range slice, int64_t columns_per_unit) {
      if (!partition_) return view;
      sliced_weights_.emplace_back();
      return columns_copy(view, slice.first * columns_per_unit, slice.count * columns_per_unit, sliced_weights_.back());
    };
    const LayerPartition part = partition_ ? partition_->layers[index] : LayerPartition{};
    state->input_norm = constant(layer.input_norm);
    state->post_attention_norm = constant(layer.post_attention_norm);
    state->pre_feedforward_norm = constant(layer.pre_feedforward_norm);
    state->post_feedforward_norm = constant(layer.post_feedforward_norm);
    state->q_norm = constant(layer.attention.q_norm);
    state->k_norm = constant(layer.attention.k_norm);
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
      state->router_scale = constant(moe.router_scale);
      state->per_expert_scale = constant(moe.per_expert_scale);
      state->pre_feedforward_norm_2 = constant(moe.pre_feedforward_norm_2);
      state->post_feedforward_norm_1 = constant(moe.post_feedforward_norm_1);
      state->post_feedforward_norm_2 = constant(moe.post_feedforward_norm_2);
      // The router decides which experts run: keep it in f32 on every backend.
      state->router = device.prepare_weight(moe.router_proj, WeightFormat::kF32);
      // Expert parallelism: a rank prepares only its experts; the others stay absent here.
      state->expert_gate_up.resize(config_.num_experts);
      state->expert_down.resize(config_.num_experts);
      for (int expert = 0; expert < config_.num_experts; ++expert) {
        if (partition_ && !part.experts.contains(expert)) continue;
        state->expert_gate_up[expert] = prepare(moe.gate_up_proj.slice(expert));
        state->expert_down[expert] = prepare(moe.down_proj.slice(expert));
      }
    }
    if (layer.per_layer_input) {
      state->per_layer_post_norm = constant(layer.per_layer_input->post_norm);
      state->per_layer_gate = prepare(layer.per_layer_input->input_gate);
      state->per_layer_projection = prepare(layer.per_layer_input->projection);
    }
    layers_.push_back(std::move(state));
  }
  lm_head_ = prepare(partition_ ? weights_.lm_head.rows(partition_->vocab_rows.first, partition_->vocab_rows.count) : weights_.lm_head);
  if (config_.has_per_layer_inputs()) per_layer_model_projection_ = prepare(weights_.per_layer_model_projection);
  if (upload_bytes > 0 && options_.on_weight_upload) options_.on_weight_upload(upload_bytes, upload_bytes);
  final_norm_ = constant(weights_.final_norm);
  per_layer_projection_norm_ = constant(weights_.per_layer_projection_norm);
  const RopeTable rope_sliding(config_.rope_sliding, config_.head_dim);
  const RopeTable rope_full(config_.rope_full, config_.global_head_dim > 0 ? config_.global_head_dim : config_.head_dim);
  rope_sliding_ = device.upload_constant(rope_sliding.inverse_frequencies());
  rope_full_ = device.upload_constant(rope_full.inverse_frequencies());
  // K=V layers rebuild keys at every cached position: the rotations of each position, once.
  for (const LayerConfig& layer : config_.layers) {
    KeyRotations& rotations = layer.is_sliding() ? key_rotations_sliding_ : key_rotations_full_;
    if (!layer.k_eq_v || rotations.table.valid()) continue;
    const RopeTable& rope = layer.is_sliding() ? rope_sliding : rope_full;
    rotations = {device.upload_constant(rope.rotations(options_.context_tokens)), rope.rotated_pairs()};
  }

  // The reference casts sqrt(width) to the embedding's compute dtype before multiplying: exact in fp32,
  // rounded (39.25 for E2B) when the model computes in bf16.
  embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size)));
  per_layer_embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size_per_layer_input)));
  if (weight_format_ != WeightFormat::kF32) {
    embed_scale_ = round_to_bf16(embed_scale_);
    per_layer_embed_scale_ = round_to_bf16(per_layer_embed_scale_);
  }

  int max_head_dim = 0, max_kv_row = 0, max_mlp = 0;
  for (const LayerConfig& layer : config_.layers) {
    max_head_dim = std::max(max_head_dim, layer.head_dim);
    max_kv_row = std::max(max_kv_row, layer.num_kv_heads * layer.head_dim);
    max_mlp = std::max(max_mlp, layer.mlp_intermediate_size);
  }
  const size_t rows = static_cast<size_t>(options_.max_chunk_tokens);
  const size_t hidden = static_cast<size_t>(config_.hidden_size);
  const size_t packed_per_layer = static_cast<size_t>(config_.num_layers) * config_.hidden_size_per_layer_input;
  // A step returns logits for at most this many rows (a longer request is split into more steps), so
  // the logits buffer need not hold 262,144 floats for every row of a prefill chunk.
  logit_capacity_ = std::min(options_.max_chunk_tokens, std::max(16, options_.sequences));
  auto floats = [&](size_t count) { return device.allocate(count * sizeof(float)); };
  row_table_ = device.allocate(rows * sizeof(BatchRow));
  logit_row_ids_ = device.allocate(static_cast<size_t>(logit_capacity_) * sizeof(int32_t));
  hidden_ = floats(rows * hidden);
  normed_ = floats(rows * hidden);
  branch_ = floats(rows * hidden);
  ffn_out_ = floats(rows * hidden);
  query_ = floats(rows * config_.num_attention_heads * max_head_dim);
  attention_out_ = floats(rows * config_.num_attention_heads * max_head_dim);
  key_ = floats(rows * max_kv_row);
  value_ = floats(rows * max_kv_row);
  gate_ = floats(rows * max_mlp);
  up_ = floats(rows * max_mlp);
  if (config_.has_per_layer_inputs()) {
    per_layer_inputs_ = floats(rows * packed_per_layer);
    per_layer_projected_ = floats(rows * packed_per_layer);
    per_layer_gate_ = floats(rows * config_.hidden_size_per_layer_input);
  }
  if (config_.enable_moe_block) {
    const size_t experts = config_.num_experts, top_k = config_.top_k_experts;
    moe_out_ = floats(rows * hidden);
    expert_input_ = floats(rows * hidden);
    router_inputs_ = floats(rows * hidden);
    router_logits_ = floats(rows * experts);
    chosen_experts_ = device.allocate(rows * top_k * sizeof(int32_t));
    chosen_weights_ = floats(rows * top_k);
  }
  final_hidden_ = floats(static_cast<size_t>(logit_capacity_) * hidden);
  logits_ = floats(static_cast<size_t>(logit_capacity_) * config_.vocab_size);
  log_normalisers_ = floats(static_cast<size_t>(logit_capacity_));
  ids_ = device.allocate(static_cast<size_t>(logit_capacity_) * sizeof(int32_t));
  if (partition_) local_logits_ = floats(static_cast<size_t>(logit_capacity_) * partition_->vocab_rows.count);
  embedding_rows_.resize(rows * hidden);
  per_layer_rows_.resize(config_.has_per_layer_inputs() ? rows * packed_per_layer : 0);
  logit_row_scratch_.reserve(static_cast<size_t>(logit_capacity_));
  last_logits_.resize(config_.vocab_size);

  // In-process tensor parallelism: the other ranks are engines of their own, run in lockstep.
  if (group_) {
    for (int rank = 1; rank < options_.tensor_parallel; ++rank) {
      EngineOptions peer_options = options_;
      peer_options.backend = device.name();
      peer_options.tensor_parallel = 1;
      peer_options.communicator = group_communicators_[rank].get();
      peer_options.threads = threads_per_rank(options_);
      peers_.push_back(std::make_unique<Transformer>(model_, peer_options));
      peer_logits_.emplace_back();
      peer_ids_.emplace_back();
    }
    rank_threads_ = std::make_unique<ThreadPool>(options_.tensor_parallel);
  }
}

// The context must be one the model was trained for, and what is allocated must fit: on a device
// with its own memory the whole model (the deployment planner's arithmetic, before anything is
// uploaded), on the host the KV cache and scratch.
uint64_t Transformer::check_fits(KvFormat kv_format) const {
  if (config_.max_position_embeddings > 0 && options_.context_tokens > config_.max_position_embeddings) {
    fail("a context of {} tokens exceeds what the model was trained for (max_position_embeddings {})", options_.context_tokens,
         config_.max_position_embeddings);
  }
  const uint64_t memory = backend_->memory_bytes();
  if (memory == 0) {
    // Host memory: weights are mapped from the checkpoint (the page cache holds them), but the KV
    // cache and scratch are allocated, so they must fit what the machine has free.
    const uint64_t available = available_host_memory();
    if (available == 0) return 0;
    const planning::RankMemory needed = host_needs(config_, options_, kv_format);
    const int64_t allocated = needed.kv_cache_bytes + needed.activation_bytes;
    if (allocated > static_cast<int64_t>(available)) {
      fail("the KV cache and scratch for {} x {} tokens need {:.2f} GB ({:.2f} GB of {} KV cache) and this machine has {:.2f} GB available; "
           "lower the context or the number of sequences",
           options_.sequences, options_.context_tokens, allocated / 1e9, needed.kv_cache_bytes / 1e9, format_name(kv_format), available / 1e9);
    }
    return 0;
  }
  planning::Target target;
  target.name = backend_->name();
  target.kind = planning::TargetKind::kGpu;
  target.memory_per_rank_bytes = static_cast<int64_t>(memory);
  const planning::RankMemory needed = planning::rank_memory(config_, parallel::make_shard_plan(config_, 1), target, plan_options(options_, weight_format_));
  if (needed.total_bytes > static_cast<int64_t>(memory)) {
    fail("the model does not fit the {} device: it needs {:.2f} GB ({:.2f} GB of {} weights, {:.2f} GB of {} KV cache for {} x {} tokens) "
         "and the device has {:.2f} GB",
         backend_->name(), needed.total_bytes / 1e9, needed.weight_bytes / 1e9, format_name(weight_format_), needed.kv_cache_bytes / 1e9,
         format_name(kv_format), options_.sequences, options_.context_tokens, memory / 1e9);
  }
  return static_cast<uint64_t>(needed.weight_bytes);
}

void Transformer::visit_weights(const std::function<void(const Weight&, double share)>& visit) const {
  auto visit_present = [&](const Weight& weight, double share) {
    if (weight.present()) visit(weight, share);
  };
  visit_present(lm_head_, 1.0);
  visit_present(per_layer_model_projection_, 1.0);
  // Each token reads top_k of the experts.
  const double expert_share = config_.enable_moe_block ? static_cast<double>(config_.top_k_experts) / config_.num_experts : 0.0;
  for (const auto& layer : layers_) {
    for (const Weight* weight : {&layer->q, &layer->k, &layer->v, &layer->o, &layer->gate, &layer->up, &layer->down,
                                 &layer->per_layer_gate, &layer->per_layer_projection, &layer->router}) {
      visit_present(*weight, 1.0);
    }
    for (size_t e = 0; e < layer->expert_gate_up.size(); ++e) {
      visit_present(layer->expert_gate_up[e], expert_share);
      visit_present(layer->expert_down[e], expert_share);
    }
  }
}

double Transformer::weight_bytes_per_token() const {
  double total = 0.0;
  visit_weights([&](const Weight& weight, double share) { total += share * static_cast<double>(backend_->weight_read_bytes(weight)); });
  return total;
}

double Transformer::layer_matmul_flops_per_token() const {
  double total = 0.0;
  visit_weights([&](const Weight& weight, double share) { total += share * 2.0 * static_cast<double>(weight.rows * weight.cols); });
  return total - head_flops_per_row();
}

double Transformer::head_flops_per_row() const { return 2.0 * static_cast<double>(lm_head_.rows * lm_head_.cols); }

double Transformer::attention_flops_per_token(int position) const {
  double total = 0.0;
  for (const LayerConfig& layer : config_.layers) {
    const int keys = layer.is_sliding() ? std::min(position + 1, layer.sliding_window) : position + 1;
    total += 4.0 * layer.num_query_heads * layer.head_dim * keys;  // q.k and p.v, a multiply and an add each
  }
  return total;
}

// ---- entry points ----

int Transformer::single_sequence_rows(std::span<const int32_t> tokens, int position, int sequence) {
  if (tokens.empty()) fail("forward needs at least one token");
  row_scratch_.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) row_scratch_[i] = {sequence, position + static_cast<int32_t>(i), tokens[i]};
  return static_cast<int>(tokens.size()) - 1;
}

std::span<const float> Transformer::forward(std::span<const int32_t> tokens, int position, int sequence, float* log_normaliser) {
  const int last = single_sequence_rows(tokens, position, sequence);
  run(row_scratch_, std::span<const int>(&last, 1), {.logits = last_logits_.data(), .log_normalisers = log_normaliser});
  return last_logits_;
}

int32_t Transformer::forward_greedy(std::span<const int32_t> tokens, int position, int sequence) {
  const int last = single_sequence_rows(tokens, position, sequence);
  int32_t id = 0;
  run(row_scratch_, std::span<const int>(&last, 1), {.ids = &id});
  return id;
}

void Transformer::forward(std::span<const BatchRow> rows, std::span<const int> logit_rows, float* logits, float* log_normalisers) {
  run(rows, logit_rows, {.logits = logits, .log_normalisers = log_normalisers});
}

void Transformer::forward_greedy(std::span<const BatchRow> rows, std::span<const int> logit_rows, int32_t* ids) {
  run(rows, logit_rows, {.ids = ids});
}

void Transformer::run(std::span<const BatchRow> rows, std::span<const int> logit_rows, StepOutput output) {
  if (peers_.empty()) {
    run_local(rows, logit_rows, output);
    return;
  }
  // Every rank runs the same rows; collectives inside keep them in step. Rank 0's result is returned.
  std::exception_ptr failure;
  std::mutex failure_mutex;
  rank_threads_->run([&](int rank, int) {
    try {
      if (rank == 0) {
        run_local(rows, logit_rows, output);
      } else if (output.ids != nullptr) {
        peer_ids_[rank - 1].resize(logit_rows.size());
        peers_[rank - 1]->run_local(rows, logit_rows, {.ids = peer_ids_[rank - 1].data()});
      } else {
        peer_logits_[rank - 1].resize(logit_rows.size() * static_cast<size_t>(config_.vocab_size));
        peers_[rank - 1]->run_local(rows, logit_rows, {.logits = peer_logits_[rank - 1].data()});
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  });
  if (failure) std::rethrow_exception(failure);
}

void Transformer::check_rows(std::span<const BatchRow> rows, std::span<const int> logit_rows) const {
  if (rows.empty()) fail("forward needs at least one token");
  for (const BatchRow& row : rows) {
    if (row.sequence < 0 || row.sequence >= options_.sequences) fail("sequence {} does not exist ({} KV slots)", row.sequence, options_.sequences);
    if (row.position < 0 || row.position >= options_.context_tokens) {
      fail("position {} does not fit the context of {} tokens (context_tokens)", row.position, options_.context_tokens);
    }
    if (row.token < 0 || row.token >= config_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", row.token, config_.vocab_size - 1);
    if (config_.has_per_layer_inputs() && row.token >= config_.vocab_size_per_layer_input) {
      fail("token id {} is outside the per-layer embedding table ({} rows)", row.token, config_.vocab_size_per_layer_input);
    }
  }
  for (size_t i = 1; i < logit_rows.size(); ++i) {
    if (logit_rows[i] <= logit_rows[i - 1]) fail("logit rows must be in increasing order");
  }
  if (!logit_rows.empty() && (logit_rows.front() < 0 || static_cast<size_t>(logit_rows.back()) >= rows.size())) {
    fail("logit row {} is not one of the {} rows", logit_rows.front() < 0 ? logit_rows.front() : logit_rows.back(), rows.size());
  }
}

void Transformer::run_local(std::span<const BatchRow> rows, std::span<const int> logit_rows, StepOutput output) {
  check_rows(rows, logit_rows);
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  size_t next_logit = 0;
  for (size_t first = 0; first < rows.size();) {
    // A step holds at most max_chunk_tokens rows and logit_capacity_ logit rows.
    size_t count = std::min<size_t>(options_.max_chunk_tokens, rows.size() - first);
    logit_row_scratch_.clear();
    size_t logit = next_logit;
    while (logit < logit_rows.size() && static_cast<size_t>(logit_rows[logit]) < first + count) {
      if (logit_row_scratch_.size() == static_cast<size_t>(logit_capacity_)) {
        count = static_cast<size_t>(logit_rows[logit]) - first;  // the next step starts at this logit row
        break;
      }
      logit_row_scratch_.push_back(logit_rows[logit] - static_cast<int32_t>(first));
      ++logit;
    }
    StepOutput chunk_output;
    if (output.ids) chunk_output.ids = output.ids + next_logit;
    if (output.logits) chunk_output.logits = output.logits + next_logit * vocab;
    if (output.log_normalisers) chunk_output.log_normalisers = output.log_normalisers + next_logit;
    step(rows.subspan(first, count), logit_row_scratch_, chunk_output);
    next_logit = logit;
    first += count;
  }
}

// ---- one step: the host's only contact with device memory ----

void Transformer::step(std::span<const BatchRow> rows, std::span<const int32_t> logit_rows, StepOutput output) {
  backend::Backend& device = *backend_;
  const int count = static_cast<int>(rows.size());
  const int wanted = static_cast<int>(logit_rows.size());
  const int64_t hidden = config_.hidden_size;
  // Inputs: the row table, the logit rows, and the embedding rows gathered from the memory map.
  device.upload(row_table_, 0, rows.data(), rows.size_bytes());
  if (wanted > 0) device.upload(logit_row_ids_, 0, logit_rows.data(), logit_rows.size_bytes());
  for (int t = 0; t < count; ++t) {
    weights_.embed_tokens.read_floats(static_cast<int64_t>(rows[t].token) * hidden, hidden, embedding_rows_.data() + t * hidden);
  }
  device.upload(hidden_, 0, embedding_rows_.data(), static_cast<size_t>(count * hidden) * sizeof(float));
  if (config_.has_per_layer_inputs()) {
    // Gathered straight from the memory-mapped table: the table is never copied or converted.
    const int64_t packed = static_cast<int64_t>(config_.num_layers) * config_.hidden_size_per_layer_input;
    for (int t = 0; t < count; ++t) {
      weights_.embed_tokens_per_layer.read_floats(static_cast<int64_t>(rows[t].token) * packed, packed, per_layer_rows_.data() + t * packed);
    }
    device.upload(per_layer_inputs_, 0, per_layer_rows_.data(), static_cast<size_t>(count * packed) * sizeof(float));
  }

  const bool greedy = output.ids != nullptr;
  if (device.begin_step({count, wanted, greedy})) issue_step(count, wanted, greedy);
  device.end_step();

  // The result: the ids (4 bytes a row) or the softcapped logits.
  if (wanted == 0) return;
  if (greedy) {
    device.download(ids_, 0, output.ids, static_cast<size_t>(wanted) * sizeof(int32_t));
    if (std::any_of(output.ids, output.ids + wanted, [](int32_t id) { return id < 0; })) fail("{}", kNoFiniteLogitError);
  } else {
    device.download(logits_, 0, output.logits, static_cast<size_t>(wanted) * config_.vocab_size * sizeof(float));
    if (output.log_normalisers) device.download(log_normalisers_, 0, output.log_normalisers, static_cast<size_t>(wanted) * sizeof(float));
  }
}

void Transformer::all_reduce(Buffer values, int64_t count) {
  if (partition_) backend_->all_reduce_sum(values, count, *communicator_);
}

// ---- the forward pass: ops only, so a recording backend can replay it ----

void Transformer::issue_step(int count, int wanted, bool greedy) {
  backend::Backend& device = *backend_;
  const int hidden = config_.hidden_size;
  const int64_t values = static_cast<int64_t>(count) * hidden;
  device.scale(hidden_, values, embed_scale_);
  if (config_.has_per_layer_inputs()) compute_per_layer_inputs(count);

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    const LayerState& state = *layers_[layer];
    // Attention block: pre-norm, attention, post-norm, residual.
    device.rms_norm(hidden_, count, hidden, state.input_norm, eps_, normed_);
    attention(layer, count);
    device.rms_norm(branch_, count, hidden, state.post_attention_norm, eps_, branch_);
    device.add(hidden_, branch_, values);

    feed_forward(layer, count);
    if (config_.has_per_layer_inputs()) per_layer_input_block(layer, count);

    // layer_scalar scales the whole residual stream, not only this layer's contribution.
    device.scale(hidden_, values, state.layer_scalar);
  }
  if (wanted == 0) return;

  // Logits for the requested rows: final norm, then the (tied) head, read once for all of them.
  device.gather_rows(hidden_, logit_row_ids_, wanted, hidden, final_hidden_);
  device.rms_norm(final_hidden_, wanted, hidden, final_norm_, eps_, final_hidden_);
  if (partition_) {
    // Each rank scores its vocabulary rows; the full logits are gathered on every rank.
    device.matmul(final_hidden_, wanted, lm_head_, local_logits_);
    device.all_gather_rows(local_logits_, wanted, partition_->vocab_counts, logits_, *communicator_);
  } else {
    device.matmul(final_hidden_, wanted, lm_head_, logits_);
  }
  if (greedy) {
    device.argmax(logits_, wanted, config_.vocab_size, ids_);  // tanh is monotonic: no softcap needed
    return;
  }
  if (config_.final_logit_softcapping) {
    device.softcap(logits_, static_cast<int64_t>(wanted) * config_.vocab_size, static_cast<float>(*config_.final_logit_softcapping));
  }
  // Logprobs need each row's normaliser: one pass over the row on the device, not on the host.
  device.log_sum_exp(logits_, wanted, config_.vocab_size, log_normalisers_);
}

// Per-Layer Embeddings (architecture doc §2.2): a token-identity part (the gathered rows, already in
// per_layer_inputs_) and a context part projected from the scaled main embedding, each layer's slice
// normalised separately.
void Transformer::compute_per_layer_inputs(int count) {
  backend::Backend& device = *backend_;
  const int width = config_.hidden_size_per_layer_input;
  const int64_t packed = static_cast<int64_t>(config_.num_layers) * width;
  device.matmul(hidden_, count, per_layer_model_projection_, per_layer_projected_);
  device.scale(per_layer_projected_, count * packed, static_cast<float>(1.0 / std::sqrt(static_cast<double>(config_.hidden_size))));
  device.rms_norm(per_layer_projected_, static_cast<int64_t>(count) * config_.num_layers, width, per_layer_projection_norm_, eps_,
                  per_layer_projected_);
  device.combine_per_layer_inputs(per_layer_projected_, per_layer_inputs_, count * packed, per_layer_embed_scale_,
                                  static_cast<float>(1.0 / std::sqrt(2.0)));
}

void Transformer::attention(int layer, int count) {
  backend::Backend& device = *backend_;
  const LayerConfig& geometry = config_.layers[layer];
  const LayerState& state = *layers_[layer];
  const int head_dim = geometry.head_dim;
  // This rank's heads: all of them without tensor parallelism. Query head q uses KV head q / groups,
  // computed from the unsharded counts, whether this rank holds a share of the KV heads or all of them.
  const Range query_heads = partition_ ? partition_->layers[layer].query_heads : Range{0, geometry.num_query_heads};
  const Range kv_heads = partition_ ? partition_->layers[layer].kv_heads : Range{0, geometry.num_kv_heads};
  const int64_t kv_row = kv_heads.count * head_dim;
  const bool owns_kv = geometry.owns_kv(layer);

  // K=V layers cache only V = v_norm(k_proj x); attention rebuilds K = RoPE(V * k_norm) from it.
  if (!owns_kv) {
    device.matmul(normed_, count, state.q, query_);
  } else if (geometry.k_eq_v) {
    const backend::Weight weights[] = {state.q, state.k};
    const Buffer outputs[] = {query_, value_};
    device.matmul_each(normed_, count, weights, outputs);
  } else {
    const backend::Weight weights[] = {state.q, state.k, state.v};
    const Buffer outputs[] = {query_, key_, value_};
    device.matmul_each(normed_, count, weights, outputs);
  }
  device.rms_norm(query_, count * query_heads.count, head_dim, state.q_norm, eps_, query_);
  const bool keys_derived = cache_->keys_derived(layer);
  if (owns_kv) {
    if (!geometry.k_eq_v) device.rms_norm(key_, count * kv_heads.count, head_dim, state.k_norm, eps_, key_);
    device.rms_norm(value_, count * kv_heads.count, head_dim, Buffer{}, eps_, value_);  // v_norm has no weight
  }
  const bool rotate_keys = owns_kv && !geometry.k_eq_v;
  device.rope(query_, static_cast<int>(query_heads.count), key_, rotate_keys ? static_cast<int>(kv_heads.count) : 0, count, head_dim, row_table_,
              geometry.is_sliding() ? rope_sliding_ : rope_full_);
  if (owns_kv) {
    if (!geometry.k_eq_v) device.store_kv(key_, count, kv_row, row_table_, cache_->keys(layer), cache_->capacity(layer), cache_->format());
    device.store_kv(value_, count, kv_row, row_table_, cache_->values(layer), cache_->capacity(layer), cache_->format());
  }

  backend::AttentionShape shape;
  shape.head_dim = head_dim;
  shape.query_heads = static_cast<int>(query_heads.count);
  shape.kv_heads = static_cast<int>(kv_heads.count);
  shape.first_query_head = static_cast<int>(query_heads.first);
  shape.first_kv_head = static_cast<int>(kv_heads.first);
  shape.group_size = geometry.num_query_heads / geometry.num_kv_heads;
  shape.cache_capacity = cache_->capacity(layer);
  shape.sliding_window = geometry.is_sliding() ? geometry.sliding_window : 0;
  shape.kv_format = cache_->format();
  if (keys_derived) {
    const int source = geometry.kv_source_layer;
    const KeyRotations& rotations = config_.layers[static_cast<size_t>(source)].is_sliding() ? key_rotations_sliding_ : key_rotations_full_;
    shape.derived_keys = {layers_[static_cast<size_t>(source)]->k_norm, rotations.table, rotations.pairs};
  }
  device.attention(query_, count, row_table_, cache_->keys(layer), cache_->values(layer), shape, attention_out_);
  device.matmul(attention_out_, count, state.o, branch_);
  all_reduce(branch_, static_cast<int64_t>(count) * config_.hidden_size);  // o_proj is row-parallel
}

void Transformer::feed_forward(int layer, int count) {
  backend::Backend& device = *backend_;
  const LayerConfig& geometry = config_.layers[layer];
  const LayerState& state = *layers_[layer];
  const int hidden = config_.hidden_size;
  const int64_t values = static_cast<int64_t>(count) * hidden;
  const int width = static_cast<int>(partition_ ? partition_->layers[layer].mlp_rows.count : geometry.mlp_intermediate_size);

  device.rms_norm(hidden_, count, hidden, state.pre_feedforward_norm, eps_, normed_);
  device.gelu_feed_forward(normed_, count, state.gate, state.up, width, state.down, gate_, up_, ffn_out_);
  all_reduce(ffn_out_, values);  // down_proj is row-parallel

  if (config_.enable_moe_block) {
    // The dense MLP and the experts run side by side on the same residual, each with its own norms.
    device.rms_norm(ffn_out_, count, hidden, state.post_feedforward_norm_1, eps_, ffn_out_);
    mixture_of_experts(layer, count);
    all_reduce(moe_out_, values);  // each rank added its own experts' contributions
    device.rms_norm(moe_out_, count, hidden, state.post_feedforward_norm_2, eps_, moe_out_);
    device.add(ffn_out_, moe_out_, values);
  }
  device.rms_norm(ffn_out_, count, hidden, state.post_feedforward_norm, eps_, ffn_out_);
  device.add(hidden_, ffn_out_, values);
}

// MoE (architecture doc §5): the router reads the raw residual; softmax over all experts, top-k,
// renormalise, then the per-expert scale, all on the device. Experts read their own pre-norm of the
// residual.
void Transformer::mixture_of_experts(int layer, int count) {
  backend::Backend& device = *backend_;
  const LayerState& state = *layers_[layer];
  const int hidden = config_.hidden_size;
  device.rms_norm(hidden_, count, hidden, Buffer{}, eps_, router_inputs_);
  device.scale_columns(router_inputs_, count, hidden, state.router_scale, static_cast<float>(1.0 / std::sqrt(static_cast<double>(hidden))));
  device.matmul(router_inputs_, count, state.router, router_logits_);
  device.route_experts(router_logits_, count, config_.num_experts, config_.top_k_experts, state.per_expert_scale, chosen_experts_,
                       chosen_weights_);
  device.rms_norm(hidden_, count, hidden, state.pre_feedforward_norm_2, eps_, expert_input_);
  const backend::ExpertSet experts{state.expert_gate_up, state.expert_down, config_.moe_intermediate_size, hidden, config_.top_k_experts};
  device.expert_feed_forward(expert_input_, count, chosen_experts_, chosen_weights_, experts, moe_out_);
}

void Transformer::per_layer_input_block(int layer, int count) {
  backend::Backend& device = *backend_;
  const LayerState& state = *layers_[layer];
  const int hidden = config_.hidden_size;
  const int width = config_.hidden_size_per_layer_input;
  const int64_t packed = static_cast<int64_t>(config_.num_layers) * width;
  device.matmul(hidden_, count, state.per_layer_gate, per_layer_gate_);
  device.gelu_multiply_matmul(per_layer_gate_, per_layer_inputs_, count, width, packed, static_cast<int64_t>(layer) * width,
                              state.per_layer_projection, branch_);
  device.rms_norm(branch_, count, hidden, state.per_layer_post_norm, eps_, branch_);
  device.add(hidden_, branch_, static_cast<int64_t>(count) * hidden);
}

}  // namespace gemma4rt
