// A typed, shaped view of tensor bytes that live elsewhere (usually in a memory-mapped checkpoint).
// Views never own memory; the file or buffer they point into must outlive them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/formats.h"

namespace gemma4rt {

// kQ8: symmetric int8 with one float scale per 32 consecutive values of a row (the last dimension),
// as written by `gemma4rt quantize`.
enum class DType { kF32, kBF16, kF16, kQ8 };

inline size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kQ8: return 1;
    default: return 2;
  }
}

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kQ8: return "Q8";
  }
  return "?";
}

std::string shape_to_string(const std::vector<int64_t>& shape);

struct TensorView {
  std::string name;                 // full checkpoint key, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  const float* q8_scales = nullptr;  // kQ8 only: [rows][ceil(last dimension / 32)]

  bool empty() const { return data == nullptr; }
  int64_t element_count() const {
    int64_t count = 1;
    for (int64_t dimension : shape) count *= dimension;
    return count;
  }
  size_t size_bytes() const { return static_cast<size_t>(element_count()) * dtype_size_bytes(dtype); }

  // Element i (row-major), converted to float. The reference kernels read weights through this.
  float at(int64_t index) const {
    switch (dtype) {
      case DType::kF32: return reinterpret_cast<const float*>(data)[index];
      case DType::kBF16: return bf16_to_float(reinterpret_cast<const uint16_t*>(data)[index]);
      case DType::kF16: return f16_to_float(reinterpret_cast<const uint16_t*>(data)[index]);
      case DType::kQ8: {
        const int64_t columns = shape.back();
        const int64_t blocks = q8_blocks_per_row(columns);
        const int64_t row = index / columns;
        const int64_t block = (index % columns) / kQ8BlockValues;
        return static_cast<float>(reinterpret_cast<const int8_t*>(data)[index]) * q8_scales[row * blocks + block];
      }
    }
    return 0.0f;
  }
  // The index-th sub-tensor along the first dimension (e.g. one expert of a stacked expert tensor).
  TensorView slice(int64_t index) const {
    TensorView part;
    part.name = name;
    part.dtype = dtype;
    part.shape.assign(shape.begin() + 1, shape.end());
    part.data = data + static_cast<size_t>(index) * part.size_bytes();
    if (q8_scales != nullptr) {
      const int64_t columns = shape.back();
      const int64_t scales_per_part = part.element_count() / columns * q8_blocks_per_row(columns);
      part.q8_scales = q8_scales + index * scales_per_part;
    }
    return part;
  }
  // Copies `count` elements starting at `first` into `out` as floats.
  void read_floats(int64_t first, int64_t count, float* out) const;
};

}  // namespace gemma4rt
