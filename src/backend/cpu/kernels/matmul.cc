#include "backend/cpu/kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "backend/host/isa.h"

namespace gemma4rt::kernels {
namespace {

using detail::MatmulOperands;

// Activation rows are padded to a multiple of this many elements (>= one vector step of every
// kernel, and 64-byte aligned for every operand type) so kernels read whole vectors past `cols`.
constexpr int64_t kActivationPadding = 64;

bool isa_at_least(Isa active, Isa level) { return static_cast<int>(active) >= static_cast<int>(level); }

// ---- scalar path: the reference for the SIMD paths (fp32 accumulation in k order) ----

void matmul_f32_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const auto* x = static_cast<const float*>(op.x);
  const auto* w = static_cast<const float*>(op.w);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row = w + r * op.cols;
    for (int64_t t = 0; t < op.tokens; ++t) {
      const float* token = x + t * op.x_stride;
      float sum = 0.0f;
      for (int64_t k = 0; k < op.cols; ++k) sum += token[k] * row[k];
      op.y[t * op.y_stride + r] = sum;
    }
  }
}

void matmul_bf16_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const auto* x = static_cast<const uint16_t*>(op.x);
  const auto* w = static_cast<const uint16_t*>(op.w);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* row = w + r * op.cols;
    for (int64_t t = 0; t < op.tokens; ++t) {
      const uint16_t* token = x + t * op.x_stride;
      float sum = 0.0f;
      for (int64_t k = 0; k < op.cols; ++k) sum += bf16_to_float(token[k]) * bf16_to_float(row[k]);
      op.y[t * op.y_stride + r] = sum;
    }
  }
}

// Exact int32 dot product per block of 32 activations, scaled by w_scale * x_scale and summed in fp32;
// weight(r, k) gives a weight's integer value and weight_scale(r, b) its block's scale.
template <class WeightValue, class WeightScale>
void matmul_blocks_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end, WeightValue weight, WeightScale weight_scale) {
  static_assert(kQ8BlockValues == kQ4BlockValues, "q8 and q4 weights share the activations' blocks");
  const auto* x = static_cast<const int8_t*>(op.x);
  const int64_t blocks = q8_blocks_per_row(op.cols);
  const int64_t x_blocks = op.x_stride / kQ8BlockValues;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t t = 0; t < op.tokens; ++t) {
      const int8_t* token = x + t * op.x_stride;
      const float* token_scales = op.x_scales + t * x_blocks;
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t begin = b * kQ8BlockValues;
        const int64_t end = begin + kQ8BlockValues < op.cols ? begin + kQ8BlockValues : op.cols;
        int32_t dot = 0;
        for (int64_t k = begin; k < end; ++k) dot += static_cast<int32_t>(token[k]) * weight(r, k);
        sum += static_cast<float>(dot) * (weight_scale(r, b) * token_scales[b]);
      }
      op.y[t * op.y_stride + r] = sum;
    }
  }
}

// The weight's byte holds w + 128 (pack_q8).
void matmul_q8_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const auto* w = static_cast<const uint8_t*>(op.w);
  matmul_blocks_scalar(
      op, row_begin, row_end,
      [&](int64_t r, int64_t k) { return static_cast<int32_t>(w[q8_packed_address(r, q8_packed_offset(k, op.cols), op.cols)]) - 128; },
      [&](int64_t r, int64_t b) { return op.w_scales[q8_scale_index(r, b, op.cols)]; });
}

// The same over panels (pack_q8_panels): what a level below AVX-512 runs on weights packed for it.
void matmul_q8_panels_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const auto* w = static_cast<const uint8_t*>(op.w);
  matmul_blocks_scalar(
      op, row_begin, row_end, [&](int64_t r, int64_t k) { return static_cast<int32_t>(w[q8_panel_address(r, k, op.rows, op.cols)]) - 128; },
      [&](int64_t r, int64_t b) {
        float scale;
        std::memcpy(&scale, w + q8_panel_scale_address(r, b, op.rows, op.cols), sizeof(scale));
        return scale;
      });
}

