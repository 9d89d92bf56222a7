// Fast matmul kernels: every instruction-set level this CPU runs, every weight format, shapes with
// tails, compared with a double-precision reference computed from the same rounded operands
// (bf16-rounded activations for bf16; dequantised q8 / q4 weights and q8 activations for q8 and q4).
//
// Tolerance: |y - reference| <= 2e-6 * sum_k |x_k| |w_k| (+1e-30 for all-zero rows). The operands are
// identical, so only fp32 rounding differs: every path sums in fp32 (SIMD paths over 8-16 lane vectors,
// scalar sequentially), and q8 rounds each block's w_scale * x_scale to fp32. The worst seen here is
// about 1.8e-7 (scalar, K = 6157) and 1.2e-7 for the SIMD paths, so the bound has a 10x margin.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "core/error.h"
#include "backend/host/isa.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/vector_ops.h"

namespace gemma4rt::kernels {
namespace {

constexpr double kRelativeTolerance = 2e-6;

std::vector<Isa> runnable_levels() {
  std::vector<Isa> levels;
  for (int level = 0; level <= static_cast<int>(detected_isa()); ++level) levels.push_back(static_cast<Isa>(level));
  return levels;
}

// Restores the active level when a test ends, whatever it forced.
class IsaGuard {
 public:
  IsaGuard() : saved_(active_isa()) {}
  ~IsaGuard() { set_active_isa(saved_); }

 private:
  Isa saved_;
};

std::vector<float> random_floats(std::mt19937& rng, size_t count, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

// A weight matrix in one format, with its values as the kernels see them (dequantised for q8).
struct TestWeights {
  WeightMatrix matrix;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<int8_t> q8;
  std::vector<float> scales;
  std::vector<uint8_t> q4;
  std::vector<uint16_t> half_scales;
  std::vector<uint8_t> q8_packed;  // what the kernels read (pack_q8_panels; pack_q8, pack_q8_scales)
  std::vector<float> q8_packed_scales;
  std::vector<uint8_t> q4_panels;  // pack_q4_panels
  std::vector<double> effective;  // [rows][cols]
};

// Weight (r, k) of a q4 matrix, decoded from the layout core/formats.h describes.
double q4_value(const TestWeights& weights, int64_t r, int64_t k) {
  const int64_t cols = weights.matrix.cols;
  // Superblocks of 512 values, 256 bytes (the last one: 16 bytes per block it has); value v of one:
  // block b = v / 32, column c = v % 32 / 4.
  const int64_t v = k % 512, b = v / 32, c = v % 32 / 4;
  const int64_t blocks_in_row = (cols + 31) / 32, lanes = std::min<int64_t>(16, blocks_in_row - k / 512 * 16);
  const uint8_t byte = weights.q4[r * blocks_in_row * 16 + k / 512 * 256 + 4 * lanes * (c / 2) + 4 * b + v % 4];
  const int code = c % 2 == 0 ? byte & 0x0f : byte >> 4;
  return static_cast<double>(code - 8) * f16_to_float(weights.half_scales[r * q4_blocks_per_row(cols) + k / 32]);
}

// A weight format and, for q8 and q4, the layout its kernels read (superblocks everywhere, panels where
// the AVX-512 kernels run; below AVX-512, panels take the scalar path).
struct WeightKind {
  WeightKind(WeightFormat format, QuantLayout layout = QuantLayout::kSuperblocks) : format(format), layout(layout) {}
  WeightFormat format;
  QuantLayout layout;
};
std::string kind_name(const WeightKind& kind) {
  return std::string(format_name(kind.format)) + (kind.layout == QuantLayout::kPanels ? " panels" : "");
}

TestWeights make_weights(const std::vector<float>& source, int64_t rows, int64_t cols, WeightKind kind) {
  const WeightFormat format = kind.format;
  TestWeights weights;
  weights.matrix.format = format;
  weights.matrix.rows = rows;
  weights.matrix.cols = cols;
  weights.effective.resize(source.size());
  switch (format) {
    case WeightFormat::kF32:
      weights.f32 = source;
      weights.matrix.values = weights.f32.data();
      for (size_t i = 0; i < source.size(); ++i) weights.effective[i] = source[i];
      break;
    case WeightFormat::kBF16:
      weights.bf16.resize(source.size());
      for (size_t i = 0; i < source.size(); ++i) {
        weights.bf16[i] = float_to_bf16(source[i]);
        weights.effective[i] = bf16_to_float(weights.bf16[i]);
      }
      weights.matrix.values = weights.bf16.data();
      break;
    case WeightFormat::kQ8: {
      const int64_t blocks = q8_blocks_per_row(cols);
      weights.q8.resize(source.size());
      weights.scales.resize(static_cast<size_t>(rows * blocks));
      quantize_q8(source.data(), rows, cols, weights.q8.data(), weights.scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < cols; ++k) {
          weights.effective[r * cols + k] =
              static_cast<double>(weights.q8[r * cols + k]) * weights.scales[r * blocks + k / kQ8BlockValues];
        }
      }
      if (kind.layout == QuantLayout::kPanels) {
        weights.q8_packed.resize(static_cast<size_t>(q8_panel_bytes(rows, cols)));
        // In two calls, as load's tasks do it.
        const int64_t split = rows / 2;
        pack_q8_panels(weights.q8.data(), weights.scales.data(), 0, split, rows, cols, weights.q8_packed.data());
        pack_q8_panels(weights.q8.data() + split * cols, weights.scales.data() + split * blocks, split, rows - split, rows, cols,
                       weights.q8_packed.data());
        weights.matrix.layout = QuantLayout::kPanels;
      } else {
        weights.q8_packed.resize(static_cast<size_t>(q8_packed_bytes(rows, cols)));
        weights.q8_packed_scales.resize(static_cast<size_t>(q8_packed_scale_count(rows, cols)));
        pack_q8(weights.q8.data(), 0, rows, cols, weights.q8_packed.data());
        pack_q8_scales(weights.scales.data(), 0, rows, cols, weights.q8_packed_scales.data());
      }
      weights.matrix.values = weights.q8_packed.data();
      weights.matrix.block_scales = weights.q8_packed_scales.data();
      break;
    }
    case WeightFormat::kQ4: {
      weights.q4.resize(static_cast<size_t>(rows * q4_row_bytes(cols)));
      weights.half_scales.resize(static_cast<size_t>(rows * q4_blocks_per_row(cols)));
      quantize_q4(source.data(), rows, cols, weights.q4.data(), weights.half_scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < cols; ++k) weights.effective[r * cols + k] = q4_value(weights, r, k);
      }
      weights.matrix.values = weights.q4.data();
      weights.matrix.half_scales = weights.half_scales.data();
      if (kind.layout == QuantLayout::kPanels) {
        weights.q4_panels.resize(static_cast<size_t>(q4_panel_bytes(rows, cols)));
        const int64_t split = rows / 2, blocks = q4_blocks_per_row(cols);
        pack_q4_panels(weights.q4.data(), weights.half_scales.data(), 0, split, rows, cols, weights.q4_panels.data());
        pack_q4_panels(weights.q4.data() + split * q4_row_bytes(cols), weights.half_scales.data() + split * blocks, split,
                       rows - split, rows, cols, weights.q4_panels.data());
        weights.matrix.values = weights.q4_panels.data();
        weights.matrix.half_scales = nullptr;  // the panels hold their scales
        weights.matrix.layout = QuantLayout::kPanels;
      }
      break;
    }
  }
  return weights;
}

// The activations the kernels multiply, from the prepared buffers (checked against the scalar
// conversions separately).
std::vector<double> effective_activations(const PreparedActivations& prepared) {
  const int64_t tokens = prepared.tokens(), cols = prepared.cols(), stride = prepared.stride();
  std::vector<double> values(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t at = t * stride + k;
      switch (prepared.format()) {
        case WeightFormat::kF32: values[t * cols + k] = prepared.f32_values()[at]; break;
        case WeightFormat::kBF16: values[t * cols + k] = bf16_to_float(prepared.bf16_values()[at]); break;
        case WeightFormat::kQ8:
        case WeightFormat::kQ4:
          values[t * cols + k] = static_cast<double>(prepared.q8_values()[at]) *
                                 prepared.q8_scales()[t * (stride / kQ8BlockValues) + k / kQ8BlockValues];
          break;
      }
    }
  }
  return values;
}

