// Prefill products of bf16 weights with vdpbf16ps, output rows in the vector lanes (compiled with the
// AVX-512 flags; see CMakeLists.txt and the note atop matmul_avx512.cc on why everything here stays in an
// anonymous namespace).
//
// The tiles of matmul_avx512.cc put K in the lanes: each product needs a weight vector and an
// activation vector, six tokens' activations of a long row (1536 x 6144's 72 KiB) come from L2 at every
// step, and each sum ends in a horizontal reduction. Here a block of weight rows is first packed into
// panels of 64 rows, pair-interleaved: for each pair of K values, the 64 rows' two bf16 as 64 u32, so one
// 64-byte load holds one pair of 16 rows and vdpbf16ps multiplies it by one token's pair broadcast from
// memory (a 4-byte load). A tile of 6 tokens x 64 rows keeps its 24 sums in registers over a stretch of
// K (all of it for rows up to 2,048 values); per pair it reads 256 contiguous panel bytes and 6
// broadcasts for 24 vdpbf16ps, so neither the load ports nor L2 set the pace, and the sums are stored
// straight into the outputs' rows, where the next stretch picks them up.
//
// A prompt's MLP packs its gate and up weights together (gated panels: 32 gate rows beside the same 32
// up rows), so the tile that ends K holds both sums of each index and writes gelu_tanh(gate) * up,
// rounded to bf16, as down_proj's prepared input: the GELU pass, the conversion and 24 MiB of float
// stores and loads a layer (E2B, 512 tokens) are gone, and pp512 rose from 82.9% to 85.75% of the peak
// at the medians of twenty interleaved pairs (Zen 5; docs/benchmarks.md).
//
// Each output is one lane's chain of vdpbf16ps over K's pairs in order, the same whichever token tile,
// panel, stretch or thread range it falls in, so splitting rows across threads never changes results
// (bitwise).
//
// Packing reads the weights from memory while no tile runs. Prefetching the next block during the
// current one's tiles did not help (Zen 5: within 1%; even plain loads of it had left L2 again by the
// time it was packed, pushed out by the tiles' activations), so there is none. Packing itself asks for
// the next 16 rows while it transposes the current ones.

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels/math_avx512.h"  // <immintrin.h>, with GCC 12's false warnings silenced
#include "backend/cpu/kernels/matmul.h"

