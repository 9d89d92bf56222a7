// The element formats the engine computes in, one vocabulary for every layer: the checkpoint's stored
// dtypes are DType (core/tensor.h); these are what a backend keeps weights and the KV cache in.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace gemma4rt {

// Weights as a backend multiplies them. kQ8: symmetric int8 with one fp32 scale per kQ8BlockValues
// consecutive values of a row (the last block of a row may be shorter), as `gemma4rt quantize` writes.
enum class WeightFormat { kF32, kBF16, kQ8 };

// KV cache elements.
enum class KvFormat { kF32, kBF16 };

inline constexpr int64_t kQ8BlockValues = 32;

inline int64_t q8_blocks_per_row(int64_t cols) { return (cols + kQ8BlockValues - 1) / kQ8BlockValues; }

// Bytes of a [rows, cols] matrix in `format` (q8: the int8 values and their fp32 block scales).
inline int64_t weight_bytes(int64_t rows, int64_t cols, WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return rows * cols * 4;
    case WeightFormat::kBF16: return rows * cols * 2;
    case WeightFormat::kQ8: return rows * cols + rows * q8_blocks_per_row(cols) * 4;
  }
  return 0;
}

inline size_t kv_element_bytes(KvFormat format) { return format == KvFormat::kF32 ? 4 : 2; }

// Lower-case names, as the command line and reports spell them: "f32", "bf16", "q8".
const char* format_name(WeightFormat format);
const char* format_name(KvFormat format);
// "f32" (or "fp32"), "bf16", "q8"; nullopt for anything else.
std::optional<WeightFormat> parse_weight_format(std::string_view name);
std::optional<KvFormat> parse_kv_format(std::string_view name);

}  // namespace gemma4rt
