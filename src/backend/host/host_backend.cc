#include "backend/host/host_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/host/bandwidth.h"
#include "backend/host/compute_peak.h"
#include "core/argmax.h"
#include "core/bf16.h"
#include "core/error.h"
#include "parallel/communicator.h"

namespace gemma4rt::backend {
namespace {

// Below this many multiply-adds, attention runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelMultiplyAdds = int64_t{1} << 16;

struct RowEntry {
  int32_t sequence, position, token;
};
static_assert(sizeof(RowEntry) == kRowTableInts * sizeof(int32_t));

}  // namespace

HostBackend::HostBackend(int threads) : pool_(threads) {}

Buffer HostBackend::allocate(size_t bytes) {
  // 64-byte aligned (whole vectors, cache lines) and zeroed: an unwritten KV slot reads as zero.
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  auto* pointer = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (pointer == nullptr) fail("out of host memory allocating a buffer of {} bytes", bytes);
  std::memset(pointer, 0, rounded);
  buffers_.emplace_back(pointer);
  buffer_bytes_ += rounded;
  return Buffer{static_cast<int32_t>(buffers_.size() - 1)};
}

void HostBackend::upload(Buffer destination, size_t offset, const void* source, size_t bytes) {
  std::memcpy(data<std::byte>(destination) + offset, source, bytes);
}

void HostBackend::download(Buffer source, size_t offset, void* destination, size_t bytes) {
  std::memcpy(destination, data<std::byte>(source) + offset, bytes);
}

Weight HostBackend::prepare_weight(const TensorView& view, WeightFormat format) {
  const int64_t rows = view.shape.at(0);
  const Weight weight{weight_count_++, rows, view.element_count() / rows};
  store_weight(weight.id, view, format);
  return weight;
}

// The probe's buffer is kept: bench probes between blocks of decode steps.
double HostBackend::measure_read_bandwidth() {
  if (!read_probe_) read_probe_ = std::make_unique<kernels::ReadProbe>(pool_);
  return read_probe_->measure();
}

Backend::ComputePeak HostBackend::measure_compute_peak(WeightFormat format) {
  const kernels::ComputePeak peak = kernels::measure_compute_peak(pool_, format);
  return {peak.ops_per_second, peak.instruction};
}

void HostBackend::matmul(Buffer x, int rows, Weight weight, Buffer y) { multiply(data(x), rows, weight.id, data(y)); }

void HostBackend::matmul_each(Buffer x, int rows, std::span<const Weight> weights, std::span<const Buffer> ys) {
  if (ys.size() != weights.size()) fail("matmul_each: {} weights but {} outputs", weights.size(), ys.size());
  each_ids_.clear();
  each_outputs_.clear();
  for (size_t i = 0; i < weights.size(); ++i) {
    each_ids_.push_back(weights[i].id);
    each_outputs_.push_back(data(ys[i]));
  }
  multiply_each(data(x), rows, each_ids_, each_outputs_);
}

void HostBackend::rms_norm(Buffer x, int64_t rows, int width, Buffer weight, float eps, Buffer out) {
  const float* in = data(x);
  const float* scale = weight.valid() ? data(weight) : nullptr;
  float* result = data(out);
  for_rows(rows, width, [&](int64_t first, int64_t last, int) {
    for (int64_t row = first; row < last; ++row) norm_row(in + row * width, width, scale, eps, result + row * width);
  });
}

void HostBackend::scale(Buffer x, int64_t count, float factor) {
  float* values = data(x);
  for (int64_t i = 0; i < count; ++i) values[i] *= factor;
}

void HostBackend::scale_columns(Buffer x, int rows, int width, Buffer weights, float factor) {
  float* values = data(x);
  const float* scales = data(weights);
  for (int row = 0; row < rows; ++row) {
    float* value = values + static_cast<int64_t>(row) * width;
    for (int i = 0; i < width; ++i) value[i] = value[i] * scales[i] * factor;
  }
}

void HostBackend::add(Buffer y, Buffer x, int64_t count) { add_span(data(y), data(x), count); }

void HostBackend::copy(Buffer source, Buffer destination, int64_t count) {
  std::memcpy(data(destination), data(source), static_cast<size_t>(count) * sizeof(float));
}

void HostBackend::gelu_multiply(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset) {
  float* gates = data(gate);
  const float* ups = data(up);
  if (up_stride == width && up_offset == 0) {  // dense rows: one span over each thread's rows
    for_rows(rows, width, [&](int64_t first, int64_t last, int) {
      gelu_multiply_span(gates + first * width, ups + first * width, (last - first) * width);
    });
    return;
  }
  for_rows(rows, width, [&](int64_t first, int64_t last, int) {
    for (int64_t row = first; row < last; ++row) gelu_multiply_span(gates + row * width, ups + row * up_stride + up_offset, width);
  });
}

void HostBackend::combine_per_layer_inputs(Buffer context, Buffer inputs, int64_t count, float embed_scale, float combine_scale) {
  const float* context_part = data(context);
  float* out = data(inputs);
  for (int64_t i = 0; i < count; ++i) out[i] = (context_part[i] + out[i] * embed_scale) * combine_scale;
}

void HostBackend::rope(Buffer queries, int query_heads, Buffer keys, int key_heads, int rows, int head_dim, Buffer row_table,
                       Buffer inverse_frequencies) {
  const auto* table = data<const RowEntry>(row_table);
  const float* frequencies = data(inverse_frequencies);
  // One cos/sin table per thread: each row has its own position.
  const size_t table_size = static_cast<size_t>(head_dim);
  reserve(rope_cos_, table_size * static_cast<size_t>(pool_.size()));
  reserve(rope_sin_, table_size * static_cast<size_t>(pool_.size()));
  const int half = head_dim / 2;
  const int64_t row_elements = static_cast<int64_t>(query_heads + key_heads) * head_dim;
  for_rows(rows, row_elements, [&](int64_t first, int64_t last, int thread) {
    float* cosines = rope_cos_.data() + table_size * static_cast<size_t>(thread);
    float* sines = rope_sin_.data() + table_size * static_cast<size_t>(thread);
    for (int64_t row = first; row < last; ++row) {
      for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(table[row].position) * frequencies[i];
        cosines[i] = cosines[i + half] = std::cos(angle);
        sines[i] = sines[i + half] = std::sin(angle);
      }
      rotate_heads(data(queries) + row * query_heads * head_dim, query_heads, head_dim, cosines, sines);
      if (key_heads > 0) rotate_heads(data(keys) + row * key_heads * head_dim, key_heads, head_dim, cosines, sines);
    }
  });
}

