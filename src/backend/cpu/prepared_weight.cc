#include "backend/cpu/prepared_weight.h"

#include <cstring>
#include <mutex>
#include <vector>
#include <string>

#include <fmt/format.h>

#include "backend/host/isa.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace gemma4rt::backend {
namespace {

// Conversions run row-parallel: a full-size checkpoint has billions of weights. Tasks of whole panels
// (kernels::pack_*_panels), so no two write the same 64-byte vectors.
constexpr int64_t kRowsPerTask = 64;
static_assert(kRowsPerTask % kernels::kQuantPanelRows == 0);

// Where the AVX-512 kernels run, q8 and q4 are stored in panels (matmul.h; one token's product 20-30%
// faster, a step of 8 sequences 20-30%: docs/benchmarks.md); below that, in the superblocks the AVX2
// kernels read.
bool panels_here() { return static_cast<int>(kernels::active_isa()) >= static_cast<int>(kernels::Isa::kAvx512); }

// Moves row-major q4 (in place from the map, or owned) into panels this weight owns.
void move_q4_to_panels(PreparedWeight& linear, ThreadPool& pool) {
  const int64_t rows = linear.matrix.rows, cols = linear.matrix.cols;
  const int64_t blocks = q4_blocks_per_row(cols), row_bytes = q4_row_bytes(cols);
  const auto* nibbles = static_cast<const uint8_t*>(linear.matrix.values);
  const uint16_t* half_scales = linear.matrix.half_scales;
  WeightBuffer<uint8_t> packed;
  packed.resize(static_cast<size_t>(kernels::q4_panel_bytes(rows, cols)));
  pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
    kernels::pack_q4_panels(nibbles + first * row_bytes, half_scales + first * blocks, first, last - first, rows, cols, packed.data());
  });
  linear.owned_q4 = std::move(packed);
  linear.owned_half_scales.resize(0);  // the panels hold their scales
  linear.matrix.values = linear.owned_q4.data();
  linear.matrix.half_scales = nullptr;
  linear.matrix.layout = kernels::QuantLayout::kPanels;
}

// A checkpoint's cached pages stay in the 4 KiB folios they were read in, whatever MappedFile advises
// (on the test VM /proc/meminfo's FilePmdMapped stayed 0), and a decode step streaming weights in place
// pays for a TLB entry and a prefetcher restart every 4 KiB: E2B in bf16 decoded 9.3-9.6 tok/s in place
// against 13.7-14.1 copied into huge pages, two threads (docs/benchmarks.md, "bf16 weights copied out of
// the map"). Weights under 1 MiB would not fill a huge page (WeightBuffer keeps them on ordinary
// memory), so they stay.
constexpr uint64_t kCopyFromBytes = uint64_t{1} << 20;

// The weight's own copy of its in-place values, if the budget allows one and the host still has the
// memory now (other processes may be loading beside this one), else it keeps the map's.
template <class T>
void copy_out_of_map(PreparedWeight& linear, WeightBuffer<T>& owned, size_t elements, uint64_t* copy_budget, ThreadPool& pool) {
  const uint64_t bytes = elements * sizeof(T);
  if (copy_budget == nullptr || bytes < kCopyFromBytes || bytes > *copy_budget) return;
  if (available_host_memory() < bytes + kHostMemoryReserve) return;
  try {
    owned.resize(elements, "a weight copied out of the checkpoint's map");
  } catch (const Error&) {
    return;  // no memory for it after all: the map's values serve
  }
  const auto* source = static_cast<const T*>(linear.matrix.values);
  const int64_t rows = linear.matrix.rows, cols = linear.matrix.cols;
  pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
    std::memcpy(owned.data() + first * cols, source + first * cols, static_cast<size_t>((last - first) * cols) * sizeof(T));
  });
  linear.matrix.values = owned.data();
  *copy_budget -= bytes;
}

PreparedWeight prepare_rows(const TensorView& view, WeightFormat format, ThreadPool& pool);

}  // namespace

PreparedWeight prepare_weight(const TensorView& view, WeightFormat format, ThreadPool& pool, uint64_t* copy_budget) {
  PreparedWeight linear = prepare_rows(view, format, pool);
  if (linear.matrix.values == view.data) {  // in place from the map
    const size_t elements = static_cast<size_t>(linear.matrix.rows * linear.matrix.cols);
    if (format == WeightFormat::kBF16) copy_out_of_map(linear, linear.owned_bf16, elements, copy_budget, pool);
    if (format == WeightFormat::kF32) copy_out_of_map(linear, linear.owned_f32, elements, copy_budget, pool);
  }
  if (format == WeightFormat::kQ4 && panels_here()) move_q4_to_panels(linear, pool);
  return linear;
}