// The same over q4 panels (pack_q4_panels).
void matmul_q4_panels_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const auto* w = static_cast<const uint8_t*>(op.w);
  matmul_blocks_scalar(
      op, row_begin, row_end,
      [&](int64_t r, int64_t k) {
        const Q4NibbleAt at = q4_panel_nibble_at(r, k, op.rows, op.cols);
        return static_cast<int32_t>(at.high ? w[at.byte] >> 4 : w[at.byte] & 0x0f) - 8;
      },
      [&](int64_t r, int64_t b) {
        uint16_t scale;
        std::memcpy(&scale, w + q4_panel_scale_address(r, b, op.rows, op.cols), sizeof(scale));
        return f16_to_float(scale);
      });
}

// The weight's nibble holds q + 8 (layout in core/formats.h).
void matmul_q4_scalar(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const auto* w = static_cast<const uint8_t*>(op.w);
  const int64_t blocks = q4_blocks_per_row(op.cols);
  const int64_t row_bytes = q4_row_bytes(op.cols);
  matmul_blocks_scalar(
      op, row_begin, row_end,
      [&](int64_t r, int64_t k) {
        const Q4NibbleAt at = q4_nibble_at(k, op.cols);
        const uint8_t byte = w[r * row_bytes + at.byte];
        return static_cast<int32_t>(at.high ? byte >> 4 : byte & 0x0f) - 8;
      },
      [&](int64_t r, int64_t b) { return f16_to_float(op.w_half_scales[r * blocks + b]); });
}

void quantize_q8_row_scalar(const float* source, int64_t cols, int8_t* values, float* block_scales) {
  for (int64_t start = 0, block = 0; start < cols; start += kQ8BlockValues, ++block) {
    const int64_t end = start + kQ8BlockValues < cols ? start + kQ8BlockValues : cols;
    float absmax = 0.0f;
    for (int64_t k = start; k < end; ++k) absmax = std::fmax(absmax, std::fabs(source[k]));
    const float scale = absmax / 127.0f;
    block_scales[block] = scale;
    for (int64_t k = start; k < end; ++k) {
      // Division rather than a reciprocal multiply: it rounds identically in the SIMD versions.
      const float q = scale == 0.0f ? 0.0f : std::nearbyint(source[k] / scale);
      values[k] = static_cast<int8_t>(q > 127.0f ? 127 : q < -127.0f ? -127 : static_cast<int>(q));
    }
  }
}

void quantize_q8_row(const float* source, int64_t cols, int8_t* values, float* block_scales) {
  const Isa isa = active_isa();
  if (isa_at_least(isa, Isa::kAvx512)) {
    detail::quantize_q8_row_avx512(source, cols, values, block_scales);
  } else if (isa_at_least(isa, Isa::kAvx2)) {
    detail::quantize_q8_row_avx2(source, cols, values, block_scales);
  } else {
    quantize_q8_row_scalar(source, cols, values, block_scales);
  }
}

void round_to_bf16(const float* source, int64_t count, uint16_t* out) {
  const Isa isa = active_isa();
  if (isa_at_least(isa, Isa::kAvx512)) {
    detail::round_to_bf16_avx512(source, count, out);
  } else if (isa_at_least(isa, Isa::kAvx2)) {
    detail::round_to_bf16_avx2(source, count, out);
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(source[i]);
  }
}

void* allocate_aligned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* pointer = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (pointer == nullptr) fail("out of memory preparing matmul activations ({} bytes)", bytes);
  return pointer;
}


// The f16 bits nearest `value` (round to nearest even); finite values beyond f16's range are refused
// by the caller.
uint16_t float_to_f16(float value) { return std::bit_cast<uint16_t>(static_cast<_Float16>(value)); }

void quantize_q4_row(const float* source, int64_t cols, uint8_t* packed, uint16_t* half_scales) {
  std::memset(packed, 0x88, static_cast<size_t>(q4_row_bytes(cols)));  // padding nibbles: q = 0
  for (int64_t start = 0, block = 0; start < cols; start += kQ4BlockValues, ++block) {
    const int64_t end = start + kQ4BlockValues < cols ? start + kQ4BlockValues : cols;
    float extreme = 0.0f;
    for (int64_t k = start; k < end; ++k) {
      if (std::fabs(source[k]) > std::fabs(extreme)) extreme = source[k];
    }
    if (!std::isfinite(extreme) || std::fabs(extreme) > 8.0f * 65504.0f) {
      fail("q4 cannot hold a block whose largest value is {} (its scale must fit an f16)", extreme);
    }
    const uint16_t scale_bits = extreme == 0.0f ? 0 : float_to_f16(extreme / -8.0f);
    half_scales[block] = scale_bits;
    const float scale = f16_to_float(scale_bits);
    for (int64_t k = start; k < end; ++k) {
      const float q = scale == 0.0f ? 0.0f : std::nearbyint(source[k] / scale);
      const int code = (q > 7.0f ? 7 : q < -8.0f ? -8 : static_cast<int>(q)) + 8;
      const Q4NibbleAt at = q4_nibble_at(k, cols);
      uint8_t& byte = packed[at.byte];
      byte = at.high ? static_cast<uint8_t>((byte & 0x0f) | (code << 4)) : static_cast<uint8_t>((byte & 0xf0) | code);
    }
  }
}

}  // namespace