void HostBackend::store_kv(Buffer source, int rows, int64_t row_elements, Buffer row_table, Buffer cache, int capacity, KvFormat format) {
  const auto* table = data<const RowEntry>(row_table);
  const size_t element_bytes = kv_element_bytes(format);
  for (int row = 0; row < rows; ++row) {
    const int64_t slot = static_cast<int64_t>(table[row].sequence) * capacity + table[row].position % capacity;
    store_kv_row(data(source) + row * row_elements, row_elements, format, data<std::byte>(cache) + slot * row_elements * element_bytes);
  }
}

void HostBackend::attention(Buffer queries, int rows, Buffer row_table, Buffer keys, Buffer values, const AttentionShape& shape, Buffer out) {
  const auto* table = data<const RowEntry>(row_table);
  const int head_dim = shape.head_dim;
  const int64_t query_row = static_cast<int64_t>(shape.query_heads) * head_dim;
  const int64_t kv_row = static_cast<int64_t>(shape.kv_heads) * head_dim;
  const size_t element_bytes = kv_element_bytes(shape.kv_format);
  const int64_t sequence_bytes = static_cast<int64_t>(shape.cache_capacity) * kv_row * static_cast<int64_t>(element_bytes);
  const int last_query_head = shape.first_query_head + shape.query_heads;
  const int threads = pool_.size();
  const size_t scores_per_thread = static_cast<size_t>(shape.group_size) * shape.cache_capacity;
  reserve(attention_scores_, scores_per_thread * threads);
  reserve(attention_slots_, static_cast<size_t>(shape.cache_capacity) * threads);
  if (shape.keys_derived()) {
    if (derived_scratch_.size() < static_cast<size_t>(threads)) derived_scratch_.resize(static_cast<size_t>(threads));
    reserve(block_slots_, static_cast<size_t>(kDerivedKeyBlock));
    for (int j = 0; j < kDerivedKeyBlock; ++j) block_slots_[static_cast<size_t>(j)] = j;
  }

  // One task per (row, KV head): the group of query heads sharing that KV head reads its rows once.
  const int64_t tasks = static_cast<int64_t>(rows) * shape.kv_heads;
  auto attend_tasks = [&](int thread, int thread_count) {
    float* scores = attention_scores_.data() + static_cast<size_t>(thread) * scores_per_thread;
    int32_t* slots = attention_slots_.data() + static_cast<size_t>(thread) * shape.cache_capacity;
    for (int64_t task = thread; task < tasks; task += thread_count) {
      const int row = static_cast<int>(task / shape.kv_heads);
      const int kv_head = static_cast<int>(task % shape.kv_heads);
      const RowEntry& entry = table[row];
      // Every query sees its sequence's keys up to itself; sliding layers only the last sliding_window.
      const int first_key = shape.sliding_window > 0 ? std::max(0, entry.position - shape.sliding_window + 1) : 0;
      const int key_count = entry.position - first_key + 1;
      for (int k = 0; k < key_count; ++k) slots[k] = (first_key + k) % shape.cache_capacity;
      // The query heads in this buffer that read this KV head: a contiguous run.
      const int model_kv_head = shape.first_kv_head + kv_head;
      const int first_query = std::max(model_kv_head * shape.group_size, shape.first_query_head) - shape.first_query_head;
      const int last_query = std::min((model_kv_head + 1) * shape.group_size, last_query_head) - shape.first_query_head;
      if (first_query >= last_query) continue;
      const int64_t head_offset = static_cast<int64_t>(entry.sequence) * sequence_bytes + static_cast<int64_t>(kv_head) * head_dim * element_bytes;
      const float* group_queries = data(queries) + row * query_row + static_cast<int64_t>(first_query) * head_dim;
      const int group = last_query - first_query;
      const std::span<const int32_t> visible(slots, key_count);
      const std::byte* value_rows = data<const std::byte>(values) + head_offset;
      if (shape.keys_derived()) {
        derived_scores(shape, group_queries, group, value_rows, kv_row, first_key, visible, derived_scratch_[static_cast<size_t>(thread)], scores);
      } else {
        score_keys(group_queries, group, head_dim, data<const std::byte>(keys) + head_offset, shape.kv_format, kv_row, visible, scores);
      }
      weigh_values(scores, group, head_dim, value_rows, shape.kv_format, kv_row, visible,
                   data(out) + row * query_row + static_cast<int64_t>(first_query) * head_dim);
    }
  };
  // Short contexts of small models are cheaper on one thread than waking the pool.
  const int64_t work = tasks * shape.group_size * head_dim * (table[rows - 1].position + 1);
  if (work < kMinParallelMultiplyAdds) {
    attend_tasks(0, 1);
  } else {
    pool_.run(attend_tasks);
  }
}

