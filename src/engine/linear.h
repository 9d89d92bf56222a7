// A linear layer's weight prepared for the path that runs it: the stored view for the reference
// kernels, and for the fast kernels a matrix in the chosen format. bf16 and f32 weights stored in that
// format are used in place from the memory map; other combinations (q8, or a dtype change) are
// converted once at load into storage this object owns.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"

namespace gemma4rt {

using kernels::WeightFormat;

struct Linear {
  TensorView view;                   // as stored in the checkpoint ([out, in])
  kernels::WeightMatrix matrix;      // what the fast kernels read; rows == 0 when only the reference path runs
  std::vector<uint16_t> owned_bf16;
  std::vector<float> owned_f32;
  std::vector<int8_t> owned_q8;
  std::vector<float> owned_scales;

  int64_t rows() const { return view.shape[0]; }
  int64_t cols() const { return view.shape[1]; }
  // Bytes one full pass over this weight reads in its fast format.
  size_t fast_bytes() const;
};

// Prepares `view` for the fast kernels in `format`; `pool` parallelises conversion and quantisation.
Linear make_linear(const TensorView& view, WeightFormat format, ThreadPool& pool);
// A view-only Linear for the reference kernels.
Linear reference_linear(const TensorView& view);

const char* weight_format_name(WeightFormat format);

}  // namespace gemma4rt