WeightMatrix weight_matrix(const TensorView& view) {
  if (view.shape.size() != 2) {
    fail("tensor {} has shape {}: a weight matrix must be 2-D (slice stacked experts first)", view.name,
         shape_to_string(view.shape));
  }
  WeightMatrix matrix;
  matrix.rows = view.shape[0];
  matrix.cols = view.shape[1];
  matrix.values = view.data;
  switch (view.dtype) {
    case DType::kF32: matrix.format = WeightFormat::kF32; break;
    case DType::kBF16: matrix.format = WeightFormat::kBF16; break;
    case DType::kQ8: fail("q8 tensor {} is row-major int8: pack it (pack_q8) before the fast matmul", view.name);
    case DType::kQ4:
      if (view.q4_scales == nullptr) fail("q4 tensor {} has no block scales", view.name);
      matrix.format = WeightFormat::kQ4;
      matrix.half_scales = view.q4_scales;
      break;
    case DType::kF16: fail("tensor {} is F16: convert it to f32, bf16 or q8 before the fast matmul", view.name);
  }
  return matrix;
}

void quantize_q4(const float* source, int64_t rows, int64_t cols, uint8_t* packed, uint16_t* half_scales) {
  const int64_t blocks = q4_blocks_per_row(cols);
  const int64_t row_bytes = q4_row_bytes(cols);
  for (int64_t r = 0; r < rows; ++r) quantize_q4_row(source + r * cols, cols, packed + r * row_bytes, half_scales + r * blocks);
}

void pack_q8(const int8_t* values, int64_t first_row, int64_t row_count, int64_t cols, uint8_t* packed) {
  const int64_t row_bytes = q8_packed_row_bytes(cols);
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
  for (int64_t n = 0; n < row_count; ++n) {
    std::fill(row.begin(), row.end(), uint8_t{128});  // padding: value 0
    for (int64_t k = 0; k < cols; ++k) row[q8_packed_offset(k, cols)] = static_cast<uint8_t>(values[n * cols + k] + 128);
    // Each segment's bytes are contiguous (the whole row, unless it is segment-major).
    for (int64_t begin = 0; begin < row_bytes; begin += kQ8SegmentValues) {
      const int64_t length = std::min(kQ8SegmentValues, row_bytes - begin);
      std::memcpy(packed + q8_packed_address(first_row + n, begin, cols), row.data() + begin, static_cast<size_t>(length));
    }
  }
}

void pack_q8_panels(const int8_t* values, const float* block_scales, int64_t first_row, int64_t row_count, int64_t rows,
                    int64_t cols, uint8_t* packed) {
  const int64_t blocks = q8_blocks_per_row(cols), padded_cols = blocks * kQ8BlockValues;
  // The rows to write: the padding rows of the last panel go with the last row.
  const int64_t end = first_row + row_count == rows ? panel_count(rows) * kQuantPanelRows : first_row + row_count;
  std::vector<uint8_t> codes(static_cast<size_t>(padded_cols));
  for (int64_t r = first_row; r < end; ++r) {
    const bool real = r < rows;
    std::fill(codes.begin(), codes.end(), uint8_t{128});  // padding: value 0
    if (real) {
      for (int64_t k = 0; k < cols; ++k) codes[k] = static_cast<uint8_t>(values[(r - first_row) * cols + k] + 128);
    }
    for (int64_t k = 0; k < padded_cols; k += 4) std::memcpy(packed + q8_panel_address(r, k, rows, cols), codes.data() + k, 4);
    for (int64_t b = 0; b < blocks; ++b) {
      const float scale = real ? block_scales[(r - first_row) * blocks + b] : 0.0f;
      std::memcpy(packed + q8_panel_scale_address(r, b, rows, cols), &scale, sizeof(scale));
    }
  }
}

