#include "backend/cpu/cpu_backend.h"

#include <algorithm>

#include "backend/cpu/kernels/vector_ops.h"
#include "backend/host/isa.h"
#include "backend/reference/kernels.h"

namespace gemma4rt::backend {
namespace {

// The threads' shares of a decode step's rows are multiples of this, or of what weights in panels (q8,
// q4 on AVX-512) keep together: whole panels, whole groups of long ones (CpuBackend::rows_together).
constexpr int64_t kMatmulRowsPerTask = kernels::kQuantPanelRows;
// Decode steps (up to kernels::kBatchMaxTokens tokens) stream the weights: a thread steals the other's
// rows in chunks of about this many weight bytes, a multiple of 48 rows (the superblock batch kernels
// stage outputs 48 rows at a time) or, for weights in panels, of the rows they keep together. 256 KiB
// rather than 64: one q4 or q8 token 1-4 points nearer the roofline on a Zen 5 (a quarter of the
// kernel calls; docs/benchmarks.md), bf16 and steps of 8 the same.
constexpr int64_t kStealChunkBytes = 256 * 1024;
constexpr int64_t kStealChunkRows = 48;
// Below this many multiply-adds a matrix product runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelMultiplyAdds = int64_t{1} << 16;

}  // namespace

std::string CpuBackend::kernels() const { return kernels::isa_name(kernels::active_isa()); }

WeightFormat CpuBackend::default_weight_format(DType stored) const {
  if (stored == DType::kQ8) return WeightFormat::kQ8;
  if (stored == DType::kQ4) return WeightFormat::kQ4;
  return stored == DType::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16;
}

size_t CpuBackend::owned_weight_bytes() const {
  size_t total = 0;
  for (const PreparedWeight& weight : weights_) total += weight.owned_bytes();
  return total;
}

void CpuBackend::store_weight(int32_t id, const TensorView& view, WeightFormat format) {
  weights_.resize(static_cast<size_t>(id) + 1);
  weights_[static_cast<size_t>(id)] = backend::prepare_weight(view, format, pool(), &copy_budget_);
}

int64_t CpuBackend::steal_chunk_rows(const PreparedWeight& weight) {
  const int64_t row_bytes = std::max<int64_t>(1, static_cast<int64_t>(weight.read_bytes()) / std::max<int64_t>(1, weight.matrix.rows));
  const int64_t multiple = in_panels(weight) ? rows_together(weight) : kStealChunkRows;
  const int64_t rows = (kStealChunkBytes / row_bytes + multiple - 1) / multiple * multiple;
  return std::max(rows, multiple);
}

bool CpuBackend::in_panels(const PreparedWeight& weight) { return weight.matrix.layout == kernels::QuantLayout::kPanels; }

int64_t CpuBackend::rows_together(const PreparedWeight& weight) {
  return in_panels(weight) ? kernels::panel_rows_together(weight.matrix.cols) : kMatmulRowsPerTask;
}

bool CpuBackend::worth_threads(const kernels::WeightMatrix& matrix, int rows) {
  return matrix.rows * matrix.cols * rows >= kMinParallelMultiplyAdds;
}

void CpuBackend::prepare_input(const float* x, int rows, const kernels::WeightMatrix& matrix, bool threaded) {
  if (rows > 1 && threaded) {  // a step of several sequences, or prefill
    prepared_.reshape(rows, matrix.cols, matrix.format);
    pool().parallel_for(rows, 1, [&](int64_t first, int64_t last) { prepared_.convert(x, first, last); });
  } else {
    prepared_.prepare(x, rows, matrix.cols, matrix.format);
  }
}

void CpuBackend::multiply(const float* x, int rows, int32_t id, float* y) {
  const kernels::WeightMatrix& matrix = weights_[static_cast<size_t>(id)].matrix;
  const bool threaded = worth_threads(matrix, rows);
  prepare_input(x, rows, matrix, threaded);
  if (!threaded) {
    kernels::matmul(prepared_, matrix, y, matrix.rows, 0, matrix.rows);
    return;
  }
  run_products(prepared_, std::span<const int32_t>(&id, 1), std::span<float* const>(&y, 1));
}

// Products of one input share its preparation and one fork-join: each thread takes its rows of every
// weight in turn, so a thread done early with one starts on the next instead of waiting (a decode
// token of E2B had ~315 fork-joins, a third of them q/k/v and gate/up).
void CpuBackend::multiply_each(const float* x, int rows, std::span<const int32_t> ids, std::span<float* const> ys) {
  if (ids.empty()) return;
  const kernels::WeightMatrix& first = weights_[static_cast<size_t>(ids[0])].matrix;
  bool joined = ids.size() > 1;
  for (int32_t id : ids) {
    const kernels::WeightMatrix& matrix = weights_[static_cast<size_t>(id)].matrix;
    joined = joined && matrix.cols == first.cols && matrix.format == first.format && worth_threads(matrix, rows);
  }
  if (!joined) return HostBackend::multiply_each(x, rows, ids, ys);
  prepare_input(x, rows, first, true);
  run_products(prepared_, ids, ys);
}

// Each weight's rows are split as ThreadPool::share splits them, with stealing: a decode step's thread
// done early with its rows takes chunks from the back of the other's, then both go on to the next
// weight. A prompt's threads take their whole ranges at once (the tiles want long contiguous ranges,
// and compute-bound halves finish together).
void CpuBackend::run_products(const kernels::PreparedActivations& input, std::span<const int32_t> ids, std::span<float* const> ys) {
  const int64_t rows = input.tokens();
  if (steals_.size() < ids.size()) steals_.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const PreparedWeight& weight = weights_[static_cast<size_t>(ids[i])];
    const int64_t chunk = rows > kernels::kBatchMaxTokens ? weight.matrix.rows : steal_chunk_rows(weight);
    steals_[i].reset(weight.matrix.rows, rows_together(weight), chunk, pool().size());
  }
  pool().run([&](int thread, int) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const kernels::WeightMatrix& matrix = weights_[static_cast<size_t>(ids[i])].matrix;
      ThreadPool::Range chunk;
      while (steals_[i].next(thread, chunk)) kernels::matmul(input, matrix, ys[i], matrix.rows, chunk.begin, chunk.end);
    }
  });
}