namespace gemma4rt::kernels::detail {
namespace {

constexpr int kPanelVectors = 4;                    // output vectors of 16 rows
constexpr int64_t kPanelRows = 16 * kPanelVectors;  // 64 rows per panel
constexpr int kTileTokens = 6;                      // 24 sums + 4 weight vectors of the 32 registers
// Packed bytes per block of rows (at least one panel): the block stays in L2 (1 MiB on Zen 4 and 5)
// while every token tile sweeps it, so each weight byte comes from memory once per call.
constexpr int64_t kBlockBytes = 512 * 1024;
// Long rows are packed and swept a stretch of K at a time, so that a panel is at most this many bytes:
// a whole panel of 12,288 values (1.5 MiB) did not fit in L2 and its products ran 8-10% slower
// (1536 x 12288, 24-512 tokens, Zen 5). Stretches of 1,024 pairs measured faster than 512, 768, 1,536
// and 2,048.
constexpr int64_t kStretchPairs = 1024;
// Gated panels keep K in one stretch up to this many pairs (every Gemma-4 hidden size: 5,376 values at
// most, a 672 KiB panel): a stretch boundary costs them a float store and reload of both sums, and a
// 256-token fused gate/up took 8-11% less time in one stretch than in two or three at K = 2,560 and
// 3,840, and 3-9% less at K = 5,376 (Zen 5, GatedFeedForward of the kernel bench).
constexpr int64_t kGatedStretchPairs = 3072;

inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// Transposes 16 vectors of 16 u32 in place: afterwards rows[j] holds element j of every input.
inline void transpose16(__m512i (&rows)[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    rows[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    rows[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    rows[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    rows[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Within each 128-bit chunk c of rows[4q + s] now: element 4c + s of inputs 4q .. 4q + 3.
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    t[s] = _mm512_shuffle_i32x4(rows[s], rows[4 + s], 0x88);
    t[4 + s] = _mm512_shuffle_i32x4(rows[s], rows[4 + s], 0xDD);
    t[8 + s] = _mm512_shuffle_i32x4(rows[8 + s], rows[12 + s], 0x88);
    t[12 + s] = _mm512_shuffle_i32x4(rows[8 + s], rows[12 + s], 0xDD);
  }
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    rows[s] = _mm512_shuffle_i32x4(t[s], t[8 + s], 0x88);
    rows[8 + s] = _mm512_shuffle_i32x4(t[s], t[8 + s], 0xDD);
    rows[4 + s] = _mm512_shuffle_i32x4(t[4 + s], t[12 + s], 0x88);
    rows[12 + s] = _mm512_shuffle_i32x4(t[4 + s], t[12 + s], 0xDD);
  }
}

// Where a panel's 64 rows come from: 64 consecutive rows of one matrix, or (gated) 32 rows of the gate
// matrix in lanes 0-31 beside the same 32 rows of the up matrix in lanes 32-63, so that a tile ends
// holding each index's gate and up sums and can apply GELU x up itself.
struct PanelRows {
  const uint16_t* matrices[2];  // bf16 [rows][row_stride]; the second only when gated
  int64_t row_stride;
  bool gated;

  int64_t per_panel() const { return gated ? kPanelRows / 2 : kPanelRows; }  // rows of each matrix
  const uint16_t* matrix(int group) const { return matrices[gated ? group / 2 : 0]; }
  // The panel's first row of each matrix that 16-lane group `group` holds is this many rows in.
  int64_t group_offset(int group) const { return 16 * (gated ? group % 2 : group); }
};

// Packs the values [first_value, first_value + values) of rows [r0, r0 + rows) of each matrix of
// `source` into panels: panel p, pair j, lane i at out[(p * pairs + j) * kPanelRows + i] holds one
// row's values 2j and 2j + 1 of the stretch as one u32 (lane i's row: source.matrix(i / 16), row r0 +
// p * per_panel() + source.group_offset(i / 16) + i % 16). Rows past `rows` and the value past an odd
// count are packed as zero. Each 16 rows' loads prefetch the same columns of the 16 rows after them in
// their matrix, into L2, up to `prefetch_rows` rows from r0 (the next pack's first rows, where it reads
// the same columns): the hardware did not keep 16 streams per core ahead, and packing read 3.8-5.0
// bytes per TSC cycle without, 5.2-5.7 with (pp512 on E2B, Zen 5, five interleaved pairs).
void pack_panels(const PanelRows& source, int64_t first_value, int64_t values, int64_t r0, int64_t rows,
                 int64_t prefetch_rows, uint32_t* out) {
  const int64_t pairs = (values + 1) / 2;
  const int64_t stride = source.row_stride;
  for (int64_t panel = 0; panel * source.per_panel() < rows; ++panel) {
    uint32_t* panel_out = out + panel * pairs * kPanelRows;
    for (int group = 0; group < kPanelVectors; ++group) {
      const uint16_t* w = source.matrix(group) + first_value;
      const int64_t first = panel * source.per_panel() + source.group_offset(group);  // of the block's rows
      const int64_t valid_rows = smaller(16, rows - first);
      const int64_t ahead_rows = smaller(16, prefetch_rows - first - 16);
      for (int64_t j0 = 0; j0 < pairs; j0 += 16) {
        for (int64_t i = 0; i < ahead_rows; ++i) {
          _mm_prefetch(reinterpret_cast<const char*>(w + (r0 + first + 16 + i) * stride + 2 * j0), _MM_HINT_T1);
        }
        const int64_t count = smaller(32, values - 2 * j0);
        const __mmask32 mask = count >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << count) - 1u);
        __m512i block[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          block[i] = i < valid_rows ? _mm512_maskz_loadu_epi16(mask, w + (r0 + first + i) * stride + 2 * j0) : _mm512_setzero_si512();
        }
        transpose16(block);
        const int64_t stored = smaller(16, pairs - j0);
        for (int64_t j = 0; j < stored; ++j) _mm512_store_si512(panel_out + (j0 + j) * kPanelRows + 16 * group, block[j]);
      }
    }
  }
}

inline __mmask16 valid_lanes(int64_t valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xffff) : valid > 0 ? static_cast<__mmask16>((1u << valid) - 1u) : 0;
}

// Where one token tile's sums over a panel go: for each 16-lane vector, the first token's outputs and
// how many of its lanes hold rows; tokens' outputs are `stride` floats apart. With `products` set (a
// gated panel's last stretch of K) the tile instead writes gelu_tanh(gate) * up for its 32 indices,
// rounded to bf16, there (tokens `products_stride` apart), exactly as gelu_tanh_multiply and
// round_to_bf16 would from the stored sums.
struct TileOutputs {
  float* sums[kPanelVectors];
  int64_t valid[kPanelVectors];
  int64_t stride;
  uint16_t* products = nullptr;
  int64_t products_stride = 0;
};

// MT tokens (their activations from x, tokens x_stride apart, at the stretch's first pair) x one packed
// panel, over `pairs` pairs of K. After the first stretch of K (continue_sums) the sums go on from what
// the outputs hold: a chain stored and reloaded as floats is the same chain.
template <int MT>
void panel_tile(const uint16_t* x, int64_t x_stride, const uint32_t* panel, int64_t pairs, bool continue_sums,
                const TileOutputs& out) {
  __m512 acc[MT][kPanelVectors];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 4
    for (int v = 0; v < kPanelVectors; ++v) {
      acc[t][v] = continue_sums ? _mm512_maskz_loadu_ps(valid_lanes(out.valid[v]), out.sums[v] + t * out.stride) : _mm512_setzero_ps();
    }
  }
  for (int64_t j = 0; j < pairs; ++j) {
    __m512bh w[kPanelVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kPanelVectors; ++v) w[v] = (__m512bh)_mm512_load_si512(panel + j * kPanelRows + 16 * v);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      int32_t bits;  // the token's values 2j and 2j + 1 (zero padding past cols)
      std::memcpy(&bits, x + t * x_stride + 2 * j, sizeof bits);
      const __m512bh pair = (__m512bh)_mm512_set1_epi32(bits);
#pragma GCC unroll 4
      for (int v = 0; v < kPanelVectors; ++v) acc[t][v] = _mm512_dpbf16_ps(acc[t][v], w[v], pair);
    }
  }
  if (out.products != nullptr) {  // gated: vectors 0-1 hold gates, 2-3 the same indices' ups
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        if (out.valid[h] <= 0) continue;
        const __m512 product = _mm512_mul_ps(gelu_tanh_ps(acc[t][h]), acc[t][h + 2]);
        _mm512_mask_cvtepi32_storeu_epi16(out.products + t * out.products_stride + 16 * h, valid_lanes(out.valid[h]),
                                          round_to_bf16_bits(_mm512_castps_si512(product)));
      }
    }
    return;
  }
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 4
    for (int v = 0; v < kPanelVectors; ++v) {
      if (out.valid[v] >= 16) {
        _mm512_storeu_ps(out.sums[v] + t * out.stride, acc[t][v]);
      } else if (out.valid[v] > 0) {
        _mm512_mask_storeu_ps(out.sums[v] + t * out.stride, valid_lanes(out.valid[v]), acc[t][v]);
      }
    }
  }
}