// The prepared operands must be exactly the scalar conversions of x.
void expect_prepared_matches_scalar(const std::vector<float>& x, int64_t tokens, int64_t cols,
                                    const PreparedActivations& prepared) {
  const int64_t stride = prepared.stride();
  ASSERT_GE(stride, cols);
  if (prepared.format() == WeightFormat::kQ8 || prepared.format() == WeightFormat::kQ4) {
    std::vector<int8_t> values(static_cast<size_t>(tokens * cols));
    std::vector<float> scales(static_cast<size_t>(tokens * q8_blocks_per_row(cols)));
    {
      IsaGuard guard;
      set_active_isa(Isa::kScalar);
      quantize_q8(x.data(), tokens, cols, values.data(), scales.data());
    }
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t k = 0; k < cols; ++k) ASSERT_EQ(prepared.q8_values()[t * stride + k], values[t * cols + k]);
      for (int64_t b = 0; b < q8_blocks_per_row(cols); ++b) {
        ASSERT_EQ(prepared.q8_scales()[t * (stride / kQ8BlockValues) + b], scales[t * q8_blocks_per_row(cols) + b]);
      }
    }
  } else if (prepared.format() == WeightFormat::kBF16) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t k = 0; k < cols; ++k) ASSERT_EQ(prepared.bf16_values()[t * stride + k], float_to_bf16(x[t * cols + k]));
    }
  } else {
    for (int64_t t = 0; t < tokens; ++t) {
      ASSERT_EQ(std::memcmp(prepared.f32_values() + t * stride, x.data() + t * cols, cols * sizeof(float)), 0);
    }
  }
}

constexpr float kSentinel = -12345.5f;

// Runs one matmul over [row_begin, row_end) at the active level and checks every output against the
// double reference and every element outside the range against the sentinel.
void check_matmul(std::mt19937& rng, int64_t tokens, int64_t rows, int64_t cols, WeightKind kind) {
  const WeightFormat format = kind.format;
  SCOPED_TRACE(testing::Message() << isa_name(active_isa()) << " " << kind_name(kind) << " tokens " << tokens
                                  << " rows " << rows << " cols " << cols);
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * cols));
  const TestWeights weights = make_weights(random_floats(rng, static_cast<size_t>(rows * cols), 0.05f), rows, cols, kind);
  PreparedActivations prepared;
  prepared.prepare(x.data(), tokens, cols, format);
  expect_prepared_matches_scalar(x, tokens, cols, prepared);
  const std::vector<double> xe = effective_activations(prepared);

  const int64_t y_stride = rows + 3;
  std::uniform_int_distribution<int64_t> pick_begin(0, rows - 1);
  const int64_t row_begin = pick_begin(rng);
  const int64_t row_end = std::uniform_int_distribution<int64_t>(row_begin + 1, rows)(rng);
  std::vector<float> y(static_cast<size_t>(tokens * y_stride), kSentinel);
  matmul(prepared, weights.matrix, y.data(), y_stride, row_begin, row_end);

  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < y_stride; ++r) {
      const float got = y[t * y_stride + r];
      if (r < row_begin || r >= row_end) {
        ASSERT_EQ(std::memcmp(&got, &kSentinel, sizeof(float)), 0) << "wrote outside the range at t " << t << " r " << r;
        continue;
      }
      double expected = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double product = xe[t * cols + k] * weights.effective[r * cols + k];
        expected += product;
        magnitude += std::fabs(product);
      }
      ASSERT_NEAR(got, expected, kRelativeTolerance * magnitude + 1e-30) << "t " << t << " r " << r;
    }
  }
}

struct Shape {
  int64_t rows, cols;
};

// Rows not a multiple of any tile (1..6 tokens x 2..4 rows), cols around every vector width.
const Shape kShapes[] = {{1, 1}, {5, 7}, {3, 31}, {13, 32}, {6, 33}, {9, 63}, {7, 64}, {11, 65},
                         {4, 100}, {17, 129}, {10, 200}, {23, 257}, {5, 1000}};
const int64_t kTokenCounts[] = {1, 2, 3, 7, 12, 16, 64, 130};  // 2-16: a decode step of that many sequences
const WeightKind kKinds[] = {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, {WeightFormat::kQ8, QuantLayout::kPanels},
                             WeightFormat::kQ4,  {WeightFormat::kQ4, QuantLayout::kPanels}};

