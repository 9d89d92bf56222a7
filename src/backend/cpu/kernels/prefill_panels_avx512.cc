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
// Each output is one lane's chain of vdpbf16ps over K's pairs in order, the same whichever token tile,
// panel, stretch or thread range it falls in, so splitting rows across threads never changes results
// (bitwise).
//
// Packing reads the weights from memory while no tile runs. Prefetching the next block during the
// current one's tiles did not help (Zen 5: within 1%; even plain loads of it had left L2 again by the
// time it was packed, pushed out by the tiles' activations), so there is none. Packing itself asks for
// the next 16 rows while it transposes the current ones.

// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsic headers as
// uninitialised (GCC bug 105593) once they are inlined into these kernels.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

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

inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// A buffer per thread for the packed block, grown as needed and kept.
struct FreeDeleter {
  void operator()(void* pointer) const { std::free(pointer); }
};
uint32_t* panel_buffer(size_t bytes) {
  thread_local std::unique_ptr<uint32_t, FreeDeleter> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    buffer.reset(static_cast<uint32_t*>(std::aligned_alloc(4096, rounded)));
    if (!buffer) throw std::bad_alloc();
    capacity = rounded;
  }
  return buffer.get();
}

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

// Packs `cols` values of rows [r0, r0 + rows) of the bf16 matrix w (rows `row_stride` values apart)
// into panels of kPanelRows: panel p, pair j, row i at out[(p * pairs + j) * kPanelRows + i] holds
// W[r0 + 64p + i][2j .. 2j + 1] as one u32. Rows past `rows` and the value past an odd `cols` are packed
// as zero. Each 16 rows' loads prefetch the same columns of the 16 rows after them, into L2, up to
// `prefetch_rows` rows from r0 (the next pack's first rows, where it reads the same columns): the
// hardware did not keep 16 streams per core ahead, and packing read 3.8-5.0 bytes per TSC cycle
// without, 5.2-5.7 with (pp512 on E2B, Zen 5, five interleaved pairs).
void pack_panels(const uint16_t* w, int64_t row_stride, int64_t cols, int64_t r0, int64_t rows, int64_t prefetch_rows,
                 uint32_t* out) {
  const int64_t pairs = (cols + 1) / 2;
  for (int64_t panel = 0; panel * kPanelRows < rows; ++panel) {
    uint32_t* panel_out = out + panel * pairs * kPanelRows;
    for (int64_t group = 0; group < kPanelVectors; ++group) {
      const int64_t first = panel * kPanelRows + 16 * group;  // of the block's rows
      const int64_t valid_rows = smaller(16, rows - first);
      const int64_t ahead_rows = smaller(16, prefetch_rows - first - 16);
      for (int64_t j0 = 0; j0 < pairs; j0 += 16) {
        for (int64_t i = 0; i < ahead_rows; ++i) {
          _mm_prefetch(reinterpret_cast<const char*>(w + (r0 + first + 16 + i) * row_stride + 2 * j0), _MM_HINT_T1);
        }
        const int64_t values = smaller(32, cols - 2 * j0);
        const __mmask32 mask = values >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << values) - 1u);
        __m512i block[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          block[i] = i < valid_rows ? _mm512_maskz_loadu_epi16(mask, w + (r0 + first + i) * row_stride + 2 * j0) : _mm512_setzero_si512();
        }
        transpose16(block);
        const int64_t count = smaller(16, pairs - j0);
        for (int64_t j = 0; j < count; ++j) _mm512_store_si512(panel_out + (j0 + j) * kPanelRows + 16 * group, block[j]);
      }
    }
  }
}

inline __mmask16 valid_lanes(int64_t valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xffff) : valid > 0 ? static_cast<__mmask16>((1u << valid) - 1u) : 0;
}