template <int MT>
void tile_for_tokens(int64_t token_count, const uint16_t* x, int64_t x_stride, const uint32_t* panel, int64_t pairs,
                     bool continue_sums, const TileOutputs& out) {
  if constexpr (MT > 1) {
    if (token_count < MT) return tile_for_tokens<MT - 1>(token_count, x, x_stride, panel, pairs, continue_sums, out);
  }
  panel_tile<MT>(x, x_stride, panel, pairs, continue_sums, out);
}

// Every token (bf16 activations x, [tokens][x_stride]) times rows [row_begin, row_end) of each matrix
// of `source` (K = cols), packed a block of rows and a stretch of K at a time. outputs(t0, r0, rows,
// last_stretch) gives a tile's TileOutputs: tokens from t0, the panel's rows of each matrix from r0.
template <class Outputs>
void sweep_panels(const uint16_t* x, int64_t x_stride, int64_t tokens, int64_t cols, const PanelRows& source,
                  int64_t row_begin, int64_t row_end, const Outputs& outputs) {
  if (row_begin >= row_end || tokens <= 0) return;
  const int64_t all_pairs = (cols + 1) / 2;
  // Stretches of equal length (plain panels: K = 6144 three of 1,024 pairs, K = 2560 two of 640).
  const int64_t stretch_limit = source.gated ? kGatedStretchPairs : kStretchPairs;
  const int64_t stretches = (all_pairs + stretch_limit - 1) / stretch_limit;
  const int64_t stretch_pairs = (all_pairs + stretches - 1) / stretches;
  const int64_t panel_bytes = stretch_pairs * kPanelRows * 4;
  const int64_t block_panels = kBlockBytes / panel_bytes > 1 ? kBlockBytes / panel_bytes : 1;
  const int64_t block_rows = block_panels * source.per_panel();
  auto* packed = static_cast<uint32_t*>(thread_scratch(0, static_cast<size_t>(block_panels * panel_bytes)));
  // Token tiles of equal size (512 tokens: 82 of 6 and 4 of 5), none left with a token or two.
  const int64_t tiles = (tokens + kTileTokens - 1) / kTileTokens;
  for (int64_t block = row_begin; block < row_end; block += block_rows) {
    const int64_t rows = smaller(block_rows, row_end - block);
    for (int64_t first_pair = 0; first_pair < all_pairs; first_pair += stretch_pairs) {
      const int64_t pairs = smaller(stretch_pairs, all_pairs - first_pair);
      const bool last_stretch = first_pair + pairs == all_pairs;
      // With K in one stretch, the next pack reads the same columns of the next block's rows.
      const int64_t prefetch_rows = pairs == all_pairs ? smaller(rows + 16, row_end - block) : rows;
      pack_panels(source, 2 * first_pair, smaller(2 * pairs, cols - 2 * first_pair), block, rows, prefetch_rows, packed);
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t t0 = tokens * tile / tiles, t1 = tokens * (tile + 1) / tiles;
        for (int64_t panel = 0; panel * source.per_panel() < rows; ++panel) {
          const int64_t r0 = block + panel * source.per_panel();
          const TileOutputs out = outputs(t0, r0, smaller(source.per_panel(), row_end - r0), last_stretch);
          tile_for_tokens<kTileTokens>(t1 - t0, x + t0 * x_stride + 2 * first_pair, x_stride, packed + panel * pairs * kPanelRows,
                                       pairs, first_pair > 0, out);
        }
      }
    }
  }
}

}  // namespace

