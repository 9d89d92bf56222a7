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

// kQ8: symmetric int8 with one float scale per 32 consecutive values of a row (the last dimension);
// kQ4: the nibbles of WeightFormat::kQ4 with f16 block scales. Both as written by `gemma4rt quantize`.
enum class DType { kF32, kBF16, kF16, kQ8, kQ4 };

// Bytes per element; kQ4 packs two per byte (plus row padding), so its sizes come from
// TensorView::size_bytes, never from this.
inline size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kQ8: return 1;
    case DType::kQ4: return 1;
    default: return 2;
  }
}

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kQ8: return "Q8";
    case DType::kQ4: return "Q4";
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
  const uint16_t* q4_scales = nullptr;  // kQ4 only: f16 [rows][q4_blocks_per_row(last dimension)]

  bool empty() const { return data == nullptr; }
  int64_t element_count() const {
    int64_t count = 1;
    for (int64_t dimension : shape) count *= dimension;
    return count;
  }
  size_t size_bytes() const {
    if (dtype == DType::kQ4) return static_cast<size_t>(element_count() / shape.back() * q4_row_bytes(shape.back()));
    return static_cast<size_t>(element_count()) * dtype_size_bytes(dtype);
  }

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
      case DType::kQ4: {
        const int64_t columns = shape.back();
        const int64_t row = index / columns, column = index % columns;
        const Q4NibbleAt at = q4_nibble_at(column, columns);
        const auto byte = static_cast<uint8_t>(data[row * q4_row_bytes(columns) + at.byte]);
        const int nibble = at.high ? (byte >> 4) : (byte & 0x0f);
        return static_cast<float>(nibble - 8) * f16_to_float(q4_scales[row * q4_blocks_per_row(columns) + column / kQ4BlockValues]);
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
    const int64_t part_rows = part.element_count() / shape.back();
    if (q8_scales != nullptr) part.q8_scales = q8_scales + index * part_rows * q8_blocks_per_row(shape.back());
    if (q4_scales != nullptr) part.q4_scales = q4_scales + index * part_rows * q4_blocks_per_row(shape.back());
    return part;
  }
  // Rows [first, first + count) along the first dimension: a view into the same memory.
  TensorView rows(int64_t first, int64_t count) const {
    TensorView part = *this;
    part.shape[0] = count;
    const int64_t row_elements = element_count() / shape[0];
    const int64_t matrix_rows = row_elements / shape.back();  // last-dimension rows per first-dimension row
    part.data = data + static_cast<size_t>(first) * (size_bytes() / static_cast<size_t>(shape[0]));
    if (q8_scales != nullptr) part.q8_scales = q8_scales + first * matrix_rows * q8_blocks_per_row(shape.back());
    if (q4_scales != nullptr) part.q4_scales = q4_scales + first * matrix_rows * q4_blocks_per_row(shape.back());
    return part;
  }
  // Copies `count` elements starting at `first` into `out` as floats.
  void read_floats(int64_t first, int64_t count, float* out) const;
};

}  // namespace gemma4rt
