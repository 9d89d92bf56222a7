// The seam between the Gemma-4 forward pass (engine/) and the devices that run it. The engine writes
// the forward once against this interface; a backend decides where memory lives and how each op runs.
//
// What every backend honours, including the CPU ones, so that a device whose memory the host cannot
// touch fits behind the same calls:
//  - Device-resident state. Weights are prepared once (prepare_weight: the backend's own format, in
//    place or uploaded); activations, scratch and the KV cache are Buffers allocated at load. The host
//    names them by handle and never dereferences them.
//  - Fixed transfer points. The host writes a step's inputs with upload() (the row table, the logit
//    row ids, and the word-embedding and per-layer-embedding rows it gathered from the mmap: embedding
//    tables never go to the device) and reads the result with download(): argmax ids for greedy
//    decoding, softcapped logits for sampling. Nothing is read back in the middle of a forward pass.
//  - Per-row data on the device. Positions, sequences and logit rows are read by the ops from buffers
//    (the row table below), never baked into the issued work, so a step's work depends only on its
//    shape: a recording backend records it once per shape and replays it with new inputs.
//  - Routing on the device. MoE top-k selection and the chosen experts' products are ops; only the
//    chosen experts' weights are read and no host loop sits between two layers.
//
// The row table: for each row of a step, three int32 (sequence, position, token), as BatchRow lays
// them out. Ops that need a row's position or sequence read it there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/formats.h"
#include "core/tensor.h"

namespace gemma4rt::parallel {
class Communicator;
}

namespace gemma4rt::backend {

// A buffer in the backend's memory. Only the backend that allocated it can read or write it.
struct Buffer {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
};

// A weight matrix [rows, cols] (PyTorch nn.Linear layout, y = x W^T) prepared by the backend.
struct Weight {
  int32_t id = -1;
  int64_t rows = 0, cols = 0;
  bool present() const { return id >= 0; }
};

// Ints per row of the row table (sequence, position, token).
inline constexpr int kRowTableInts = 3;

// One layer's attention, from the point of view of this rank's heads.
struct AttentionShape {
  int head_dim = 0;
  int query_heads = 0;       // query heads per row in the query and output buffers
  int kv_heads = 0;          // KV heads per cached row
  int first_query_head = 0;  // model-wide index of the first query head in the buffer
  int first_kv_head = 0;     // model-wide index of the first cached KV head
  int group_size = 1;        // model-wide query heads per KV head: query q reads KV head q / group_size
  int cache_capacity = 0;    // slots per sequence; a position lives in slot position % capacity
  int sliding_window = 0;    // 0: full attention; else each query sees its last sliding_window keys
  KvFormat kv_format = KvFormat::kF32;
  // K=V layers cache only the values (the RMS-normalised raw k_proj rows); each key is rebuilt from its
  // value as RoPE(value * key_norm) at the key's position, so the layer's cache is one tensor, not two.
  // Unset (key_norm invalid): keys are read from the key cache.
  struct DerivedKeys {
    Buffer key_norm;        // [head_dim] the layer's k_norm weight
    Buffer rotations;       // [position][2 * rotated_pairs]: cos of each rotated pair, then sin
    int rotated_pairs = 0;  // leading frequency pairs (d, d + head_dim / 2) that rotate; the rest have frequency 0
  } derived_keys;
  bool keys_derived() const { return derived_keys.key_norm.valid(); }
};

// The mixture of experts of one layer: the chosen experts' weights and their geometry.
struct ExpertSet {
  std::span<const Weight> gate_up;  // per expert [2 * width, hidden]: gate rows, then up rows
  std::span<const Weight> down;     // per expert [hidden, width]; experts this rank lacks are absent
  int width = 0;
  int hidden = 0;
  int top_k = 0;
};

// A step's shape: everything the issued work depends on besides buffer contents.
struct StepShape {
  int rows = 0;
  int logit_rows = 0;
  bool greedy = false;
  bool operator==(const StepShape&) const = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- what this backend is
  virtual std::string name() const = 0;        // as --backend spells it
  virtual std::string kernels() const = 0;     // the kernel path, for reports ("avx512bf16", "scalar fp32")
  virtual int threads() const = 0;
  // Choices the backend makes when the engine options leave them open.
  virtual int default_chunk_tokens() const = 0;
  virtual WeightFormat default_weight_format(DType stored) const = 0;
  virtual KvFormat default_kv_format() const = 0;
  // Throws Error when this backend cannot run the combination.
  virtual void check_formats(WeightFormat weights, KvFormat kv) const = 0;
  // Whether the tensor-parallel collectives below work on this backend's buffers.
  virtual bool supports_tensor_parallel() const { return true; }
  // Bytes of memory the model must fit in; 0 when the backend shares the host's (the memory map pages).
  virtual uint64_t memory_bytes() const { return 0; }

