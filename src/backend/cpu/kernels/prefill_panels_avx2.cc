// Prompt products of bf16 weights on AVX2 + FMA, output rows in the vector lanes (compiled with the
// AVX2 flags; see CMakeLists.txt and the note atop matmul_avx2.cc on the anonymous namespace).
//
// The tiles of matmul_avx2.cc put K in the lanes and widen every bf16 weight and activation to fp32 at
// each use: 10 integer operations beside a 2 x 3 tile's 12 FMAs a step, then a horizontal sum per
// output. Here a block of weight rows is widened once into fp32 panels of 16 rows (for each value of
// K, the 16 rows' values as 64 contiguous bytes), and a tile of 6 tokens x 16 rows keeps its 12 sums in
// registers: per value of K it loads the two panel vectors and broadcasts each token's value for 12
// FMAs, so the FMA units set the pace. The tokens' activations are widened once per stretch of K for
// up to 512 tokens, into a buffer every block of rows reads.
//
// Each output is one lane's chain of FMAs over K in order, the same whichever token tile, panel,
// stretch or thread range it falls in, so splitting rows across threads never changes results.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels/matmul.h"

namespace gemma4rt::kernels::detail {
namespace {

constexpr int64_t kPanelRows = 16;  // two vectors of 8 fp32 lanes
constexpr int kTileTokens = 6;      // 12 sums + 2 weight vectors + a broadcast of the 16 ymm registers
// Packed bytes per block of rows: the block stays in L2 (512 KiB a core on Zen 3) while every token
// tile sweeps it, so each weight byte comes from memory once per call.
constexpr int64_t kBlockBytes = 256 * 1024;
// Rows are packed and swept a stretch of K at a time, a panel of at most 64 KiB: stretches of 1,024
// values measured as fast as 2,048 or faster (1536 x 12288: 82-84 GFLOP/s a thread against 56-83).
constexpr int64_t kStretchValues = 1024;
// Prompts are swept this many tokens at a time: their widened activations of a stretch (2 MiB) are
// read from L2 and L3 by every block of rows.
constexpr int64_t kGroupTokens = 512;

inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// Eight bf16 as eight fp32.
inline __m256 widen8(const uint16_t* values) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(values));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

inline float widen1(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

// Transposes 8 vectors of 8 floats: afterwards rows[j] holds element j of every input.
inline void transpose8(__m256 (&rows)[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  // u[4q + s] holds, per 128-bit half h, element 4h + s of inputs 4q .. 4q + 3.
  for (int s = 0; s < 4; ++s) {
    rows[s] = _mm256_permute2f128_ps(u[s], u[4 + s], 0x20);
    rows[4 + s] = _mm256_permute2f128_ps(u[s], u[4 + s], 0x31);
  }
}

// Widens the values [first, first + values) of rows [r0, r0 + rows) of w (bf16, [rows][stride]) into
// panels: panel p, value k, lane i at out[(p * values + k) * 16 + i] is row r0 + 16 p + i's value
// first + k. Rows past `rows` are zero.
void pack_panels(const uint16_t* w, int64_t stride, int64_t first, int64_t values, int64_t r0, int64_t rows, float* out) {
  for (int64_t panel = 0; panel * kPanelRows < rows; ++panel) {
    float* panel_out = out + panel * values * kPanelRows;
    for (int half = 0; half < 2; ++half) {
      const int64_t row0 = panel * kPanelRows + 8 * half;  // of the block's rows
      const int64_t valid = rows - row0;
      int64_t k = 0;
      for (; k + 8 <= values; k += 8) {
        __m256 block[8];
        for (int i = 0; i < 8; ++i) block[i] = i < valid ? widen8(w + (r0 + row0 + i) * stride + first + k) : _mm256_setzero_ps();
        transpose8(block);
        for (int j = 0; j < 8; ++j) _mm256_store_ps(panel_out + (k + j) * kPanelRows + 8 * half, block[j]);
      }
      for (; k < values; ++k) {  // the last few values of the stretch
        for (int i = 0; i < 8; ++i) {
          panel_out[k * kPanelRows + 8 * half + i] = i < valid ? widen1(w[(r0 + row0 + i) * stride + first + k]) : 0.0f;
        }
      }
    }
  }
}

// Where a tile's sums go: the first token's outputs for the panel's 16 rows, tokens `stride` apart, of
// which `valid` are rows.
struct TileOutputs {
  float* sums;
  int64_t stride;
  int64_t valid;
};

inline __m256i lane_mask(int64_t valid) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), lanes);
}