// A prompt's GELU product goes straight into the down projection's prepared input: each row's product
// is written to a row buffer (the gates stay as they are) and converted from there, so it is never
// written out as floats and read back (E2B's wide layers at 512 tokens: 24 MiB each way; the GELU pass
// and the conversion, both waiting on memory, were 6% of a bf16 prompt's time, and the fused op
// measured 2-4% more prompt tokens per second).
void CpuBackend::gelu_multiply_matmul(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset,
                                      Weight weight, Buffer y) {
  const kernels::WeightMatrix& matrix = weights_.at(static_cast<size_t>(weight.id)).matrix;
  if (rows <= 1 || !worth_threads(matrix, rows) || matrix.cols != width) {
    return Backend::gelu_multiply_matmul(gate, up, rows, width, up_stride, up_offset, weight, y);
  }
  const float* gates = data(gate);
  const float* ups = data(up);
  prepared_.reshape(rows, width, matrix.format);
  reserve(gelu_rows_, static_cast<size_t>(pool().size()));
  pool().run([&](int thread, int threads) {
    const ThreadPool::Range range = ThreadPool::share(rows, 1, thread, threads);
    std::vector<float>& product = gelu_rows_[static_cast<size_t>(thread)];
    reserve(product, static_cast<size_t>(width));
    for (int64_t row = range.begin; row < range.end; ++row) {
      kernels::gelu_tanh_multiply(gates + row * width, ups + row * up_stride + up_offset, width, product.data());
      prepared_.convert_row(product.data(), row);
    }
  });
  float* output = data(y);
  run_products(prepared_, std::span<const int32_t>(&weight.id, 1), std::span<float* const>(&output, 1));
}

