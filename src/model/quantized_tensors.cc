#include "model/quantized_tensors.h"

#include <fmt/format.h>

#include "core/formats.h"

namespace gemma4rt {

bool is_quantized_dtype(const std::string& dtype_name) { return dtype_name == "I8" || dtype_name == "U8"; }

std::vector<int64_t> stored_shape_of(const std::string& dtype_name, std::vector<int64_t> shape) {
  if (dtype_name == "U8" && !shape.empty()) shape.back() = q4_row_bytes(shape.back());
  return shape;
}

std::string q4_layout_problem(const StoredTensor& stored) {
  if (stored.metadata != nullptr) {
    const auto layout = stored.metadata->find(kQ4LayoutKey);
    if (layout != stored.metadata->end() && layout->second == kQ4Layout) return "";
  }
  const std::string file = stored.file != nullptr ? stored.file->string() : "its file";
  return fmt::format("q4 tensor {}: {} does not say it holds the q4 layout this gemma4rt reads (__metadata__ {} = {}); "
                     "it was written by an older gemma4rt quantize: quantize the original checkpoint again",
                     stored.name, file, kQ4LayoutKey, kQ4Layout);
}

std::string block_scales_problem(const Checkpoint& checkpoint, const StoredTensor& stored, const std::vector<int64_t>& shape) {
  const bool q4 = stored.dtype_name == "U8";
  const char* format = q4 ? "q4" : "q8";
  const char* scale_dtype = q4 ? "F16" : "F32";
  const std::string scale_name = stored.name + "_scale";
  const StoredTensor* scales = checkpoint.find(scale_name);
  if (scales == nullptr) return fmt::format("{} tensor {} has no block scales {}", format, stored.name, scale_name);
  std::vector<int64_t> expected = shape;
  if (!expected.empty()) expected.back() = q4 ? q4_blocks_per_row(expected.back()) : q8_blocks_per_row(expected.back());
  if (scales->dtype_name != scale_dtype || scales->shape != expected) {
    return fmt::format("{} block scales {} must be {} of shape {}, got {} {}", format, scale_name, scale_dtype, shape_to_string(expected),
                       scales->dtype_name, shape_to_string(scales->shape));
  }
  return "";
}

}  // namespace gemma4rt