void prefill_bf16_panels_avx512bf16(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const PanelRows source{{static_cast<const uint16_t*>(op.w), nullptr}, op.cols, false};
  sweep_panels(static_cast<const uint16_t*>(op.x), op.x_stride, op.tokens, op.cols, source, row_begin, row_end,
               [&](int64_t t0, int64_t r0, int64_t rows, bool) {
                 TileOutputs out;
                 for (int v = 0; v < kPanelVectors; ++v) {
                   out.sums[v] = op.y + t0 * op.y_stride + r0 - op.y_first_row + 16 * v;
                   out.valid[v] = rows - 16 * v;
                 }
                 out.stride = op.y_stride;
                 return out;
               });
}

void prefill_gelu_gate_up_avx512bf16(const GateUpOperands& op, int64_t index_begin, int64_t index_end) {
  const PanelRows source{{op.gate, op.up}, op.cols, true};
  sweep_panels(op.x, op.x_stride, op.tokens, op.cols, source, index_begin, index_end,
               [&](int64_t t0, int64_t i0, int64_t count, bool last_stretch) {
                 TileOutputs out;
                 for (int v = 0; v < kPanelVectors; ++v) {
                   out.sums[v] = (v < 2 ? op.gate_sums : op.up_sums) + t0 * op.sums_stride + i0 + 16 * (v % 2);
                   out.valid[v] = count - 16 * (v % 2);
                 }
                 out.stride = op.sums_stride;
                 if (last_stretch) {
                   out.products = op.products + t0 * op.products_stride + i0;
                   out.products_stride = op.products_stride;
                 }
                 return out;
               });
}

}  // namespace gemma4rt::kernels::detail