TEST(Matmul, MatchesDoubleReferenceOnEveryPath) {
  IsaGuard guard;
  std::mt19937 rng(1234);
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const WeightKind& kind : kKinds) {
      for (int64_t tokens : kTokenCounts) {
        for (const Shape& shape : kShapes) {
          if (tokens * shape.rows * shape.cols > 2'000'000) continue;
          check_matmul(rng, tokens, shape.rows, shape.cols, kind);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(Matmul, LongRowsStayWithinTolerance) {
  IsaGuard guard;
  std::mt19937 rng(99);
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const WeightKind& kind : kKinds) {
      check_matmul(rng, 7, 37, 6144 + 13, kind);  // decode cuts these rows into K chunks
      check_matmul(rng, 16, 11, 6144 + 13, kind);  // two token tiles over K chunks
      check_matmul(rng, 21, 13, 6144 + 13, kind);  // prefill tiles over long rows
      check_matmul(rng, 37, 150, 1536 + 3, kind);  // bf16 prefill panels: two blocks of rows, an odd K
      check_matmul(rng, 530, 9, 70, kind);         // AVX2 bf16 prefill panels: two groups of tokens
      check_matmul(rng, 1, 19, 12288 + 5, kind);
      check_matmul(rng, 1, 70, 1536, kind);
      check_matmul(rng, 8, 13, 2048, kind);   // float rows 4 KiB apart: a step's stride gets half a page more
      check_matmul(rng, 16, 7, 6144, kind);   // the same over long rows, two token tiles
      if (HasFatalFailure()) return;
    }
  }
}

// The thread pool splits rows at arbitrary points: results must be bitwise identical to one call over
// all rows, whatever the split.
TEST(Matmul, RowSplitsGiveBitwiseIdenticalResults) {
  IsaGuard guard;
  std::mt19937 rng(7);
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const WeightKind& kind : kKinds) {
      const WeightFormat format = kind.format;
      // cols 161: every row at once; cols 4133: long rows cut into K chunks (f32 and bf16 from 5 tokens,
      // q8 and q4, whose chunks are longer, at 16; 24 tokens: prefill tiles over the whole of K).
      for (const auto& [tokens, cols] : {std::pair<int64_t, int64_t>{1, 161}, {5, 161}, {8, 161}, {13, 161},
                                        {5, 4133}, {8, 4133}, {16, 4133}, {24, 4133}}) {
        SCOPED_TRACE(testing::Message() << isa_name(level) << " " << kind_name(kind) << " tokens " << tokens
                                        << " cols " << cols);
        const int64_t rows = 203;
        const std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * cols));
        const TestWeights weights = make_weights(random_floats(rng, static_cast<size_t>(rows * cols)), rows, cols, kind);
        PreparedActivations prepared;
        prepared.prepare(x.data(), tokens, cols, format);
        std::vector<float> whole(static_cast<size_t>(tokens * rows));
        matmul(prepared, weights.matrix, whole.data(), rows, 0, rows);
        for (int trial = 0; trial < 6; ++trial) {
          std::vector<float> split(whole.size(), kSentinel);
          for (int64_t begin = 0; begin < rows;) {
            const int64_t end = std::min(rows, begin + std::uniform_int_distribution<int64_t>(1, 40)(rng));
            matmul(prepared, weights.matrix, split.data(), rows, begin, end);
            begin = end;
          }
          ASSERT_EQ(std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)), 0) << "trial " << trial;
        }
      }
    }
  }
}

// A prompt's gate and up products with GELU x up applied in the prefill tiles (gelu_gate_up) give
// bitwise what the two matmuls, gelu_tanh_multiply and the bf16 preparation of the product give, for
// K in one stretch (161, odd) and in two (6,201), widths that end inside a panel, index ranges split
// anywhere, and the rows' padding cleared. Below AVX-512 BF16, and for a decode step's 16 tokens, the
// call is refused.
TEST(Matmul, FusedGateUpGivesTheUnfusedBits) {
  IsaGuard guard;
  std::mt19937 rng(19);
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const auto& [tokens, cols, width] : {std::tuple<int64_t, int64_t, int64_t>{17, 161, 45}, {40, 161, 203},
                                              {23, 6201, 70}, {16, 161, 45}}) {
      SCOPED_TRACE(testing::Message() << isa_name(level) << " tokens " << tokens << " cols " << cols << " width " << width);
      const std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * cols));
      const TestWeights gate = make_weights(random_floats(rng, static_cast<size_t>(width * cols), 0.2f), width, cols, WeightFormat::kBF16);
      const TestWeights up = make_weights(random_floats(rng, static_cast<size_t>(width * cols), 0.2f), width, cols, WeightFormat::kBF16);
      PreparedActivations prepared;
      prepared.prepare(x.data(), tokens, cols, WeightFormat::kBF16);
      std::vector<float> gate_sums(static_cast<size_t>(tokens * width)), up_sums(gate_sums.size());
      PreparedActivations products;
      if (!gate_up_fusable(tokens, gate.matrix, up.matrix)) {
        EXPECT_TRUE(level < Isa::kAvx512Bf16 || tokens <= 16);
        products.reshape(tokens, width, WeightFormat::kBF16);
        EXPECT_THROW(gelu_gate_up(prepared, gate.matrix, up.matrix, gate_sums.data(), up_sums.data(), products, 0, width), Error);
        continue;
      }
      ASSERT_TRUE(level >= Isa::kAvx512Bf16 && tokens > 16);

      // The unfused way: both products as floats, GELU x up, then the preparation for down_proj.
      std::vector<float> gates(gate_sums.size()), ups(gate_sums.size()), unfused_values(gate_sums.size());
      matmul(prepared, gate.matrix, gates.data(), width, 0, width);
      matmul(prepared, up.matrix, ups.data(), width, 0, width);
      for (int64_t t = 0; t < tokens; ++t) {
        gelu_tanh_multiply(gates.data() + t * width, ups.data() + t * width, width, unfused_values.data() + t * width);
      }
      PreparedActivations unfused;
      unfused.prepare(unfused_values.data(), tokens, width, WeightFormat::kBF16);
      const size_t elements = static_cast<size_t>(tokens * unfused.stride());

      for (const int64_t split : {width, int64_t{13}, int64_t{32}}) {
        SCOPED_TRACE(testing::Message() << "split at " << split);
        // Fill the buffer's padding with non-zero values first: a stride's worth of ones, then reshaped.
        const std::vector<float> ones(static_cast<size_t>(tokens * unfused.stride()), 1.0f);
        products.prepare(ones.data(), tokens, unfused.stride(), WeightFormat::kBF16);
        products.reshape(tokens, width, WeightFormat::kBF16);
        ASSERT_EQ(products.stride(), unfused.stride());
        gelu_gate_up(prepared, gate.matrix, up.matrix, gate_sums.data(), up_sums.data(), products, 0, split);
        gelu_gate_up(prepared, gate.matrix, up.matrix, gate_sums.data(), up_sums.data(), products, split, width);
        EXPECT_EQ(std::memcmp(products.bf16_values(), unfused.bf16_values(), elements * sizeof(uint16_t)), 0);
      }
    }
  }
}

// A decode step of several sequences must give each one the bits it gets alone: every token of a
// product of up to 16 tokens (multi-token tiles) equals the same token's product alone (the single-row
// GEMV), on rows short enough for one pass over K and long enough to be cut into K chunks.
TEST(Matmul, EachTokenOfABatchGetsTheBitsItGetsAlone) {
  IsaGuard guard;
  std::mt19937 rng(17);
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const WeightKind& kind : kKinds) {
      const WeightFormat format = kind.format;
      for (const int64_t cols : {int64_t{161}, int64_t{1536}, int64_t{2048}, int64_t{12288 + 5}}) {
        const int64_t rows = 29;
        const TestWeights weights = make_weights(random_floats(rng, static_cast<size_t>(rows * cols)), rows, cols, kind);
        for (const int64_t tokens : {2, 3, 5, 8, 11, 16}) {
          SCOPED_TRACE(testing::Message() << isa_name(level) << " " << kind_name(kind) << " tokens " << tokens
                                          << " cols " << cols);
          const std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * cols));
          PreparedActivations prepared;
          prepared.prepare(x.data(), tokens, cols, format);
          std::vector<float> batched(static_cast<size_t>(tokens * rows));
          matmul(prepared, weights.matrix, batched.data(), rows, 0, rows);
          for (int64_t t = 0; t < tokens; ++t) {
            PreparedActivations single;
            single.prepare(x.data() + t * cols, 1, cols, format);
            std::vector<float> alone(static_cast<size_t>(rows));
            matmul(single, weights.matrix, alone.data(), rows, 0, rows);
            ASSERT_EQ(std::memcmp(alone.data(), batched.data() + t * rows, alone.size() * sizeof(float)), 0) << "token " << t;
          }
        }
      }
    }
  }
}