// A prompt's bf16 MLP with vdpbf16ps: gate and up rows of the same indices share the prefill kernel's
// panels, whose tiles apply GELU x up and the rounding to bf16 themselves and write down_proj's prepared
// input (kernels::gelu_gate_up): the gate and up products are never stored as floats, read back by a
// GELU pass and converted (E2B at 512 tokens: 24 MiB written and read per layer).
void CpuBackend::gelu_feed_forward(Buffer x, int rows, Weight gate, Weight up, int width, Weight down, Buffer gate_out,
                                   Buffer up_out, Buffer y) {
  const kernels::WeightMatrix& gates = weights_.at(static_cast<size_t>(gate.id)).matrix;
  const kernels::WeightMatrix& ups = weights_.at(static_cast<size_t>(up.id)).matrix;
  const kernels::WeightMatrix& downs = weights_.at(static_cast<size_t>(down.id)).matrix;
  if (!kernels::gate_up_fusable(rows, gates, ups) || gates.rows != width || downs.format != WeightFormat::kBF16 ||
      downs.cols != width) {
    return Backend::gelu_feed_forward(x, rows, gate, up, width, down, gate_out, up_out, y);
  }
  prepare_input(data(x), rows, gates, true);
  down_input_.reshape(rows, width, WeightFormat::kBF16);
  float* gate_sums = data(gate_out);
  float* up_sums = data(up_out);
  pool().run([&](int thread, int threads) {
    // Whole panels of 32 indices per thread.
    const ThreadPool::Range range = ThreadPool::share(width, 32, thread, threads);
    if (range.begin < range.end) kernels::gelu_gate_up(prepared_, gates, ups, gate_sums, up_sums, down_input_, range.begin, range.end);
  });
  float* output = data(y);
  run_products(down_input_, std::span<const int32_t>(&down.id, 1), std::span<float* const>(&output, 1));
}

void CpuBackend::norm_row(const float* x, int64_t width, const float* weight, float eps, float* out) {
  kernels::rms_norm(x, width, weight, eps, out);
}

void CpuBackend::gelu_multiply_span(float* gate, const float* up, int64_t count) { kernels::gelu_tanh_multiply(gate, up, count); }

void CpuBackend::add_span(float* y, const float* x, int64_t count) { kernels::add(y, x, count); }

void CpuBackend::rotate_heads(float* heads, int count, int head_dim, const float* cos, const float* sin) {
  kernels::apply_rope(heads, count, head_dim, cos, sin);
}

void CpuBackend::store_kv_row(const float* source, int64_t count, KvFormat format, void* destination) {
  kernels::store_kv_row(source, count, format, destination);
}

void CpuBackend::score_keys(const float* queries, int group, int head_dim, const std::byte* keys, KvFormat format, int64_t row_stride,
                            std::span<const int32_t> slots, float* scores) {
  kernels::attention_scores(queries, group, head_dim, keys, format, row_stride, slots, scores);
}

void CpuBackend::weigh_values(float* scores, int group, int head_dim, const std::byte* values, KvFormat format, int64_t row_stride,
                              std::span<const int32_t> slots, float* out) {
  kernels::attention_weigh_values(scores, group, head_dim, values, format, row_stride, slots, out);
}

void CpuBackend::softcap_span(float* values, int64_t count, float cap) { kernels::softcap(values, count, cap); }
float CpuBackend::log_sum_exp_span(const float* values, int64_t count) { return kernels::log_sum_exp(values, count); }
int64_t CpuBackend::argmax_span(const float* values, int64_t count) { return kernels::argmax(values, count); }

// The router decides which experts run: the scalar softmax keeps that decision the reference's.
void CpuBackend::router_softmax(float* values, int64_t count) { reference::softmax(values, count); }

}  // namespace gemma4rt::backend
