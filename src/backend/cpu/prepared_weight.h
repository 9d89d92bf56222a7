// A weight matrix prepared for the SIMD kernels in the chosen format. bf16 and f32 weights stored in
// that format are used in place from the memory map, and q4 ones below AVX-512; q8, and q4 where the
// AVX-512 kernels run, are repacked into the kernels' layout (panels where the AVX-512 kernels run,
// each block's scales inside them; q8 in superblocks below, the scales staying in place unless the rows are
// segment-major), and other combinations are converted once at load into storage this object owns.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cpu/kernels/matmul.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "core/weight_buffer.h"

namespace gemma4rt::backend {

struct PreparedWeight {
  kernels::WeightMatrix matrix;      // what the kernels read
  WeightBuffer<uint16_t> owned_bf16;
  WeightBuffer<float> owned_f32;
  WeightBuffer<uint8_t> owned_q8;   // pack_q8_panels' or pack_q8's layout
  WeightBuffer<float> owned_scales;  // q8 superblocks' segment-major scales (panels hold their own)
  WeightBuffer<uint8_t> owned_q4;   // row-major nibbles or pack_q4_panels' layout
  WeightBuffer<uint16_t> owned_half_scales;  // row-major q4's, quantised at load (panels hold their own)

  // Bytes one full pass over this weight reads.
  size_t read_bytes() const { return static_cast<size_t>(weight_bytes(matrix.rows, matrix.cols, matrix.format)); }
  // Bytes held here rather than in the memory map.
  size_t owned_bytes() const {
    return owned_bf16.size() * 2 + owned_f32.size() * 4 + owned_q8.size() + owned_scales.size() * 4 + owned_q4.size() +
           owned_half_scales.size() * 2;
  }
};

// Prepares `view` for the kernels in `format`; `pool` parallelises conversion and quantisation. A bf16
// or f32 weight of 1 MiB or more that the kernels could read in place from the checkpoint's map is
// copied into a huge-page buffer of its own instead while `copy_budget` (bytes) allows, and the budget
// shrinks by the copy; without a budget it stays in place.
PreparedWeight prepare_weight(const TensorView& view, WeightFormat format, ThreadPool& pool, uint64_t* copy_budget = nullptr);

}  // namespace gemma4rt::backend
