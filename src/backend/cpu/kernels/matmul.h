// Fast matrix multiplication y = x W^T for weights in PyTorch nn.Linear layout ([out rows][in cols],
// row-major), in f32, bf16 (used in place from the memory map), q8 (symmetric int8, one float scale
// per 32 consecutive weights of a row) or q4 (4-bit, one f16 scale per 32; core/formats.h).
//
// Activations are converted once per matmul (PreparedActivations) into the operand format the weight
// format wants: f32 as is, bf16 rounded to nearest even, or q8 blocks of 32 with per-block scales (for
// q8 and q4 weights alike). Each
// product is then computed from those rounded operands; only fp32 rounding of the sums differs between
// the instruction-set paths (about 1e-7 of sum |x| |w|; tests/unit/matmul_test.cc allows 2e-6). The
// vdpbf16ps path treats subnormal bf16 operands (below 1.2e-38) as zero.
//
// Every output element is computed by the same sequence of operations whichever row range it falls in,
// so splitting rows across threads never changes results (bitwise). Decode of one token streams each
// weight row once; a step of 2-16 tokens (several sequences) uses register tiles of tokens x rows over
// K chunks whose activations stay in L1; prefill uses larger tiles over L2-sized blocks of rows. q8 and
// q4 products work in superblocks of 512 values (16 blocks side by side), so each block's integer dot
// product ends in its own 32-bit lane and is scaled once; where the AVX-512 kernels run, q8 and q4
// weights are stored in panels of 16 rows instead, each row's sum in its own lane (QuantLayout).
//
// Paths, chosen at call time from active_isa():
//   scalar       plain loops (the reference the SIMD paths are tested against)
//   avx2         f32: vfmadd231ps; bf16: shift/and to f32 + vfmadd231ps; q8: vpsignb + vpmaddubsw + vpmaddwd;
//                q4: nibbles (unsigned) x int8 activations by vpmaddubsw + vpmaddwd
//   avx512       f32: vfmadd231ps zmm; bf16: shift/and to f32 + vfmadd231ps zmm; q8 and q4: vpdpbusd (VNNI);
//                q8 and q4 panels: vpdpbusd with broadcast activations (matmul_panels_avx512.cc)
//   avx512bf16   bf16: vdpbf16ps; f32 and q8 as avx512
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/formats.h"
#include "core/tensor.h"