  // ---- memory and transfers
  virtual Buffer allocate(size_t bytes) = 0;
  virtual void upload(Buffer destination, size_t offset, const void* source, size_t bytes) = 0;
  virtual void download(Buffer source, size_t offset, void* destination, size_t bytes) = 0;
  // A weight prepared for this backend's products, in `format`.
  virtual Weight prepare_weight(const TensorView& view, WeightFormat format) = 0;
  // Weights the backend would read in place from the checkpoint's map may instead be copied into memory
  // of its own, `bytes` in all at most; the engine says what the host can spare before it prepares
  // them (until then, none).
  virtual void allow_weight_copies(uint64_t bytes) {}
  // Bytes one product reads from the prepared weight, and bytes held beyond the checkpoint's mmap.
  virtual size_t weight_read_bytes(Weight weight) const = 0;
  virtual size_t owned_weight_bytes() const = 0;
  // Bytes of all buffers allocated so far.
  virtual size_t buffer_bytes() const = 0;
  // Read bandwidth of the memory the weights live in, bytes per second (the decode roofline).
  virtual double measure_read_bandwidth() = 0;
  // The compute ceiling of products in `format`, timed on the instruction they are built from, apart
  // from the products themselves (so a slow kernel cannot lower its own bar); ops_per_second 0 where
  // the backend has no such probe.
  struct ComputePeak {
    double ops_per_second = 0.0;  // 2 per multiply-add, as FLOP are counted
    std::string instruction;
  };
  virtual ComputePeak measure_compute_peak(WeightFormat) { return {}; }

  // Allocates a buffer holding `values` (norm weights, scales, tables).
  Buffer upload_constant(std::span<const float> values) {
    const Buffer buffer = allocate(values.size_bytes());
    if (!values.empty()) upload(buffer, 0, values.data(), values.size_bytes());
    return buffer;
  }

  // ---- steps
  // The ops issued between begin_step and end_step are one unit of work. Returns true when the caller
  // must issue them; false when the backend already holds this shape's recorded work and end_step will
  // replay it against the buffers' new contents. Eager backends run each op as it is issued.
  virtual bool begin_step(const StepShape& shape) { return true; }
  virtual void end_step() {}