// K=V layers: key = RoPE(value * key_norm), a block of keys at a time. Dims that do not rotate score as
// (q * key_norm) . value, straight from the cached values with the rotated dims' query entries zeroed;
// the rotated pairs (a quarter of the dims under proportional RoPE) are rebuilt, packed as [first
// halves, second halves], and scored against the queries' packed pairs; the two parts add.
void HostBackend::derived_scores(const AttentionShape& shape, const float* queries, int group, const std::byte* value_rows,
                                 int64_t row_stride, int first_key, std::span<const int32_t> visible, DerivedScratch& scratch,
                                 float* scores) {
  const int head_dim = shape.head_dim;
  const int half = head_dim / 2;
  const int pairs = shape.derived_keys.rotated_pairs;
  const float* key_norm = data(shape.derived_keys.key_norm);
  const float* rotations = data(shape.derived_keys.rotations);
  const int64_t count = static_cast<int64_t>(visible.size());
  reserve(scratch.queries, static_cast<size_t>(group) * head_dim);
  reserve(scratch.pair_queries, static_cast<size_t>(group) * 2 * pairs);
  reserve(scratch.pair_keys, static_cast<size_t>(kDerivedKeyBlock) * 2 * pairs);
  reserve(scratch.block_scores, static_cast<size_t>(kDerivedKeyBlock) * group * 2);
  for (int h = 0; h < group; ++h) {
    const float* query = queries + static_cast<int64_t>(h) * head_dim;
    float* scaled = scratch.queries.data() + static_cast<int64_t>(h) * head_dim;
    float* packed = scratch.pair_queries.data() + static_cast<int64_t>(h) * 2 * pairs;
    for (int d = 0; d < head_dim; ++d) scaled[d] = query[d] * key_norm[d];
    for (int i = 0; i < pairs; ++i) {
      packed[i] = query[i];
      packed[pairs + i] = query[i + half];
      scaled[i] = scaled[i + half] = 0.0f;
    }
  }
  for (int64_t first = 0; first < count; first += kDerivedKeyBlock) {
    const int block = static_cast<int>(std::min<int64_t>(kDerivedKeyBlock, count - first));
    // The unrotated dims first: the block's value rows are then in cache for the rotated pairs.
    float* unrotated = scratch.block_scores.data();
    float* rotated = unrotated + static_cast<int64_t>(block) * group;
    score_keys(scratch.queries.data(), group, head_dim, value_rows, shape.kv_format, row_stride,
               visible.subspan(static_cast<size_t>(first), static_cast<size_t>(block)), unrotated);
    if (pairs == 0) std::fill(rotated, rotated + static_cast<int64_t>(block) * group, 0.0f);  // nothing rotates
    for (int j = 0; j < block; ++j) {
      const int64_t row = static_cast<int64_t>(visible[static_cast<size_t>(first + j)]) * row_stride;
      const float* cos = rotations + (static_cast<int64_t>(first_key) + first + j) * 2 * pairs;
      const float* sin = cos + pairs;
      float* key = scratch.pair_keys.data() + static_cast<int64_t>(j) * 2 * pairs;
      for (int i = 0; i < pairs; ++i) {
        float a, b;
        if (shape.kv_format == KvFormat::kF32) {
          const float* value = reinterpret_cast<const float*>(value_rows) + row;
          a = value[i], b = value[i + half];
        } else {
          const uint16_t* value = reinterpret_cast<const uint16_t*>(value_rows) + row;
          a = bf16_to_float(value[i]), b = bf16_to_float(value[i + half]);
        }
        a *= key_norm[i];
        b *= key_norm[i + half];
        key[i] = a * cos[i] - b * sin[i];
        key[pairs + i] = b * cos[i] + a * sin[i];
      }
    }
    if (pairs > 0) {
      score_keys(scratch.pair_queries.data(), group, 2 * pairs, reinterpret_cast<const std::byte*>(scratch.pair_keys.data()), KvFormat::kF32,
                 2 * pairs, std::span<const int32_t>(block_slots_.data(), static_cast<size_t>(block)), rotated);
    }
    for (int h = 0; h < group; ++h) {
      const int64_t offset = static_cast<int64_t>(h) * block;
      float* total = scores + h * count + first;
      for (int j = 0; j < block; ++j) total[j] = unrotated[offset + j] + rotated[offset + j];
    }
  }
}