namespace gemma4rt::kernels {

// q8 weights as these kernels read them (pack_q8 writes them from the checkpoint's row-major int8):
// each value + 128 as one byte, a row cut into superblocks of 512 values laid out as q4's are
// (core/formats.h) but with a byte per value, so a 64-byte vector holds 4 values of each of 16 blocks:
// byte 4 * n * c + 4 * b + i of a superblock of n blocks (16, or fewer in a row's last one) holds value
// 32 * b + 4 * c + i (c = 0..7). A row's last block is padded with value 0. Dot products then sum every
// block in its own 32-bit lane and scale once per superblock, as for q4.
inline int64_t q8_packed_row_bytes(int64_t cols) { return q8_blocks_per_row(cols) * kQ8BlockValues; }
inline int64_t q8_packed_offset(int64_t column, int64_t cols) {
  const SuperblockSlot slot = superblock_slot(column, cols);
  return slot.superblock * kQ4SuperblockValues + 4 * slot.lanes * slot.four + 4 * slot.block + slot.index;
}
// Long rows (more packed bytes than a segment) are stored segment-major: rows come in blocks of
// kQ8SegmentRows, and a block holds its rows' first kQ8SegmentValues values (one segment of each row,
// row after row), then their next ones, and so on (a row's last segment may be shorter). A step of
// several tokens reads such rows a segment at a time (the tokens' activations for a whole row do not
// fit L1), block after block: in this order the weights stream from memory front to back, where a
// row-major layout had each segment of 12 rows come from 12 places (8 tokens x 1536 x 6144: 23-26%
// less time per product, docs/benchmarks.md).
constexpr int64_t kQ8SegmentValues = 2048;  // whole superblocks
constexpr int64_t kQ8SegmentRows = 12;
inline bool q8_segmented(int64_t cols) { return q8_packed_row_bytes(cols) > kQ8SegmentValues; }
// Where row r's packed byte p (0 <= p < q8_packed_row_bytes(cols)) lies.
inline int64_t q8_packed_address(int64_t r, int64_t p, int64_t cols) {
  const int64_t row_bytes = q8_packed_row_bytes(cols);
  if (row_bytes <= kQ8SegmentValues) return r * row_bytes + p;
  const int64_t block = r / kQ8SegmentRows, i = r % kQ8SegmentRows, segment_begin = p / kQ8SegmentValues * kQ8SegmentValues;
  const int64_t length = row_bytes - segment_begin < kQ8SegmentValues ? row_bytes - segment_begin : kQ8SegmentValues;
  return block * kQ8SegmentRows * row_bytes + segment_begin * kQ8SegmentRows + i * length + (p - segment_begin);
}
// The block scales follow the codes, one float per 32 packed bytes: block b of row r is scale
// q8_scale_index(r, b, cols) (for rows that are not segment-major, the checkpoint's [rows][blocks]).
inline int64_t q8_scale_index(int64_t r, int64_t block, int64_t cols) {
  return q8_packed_address(r, block * kQ8BlockValues, cols) / kQ8BlockValues;
}
// Bytes of a packed [rows][cols] q8 matrix (segment-major ones are allocated in whole blocks of rows)
// and the scales that go with it.
inline int64_t q8_packed_bytes(int64_t rows, int64_t cols) {
  const int64_t stored_rows = q8_segmented(cols) ? (rows + kQ8SegmentRows - 1) / kQ8SegmentRows * kQ8SegmentRows : rows;
  return stored_rows * q8_packed_row_bytes(cols);
}
inline int64_t q8_packed_scale_count(int64_t rows, int64_t cols) { return q8_packed_bytes(rows, cols) / kQ8BlockValues; }
// Packs rows [first_row, first_row + row_count) of a [rows][cols] matrix, given as row-major int8 (values
// in [-127, 127]), into their places in `packed` (q8_packed_bytes(rows, cols) bytes) ...
void pack_q8(const int8_t* values, int64_t first_row, int64_t row_count, int64_t cols, uint8_t* packed);
// ... and their [row_count][q8_blocks_per_row(cols)] block scales into theirs (q8_packed_scale_count).
void pack_q8_scales(const float* block_scales, int64_t first_row, int64_t row_count, int64_t cols, float* packed_scales);

// q8 and q4 weights in panels, the AVX-512 kernels' layout (prepare_weight picks it where active_isa()
// is AVX-512 or above): rows in groups of 16, the output rows in a vector's 16 lanes, so that one
// vpdpbusd multiplies 4 consecutive values of each of 16 rows (unsigned codes) by one token's 4
// activations broadcast from memory. A panel is stored front to back along K (cols padded to whole
// blocks of 32 with value 0), panel after panel; rows past the last (to the next multiple of 16) hold
// value 0 with scale 0. Each block's 16 scales (f32 for q8, f16 for q4) lie in the panel right after
// its codes, so one token's product streams its panels front to back as one stream: with the scales
// in an array of their own, a core read the two streams 17-25% slower (docs/benchmarks.md). The
// activations are 4-byte broadcasts rather than 64-byte loads (the loads kept the weight stream from
// overlapping the arithmetic: docs/benchmarks.md).
//   q8: a block of a panel is 8 vectors, then its 16 scales: 576 bytes. Byte 4 i + j of vector c holds
//       value 4 c + j of row i, + 128.
//   q4: a block of a panel is 4 vectors; byte 4 i + j of vector c holds values 8 c + j (low nibble) and
//       8 c + 4 + j (high nibble) of row i, as q + 8: one AND gives the first 4, a shift and an AND the
//       next. Blocks go in pairs, the two blocks' vectors then their 16 + 16 scales: 576 bytes, so every
//       vector stays on a 64-byte line (an odd last block is paired with a padding block, value 0 and
//       scale 0). 4.5 bits per weight with the scales, as the row-major q4 layout.
enum class QuantLayout { kSuperblocks, kPanels };
constexpr int64_t kQuantPanelRows = 16;
constexpr int64_t kQ8PanelBlockBytes = kQuantPanelRows * (kQ8BlockValues + 4);      // codes, then f32 scales
constexpr int64_t kQ4PanelPairBytes = 2 * (kQuantPanelRows * kQ4BlockValues / 2 + kQuantPanelRows * 2);  // two blocks' codes, then f16 scales
static_assert(kQ8PanelBlockBytes % 64 == 0 && kQ4PanelPairBytes % 64 == 0, "blocks keep vectors on 64-byte lines");
inline int64_t panel_count(int64_t rows) { return (rows + kQuantPanelRows - 1) / kQuantPanelRows; }
inline int64_t q8_panel_stride(int64_t cols) { return q8_blocks_per_row(cols) * kQ8PanelBlockBytes; }
inline int64_t q4_panel_stride(int64_t cols) { return (q4_blocks_per_row(cols) + 1) / 2 * kQ4PanelPairBytes; }
inline int64_t q8_panel_bytes(int64_t rows, int64_t cols) { return panel_count(rows) * q8_panel_stride(cols); }
inline int64_t q4_panel_bytes(int64_t rows, int64_t cols) { return panel_count(rows) * q4_panel_stride(cols); }
// Within a panel: where block b's first vector lies and where its 16 scales begin (q4: block 2 p + h's
// vectors at p * 576 + h * 256, its scales at p * 576 + 512 + h * 32). The kernels read through these.
inline int64_t q8_panel_block_offset(int64_t block) { return block * kQ8PanelBlockBytes; }
inline int64_t q8_panel_scale_offset(int64_t block) { return q8_panel_block_offset(block) + kQuantPanelRows * kQ8BlockValues; }
inline int64_t q4_panel_block_offset(int64_t block) { return block / 2 * kQ4PanelPairBytes + block % 2 * (kQuantPanelRows * kQ4BlockValues / 2); }
inline int64_t q4_panel_scale_offset(int64_t block) {
  return block / 2 * kQ4PanelPairBytes + kQuantPanelRows * kQ4BlockValues + block % 2 * kQuantPanelRows * 2;
}
// Long panels (K over kLongPanelValues) are stored in groups of kPanelGroup panels, each group
// segment-major: the first kPanelSegmentBytes of each of its panels, panel after panel, then their next
// ones, and so on (the last group may have fewer panels, a panel's last segment fewer blocks; within a
// segment the bytes are as in a short panel). One token reads a group in that order, one stream front
// to back, while the activations of a segment (1.5 KiB of int8 for q8, 3 KiB for q4) stay in L1 for
// all the group's panels: a segment is small enough that the same activations come back within 27 KiB
// of weights. With whole panels of K = 6,144 (104 KiB of q8 between two reads of the same activations)
// they left L1 every panel, and such products read 10-20% slower than the same bytes at K = 1,536;
// segments read in this order but left in place (runs of 26 KiB 104 KiB apart) were 11-24% slower
// still (docs/benchmarks.md). K = 2,048 measured no better grouped, so it stays whole.
constexpr int64_t kPanelSegmentBytes = 48 * kQ8PanelBlockBytes;  // 48 q8 blocks, 96 q4 blocks (whole pairs)
constexpr int64_t kLongPanelValues = 2048;
constexpr int64_t kPanelGroup = 4;
static_assert(kPanelSegmentBytes % kQ4PanelPairBytes == 0, "a q4 pair never straddles two segments");
inline bool long_panels(int64_t cols) { return cols > kLongPanelValues; }
// Bytes of a panel's full segment: kPanelSegmentBytes of a long panel, else the whole panel.
inline int64_t q8_panel_segment_bytes(int64_t cols) { return long_panels(cols) ? kPanelSegmentBytes : q8_panel_stride(cols); }
inline int64_t q4_panel_segment_bytes(int64_t cols) { return long_panels(cols) ? kPanelSegmentBytes : q4_panel_stride(cols); }
// Where byte `local` of panel `panel` (its offset were the panel stored whole, block after block) lies
// among `panels` panels of `stride` bytes with full segments of `segment_bytes`. With one segment a
// panel (segment_bytes = stride), panel * stride + local.
inline int64_t panel_byte(int64_t panel, int64_t local, int64_t panels, int64_t stride, int64_t segment_bytes) {
  const int64_t first = panel / kPanelGroup * kPanelGroup;
  const int64_t members = panels - first < kPanelGroup ? panels - first : kPanelGroup;
  const int64_t begin = local / segment_bytes * segment_bytes;
  const int64_t length = stride - begin < segment_bytes ? stride - begin : segment_bytes;
  return first * stride + begin * members + (panel - first) * length + (local - begin);
}
inline int64_t q8_panel_byte(int64_t r, int64_t local, int64_t rows, int64_t cols) {
  return panel_byte(r / kQuantPanelRows, local, panel_count(rows), q8_panel_stride(cols), q8_panel_segment_bytes(cols));
}
inline int64_t q4_panel_byte(int64_t r, int64_t local, int64_t rows, int64_t cols) {
  return panel_byte(r / kQuantPanelRows, local, panel_count(rows), q4_panel_stride(cols), q4_panel_segment_bytes(cols));
}
// Rows that a thread's share of a product keeps together, so that it reads whole groups: a group's for
// long panels, else a panel's.
inline int64_t panel_rows_together(int64_t cols) { return long_panels(cols) ? kPanelGroup * kQuantPanelRows : kQuantPanelRows; }
// Where value k of row r of a [rows][cols] weight lies, and where the scale of row r's block b does (a
// float / an f16).
inline int64_t q8_panel_address(int64_t r, int64_t k, int64_t rows, int64_t cols) {
  return q8_panel_byte(r, q8_panel_block_offset(k / kQ8BlockValues) + k % kQ8BlockValues / 4 * 64 + r % kQuantPanelRows * 4 + k % 4,
                       rows, cols);
}
inline int64_t q8_panel_scale_address(int64_t r, int64_t block, int64_t rows, int64_t cols) {
  return q8_panel_byte(r, q8_panel_scale_offset(block) + r % kQuantPanelRows * 4, rows, cols);
}
inline Q4NibbleAt q4_panel_nibble_at(int64_t r, int64_t k, int64_t rows, int64_t cols) {
  return {q4_panel_byte(r, q4_panel_block_offset(k / kQ4BlockValues) + k % kQ4BlockValues / 8 * 64 + r % kQuantPanelRows * 4 + k % 4,
                        rows, cols),
          k % 8 >= 4};
}
inline int64_t q4_panel_scale_address(int64_t r, int64_t block, int64_t rows, int64_t cols) {
  return q4_panel_byte(r, q4_panel_scale_offset(block) + r % kQuantPanelRows * 2, rows, cols);
}
// Pack rows [first_row, first_row + row_count) of a [rows][cols] matrix into panels (*_panel_bytes),
// scales and padding included: q8 from row-major int8 values and their
// [row_count][q8_blocks_per_row(cols)] block scales, q4 from WeightFormat::kQ4's rows and scales. The
// call that packs the last row also writes the padding rows; calls for different panels may run side
// by side.
void pack_q8_panels(const int8_t* values, const float* block_scales, int64_t first_row, int64_t row_count, int64_t rows,
                    int64_t cols, uint8_t* packed);
void pack_q4_panels(const uint8_t* nibbles, const uint16_t* half_scales, int64_t first_row, int64_t row_count, int64_t rows,
                    int64_t cols, uint8_t* packed);
// One WeightFormat::kQ4 row's codes (q + 8, a byte each) in value order: q4_blocks_per_row(cols) * 32
// of them, the last block's padding as stored (8, zero, as quantize_q4 writes it).
void unpack_q4_row(const uint8_t* row, int64_t cols, uint8_t* codes);

struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0, cols = 0;
  const void* values = nullptr;          // f32 / bf16 (uint16_t bits), row-major [rows][cols]
                                         // q8: pack_q8's bytes (q8_packed_address) or panels
                                         // q4: nibbles, [rows][q4_row_bytes(cols)], or panels
  const float* block_scales = nullptr;   // q8 only: pack_q8_scales's (q8_scale_index); none for panels
  const uint16_t* half_scales = nullptr; // q4 only: f16 [rows][q4_blocks_per_row(cols)]; none for panels
  QuantLayout layout = QuantLayout::kSuperblocks;  // q8 and q4
};