void pack_q4_panels(const uint8_t* nibbles, const uint16_t* half_scales, int64_t first_row, int64_t row_count, int64_t rows,
                    int64_t cols, uint8_t* packed) {
  const int64_t blocks = q4_blocks_per_row(cols), row_bytes = q4_row_bytes(cols);
  const int64_t paired_blocks = (blocks + 1) / 2 * 2;  // an odd last block's partner: value 0, scale 0
  const int64_t end = first_row + row_count == rows ? panel_count(rows) * kQuantPanelRows : first_row + row_count;
  std::vector<uint8_t> codes(static_cast<size_t>(paired_blocks * kQ4BlockValues), uint8_t{8});  // q + 8 per value, padding 8
  for (int64_t r = first_row; r < end; ++r) {
    const bool real = r < rows;
    if (real) {
      unpack_q4_row(nibbles + (r - first_row) * row_bytes, cols, codes.data());
    } else {
      std::fill(codes.begin(), codes.end(), uint8_t{8});  // padding rows: value 0
    }
    for (int64_t k = 0; k < paired_blocks * kQ4BlockValues; k += 8) {
      uint8_t* bytes = packed + q4_panel_nibble_at(r, k, rows, cols).byte;
      for (int64_t j = 0; j < 4; ++j) bytes[j] = static_cast<uint8_t>(codes[k + j] | codes[k + 4 + j] << 4);
    }
    for (int64_t b = 0; b < paired_blocks; ++b) {
      const uint16_t scale = real && b < blocks ? half_scales[(r - first_row) * blocks + b] : 0;
      std::memcpy(packed + q4_panel_scale_address(r, b, rows, cols), &scale, sizeof(scale));
    }
  }
}

void unpack_q4_row(const uint8_t* row, int64_t cols, uint8_t* codes) {
  // The row's superblocks (core/formats.h): value 32 b + 4 c + i of one of n blocks in byte
  // 4 n (c / 2) + 4 b + i, the high nibble for odd c.
  const int64_t blocks = q4_blocks_per_row(cols);
  for (int64_t first_block = 0; first_block < blocks; first_block += kQ4SuperblockValues / kQ4BlockValues) {
    const int64_t n = std::min<int64_t>(blocks - first_block, kQ4SuperblockValues / kQ4BlockValues);
    const uint8_t* superblock = row + first_block * (kQ4BlockValues / 2);
    uint8_t* out = codes + first_block * kQ4BlockValues;
    for (int64_t c = 0; c < 8; c += 2) {
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t i = 0; i < 4; ++i) {
          const uint8_t byte = superblock[4 * n * (c / 2) + 4 * b + i];
          out[32 * b + 4 * c + i] = byte & 0x0f;
          out[32 * b + 4 * c + 4 + i] = byte >> 4;
        }
      }
    }
  }
}

void pack_q8_scales(const float* block_scales, int64_t first_row, int64_t row_count, int64_t cols, float* packed_scales) {
  const int64_t blocks = q8_blocks_per_row(cols), segment_blocks = kQ8SegmentValues / kQ8BlockValues;
  for (int64_t n = 0; n < row_count; ++n) {
    for (int64_t begin = 0; begin < blocks; begin += segment_blocks) {
      std::memcpy(packed_scales + q8_scale_index(first_row + n, begin, cols), block_scales + n * blocks + begin,
                  static_cast<size_t>(std::min(segment_blocks, blocks - begin)) * sizeof(float));
    }
  }
}

void quantize_q8(const float* source, int64_t rows, int64_t cols, int8_t* values, float* block_scales) {
  const int64_t blocks = q8_blocks_per_row(cols);
  for (int64_t r = 0; r < rows; ++r) quantize_q8_row(source + r * cols, cols, values + r * cols, block_scales + r * blocks);
}

void PreparedActivations::FreeDeleter::operator()(void* pointer) const { std::free(pointer); }

template <typename T>
void PreparedActivations::reserve(std::unique_ptr<T, FreeDeleter>& buffer, size_t& capacity, size_t bytes) {
  if (bytes <= capacity) return;
  buffer.reset(static_cast<T*>(allocate_aligned(bytes)));
  capacity = bytes;
}