// Kernels with two ways (detail::kernel_way: one token's long rows whole or in K chunks, one token's
// q8/q4 panels without or with a prefetch, a step's panels prefetching into L2 or L1) run whichever a
// thread measured faster: the two must give the same bits, within the tolerance.
TEST(Matmul, BothWaysOfATwoWayKernelGiveTheSameBits) {
  IsaGuard guard;
  struct WayGuard {
    ~WayGuard() { detail::set_kernel_way(detail::KernelWay::kMeasure); }
  } way_guard;
  std::mt19937 rng(23);
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const WeightKind& kind : kKinds) {
      // 1,536: one token's panels (q8, q4); long rows, cut into chunks in the second way, once the
      // activations pass 16 KiB (bf16 past 8,192 values, f32 past 4,096) or, in superblocks, 32 KiB
      // (q8 and q4 past 26,214). 11 tokens: a step's panels, a tile of 8 that prefetches and one of 3.
      for (const int64_t cols : {int64_t{1536}, int64_t{6144 + 13}, int64_t{12288 + 5}, int64_t{32768 + 7}}) {
        for (const int64_t tokens : {int64_t{1}, int64_t{11}}) {
          SCOPED_TRACE(testing::Message() << isa_name(level) << " " << kind_name(kind) << " cols " << cols << " tokens " << tokens);
          const int64_t rows = 37;
          const TestWeights weights = make_weights(random_floats(rng, static_cast<size_t>(rows * cols)), rows, cols, kind);
          const std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * cols));
          PreparedActivations prepared;
          prepared.prepare(x.data(), tokens, cols, kind.format);
          std::vector<float> first(static_cast<size_t>(tokens * rows)), second(static_cast<size_t>(tokens * rows));
          detail::set_kernel_way(detail::KernelWay::kFirst);
          matmul(prepared, weights.matrix, first.data(), rows, 0, rows);
          detail::set_kernel_way(detail::KernelWay::kSecond);
          matmul(prepared, weights.matrix, second.data(), rows, 19, rows);  // ranges that start inside a block or panel
          matmul(prepared, weights.matrix, second.data(), rows, 0, 19);
          ASSERT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
          check_matmul(rng, tokens, rows, cols, kind);  // and the second way within the tolerance
          detail::set_kernel_way(detail::KernelWay::kFirst);
          check_matmul(rng, tokens, rows, cols, kind);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(Matmul, QuantizeRoundTripWithinHalfAStep) {
  IsaGuard guard;
  std::mt19937 rng(5);
  const int64_t rows = 9, cols = 211;  // a short last block
  std::vector<float> source = random_floats(rng, static_cast<size_t>(rows * cols), 3.0f);
  source[5] = 0.0f;
  source[40] = -1e-30f;  // tiny values next to normal ones
  const int64_t blocks = q8_blocks_per_row(cols);
  std::vector<int8_t> scalar_values(source.size());
  std::vector<float> scalar_scales(static_cast<size_t>(rows * blocks));
  set_active_isa(Isa::kScalar);
  quantize_q8(source.data(), rows, cols, scalar_values.data(), scalar_scales.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const float scale = scalar_scales[r * blocks + k / kQ8BlockValues];
      const int value = scalar_values[r * cols + k];
      ASSERT_LE(std::abs(value), 127);
      const double error = std::fabs(static_cast<double>(source[r * cols + k]) - static_cast<double>(value) * scale);
      ASSERT_LE(error, scale * 0.5 * (1.0 + 1e-6)) << "r " << r << " k " << k;
    }
    for (int64_t b = 0; b < blocks; ++b) {  // the largest magnitude maps to +-127 exactly
      int largest = 0;
      for (int64_t k = b * kQ8BlockValues; k < std::min(cols, (b + 1) * kQ8BlockValues); ++k) {
        largest = std::max(largest, std::abs(static_cast<int>(scalar_values[r * cols + k])));
      }
      ASSERT_EQ(largest, 127);
    }
  }
  // Every SIMD level quantises bit-identically (weights and activations use the same routine).
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    std::vector<int8_t> values(source.size());
    std::vector<float> scales(scalar_scales.size());
    quantize_q8(source.data(), rows, cols, values.data(), scales.data());
    EXPECT_EQ(values, scalar_values) << isa_name(level);
    EXPECT_EQ(std::memcmp(scales.data(), scalar_scales.data(), scales.size() * sizeof(float)), 0) << isa_name(level);
  }
}

TEST(Matmul, AllZeroBlocksGiveZerosNotNan) {
  IsaGuard guard;
  std::mt19937 rng(11);
  const int64_t tokens = 3, rows = 6, cols = 96;
  std::vector<float> weights = random_floats(rng, static_cast<size_t>(rows * cols));
  std::fill(weights.begin(), weights.begin() + cols, 0.0f);                  // row 0 entirely zero
  std::fill(weights.begin() + 2 * cols + 32, weights.begin() + 2 * cols + 64, 0.0f);  // one zero block
  std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * cols));
  std::fill(x.begin(), x.begin() + cols, 0.0f);  // token 0 entirely zero
  std::fill(x.begin() + cols + 64, x.begin() + 2 * cols, 0.0f);  // token 1's last block zero
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    for (const WeightKind kind : {WeightKind{WeightFormat::kQ8}, WeightKind{WeightFormat::kQ8, QuantLayout::kPanels},
                                  WeightKind{WeightFormat::kQ4}, WeightKind{WeightFormat::kQ4, QuantLayout::kPanels}}) {
      const TestWeights weights_here = make_weights(weights, rows, cols, kind);
      if (kind.format == WeightFormat::kQ8) {
        EXPECT_EQ(weights_here.scales[0], 0.0f);
        EXPECT_EQ(weights_here.scales[2 * 3 + 1], 0.0f);
        for (int64_t k = 0; k < cols; ++k) EXPECT_EQ(weights_here.q8[k], 0);
      } else {
        EXPECT_EQ(weights_here.half_scales[0], 0);
        EXPECT_EQ(weights_here.half_scales[2 * 3 + 1], 0);
      }
      PreparedActivations prepared;
      prepared.prepare(x.data(), tokens, cols, kind.format);
      EXPECT_EQ(prepared.q8_scales()[0], 0.0f);
      std::vector<float> y(static_cast<size_t>(tokens * rows), kSentinel);
      matmul(prepared, weights_here.matrix, y.data(), rows, 0, rows);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const float value = y[t * rows + r];
          EXPECT_TRUE(std::isfinite(value)) << isa_name(level) << " " << kind_name(kind) << " t " << t << " r " << r;
          if (t == 0 || r == 0) {
            EXPECT_EQ(value, 0.0f) << isa_name(level) << " " << kind_name(kind) << " t " << t << " r " << r;
          }
        }
      }
    }
  }
}