// A 2-D F32, BF16 or Q4 view (use TensorView::slice for one expert of a stacked tensor) as a matrix
// read in place. Q8 (packed first: pack_q8), F16 and other ranks throw gemma4rt::Error.
WeightMatrix weight_matrix(const TensorView& view);

// Quantises a row-major float matrix to q8: per block of 32 consecutive values of a row (the last block
// of a row may be shorter) scale = absmax / 127 and value = round-to-nearest(x / scale), so
// |x - value * scale| <= scale / 2. An all-zero block gets scale 0 and zero values.
void quantize_q8(const float* source, int64_t rows, int64_t cols, int8_t* values, float* block_scales);

// Quantises a row-major float matrix to q4: per block of 32 values of a row, the value of largest
// magnitude m sets scale = f16(m / -8) (so m itself becomes -8 exactly, all 16 codes in use) and each
// value becomes q = clamp(round(x / scale), -8, 7), stored as q + 8 in the nibble layout of
// WeightFormat::kQ4 (padding nibbles hold 8, i.e. zero). An all-zero block gets scale 0. Throws
// gemma4rt::Error for a block whose scale exceeds f16's range (|m| > 8 * 65504) or is not finite.
void quantize_q4(const float* source, int64_t rows, int64_t cols, uint8_t* packed, uint16_t* half_scales);