namespace {
// q8 and q4 weights take int8 activations (in superblocks); f32 and bf16 their own format.
bool takes_int8(WeightFormat format) { return format == WeightFormat::kQ8 || format == WeightFormat::kQ4; }
size_t activation_bytes(WeightFormat format) {
  return format == WeightFormat::kF32 ? 4 : format == WeightFormat::kBF16 ? 2 : 1;
}
}  // namespace

void PreparedActivations::prepare(const float* x, int64_t tokens, int64_t cols, WeightFormat format) {
  reshape(tokens, cols, format);
  convert(x, 0, tokens);
}

void PreparedActivations::reshape(int64_t tokens, int64_t cols, WeightFormat format) {
  if (tokens < 0 || cols < 0) fail("matmul activations with negative shape [{}, {}]", tokens, cols);
  const bool quantized = takes_int8(format);
  // q8 and q4 kernels read whole superblocks of activations.
  const int64_t padding = quantized ? kQ4SuperblockValues : kActivationPadding;
  int64_t stride = (cols + padding - 1) / padding * padding;
  const size_t element_bytes = activation_bytes(format);
  // A decode step's float rows a multiple of 4 KiB apart (bf16 K = 2,048, 6,144, 12,288) would put the
  // same stretch of every token in the same L1 sets, where the weights' lines land too: 8 tokens fill
  // all 8 ways and evict each other. Half a page more spreads them over both halves of the sets (with
  // bf16's whole-K step tiles, batch_chunk in matmul_avx512.cc, 8 tokens through E2B's 1536 x 12288
  // down projections took 3-7% longer than one token instead of 22-33%). Prompts keep the plain stride:
  // 512 bf16 tokens were 1-3% slower with it.
  if (!quantized && tokens > 1 && tokens <= kBatchMaxTokens && stride * static_cast<int64_t>(element_bytes) % 4096 == 0) {
    stride += 2048 / static_cast<int64_t>(element_bytes);
  }
  const size_t elements = static_cast<size_t>(tokens) * stride;
  reserve(values_, values_capacity_, elements * element_bytes);
  const int64_t scale_stride = stride / kQ8BlockValues;
  if (quantized) {
    reserve(scales_, scales_capacity_, static_cast<size_t>(tokens) * scale_stride * sizeof(float));
    reserve(superblocks_, superblocks_capacity_, elements / 4 * 5);
  }
  tokens_ = tokens;
  cols_ = cols;
  stride_ = stride;
  format_ = format;
}

void PreparedActivations::convert(const float* x, int64_t token_begin, int64_t token_end) {
  if (token_begin < 0 || token_end > tokens_ || token_begin > token_end) {
    fail("matmul activations: tokens [{}, {}) outside the {} prepared", token_begin, token_end, tokens_);
  }
  for (int64_t t = token_begin; t < token_end; ++t) convert_row(x + t * cols_, t);
}

void PreparedActivations::convert_row(const float* source, int64_t t) {
  if (t < 0 || t >= tokens_) fail("matmul activations: token {} outside the {} prepared", t, tokens_);
  const WeightFormat format = format_;
  const int64_t cols = cols_, stride = stride_;
  const bool quantized = takes_int8(format);
  const size_t element_bytes = activation_bytes(format);
  const int64_t scale_stride = stride / kQ8BlockValues;
  const size_t padding_bytes = static_cast<size_t>(stride - cols) * element_bytes;
  std::byte* row = values_.get() + static_cast<size_t>(t) * stride * element_bytes;
  switch (format) {
    case WeightFormat::kF32:
      std::memcpy(row, source, static_cast<size_t>(cols) * sizeof(float));
      break;
    case WeightFormat::kBF16:
      round_to_bf16(source, cols, reinterpret_cast<uint16_t*>(row));
      break;
    case WeightFormat::kQ8:
    case WeightFormat::kQ4:
      quantize_q8_row(source, cols, reinterpret_cast<int8_t*>(row), scales_.get() + t * scale_stride);
      break;
  }
  std::memset(row + static_cast<size_t>(cols) * element_bytes, 0, padding_bytes);
  if (!quantized) return;
  float* scales = scales_.get() + t * scale_stride;
  for (int64_t b = q8_blocks_per_row(cols); b < scale_stride; ++b) scales[b] = 0.0f;
  const auto* values = reinterpret_cast<const int8_t*>(row);
  const int32_t offset = format == WeightFormat::kQ8 ? 128 : 8;  // of the unsigned weight operand
  for (int64_t start = 0; start < stride; start += kQ4SuperblockValues) {
    std::byte* superblock = superblocks_.get() + (t * stride + start) / 4 * 5;
    for (int lane = 0; lane < 16; ++lane) {
      const int8_t* block = values + start + kQ8BlockValues * lane;
      // Values 4c .. 4c + 3 of the block go to bytes 64c + 4 lane .. + 3: whole 4-byte words.
      for (int c = 0; c < kQ8BlockValues / 4; ++c) std::memcpy(superblock + 64 * c + 4 * lane, block + 4 * c, 4);
      int32_t sum = 0;
      for (int k = 0; k < kQ8BlockValues; ++k) sum += block[k];
      const int32_t correction = -offset * sum;
      std::memcpy(superblock + 512 + 4 * lane, &scales[start / kQ8BlockValues + lane], 4);
      std::memcpy(superblock + 576 + 4 * lane, &correction, 4);
    }
  }
}