// The largest products q4 allows, everywhere: codes 15 (q = 7) against activations of +-127. The AVX2
// kernel adds a half superblock's eight vpmaddubsw results in int16 lanes (8 * 3,810 = 30,480), so
// this is where a wider int16 sum would wrap. Each block: one -8 (its extreme, scale 1) and 31 sevens.
TEST(Matmul, Q4LargestProductsDoNotWrap) {
  IsaGuard guard;
  const int64_t rows = 3, cols = 1024 + 96;  // two full superblocks and a partial one
  std::vector<float> weights(static_cast<size_t>(rows * cols), 7.0f);
  for (int64_t i = 0; i < rows * cols; i += kQ4BlockValues) weights[static_cast<size_t>(i)] = -8.0f;
  const double block_sum = -8.0 + 31 * 7.0;
  for (int64_t tokens : {1, 5}) {
    std::vector<float> x(static_cast<size_t>(tokens * cols));
    for (int64_t t = 0; t < tokens; ++t) std::fill(x.begin() + t * cols, x.begin() + (t + 1) * cols, t % 2 == 0 ? 1.0f : -1.0f);
    for (Isa level : runnable_levels()) {
      set_active_isa(level);
      for (QuantLayout layout : {QuantLayout::kSuperblocks, QuantLayout::kPanels}) {
        const TestWeights q4 = make_weights(weights, rows, cols, {WeightFormat::kQ4, layout});
        PreparedActivations prepared;
        prepared.prepare(x.data(), tokens, cols, WeightFormat::kQ4);
        std::vector<float> y(static_cast<size_t>(tokens * rows), kSentinel);
        matmul(prepared, q4.matrix, y.data(), rows, 0, rows);
        for (int64_t t = 0; t < tokens; ++t) {
          const double expected = (t % 2 == 0 ? 1.0 : -1.0) * block_sum * (cols / kQ4BlockValues);
          for (int64_t r = 0; r < rows; ++r) {
            EXPECT_NEAR(y[t * rows + r], expected, 1e-5 * std::fabs(expected))
                << isa_name(level) << " " << kind_name({WeightFormat::kQ4, layout}) << " tokens " << tokens << " t " << t << " r " << r;
          }
        }
      }
    }
  }
}

TEST(Matmul, Bf16PreparationRoundsLikeTheScalarConversion) {
  IsaGuard guard;
  std::vector<float> x = {1.0f, -2.5f, 1.00390625f /* tie, even down */, 1.01171875f /* tie, odd up */,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 1e-40f /* subnormal */, -0.0f,
                          std::numeric_limits<float>::max(), 3.3895314e38f /* rounds to infinity */};
  std::mt19937 rng(3);
  const std::vector<float> more = random_floats(rng, 45, 100.0f);
  x.insert(x.end(), more.begin(), more.end());
  const int64_t cols = static_cast<int64_t>(x.size());
  for (Isa level : runnable_levels()) {
    set_active_isa(level);
    PreparedActivations prepared;
    prepared.prepare(x.data(), 1, cols, WeightFormat::kBF16);
    for (int64_t k = 0; k < cols; ++k) {
      EXPECT_EQ(prepared.bf16_values()[k], float_to_bf16(x[k])) << isa_name(level) << " k " << k;
    }
    for (int64_t k = cols; k < prepared.stride(); ++k) EXPECT_EQ(prepared.bf16_values()[k], 0) << "padding";
  }
}

// A decode step's float rows never lie a multiple of 4 KiB apart (they would share L1 sets), and the
// padding that keeps them apart is zero; prompts and quantised formats keep their plain stride.
TEST(Matmul, StepRowsAvoidPageAlignedStrides) {
  std::mt19937 rng(5);
  for (const auto& [format, element_bytes] : {std::pair{WeightFormat::kBF16, 2}, std::pair{WeightFormat::kF32, 4}}) {
    for (int64_t cols : {1536, 2048, 6144, 12288}) {
      const std::vector<float> x = random_floats(rng, static_cast<size_t>(8 * cols));
      PreparedActivations step;
      step.prepare(x.data(), 8, cols, format);
      EXPECT_NE(step.stride() * element_bytes % 4096, 0) << format_name(format) << " cols " << cols;
      expect_prepared_matches_scalar(x, 8, cols, step);  // also asserts stride >= cols
      for (int64_t t = 0; t < 8; ++t) {
        for (int64_t k = cols; k < step.stride(); ++k) {
          const bool zero = format == WeightFormat::kBF16 ? step.bf16_values()[t * step.stride() + k] == 0
                                                          : step.f32_values()[t * step.stride() + k] == 0.0f;
          ASSERT_TRUE(zero) << "padding of token " << t << " at " << k;
        }
      }
    }
    PreparedActivations prompt;
    prompt.reshape(64, 2048, format);
    EXPECT_EQ(prompt.stride(), 2048) << "a prompt's rows are not padded";
  }
  PreparedActivations quantized;
  quantized.reshape(8, 2048, WeightFormat::kQ8);
  EXPECT_EQ(quantized.stride(), 2048);
}

TEST(Matmul, PreparedBuffersOnlyGrow) {
  std::mt19937 rng(4);
  const std::vector<float> x = random_floats(rng, 8 * 640);
  PreparedActivations prepared;
  prepared.prepare(x.data(), 8, 640, WeightFormat::kQ8);
  const int8_t* values = prepared.q8_values();
  const float* scales = prepared.q8_scales();
  prepared.prepare(x.data(), 1, 640, WeightFormat::kQ8);
  prepared.prepare(x.data(), 2, 300, WeightFormat::kBF16);
  prepared.prepare(x.data(), 8, 640, WeightFormat::kQ8);
  EXPECT_EQ(prepared.q8_values(), values);
  EXPECT_EQ(prepared.q8_scales(), scales);
  EXPECT_EQ(prepared.tokens(), 8);
  EXPECT_EQ(prepared.cols(), 640);
}

TEST(Matmul, WeightMatrixFromViews) {
  std::vector<uint16_t> bf16(2 * 3 * 4, 0x3f80);
  TensorView view;
  view.name = "experts";
  view.dtype = DType::kBF16;
  view.shape = {2, 3, 4};
  view.data = reinterpret_cast<const std::byte*>(bf16.data());
  EXPECT_THROW(weight_matrix(view), Error);  // 3-D: slice first
  const WeightMatrix second = weight_matrix(view.slice(1));
  EXPECT_EQ(second.format, WeightFormat::kBF16);
  EXPECT_EQ(second.rows, 3);
  EXPECT_EQ(second.cols, 4);
  EXPECT_EQ(second.values, bf16.data() + 12);

  std::vector<float> f32(6, 1.0f);
  view.dtype = DType::kF32;
  view.shape = {2, 3};
  view.data = reinterpret_cast<const std::byte*>(f32.data());
  const WeightMatrix matrix = weight_matrix(view);
  EXPECT_EQ(matrix.format, WeightFormat::kF32);
  EXPECT_EQ(matrix.values, f32.data());

  view.dtype = DType::kF16;
  EXPECT_THROW(weight_matrix(view), Error);
}