// Activations converted for one weight format. Buffers are reused across calls and only grow, so a
// warmed-up decode loop does not allocate. Rows are stored with a padded stride (a multiple of 64
// elements, padding zeroed) so kernels may read whole vectors past `cols`.
class PreparedActivations {
 public:
  PreparedActivations() = default;
  PreparedActivations(const PreparedActivations&) = delete;
  PreparedActivations& operator=(const PreparedActivations&) = delete;

  // x is [tokens][cols] row-major floats; it is copied, so it may be overwritten afterwards.
  void prepare(const float* x, int64_t tokens, int64_t cols, WeightFormat format);
  // The same in two steps, so threads can convert tokens side by side: reshape sizes the buffers, then
  // convert(x, begin, end) converts tokens [begin, end) of the whole [tokens][cols] input x.
  void reshape(int64_t tokens, int64_t cols, WeightFormat format);
  void convert(const float* x, int64_t token_begin, int64_t token_end);
  // Converts one token's row of cols values from `row`, which need not lie in a [tokens][cols] input.
  void convert_row(const float* row, int64_t token);

  int64_t tokens() const { return tokens_; }
  int64_t cols() const { return cols_; }
  WeightFormat format() const { return format_; }
  // Elements between consecutive tokens' rows in the buffers below.
  int64_t stride() const { return stride_; }

