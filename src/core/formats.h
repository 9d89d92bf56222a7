// The element formats the engine computes in, one vocabulary for every layer: the checkpoint's stored
// dtypes are DType (core/tensor.h); these are what a backend keeps weights and the KV cache in.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace gemma4rt {

// Weights as a backend multiplies them. kQ8: symmetric int8 with one fp32 scale per kQ8BlockValues
// consecutive values of a row (the last block of a row may be shorter), as `gemma4rt quantize` writes.
// kQ4: 4-bit integers q in [-8, 7] with one f16 scale per kQ4BlockValues values of a row (value =
// q * scale), stored as q + 8 in nibbles. A row is cut into superblocks of 512 values (16 blocks), each
// 256 bytes: the blocks side by side in columns of 4 values, so that one 64-byte vector holds 4 values
// of every block. Value v of a superblock (block b = v / 32, column c = v % 32 / 4, i = v % 4) is in
// byte 64 * (c / 2) + 4 * b + i, in its low nibble for even c and its high nibble for odd c. A row's
// last superblock may have fewer blocks, n: then 4 * n takes the place of 64, and its last block is
// padded with q = 0 (q4_nibble_at has the formula). A SIMD dot product sums each block in its own
// 32-bit lane and scales once per superblock. 4.5 bits per weight with the scales.
enum class WeightFormat { kF32, kBF16, kQ8, kQ4 };

// KV cache elements.
enum class KvFormat { kF32, kBF16 };

inline constexpr int64_t kQ8BlockValues = 32;

inline int64_t q8_blocks_per_row(int64_t cols) { return (cols + kQ8BlockValues - 1) / kQ8BlockValues; }

inline constexpr int64_t kQ4BlockValues = 32;
inline constexpr int64_t kQ4SuperblockValues = 512;
inline constexpr int64_t kQ4SuperblockBytes = kQ4SuperblockValues / 2;

inline int64_t q4_blocks_per_row(int64_t cols) { return (cols + kQ4BlockValues - 1) / kQ4BlockValues; }
// Bytes of one row's nibbles: 16 per block.
inline int64_t q4_row_bytes(int64_t cols) { return q4_blocks_per_row(cols) * (kQ4BlockValues / 2); }

// A q4 safetensors file names its layout in its __metadata__, so files of an earlier layout are refused
// rather than misread.
inline constexpr const char* kQ4LayoutKey = "gemma4rt_q4_layout";
inline constexpr const char* kQ4Layout = "superblocks-512";

// Where value `column` of a row of `cols` values falls in the superblock layout q4 and the q8 kernels
// share: its superblock, how many blocks (lanes) that superblock has, its block, its 4-value column
// (0-7) and its place in that column.
struct SuperblockSlot {
  int64_t superblock, lanes, block, four, index;
};
inline SuperblockSlot superblock_slot(int64_t column, int64_t cols) {
  constexpr int64_t kBlocks = kQ4SuperblockValues / kQ4BlockValues;
  const int64_t superblock = column / kQ4SuperblockValues, in_superblock = column % kQ4SuperblockValues;
  const int64_t blocks_here = (cols + kQ4BlockValues - 1) / kQ4BlockValues - superblock * kBlocks;
  return {superblock, blocks_here < kBlocks ? blocks_here : kBlocks, in_superblock / kQ4BlockValues,
          in_superblock % kQ4BlockValues / 4, in_superblock % 4};
}

struct Q4NibbleAt {
  int64_t byte;  // from the start of the row
  bool high;     // the byte's high nibble
};
// Where value `column` of a row of `cols` values is stored (the layout above): two 4-value columns
// share each byte.
inline Q4NibbleAt q4_nibble_at(int64_t column, int64_t cols) {
  const SuperblockSlot slot = superblock_slot(column, cols);
  return {slot.superblock * kQ4SuperblockBytes + 4 * slot.lanes * (slot.four / 2) + 4 * slot.block + slot.index, slot.four % 2 == 1};
}

// Bytes of a [rows, cols] matrix in `format` (q8 and q4: the values and their block scales).
inline int64_t weight_bytes(int64_t rows, int64_t cols, WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return rows * cols * 4;
    case WeightFormat::kBF16: return rows * cols * 2;
    case WeightFormat::kQ8: return rows * cols + rows * q8_blocks_per_row(cols) * 4;
    case WeightFormat::kQ4: return rows * q4_row_bytes(cols) + rows * q4_blocks_per_row(cols) * 2;
  }
  return 0;
}

inline size_t kv_element_bytes(KvFormat format) { return format == KvFormat::kF32 ? 4 : 2; }

// Lower-case names, as the command line and reports spell them: "f32", "bf16", "q8", "q4".
const char* format_name(WeightFormat format);
const char* format_name(KvFormat format);
// "f32" (or "fp32"), "bf16", "q8", "q4"; nullopt for anything else.
std::optional<WeightFormat> parse_weight_format(std::string_view name);
std::optional<KvFormat> parse_kv_format(std::string_view name);

}  // namespace gemma4rt