bool gate_up_fusable(int64_t tokens, const WeightMatrix& gate, const WeightMatrix& up) {
  return isa_at_least(active_isa(), Isa::kAvx512Bf16) && gate.format == WeightFormat::kBF16 && up.format == WeightFormat::kBF16 &&
         up.cols == gate.cols && up.rows == gate.rows && tokens > kBatchMaxTokens && gate.values != nullptr &&
         up.values != nullptr;
}

void gelu_gate_up(const PreparedActivations& x, const WeightMatrix& gate, const WeightMatrix& up, float* gate_sums,
                  float* up_sums, PreparedActivations& products, int64_t index_begin, int64_t index_end) {
  if (!gate_up_fusable(x.tokens(), gate, up) || x.format() != WeightFormat::kBF16 || x.cols() != gate.cols) {
    fail("gelu_gate_up: {} activations ({} tokens x {}) with {} gate [{}, {}] and {} up [{}, {}] weights on {} cannot be fused",
         format_name(x.format()), x.tokens(), x.cols(), format_name(gate.format), gate.rows, gate.cols, format_name(up.format),
         up.rows, up.cols, isa_name(active_isa()));
  }
  if (products.format() != WeightFormat::kBF16 || products.tokens() != x.tokens() || products.cols() != gate.rows) {
    fail("gelu_gate_up: products prepared as {} tokens x {} {} for {} tokens x {} bf16", products.tokens(), products.cols(),
         format_name(products.format()), x.tokens(), gate.rows);
  }
  if (index_begin < 0 || index_end > gate.rows || index_begin > index_end) {
    fail("gelu_gate_up: index range [{}, {}) outside {} rows", index_begin, index_end, gate.rows);
  }
  if (gate_sums == nullptr || up_sums == nullptr) fail("gelu_gate_up: no buffers for the partial sums");
  detail::GateUpOperands operands{};
  operands.x = x.bf16_values();
  operands.x_stride = x.stride();
  operands.tokens = x.tokens();
  operands.gate = static_cast<const uint16_t*>(gate.values);
  operands.up = static_cast<const uint16_t*>(up.values);
  operands.cols = gate.cols;
  operands.gate_sums = gate_sums;
  operands.up_sums = up_sums;
  operands.sums_stride = gate.rows;
  operands.products = reinterpret_cast<uint16_t*>(products.values_.get());
  operands.products_stride = products.stride();
  detail::prefill_gelu_gate_up_avx512bf16(operands, index_begin, index_end);
  if (index_end == gate.rows) {
    for (int64_t t = 0; t < x.tokens(); ++t) {
      std::memset(operands.products + t * operands.products_stride + gate.rows, 0,
                  static_cast<size_t>(operands.products_stride - gate.rows) * sizeof(uint16_t));
    }
  }
}