// Tokens [t0, t0 + MT) x one packed panel of `rows` (<= 64) valid rows starting at output row r0, over
// the pairs [first_pair, first_pair + pairs) of K. After the first stretch of K the sums go on from
// what the outputs hold: a chain stored and reloaded as floats is the same chain.
template <int MT>
void panel_tile(const MatmulOperands& op, int64_t t0, const uint32_t* panel, int64_t first_pair, int64_t pairs, int64_t r0,
                int64_t rows) {
  const uint16_t* x[MT];
  float* out[MT];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
    x[t] = static_cast<const uint16_t*>(op.x) + (t0 + t) * op.x_stride + 2 * first_pair;
    out[t] = op.y + (t0 + t) * op.y_stride + r0 - op.y_first_row;
  }
  __m512 acc[MT][kPanelVectors];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 4
    for (int v = 0; v < kPanelVectors; ++v) {
      acc[t][v] = first_pair == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid_lanes(rows - 16 * v), out[t] + 16 * v);
    }
  }
  for (int64_t j = 0; j < pairs; ++j) {
    __m512bh w[kPanelVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kPanelVectors; ++v) w[v] = (__m512bh)_mm512_load_si512(panel + j * kPanelRows + 16 * v);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      int32_t bits;  // the token's values 2j and 2j + 1 (zero padding past cols)
      std::memcpy(&bits, x[t] + 2 * j, sizeof bits);
      const __m512bh pair = (__m512bh)_mm512_set1_epi32(bits);
#pragma GCC unroll 4
      for (int v = 0; v < kPanelVectors; ++v) acc[t][v] = _mm512_dpbf16_ps(acc[t][v], w[v], pair);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 4
    for (int v = 0; v < kPanelVectors; ++v) {
      const int64_t valid = rows - 16 * v;
      if (valid >= 16) {
        _mm512_storeu_ps(out[t] + 16 * v, acc[t][v]);
      } else if (valid > 0) {
        _mm512_mask_storeu_ps(out[t] + 16 * v, valid_lanes(valid), acc[t][v]);
      }
    }
  }
}

template <int MT>
void tile_for_tokens(int64_t token_count, const MatmulOperands& op, int64_t t0, const uint32_t* panel, int64_t first_pair,
                     int64_t pairs, int64_t r0, int64_t rows) {
  if constexpr (MT > 1) {
    if (token_count < MT) return tile_for_tokens<MT - 1>(token_count, op, t0, panel, first_pair, pairs, r0, rows);
  }
  panel_tile<MT>(op, t0, panel, first_pair, pairs, r0, rows);
}

}  // namespace

void prefill_bf16_panels_avx512bf16(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || op.tokens <= 0) return;
  const int64_t all_pairs = (op.cols + 1) / 2;
  // Stretches of equal length (K = 6144: three of 1,024 pairs; K = 2560: two of 640).
  const int64_t stretches = (all_pairs + kStretchPairs - 1) / kStretchPairs;
  const int64_t stretch_pairs = (all_pairs + stretches - 1) / stretches;
  const int64_t panel_bytes = stretch_pairs * kPanelRows * 4;
  const int64_t block_panels = kBlockBytes / panel_bytes > 1 ? kBlockBytes / panel_bytes : 1;
  const int64_t block_rows = block_panels * kPanelRows;
  uint32_t* packed = panel_buffer(static_cast<size_t>(block_panels * panel_bytes));
  const auto* w = static_cast<const uint16_t*>(op.w);
  // Token tiles of equal size (512 tokens: 82 of 6 and 4 of 5), none left with a token or two.
  const int64_t tiles = (op.tokens + kTileTokens - 1) / kTileTokens;
  for (int64_t block = row_begin; block < row_end; block += block_rows) {
    const int64_t rows = smaller(block_rows, row_end - block);
    for (int64_t first_pair = 0; first_pair < all_pairs; first_pair += stretch_pairs) {
      const int64_t pairs = smaller(stretch_pairs, all_pairs - first_pair);
      // With K in one stretch, the next pack reads the same columns of the next block's rows.
      const int64_t prefetch_rows = pairs == all_pairs ? smaller(rows + 16, row_end - block) : rows;
      pack_panels(w + 2 * first_pair, op.cols, smaller(2 * pairs, op.cols - 2 * first_pair), block, rows, prefetch_rows,
                  packed);
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t t0 = op.tokens * tile / tiles, t1 = op.tokens * (tile + 1) / tiles;
        for (int64_t panel = 0; panel * kPanelRows < rows; ++panel) {
          tile_for_tokens<kTileTokens>(t1 - t0, op, t0, packed + panel * pairs * kPanelRows, first_pair, pairs,
                                       block + panel * kPanelRows, smaller(kPanelRows, rows - panel * kPanelRows));
        }
      }
    }
  }
}

}  // namespace gemma4rt::kernels::detail