// MT tokens (fp32 activations, tokens x_stride apart, at the stretch's first value) x one panel over
// `values` values of K. After the first stretch (continue_sums) the sums go on from what the outputs
// hold: a chain stored and reloaded as floats is the same chain.
template <int MT>
void panel_tile(const float* x, int64_t x_stride, const float* panel, int64_t values, bool continue_sums, const TileOutputs& out) {
  const __m256i masks[2] = {lane_mask(out.valid), lane_mask(out.valid - 8)};
  __m256 acc[MT][2];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      acc[t][v] = continue_sums ? _mm256_maskload_ps(out.sums + t * out.stride + 8 * v, masks[v]) : _mm256_setzero_ps();
    }
  }
  for (int64_t k = 0; k < values; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + k * kPanelRows), w1 = _mm256_load_ps(panel + k * kPanelRows + 8);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const __m256 value = _mm256_broadcast_ss(x + t * x_stride + k);
      acc[t][0] = _mm256_fmadd_ps(w0, value, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, value, acc[t][1]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      if (out.valid - 8 * v >= 8) {
        _mm256_storeu_ps(out.sums + t * out.stride + 8 * v, acc[t][v]);
      } else if (out.valid - 8 * v > 0) {
        _mm256_maskstore_ps(out.sums + t * out.stride + 8 * v, masks[v], acc[t][v]);
      }
    }
  }
}

template <int MT>
void tile_for_tokens(int64_t token_count, const float* x, int64_t x_stride, const float* panel, int64_t values, bool continue_sums,
                     const TileOutputs& out) {
  if constexpr (MT > 1) {
    if (token_count < MT) return tile_for_tokens<MT - 1>(token_count, x, x_stride, panel, values, continue_sums, out);
  }
  panel_tile<MT>(x, x_stride, panel, values, continue_sums, out);
}

}  // namespace

void prefill_bf16_panels_avx2(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || op.tokens <= 0) return;
  const auto* w = static_cast<const uint16_t*>(op.w);
  const auto* x = static_cast<const uint16_t*>(op.x);
  // Stretches of equal length (K = 1536: two of 768; K = 6144: six of 1,024).
  const int64_t stretches = (op.cols + kStretchValues - 1) / kStretchValues;
  const int64_t stretch_values = (op.cols + stretches - 1) / stretches;
  const int64_t panel_floats = stretch_values * kPanelRows;
  const int64_t block_panels = kBlockBytes / (panel_floats * 4) > 1 ? kBlockBytes / (panel_floats * 4) : 1;
  const int64_t block_rows = block_panels * kPanelRows;
  auto* packed = static_cast<float*>(thread_scratch(0, static_cast<size_t>(block_panels * panel_floats) * sizeof(float)));
  // A group's activations of one stretch, widened once for all its blocks of rows (widened per block
  // and token tile instead, they took 8% of a 512-token prompt). Tokens are 8 floats more than the
  // stretch apart, so that they do not share L1 sets at a power-of-two stride.
  const int64_t x_stride = (stretch_values + 7) / 8 * 8 + 8;
  const int64_t group_tokens = smaller(op.tokens, kGroupTokens);
  auto* activations = static_cast<float*>(thread_scratch(1, static_cast<size_t>(group_tokens * x_stride) * sizeof(float)));
  for (int64_t g0 = 0; g0 < op.tokens; g0 += kGroupTokens) {
    const int64_t tokens = smaller(kGroupTokens, op.tokens - g0);
    // Token tiles of equal size (512 tokens: 82 of 6 and 4 of 5), none left with a token or two.
    const int64_t tiles = (tokens + kTileTokens - 1) / kTileTokens;
    for (int64_t first = 0; first < op.cols; first += stretch_values) {
      const int64_t values = smaller(stretch_values, op.cols - first);
      for (int64_t t = 0; t < tokens; ++t) {
        const uint16_t* source = x + (g0 + t) * op.x_stride + first;
        float* target = activations + t * x_stride;
        int64_t k = 0;
        for (; k + 8 <= values; k += 8) _mm256_store_ps(target + k, widen8(source + k));
        for (; k < values; ++k) target[k] = widen1(source[k]);
      }
      for (int64_t block = row_begin; block < row_end; block += block_rows) {
        const int64_t rows = smaller(block_rows, row_end - block);
        pack_panels(w, op.cols, first, values, block, rows, packed);
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t t0 = tokens * tile / tiles, t1 = tokens * (tile + 1) / tiles;
          for (int64_t panel = 0; panel * kPanelRows < rows; ++panel) {
            const int64_t r0 = block + panel * kPanelRows;
            const TileOutputs out{op.y + (g0 + t0) * op.y_stride + r0 - op.y_first_row, op.y_stride, smaller(kPanelRows, row_end - r0)};
            tile_for_tokens<kTileTokens>(t1 - t0, activations + t0 * x_stride, x_stride, packed + panel * values * kPanelRows, values,
                                         first > 0, out);
          }
        }
      }
    }
  }
}

}  // namespace gemma4rt::kernels::detail