namespace {

// The weight in the row-major layouts (q8: panels already where they apply).
PreparedWeight prepare_rows(const TensorView& view, WeightFormat format, ThreadPool& pool) {
  PreparedWeight linear;
  const int64_t rows = view.shape.at(0);
  const int64_t cols = view.element_count() / rows;
  linear.matrix.format = format;
  linear.matrix.rows = rows;
  linear.matrix.cols = cols;
  const size_t elements = static_cast<size_t>(rows) * cols;

  if (format == WeightFormat::kBF16 && view.dtype == DType::kBF16) {
    linear.matrix.values = view.data;  // in place, straight from the memory map
    return linear;
  }
  if (format == WeightFormat::kF32 && view.dtype == DType::kF32) {
    linear.matrix.values = view.data;
    return linear;
  }
  if (format == WeightFormat::kQ8 && panels_here()) {
    const int64_t blocks = q8_blocks_per_row(cols);
    linear.owned_q8.resize(static_cast<size_t>(kernels::q8_panel_bytes(rows, cols)));
    const bool stored_q8 = view.dtype == DType::kQ8;  // a checkpoint written by `gemma4rt quantize`
    pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
      if (stored_q8) {
        kernels::pack_q8_panels(reinterpret_cast<const int8_t*>(view.data) + first * cols, view.q8_scales + first * blocks, first,
                                last - first, rows, cols, linear.owned_q8.data());
        return;
      }
      std::vector<float> row(static_cast<size_t>(cols)), scales(static_cast<size_t>(blocks));
      std::vector<int8_t> values(static_cast<size_t>(cols));
      for (int64_t r = first; r < last; ++r) {
        view.read_floats(r * cols, cols, row.data());
        kernels::quantize_q8(row.data(), 1, cols, values.data(), scales.data());
        kernels::pack_q8_panels(values.data(), scales.data(), r, 1, rows, cols, linear.owned_q8.data());
      }
    });
    linear.matrix.values = linear.owned_q8.data();  // the panels hold their scales
    linear.matrix.layout = kernels::QuantLayout::kPanels;
    return linear;
  }
  if (format == WeightFormat::kQ8 && view.dtype == DType::kQ8) {  // a checkpoint written by `gemma4rt quantize`
    // The kernels' layout (pack_q8) is a copy; the scales are read in place unless the rows are
    // segment-major (pack_q8_scales).
    linear.owned_q8.resize(static_cast<size_t>(kernels::q8_packed_bytes(rows, cols)));
    const bool segmented = kernels::q8_segmented(cols);
    if (segmented) linear.owned_scales.resize(static_cast<size_t>(kernels::q8_packed_scale_count(rows, cols)));
    const auto* values = reinterpret_cast<const int8_t*>(view.data);
    const int64_t blocks = q8_blocks_per_row(cols);
    pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
      kernels::pack_q8(values + first * cols, first, last - first, cols, linear.owned_q8.data());
      if (segmented) kernels::pack_q8_scales(view.q8_scales + first * blocks, first, last - first, cols, linear.owned_scales.data());
    });
    linear.matrix.values = linear.owned_q8.data();
    linear.matrix.block_scales = segmented ? linear.owned_scales.data() : view.q8_scales;
    return linear;
  }
  if (format == WeightFormat::kQ4 && view.dtype == DType::kQ4) {
    linear.matrix.values = view.data;
    linear.matrix.half_scales = view.q4_scales;
    return linear;
  }
  switch (format) {
    case WeightFormat::kF32:
      linear.owned_f32.resize(elements);
      pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
        view.read_floats(first * cols, (last - first) * cols, linear.owned_f32.data() + first * cols);
      });
      linear.matrix.values = linear.owned_f32.data();
      break;
    case WeightFormat::kBF16:
      linear.owned_bf16.resize(elements);
      pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
        for (int64_t i = first * cols; i < last * cols; ++i) linear.owned_bf16[i] = float_to_bf16(view.at(i));
      });
      linear.matrix.values = linear.owned_bf16.data();
      break;
    case WeightFormat::kQ8: {
      const int64_t blocks = q8_blocks_per_row(cols);
      linear.owned_q8.resize(static_cast<size_t>(kernels::q8_packed_bytes(rows, cols)));
      linear.owned_scales.resize(static_cast<size_t>(kernels::q8_packed_scale_count(rows, cols)));
      pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
        std::vector<float> row(static_cast<size_t>(cols)), scales(static_cast<size_t>(blocks));
        std::vector<int8_t> values(static_cast<size_t>(cols));
        for (int64_t r = first; r < last; ++r) {
          view.read_floats(r * cols, cols, row.data());
          kernels::quantize_q8(row.data(), 1, cols, values.data(), scales.data());
          kernels::pack_q8(values.data(), r, 1, cols, linear.owned_q8.data());
          kernels::pack_q8_scales(scales.data(), r, 1, cols, linear.owned_scales.data());
        }
      });
      linear.matrix.values = linear.owned_q8.data();
      linear.matrix.block_scales = linear.owned_scales.data();
      break;
    }
    case WeightFormat::kQ4: {
      const int64_t blocks = q4_blocks_per_row(cols), row_bytes = q4_row_bytes(cols);
      linear.owned_q4.resize(static_cast<size_t>(rows * row_bytes));
      linear.owned_half_scales.resize(static_cast<size_t>(rows * blocks));
      // A worker thread must not throw: the first refused row is reported once all have finished.
      std::mutex mutex;
      std::string refused;
      pool.parallel_for(rows, kRowsPerTask, [&](int64_t first, int64_t last) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = first; r < last; ++r) {
          view.read_floats(r * cols, cols, row.data());
          try {
            kernels::quantize_q4(row.data(), 1, cols, linear.owned_q4.data() + r * row_bytes, linear.owned_half_scales.data() + r * blocks);
          } catch (const Error& error) {
            std::lock_guard<std::mutex> lock(mutex);
            if (refused.empty()) refused = fmt::format("{} row {}: {}", view.name, r, error.what());
            return;
          }
        }
      });
      if (!refused.empty()) fail("{}", refused);
      linear.matrix.values = linear.owned_q4.data();
      linear.matrix.half_scales = linear.owned_half_scales.data();
      break;
    }
  }
  return linear;
}

}  // namespace
}  // namespace gemma4rt::backend