void HostBackend::route_experts(Buffer router_logits, int rows, int experts, int top_k, Buffer per_expert_scale, Buffer chosen_experts,
                                Buffer chosen_weights) {
  const float* expert_scale = data(per_expert_scale);
  for (int row = 0; row < rows; ++row) {
    float* probabilities = data(router_logits) + static_cast<int64_t>(row) * experts;
    router_softmax(probabilities, experts);
    // Top-k by probability; equal probabilities prefer the lower expert index.
    int32_t* chosen = data<int32_t>(chosen_experts) + static_cast<int64_t>(row) * top_k;
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
    float* weights = data(chosen_weights) + static_cast<int64_t>(row) * top_k;
    for (int k = 0; k < top_k; ++k) weights[k] = probabilities[chosen[k]] / total * expert_scale[chosen[k]];
  }
}

// Experts in ascending index order, each over the rows that chose it, so each chosen expert's weights
// are read once per step and every row adds its experts' outputs in the reference's order.
void HostBackend::expert_feed_forward(Buffer input, int rows, Buffer chosen_experts, Buffer chosen_weights, const ExpertSet& experts,
                                      Buffer out) {
  const int hidden = experts.hidden;
  const int64_t width = experts.width;
  const int top_k = experts.top_k;
  const int32_t* chosen = data<const int32_t>(chosen_experts);
  const float* weights = data(chosen_weights);
  float* result = data(out);
  std::fill(result, result + static_cast<int64_t>(rows) * hidden, 0.0f);
  reserve(expert_rows_, static_cast<size_t>(rows) * top_k);
  reserve(expert_gathered_, static_cast<size_t>(rows) * hidden);
  reserve(expert_hidden_, static_cast<size_t>(rows) * 2 * width);
  reserve(expert_activated_, static_cast<size_t>(rows) * width);
  reserve(expert_output_, static_cast<size_t>(rows) * hidden);
  for (size_t expert = 0; expert < experts.gate_up.size(); ++expert) {
    if (!experts.gate_up[expert].present()) continue;  // another rank's expert
    int expert_row_count = 0;
    for (int64_t choice = 0; choice < static_cast<int64_t>(rows) * top_k; ++choice) {
      if (chosen[choice] == static_cast<int32_t>(expert)) expert_rows_[expert_row_count++] = static_cast<int>(choice);
    }
    if (expert_row_count == 0) continue;
    for (int r = 0; r < expert_row_count; ++r) {
      std::copy_n(data(input) + static_cast<int64_t>(expert_rows_[r] / top_k) * hidden, hidden, expert_gathered_.data() + static_cast<int64_t>(r) * hidden);
    }
    multiply(expert_gathered_.data(), expert_row_count, experts.gate_up[expert].id, expert_hidden_.data());
    // gate_up rows hold [gate | up]; the activated product is compacted to [rows, width].
    for (int r = 0; r < expert_row_count; ++r) {
      float* gate_up = expert_hidden_.data() + static_cast<int64_t>(r) * 2 * width;
      gelu_multiply_span(gate_up, gate_up + width, width);
      std::copy_n(gate_up, width, expert_activated_.data() + static_cast<int64_t>(r) * width);
    }
    multiply(expert_activated_.data(), expert_row_count, experts.down[expert].id, expert_output_.data());
    for (int r = 0; r < expert_row_count; ++r) {
      const float weight = weights[expert_rows_[r]];
      float* row_out = result + static_cast<int64_t>(expert_rows_[r] / top_k) * hidden;
      const float* y = expert_output_.data() + static_cast<int64_t>(r) * hidden;
      for (int i = 0; i < hidden; ++i) row_out[i] += y[i] * weight;
    }
  }
}

