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
// q * scale), stored as q + 8 in nibbles: each group of 64 values of a row is 32 bytes whose low
// nibbles hold values 0-31 of the group and whose high nibbles hold values 32-63, and a row is padded
// with zero nibbles to whole groups. 4.5 bits per weight with the scales.
enum class WeightFormat { kF32, kBF16, kQ8, kQ4 };

// KV cache elements.
enum class KvFormat { kF32, kBF16 };

inline constexpr int64_t kQ8BlockValues = 32;

inline int64_t q8_blocks_per_row(int64_t cols) { return (cols + kQ8BlockValues - 1) / kQ8BlockValues; }

inline constexpr int64_t kQ4BlockValues = 32;
inline constexpr int64_t kQ4GroupValues = 64;  // values sharing one 32-byte run of nibbles

inline int64_t q4_blocks_per_row(int64_t cols) { return (cols + kQ4BlockValues - 1) / kQ4BlockValues; }
// Bytes of one row's nibbles (padded to whole groups of 64 values).
inline int64_t q4_row_bytes(int64_t cols) { return (cols + kQ4GroupValues - 1) / kQ4GroupValues * (kQ4GroupValues / 2); }

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