  // ---- ops. Buffers hold f32 unless said otherwise; `rows` counts rows of `width` values.
  // y[r] = W x[r] for r < rows.
  virtual void matmul(Buffer x, int rows, Weight weight, Buffer y) = 0;
  // ys[i][r] = weights[i] x[r]: products of one input (q, k and v; gate and up). One after another
  // here; a backend may run them as one unit of work (the CPU backend: one fork-join for all).
  virtual void matmul_each(Buffer x, int rows, std::span<const Weight> weights, std::span<const Buffer> ys) {
    for (size_t i = 0; i < weights.size(); ++i) matmul(x, rows, weights[i], ys[i]);
  }
  // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight; weight invalid: the weightless norm. out may be x.
  virtual void rms_norm(Buffer x, int64_t rows, int width, Buffer weight, float eps, Buffer out) = 0;
  virtual void scale(Buffer x, int64_t count, float factor) = 0;                          // x *= factor
  // x[r][i] = x[r][i] * weights[i] * factor.
  virtual void scale_columns(Buffer x, int rows, int width, Buffer weights, float factor) = 0;
  virtual void add(Buffer y, Buffer x, int64_t count) = 0;                                 // y += x
  virtual void copy(Buffer source, Buffer destination, int64_t count) = 0;
  // gate[r][i] = gelu_tanh(gate[r][i]) * up[r * up_stride + up_offset + i] for i < width.
  virtual void gelu_multiply(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset) = 0;
  // gelu_multiply, then matmul of its result by `weight` into y. Afterwards gate holds the product or is
  // left as it was: a backend may feed the product to the matmul without writing it out (the CPU
  // backend: a prompt's gate and up rows are read once and the product goes straight to the matmul's
  // own input format).
  virtual void gelu_multiply_matmul(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset,
                                    Weight weight, Buffer y) {
    gelu_multiply(gate, up, rows, width, up_stride, up_offset);
    matmul(gate, rows, weight, y);
  }
  // A dense gated MLP: gate_out = W_gate x and up_out = W_up x (rows x width each), then
  // gelu_multiply_matmul(gate_out, up_out, ...) by `down` into y. Afterwards gate_out and up_out hold
  // unspecified values: a backend may apply the GELU as the products leave its kernels (the CPU backend
  // on a prompt: gate and up sums never leave the registers as floats).
  virtual void gelu_feed_forward(Buffer x, int rows, Weight gate, Weight up, int width, Weight down, Buffer gate_out,
                                 Buffer up_out, Buffer y) {
    const Weight weights[] = {gate, up};
    const Buffer outputs[] = {gate_out, up_out};
    matmul_each(x, rows, weights, outputs);
    gelu_multiply_matmul(gate_out, up_out, rows, width, width, 0, down, y);
  }
  // Per-Layer Embeddings: inputs[i] = (context[i] + inputs[i] * embed_scale) * combine_scale, where
  // `inputs` arrives holding the gathered per-layer embedding rows.
  virtual void combine_per_layer_inputs(Buffer context, Buffer inputs, int64_t count, float embed_scale, float combine_scale) = 0;
  // Rotates heads in place by each row's position ("rotate half": pairs (j, j + head_dim / 2)), with
  // the angle position * inverse_frequencies[j]: `query_heads` heads per row of `queries`, then
  // `key_heads` per row of `keys` (key_heads 0: queries only).
  virtual void rope(Buffer queries, int query_heads, Buffer keys, int key_heads, int rows, int head_dim, Buffer row_table,
                    Buffer inverse_frequencies) = 0;
  // Writes rows of `row_elements` (K or V of this rank's KV heads) into `cache` ([sequences][capacity]
  // [row_elements] in `format`) at each row's sequence and slot position % capacity.
  virtual void store_kv(Buffer source, int rows, int64_t row_elements, Buffer row_table, Buffer cache, int capacity,
                        KvFormat format) = 0;
  // out = softmax(q . k) v over each row's visible cached positions (scale 1: Gemma-4 has none), for
  // every query head; with shape.keys_derived() the keys are rebuilt from `values` and `keys` is unused.
  virtual void attention(Buffer queries, int rows, Buffer row_table, Buffer keys, Buffer values, const AttentionShape& shape,
                         Buffer out) = 0;
  // Router: softmax over `experts` logits per row, the top_k most probable (ties: the lower index)
  // renormalised and multiplied by per_expert_scale. chosen_experts: int32 [rows][top_k].
  virtual void route_experts(Buffer router_logits, int rows, int experts, int top_k, Buffer per_expert_scale,
                             Buffer chosen_experts, Buffer chosen_weights) = 0;
  // out[r] = sum over r's chosen experts e, in ascending e, of weight * down_e(gelu(gate_e x) * up_e x).
  virtual void expert_feed_forward(Buffer input, int rows, Buffer chosen_experts, Buffer chosen_weights, const ExpertSet& experts,
                                   Buffer out) = 0;
  // out[i] = source[row_ids[i]] for i < rows; row_ids int32.
  virtual void gather_rows(Buffer source, Buffer row_ids, int rows, int width, Buffer out) = 0;
  virtual void softcap(Buffer values, int64_t count, float cap) = 0;   // v = tanh(v / cap) * cap
  // ids[r] = the index of row r's largest value (the lowest on ties, NaN never chosen), or -1 when the
  // row has nothing above -inf (a broken forward pass: all NaN); ids int32.
  virtual void argmax(Buffer values, int rows, int width, Buffer ids) = 0;
  // out[r] = log(sum_i exp(values[r][i])): the log of the softmax normaliser of row r, so that a token's
  // log-probability is its value minus out[r] (logprobs without reading the row on the host).
  virtual void log_sum_exp(Buffer values, int rows, int width, Buffer out) = 0;

  // ---- tensor parallelism: collectives on backend buffers, through the communicator
  virtual void all_reduce_sum(Buffer values, int64_t count, parallel::Communicator& communicator) = 0;
  // For each of `rows` rows: every rank's `counts[rank]` values of `local` concatenated into `out`.
  virtual void all_gather_rows(Buffer local, int rows, std::span<const size_t> counts, Buffer out,
                               parallel::Communicator& communicator) = 0;
};

}  // namespace gemma4rt::backend
