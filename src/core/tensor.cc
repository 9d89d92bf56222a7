#include "core/tensor.h"

#include <cstring>

namespace gemma4rt {

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t index = 0; index < shape.size(); ++index) {
    if (index > 0) text += ", ";
    text += std::to_string(shape[index]);
  }
  return text + "]";
}

void TensorView::read_floats(int64_t first, int64_t count, float* out) const {
  if (dtype == DType::kF32) {
    std::memcpy(out, reinterpret_cast<const float*>(data) + first, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  for (int64_t index = 0; index < count; ++index) out[index] = at(first + index);
}

}  // namespace gemma4rt