  // The prepared operands (what the kernels multiply), for the format given to prepare():
  const float* f32_values() const { return reinterpret_cast<const float*>(values_.get()); }        // kF32
  const uint16_t* bf16_values() const { return reinterpret_cast<const uint16_t*>(values_.get()); }  // kBF16
  const int8_t* q8_values() const { return reinterpret_cast<const int8_t*>(values_.get()); }        // kQ8
  // kQ8: [tokens][stride / 32] block scales (blocks past cols are 0).
  const float* q8_scales() const { return scales_.get(); }
  // kQ8 and kQ4, the SIMD kernels' copy (with a stride of whole superblocks of 512): [tokens][stride /
  // 512] superblocks of 640 bytes, 64-byte aligned: the 512 int8 values in the weights' superblock
  // order (64 bytes hold 4 values of each of the 16 blocks), the 16 blocks' scales, then each block's
  // int32 -c * (sum of its values), c = 128 for q8 and 8 for q4: it turns a product with unsigned
  // weights (w + 128, or the nibble q + 8) into one with w.
  const std::byte* superblocks() const { return superblocks_.get(); }

 private:
  struct FreeDeleter {
    void operator()(void* pointer) const;
  };
  // Grows `buffer` (capacity in bytes) to at least `bytes`, 64-byte aligned; never shrinks.
  template <typename T>
  static void reserve(std::unique_ptr<T, FreeDeleter>& buffer, size_t& capacity, size_t bytes);