void matmul(const PreparedActivations& x, const WeightMatrix& w, float* y, int64_t y_stride, int64_t row_begin,
            int64_t row_end) {
  if (x.format() != w.format || x.cols() != w.cols) {
    fail("matmul: activations prepared as {} with {} columns for a {} weight with {} columns", format_name(x.format()),
         x.cols(), format_name(w.format), w.cols);
  }
  if (row_begin < 0 || row_end > w.rows || row_begin > row_end) {
    fail("matmul: row range [{}, {}) outside a weight of {} rows", row_begin, row_end, w.rows);
  }
  if (row_begin == row_end || x.tokens() == 0) return;
  const bool scales_apart = w.layout != QuantLayout::kPanels;  // panels hold their scales
  if (w.values == nullptr || (scales_apart && w.format == WeightFormat::kQ8 && w.block_scales == nullptr) ||
      (scales_apart && w.format == WeightFormat::kQ4 && w.half_scales == nullptr)) {
    fail("matmul: weight matrix of {} rows has no data", w.rows);
  }

  MatmulOperands operands{};
  operands.x = x.format() == WeightFormat::kF32    ? static_cast<const void*>(x.f32_values())
               : x.format() == WeightFormat::kBF16 ? static_cast<const void*>(x.bf16_values())
                                                   : static_cast<const void*>(x.q8_values());
  operands.x_scales = x.q8_scales();
  operands.x_superblocks = x.superblocks();
  operands.x_stride = x.stride();
  operands.tokens = x.tokens();
  operands.w = w.values;
  operands.w_scales = w.block_scales;
  operands.w_half_scales = w.half_scales;
  operands.cols = w.cols;
  operands.rows = w.rows;
  operands.y = y;
  operands.y_stride = y_stride;

  const Isa isa = active_isa();
  void (*kernel)(const MatmulOperands&, int64_t, int64_t) = nullptr;
  switch (w.format) {
    case WeightFormat::kF32:
      kernel = isa_at_least(isa, Isa::kAvx512) ? detail::matmul_f32_avx512
               : isa_at_least(isa, Isa::kAvx2) ? detail::matmul_f32_avx2
                                               : matmul_f32_scalar;
      break;
    case WeightFormat::kBF16:
      kernel = isa_at_least(isa, Isa::kAvx512Bf16) ? detail::matmul_bf16_avx512bf16
               : isa_at_least(isa, Isa::kAvx512)   ? detail::matmul_bf16_avx512
               : isa_at_least(isa, Isa::kAvx2)     ? detail::matmul_bf16_avx2
                                                   : matmul_bf16_scalar;
      break;
    case WeightFormat::kQ8:
      if (w.layout == QuantLayout::kPanels) {
        kernel = isa_at_least(isa, Isa::kAvx512) ? detail::matmul_q8_panels_avx512 : matmul_q8_panels_scalar;
        break;
      }
      kernel = isa_at_least(isa, Isa::kAvx512) ? detail::matmul_q8_avx512
               : isa_at_least(isa, Isa::kAvx2) ? detail::matmul_q8_avx2
                                               : matmul_q8_scalar;
      break;
    case WeightFormat::kQ4:
      if (w.layout == QuantLayout::kPanels) {
        kernel = isa_at_least(isa, Isa::kAvx512) ? detail::matmul_q4_panels_avx512 : matmul_q4_panels_scalar;
        break;
      }
      kernel = isa_at_least(isa, Isa::kAvx512) ? detail::matmul_q4_avx512
               : isa_at_least(isa, Isa::kAvx2) ? detail::matmul_q4_avx2
                                               : matmul_q4_scalar;
      break;
  }
  kernel(operands, row_begin, row_end);
}

namespace detail {

void* thread_scratch(int slot, size_t bytes) {
  struct FreeDeleter {
    void operator()(void* pointer) const { std::free(pointer); }
  };
  thread_local std::unique_ptr<void, FreeDeleter> buffers[2];
  thread_local size_t capacities[2] = {};
  if (slot < 0 || slot > 1) fail("matmul: no scratch slot {}", slot);
  if (bytes > capacities[slot]) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    buffers[slot].reset(std::aligned_alloc(4096, rounded));
    if (!buffers[slot]) throw std::bad_alloc();
    capacities[slot] = rounded;
  }
  return buffers[slot].get();
}

namespace {
std::atomic<int> kernel_way_value{static_cast<int>(KernelWay::kMeasure)};
}  // namespace

void set_kernel_way(KernelWay way) { kernel_way_value.store(static_cast<int>(way), std::memory_order_relaxed); }

KernelWay kernel_way() { return static_cast<KernelWay>(kernel_way_value.load(std::memory_order_relaxed)); }

}  // namespace detail

}  // namespace gemma4rt::kernels