// The q4 layout written out by hand: a row of 600 values is one superblock of 512 and a last one of 3
// blocks (88 values: the last block padded with code 8, i.e. zero). Block 0 has codes 0..15 (its
// largest value is negative), block 1 the same with a positive largest value, so their scales differ
// in sign. Byte 64 p + 4 b + i of a full superblock holds value 32 b + 8 p + i of block b in its low
// nibble and value 32 b + 8 p + 4 + i in its high nibble; in the last one 4 * 3 replaces 64.
TEST(Matmul, Q4LayoutIsTheDocumentedOne) {
  const int64_t cols = 600;
  std::vector<float> row(cols);
  for (int64_t k = 0; k < 32; ++k) row[k] = static_cast<float>(k % 16 - 8) * 0.25f;        // m = -2: scale 0.25
  for (int64_t k = 32; k < 64; ++k) row[k] = -static_cast<float>(k % 16 - 8) * 0.25f;      // m = 2: scale -0.25
  for (int64_t k = 64; k < cols; ++k) row[k] = static_cast<float>(k % 16 - 8) * 1.0f;      // m = -8: scale 1
  std::vector<uint8_t> packed(static_cast<size_t>(q4_row_bytes(cols)));
  std::vector<uint16_t> scales(static_cast<size_t>(q4_blocks_per_row(cols)));
  ASSERT_EQ(packed.size(), 256u + 48u);
  ASSERT_EQ(scales.size(), 19u);
  quantize_q4(row.data(), 1, cols, packed.data(), scales.data());
  EXPECT_EQ(scales[0], 0x3400);  // 0.25
  EXPECT_EQ(scales[1], 0xB400);  // -0.25
  for (int b = 2; b < 19; ++b) EXPECT_EQ(scales[b], 0x3C00) << "block " << b;  // 1
  auto code = [](int64_t k) { return k < cols ? static_cast<int>(k % 16) : 8; };
  for (int j = 0; j < 256; ++j) {
    const int p = j / 64, b = j % 64 / 4, i = j % 4;
    EXPECT_EQ(packed[j], code(32 * b + 8 * p + i) | code(32 * b + 8 * p + 4 + i) << 4) << "byte " << j;
  }
  for (int j = 0; j < 48; ++j) {
    const int p = j / 12, b = j % 12 / 4, i = j % 4;
    EXPECT_EQ(packed[256 + j], code(512 + 32 * b + 8 * p + i) | code(512 + 32 * b + 8 * p + 4 + i) << 4) << "byte " << 256 + j;
  }

  // TensorView::at decodes the same layout.
  TensorView view;
  view.name = "w";
  view.dtype = DType::kQ4;
  view.shape = {1, cols};
  view.data = reinterpret_cast<const std::byte*>(packed.data());
  view.q4_scales = scales.data();
  EXPECT_EQ(view.size_bytes(), 304u);
  for (int64_t k = 0; k < cols; ++k) EXPECT_EQ(view.at(k), row[k]) << "k " << k;
  const WeightMatrix matrix = weight_matrix(view);
  EXPECT_EQ(matrix.format, WeightFormat::kQ4);
  EXPECT_EQ(matrix.half_scales, scales.data());
}

// pack_q8 written out by hand: a row of 600 values is a superblock of 16 blocks and a last one of 3
// (the last block padded with value 0, i.e. byte 128). Byte 64 c + 4 b + i of a full superblock holds
// value 32 b + 4 c + i + 128; in the last one 4 * 3 replaces 64.
TEST(Matmul, Q8PackIsTheDocumentedOne) {
  const int64_t cols = 600;
  std::vector<int8_t> row(cols);
  for (int64_t k = 0; k < cols; ++k) row[k] = static_cast<int8_t>(k % 255 - 127);
  std::vector<uint8_t> packed(static_cast<size_t>(q8_packed_row_bytes(cols)));
  ASSERT_EQ(packed.size(), 512u + 96u);
  pack_q8(row.data(), 0, 1, cols, packed.data());
  auto byte = [&](int64_t k) { return k < cols ? static_cast<int>(row[k]) + 128 : 128; };
  for (int j = 0; j < 512; ++j) EXPECT_EQ(packed[j], byte(32 * (j % 64 / 4) + 4 * (j / 64) + j % 4)) << "byte " << j;
  for (int j = 0; j < 96; ++j) EXPECT_EQ(packed[512 + j], byte(512 + 32 * (j % 12 / 4) + 4 * (j / 12) + j % 4)) << "byte " << 512 + j;
}

// Panels written out by hand: 18 rows of 40 values are two panels of 16 rows (the second holding rows
// 16 and 17, then 14 padding rows) over two blocks (40 values padded to 64). A panel's block is 576
// bytes: byte 64 c + 4 i + j holds value 4 c + j of its row i, + 128, for c < 8, then the 16 rows'
// f32 scales.
TEST(Matmul, Q8PanelsAreTheDocumentedOnes) {
  const int64_t rows = 18, cols = 40;
  ASSERT_EQ(q8_panel_bytes(rows, cols), 2 * 2 * 576);
  std::vector<int8_t> values(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) values[i] = static_cast<int8_t>((i * 7) % 255 - 127);
  std::vector<float> scales(static_cast<size_t>(rows * 2));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<float>(i + 1);
  std::vector<uint8_t> packed(2 * 2 * 576, 7);  // whatever was there before must be overwritten
  pack_q8_panels(values.data(), scales.data(), 0, 17, rows, cols, packed.data());
  pack_q8_panels(values.data() + 17 * cols, scales.data() + 17 * 2, 17, 1, rows, cols, packed.data());
  EXPECT_EQ(packed[0], values[0] + 128);                                     // row 0, value 0
  EXPECT_EQ(packed[64 + 4 * 3 + 2], values[3 * cols + 6] + 128);             // row 3, value 6
  EXPECT_EQ(packed[1152 + 576 + 64 + 4 * 1 + 3], values[17 * cols + 39] + 128);  // row 17, value 39
  EXPECT_EQ(packed[1152 + 576 + 128 + 4 * 1], 128);                          // row 17, value 40: padding
  auto scale_at = [&](int64_t byte) {
    float scale;
    std::memcpy(&scale, packed.data() + byte, sizeof(scale));
    return scale;
  };
  EXPECT_EQ(scale_at(1152 + 576 + 512 + 4 * 1), scales[17 * 2 + 1]);  // row 17, block 1
  for (int64_t panel = 0; panel < 2; ++panel) {
    for (int64_t block = 0; block < 2; ++block) {
      const int64_t start = 1152 * panel + 576 * block;
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t r = 16 * panel + i;
        for (int64_t c = 0; c < 8; ++c) {
          for (int64_t j = 0; j < 4; ++j) {
            const int64_t k = 32 * block + 4 * c + j;
            const int expected = r < rows && k < cols ? values[r * cols + k] + 128 : 128;
            ASSERT_EQ(packed[start + 64 * c + 4 * i + j], expected) << "row " << r << " value " << k;
          }
        }
        ASSERT_EQ(scale_at(start + 512 + 4 * i), r < rows ? scales[r * 2 + block] : 0.0f) << "row " << r << " block " << block;
      }
    }
  }
}