  friend void gelu_gate_up(const PreparedActivations&, const WeightMatrix&, const WeightMatrix&, float*, float*,
                           PreparedActivations&, int64_t, int64_t);  // writes its bf16 values

  std::unique_ptr<std::byte, FreeDeleter> values_;
  std::unique_ptr<float, FreeDeleter> scales_;
  std::unique_ptr<std::byte, FreeDeleter> superblocks_;
  size_t values_capacity_ = 0, scales_capacity_ = 0, superblocks_capacity_ = 0;  // bytes
  int64_t tokens_ = 0, cols_ = 0, stride_ = 0;
  WeightFormat format_ = WeightFormat::kF32;
};

// A prompt's gated feed-forward input in one pass over gate and up: for each token t and index i in
// [index_begin, index_end), products' bf16 value (t, i) = gelu_tanh(gate_i . x_t) * (up_i . x_t), bit for
// bit what matmul of each weight, gelu_tanh_multiply and PreparedActivations::convert_row give, without
// the two products written out as floats and read back. `products` must have been reshaped to
// (x.tokens(), gate.rows, kBF16); the call whose range ends at gate.rows clears the rows' padding.
// gate_sums and up_sums ([x.tokens()][gate.rows]) hold partial sums when K is long (more than 6,144
// values); afterwards their contents are unspecified. Only where gate_up_fusable says so for x.tokens()
// (bf16 weights of one shape with vdpbf16ps, more tokens than a decode step's 16) and x is bf16 of
// gate.cols columns; throws gemma4rt::Error otherwise.
bool gate_up_fusable(int64_t tokens, const WeightMatrix& gate, const WeightMatrix& up);
void gelu_gate_up(const PreparedActivations& x, const WeightMatrix& gate, const WeightMatrix& up, float* gate_sums,
                  float* up_sums, PreparedActivations& products, int64_t index_begin, int64_t index_end);

// Products of up to this many tokens are a decode step's (the AVX-512 batch tiles, which stream the
// weights); more take the prefill kernels (panels, L2-sized blocks).
inline constexpr int kBatchMaxTokens = 16;

// y[t * y_stride + r] = sum_k x[t, k] * W[r, k] for t < x.tokens() and r in [row_begin, row_end);
// other elements of y are untouched. Single-threaded; callers split rows across threads. x must have
// been prepared for w.format and w.cols (throws gemma4rt::Error otherwise).
void matmul(const PreparedActivations& x, const WeightMatrix& w, float* y, int64_t y_stride, int64_t row_begin,
            int64_t row_end);