void HostBackend::gather_rows(Buffer source, Buffer row_ids, int rows, int width, Buffer out) {
  const int32_t* ids = data<const int32_t>(row_ids);
  for (int row = 0; row < rows; ++row) {
    std::copy_n(data(source) + static_cast<int64_t>(ids[row]) * width, width, data(out) + static_cast<int64_t>(row) * width);
  }
}

void HostBackend::softcap(Buffer values, int64_t count, float cap) {
  // In pieces over the pool (a multiple of every kernel's vector width, so each value takes the path it
  // takes in one call): a server step's 8 rows of 262,144 logits took 1.6 ms on one thread.
  constexpr int64_t kPiece = 16384;
  for_rows((count + kPiece - 1) / kPiece, kPiece, [&](int64_t first, int64_t last, int) {
    const int64_t begin = first * kPiece, end = std::min(count, last * kPiece);
    softcap_span(data(values) + begin, end - begin, cap);
  });
}

void HostBackend::argmax(Buffer values, int rows, int width, Buffer ids) {
  for_rows(rows, width, [&](int64_t first, int64_t last, int) {
    for (int64_t row = first; row < last; ++row) {
      const float* row_values = data(values) + row * width;
      data<int32_t>(ids)[row] = static_cast<int32_t>(chosen_or_none(row_values, width, argmax_span(row_values, width)));
    }
  });
}

void HostBackend::log_sum_exp(Buffer values, int rows, int width, Buffer out) {
  for_rows(rows, width, [&](int64_t first, int64_t last, int) {
    for (int64_t row = first; row < last; ++row) data(out)[row] = log_sum_exp_span(data(values) + row * width, width);
  });
}

void HostBackend::all_reduce_sum(Buffer values, int64_t count, parallel::Communicator& communicator) {
  communicator.all_reduce_sum(data(values), static_cast<size_t>(count));
}

void HostBackend::all_gather_rows(Buffer local, int rows, std::span<const size_t> counts, Buffer out, parallel::Communicator& communicator) {
  const size_t local_width = counts[static_cast<size_t>(communicator.rank())];
  size_t width = 0;
  for (size_t count : counts) width += count;
  for (int row = 0; row < rows; ++row) communicator.all_gather(data(local) + row * local_width, counts, data(out) + row * width);
}

}  // namespace gemma4rt::backend