// Long panels (more than 64 blocks) written out by hand: 80 rows of 3,112 values (98 blocks) are 5
// panels of 56,448 bytes, in segments of 48 blocks (27,648 bytes) and a last one of 2 (1,152). Panels
// 0-3 are a group: each one's first segment, one panel after another, then each one's second, then
// each one's last. Panel 4 is a group of its own. Within a segment the bytes are as in a short panel.
TEST(Matmul, LongQ8PanelsAreGroupedSegmentMajor) {
  const int64_t rows = 80, cols = 3112, blocks = 98;
  ASSERT_EQ(q8_blocks_per_row(cols), blocks);
  ASSERT_EQ(q8_panel_bytes(rows, cols), 5 * 56448);
  std::vector<int8_t> values(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) values[i] = static_cast<int8_t>((i * 7) % 255 - 127);
  std::vector<float> scales(static_cast<size_t>(rows * blocks));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<float>(i + 1);
  std::vector<uint8_t> packed(5 * 56448, 7);
  pack_q8_panels(values.data(), scales.data(), 0, 37, rows, cols, packed.data());  // in two calls, as load's tasks do it
  pack_q8_panels(values.data() + 37 * cols, scales.data() + 37 * blocks, 37, rows - 37, rows, cols, packed.data());
  auto address = [](int64_t panel, int64_t local) -> int64_t {  // local: the byte's place in a short panel
    const int64_t group_start = panel < 4 ? 0 : 4 * 56448, members = panel < 4 ? 4 : 1, i = panel % 4;
    const int64_t segment = local / 27648, length = segment < 2 ? 27648 : 1152;
    return group_start + 27648 * segment * members + length * i + local % 27648;
  };
  EXPECT_EQ(packed[4 * 55296 + 1152 + 4 * 4 + 1], values[20 * cols + 3073] + 128);  // row 20, value 3,073 (block 96)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t local = k / 32 * 576 + k % 32 / 4 * 64 + r % 16 * 4 + k % 4;
      ASSERT_EQ(packed[address(r / 16, local)], values[r * cols + k] + 128) << "row " << r << " value " << k;
    }
    for (int64_t b = 0; b < blocks; ++b) {
      float scale;
      std::memcpy(&scale, packed.data() + address(r / 16, b * 576 + 512 + r % 16 * 4), sizeof(scale));
      ASSERT_EQ(scale, scales[r * blocks + b]) << "row " << r << " block " << b;
    }
  }
}

// q4 panels written out by hand: 18 rows of 40 values (two blocks, the second padded with q = 0) are two
// panels of 16 rows. A panel's blocks go in pairs of 576 bytes: each block's 4 vectors (byte 64 c + 4 i + j
// holds values 8 c + j, low nibble, and 8 c + 4 + j, high, of its row i, as q + 8), then the 16 rows'
// f16 scales of the first block, then of the second.
TEST(Matmul, Q4PanelsAreTheDocumentedOnes) {
  const int64_t rows = 18, cols = 40;
  ASSERT_EQ(q4_panel_bytes(rows, cols), 2 * 576);
  std::vector<float> source(static_cast<size_t>(rows * cols));
  // q = (i * 5) % 16 - 8 at value i; block 0 with scale 1, block 1 with scale 2 (each block's largest
  // magnitude is 8 times its scale, at its first value).
  auto block_scale = [](int64_t k) { return k < 32 ? 1.0f : 2.0f; };
  for (int64_t i = 0; i < rows * cols; ++i) source[i] = static_cast<float>((i * 5) % 16 - 8) * block_scale(i % cols);
  for (int64_t r = 0; r < rows; ++r) source[r * cols] = -8.0f;
  for (int64_t r = 0; r < rows; ++r) source[r * cols + 32] = -16.0f;
  std::vector<uint8_t> nibbles(static_cast<size_t>(rows * q4_row_bytes(cols)));
  std::vector<uint16_t> scales(static_cast<size_t>(rows * 2));
  quantize_q4(source.data(), rows, cols, nibbles.data(), scales.data());
  ASSERT_EQ(f16_to_float(scales[0]), 1.0f);
  ASSERT_EQ(f16_to_float(scales[1]), 2.0f);
  std::vector<uint8_t> packed(2 * 576, 7);  // whatever was there before must be overwritten
  pack_q4_panels(nibbles.data(), scales.data(), 0, 17, rows, cols, packed.data());
  pack_q4_panels(nibbles.data() + 17 * q4_row_bytes(cols), scales.data() + 17 * 2, 17, 1, rows, cols, packed.data());
  auto code = [&](int64_t r, int64_t k) { return r < rows && k < cols ? static_cast<int>(source[r * cols + k] / block_scale(k)) + 8 : 8; };
  auto scale_at = [&](int64_t byte) { return static_cast<uint16_t>(packed[byte] | packed[byte + 1] << 8); };
  EXPECT_EQ(packed[0], code(0, 0) | code(0, 4) << 4);                          // row 0, values 0 and 4
  EXPECT_EQ(packed[64 + 4 * 3 + 2], code(3, 10) | code(3, 14) << 4);           // row 3, values 10 and 14
  EXPECT_EQ(packed[576 + 256 + 4 * 1 + 3], code(17, 35) | code(17, 39) << 4);  // row 17, values 35 and 39
  EXPECT_EQ(packed[576 + 256 + 64 + 4 * 1], 0x88);                             // row 17, values 40 and 44: padding
  EXPECT_EQ(scale_at(576 + 512 + 32 + 2 * 1), scales[17 * 2 + 1]);             // row 17, block 1
  for (int64_t panel = 0; panel < 2; ++panel) {
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t r = 16 * panel + i;
      for (int64_t block = 0; block < 2; ++block) {
        for (int64_t c = 0; c < 4; ++c) {
          for (int64_t j = 0; j < 4; ++j) {
            const int64_t k = 32 * block + 8 * c + j;
            ASSERT_EQ(packed[576 * panel + 256 * block + 64 * c + 4 * i + j], code(r, k) | code(r, k + 4) << 4) << "row " << r << " values " << k;
          }
        }
        ASSERT_EQ(scale_at(576 * panel + 512 + 32 * block + 2 * i), r < rows ? scales[r * 2 + block] : 0) << "row " << r << " block " << block;
      }
    }
  }
}