// Implementation detail shared with the per-instruction-set files (matmul_avx2.cc, matmul_avx512.cc),
// which are compiled with wider instruction flags and therefore see only plain data and raw pointers.
namespace detail {

struct MatmulOperands {
  const void* x;                // prepared activations: f32 / bf16 bits / int8, [tokens][x_stride], zero padded
  const float* x_scales;        // q8, q4: [tokens][x_stride / 32]
  const std::byte* x_superblocks;  // q8, q4: [tokens][x_stride / 512] of 640 bytes (PreparedActivations::superblocks)
  int64_t x_stride;             // elements between tokens (a multiple of 64)
  int64_t tokens;
  const void* w;                // weights [rows][cols]
  const float* w_scales;        // q8: at q8_scale_index (panels hold their own)
  const uint16_t* w_half_scales;  // q4: f16 [rows][q4_blocks_per_row(cols)] (panels hold their own)
  int64_t cols;
  int64_t rows;                 // the weight's (where its panels lie depends on their count)
  float* y;
  int64_t y_stride;
  int64_t y_first_row = 0;      // the weight row whose output is y[0] (a kernel may stage outputs in its own buffer)
};

// gelu_gate_up's operands: bf16 activations and weights, its products' bf16 rows.
struct GateUpOperands {
  const uint16_t* x;            // [tokens][x_stride], zero padded
  int64_t x_stride;
  int64_t tokens;
  const uint16_t* gate;         // [rows][cols] each
  const uint16_t* up;
  int64_t cols;
  float* gate_sums;             // [tokens][sums_stride]: partial sums between stretches of K
  float* up_sums;
  int64_t sums_stride;
  uint16_t* products;           // [tokens][products_stride]
  int64_t products_stride;
};

void matmul_f32_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_bf16_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_q8_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
// Scratch of the calling thread for the prefill kernels' packed panels and widened activations: one
// buffer per slot (0, 1), 4 KiB aligned, at least `bytes` long, grown as needed and kept. Throws
// std::bad_alloc.
void* thread_scratch(int slot, size_t bytes);
// Kernels that can run two ways giving the same bits, where which is faster depends on the host (two
// Zen 5 VMs with the same caches measured them opposite ways): on AVX-512, one token's long float rows
// (activations over 16 KiB: E2B's 1536 x 12288 bf16 down projections) whole (first) or in K chunks
// with blocks of rows taking turns per chunk (second), one token's q8/q4 panels without (first) or
// with (second) a software prefetch kOneTokenPrefetchBytes ahead, and a step's q8/q4 panels
// prefetching into L2 (first) or L1 (second). By default (kMeasure) each thread times both ways in turn
// over its first calls of each and keeps the faster (measured_choice.h). Tests and the kernel bench
// force one; process-wide.
enum class KernelWay { kMeasure, kFirst, kSecond };
void set_kernel_way(KernelWay way);
KernelWay kernel_way();
// Prefill on AVX2 (tokens above the steps' 16): bf16 weight rows widened into fp32 panels, output rows
// in the lanes (prefill_panels_avx2.cc).
void prefill_bf16_panels_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_f32_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_bf16_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_bf16_avx512bf16(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
// Prefill (tokens above the batch tiles' 16): weight rows packed into pair-interleaved panels, output
// rows in the lanes (prefill_panels_avx512.cc).
void prefill_bf16_panels_avx512bf16(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
// gelu_gate_up on the same panels, gate and up rows of the same indices side by side in each.
void prefill_gelu_gate_up_avx512bf16(const GateUpOperands& operands, int64_t index_begin, int64_t index_end);
void matmul_q8_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
// q8 and q4 weights in panels (matmul_panels_avx512.cc), every token count.
void matmul_q8_panels_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_q4_panels_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_q4_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);
void matmul_q4_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end);

// Activation preparation, bit-identical to the scalar float_to_bf16 / quantize_q8.
void round_to_bf16_avx2(const float* source, int64_t count, uint16_t* out);
void round_to_bf16_avx512(const float* source, int64_t count, uint16_t* out);
// One row: blocks of 32 (the last may be shorter); writes q8_blocks_per_row(cols) scales.
void quantize_q8_row_avx2(const float* source, int64_t cols, int8_t* values, float* block_scales);
void quantize_q8_row_avx512(const float* source, int64_t cols, int8_t* values, float* block_scales);

}  // namespace detail

}  // namespace gemma4rt::kernels