// An odd number of blocks: the last block's partner in its pair is padding, value 0 (code 8) with scale 0.
TEST(Matmul, Q4PanelsPairAnOddLastBlockWithPadding) {
  const int64_t rows = 16, cols = 70;  // three blocks: a pair, then block 2 and a padding block
  ASSERT_EQ(q4_panel_bytes(rows, cols), 2 * 576);
  std::vector<float> source(static_cast<size_t>(rows * cols), 1.0f);
  std::vector<uint8_t> nibbles(static_cast<size_t>(rows * q4_row_bytes(cols)));
  std::vector<uint16_t> scales(static_cast<size_t>(rows * 3));
  quantize_q4(source.data(), rows, cols, nibbles.data(), scales.data());
  std::vector<uint8_t> packed(2 * 576, 7);
  pack_q4_panels(nibbles.data(), scales.data(), 0, rows, rows, cols, packed.data());
  for (int64_t byte = 576 + 256; byte < 576 + 512; ++byte) ASSERT_EQ(packed[byte], 0x88) << "byte " << byte;
  for (int64_t byte = 576 + 512 + 32; byte < 2 * 576; ++byte) ASSERT_EQ(packed[byte], 0) << "byte " << byte;
  for (int64_t i = 0; i < 16; ++i) {
    ASSERT_EQ(packed[576 + 512 + 2 * i] | packed[576 + 512 + 2 * i + 1] << 8, scales[i * 3 + 2]) << "row " << i;
  }
}

// Rows longer than a segment (2,048 packed bytes) written out by hand: 13 rows of 2,648 values (2,656
// packed bytes: a segment of 2,048 and one of 608) are a block of 12 rows and one of a single row, each
// holding its rows' first segments one after another, then their second ones. Block scales (one per 32
// bytes) follow the same order.
TEST(Matmul, Q8LongRowsAreSegmentMajor) {
  const int64_t rows = 13, cols = 2048 + 600, row_bytes = 2656;
  ASSERT_EQ(q8_packed_row_bytes(cols), row_bytes);
  ASSERT_EQ(q8_packed_bytes(rows, cols), 24 * row_bytes);  // whole blocks of 12 rows
  ASSERT_EQ(q8_packed_scale_count(rows, cols), 24 * row_bytes / 32);
  std::vector<int8_t> values(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) values[i] = static_cast<int8_t>((i * 7) % 255 - 127);
  std::vector<float> scales(static_cast<size_t>(rows * 83));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<float>(i + 1);
  std::vector<uint8_t> packed(static_cast<size_t>(q8_packed_bytes(rows, cols)), 0);
  std::vector<float> packed_scales(static_cast<size_t>(q8_packed_scale_count(rows, cols)), 0.0f);
  pack_q8(values.data(), 0, 5, cols, packed.data());  // in two calls, as load does it
  pack_q8(values.data() + 5 * cols, 5, rows - 5, cols, packed.data());
  pack_q8_scales(scales.data(), 0, rows, cols, packed_scales.data());
  // Where packed byte p of row r is: the block's start, the segment's, the row's piece of it.
  auto address = [](int64_t r, int64_t p) -> int64_t {
    const int64_t block_start = r < 12 ? 0 : 12 * 2656, i = r % 12;
    return p < 2048 ? block_start + 2048 * i + p : block_start + 12 * 2048 + 608 * i + (p - 2048);
  };
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int> row(static_cast<size_t>(row_bytes), 128);  // the row as pack_q8 lays out one short row
    for (int64_t k = 0; k < cols; ++k) row[q8_packed_offset(k, cols)] = values[r * cols + k] + 128;
    for (int64_t p = 0; p < row_bytes; ++p) ASSERT_EQ(packed[address(r, p)], row[p]) << "row " << r << " byte " << p;
    for (int64_t b = 0; b < 83; ++b) ASSERT_EQ(packed_scales[address(r, 32 * b) / 32], scales[r * 83 + b]) << "row " << r << " block " << b;
  }
}

TEST(Matmul, Q4RoundTripWithinHalfAStep) {
  std::mt19937 rng(21);
  const int64_t rows = 7, cols = 211;
  std::vector<float> source = random_floats(rng, static_cast<size_t>(rows * cols), 0.03f);
  source[3] = 0.0f;
  std::fill(source.begin() + 64, source.begin() + 96, 0.0f);  // an all-zero block: scale 0, codes 8
  std::vector<uint8_t> packed(static_cast<size_t>(rows * q4_row_bytes(cols)));
  std::vector<uint16_t> scales(static_cast<size_t>(rows * q4_blocks_per_row(cols)));
  quantize_q4(source.data(), rows, cols, packed.data(), scales.data());
  TestWeights weights;
  weights.matrix.cols = cols;
  weights.q4 = packed;
  weights.half_scales = scales;
  EXPECT_EQ(scales[2], 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < (cols + 31) / 32; ++b) {  // the padding blocks after these have scale 0 (layout test)
      const double scale = std::fabs(f16_to_float(scales[r * q4_blocks_per_row(cols) + b]));
      int64_t largest = b * 32;
      for (int64_t k = b * 32; k < std::min(cols, (b + 1) * 32); ++k) {
        if (std::fabs(source[r * cols + k]) > std::fabs(source[r * cols + largest])) largest = k;
        const double value = q4_value(weights, r, k);
        // Half a step, except values the top code (7) clamps: up to one step.
        const double bound = std::fabs(source[r * cols + k]) > 7.5 * scale ? scale : 0.5 * scale;
        ASSERT_LE(std::fabs(source[r * cols + k] - value), bound * (1.0 + 1e-3)) << "r " << r << " k " << k;
      }
      if (scale > 0.0) {
        EXPECT_EQ(q4_value(weights, r, largest) / scale, source[r * cols + largest] > 0 ? 8.0 : -8.0);
      }
    }
  }
  std::vector<float> huge(32, 1.0f);
  huge[7] = 1e6f;  // its scale (1.25e5) is beyond f16
  EXPECT_THROW(quantize_q4(huge.data(), 1, 32, packed.data(), scales.data()), Error);
}

TEST(Matmul, RejectsMismatchedOperands) {
  std::vector<float> x(10, 1.0f), w(20, 1.0f), y(2, 0.0f);
  WeightMatrix matrix{WeightFormat::kF32, 2, 10, w.data(), nullptr};
  PreparedActivations prepared;
  prepared.prepare(x.data(), 1, 10, WeightFormat::kBF16);
  EXPECT_THROW(matmul(prepared, matrix, y.data(), 2, 0, 2), Error);  // wrong format
  prepared.prepare(x.data(), 1, 9, WeightFormat::kF32);
  EXPECT_THROW(matmul(prepared, matrix, y.data(), 2, 0, 2), Error);  // wrong width
  prepared.prepare(x.data(), 1, 10, WeightFormat::kF32);
  EXPECT_THROW(matmul(prepared, matrix, y.data(), 2, 1, 3), Error);  // rows out of range
  matmul(prepared, matrix, y.data(), 2, 0, 2);
  EXPECT_EQ(y[0], 10.0f);
  EXPECT_EQ(y[1], 10.0f);
}

}  // namespace
}  // namespace gemma4rt::kernels
