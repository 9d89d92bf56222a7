// q8 and q4 products over weights in panels (pack_q8_panels, pack_q4_panels; matmul.h) with AVX-512
// VNNI. Compiled with the AVX-512 flags; everything stays in an anonymous namespace (see
// matmul_avx512.cc).
//
// A panel holds 16 weight rows, one per 32-bit lane. One vpdpbusd multiplies 4 consecutive values of
// each row (codes, unsigned: w + 128 for q8, the nibble q + 8 for q4) by one token's 4 activations
// broadcast from memory (int8, signed) and adds each row's 4 products to its lane. A block of 32 values
// is 8 of them (q8: 8 vectors as stored; q4: 4 vectors, each giving its low nibbles, then its high ones),
// in a chain started from the token's -c * sum(x) of the block, so the lane ends with the block's exact
// sum(w * x) (one token's tiles split the chain in two or four, and q4's chains of high nibbles take
// them in place, 16 times their codes, and are shifted back: still exact, one AND a vector instead of a
// shift and an AND); then, per block, sum += float(dot) * (w_scale * x_scale) as one fma. Every output
// is that same sequence of operations in block order whatever the tile, the token count or the row
// range it was computed in, so results are bitwise the same for a token alone or in a step of several,
// and for any split of the rows.
//
// Tiles: one token takes one panel at a time (one segment of one, for long panels) in the order the
// panels lie, so a thread's rows are one stream front to back; 2-16 tokens take up to 8 tokens x 1
// panel, in the same order; prefill takes 6 tokens x 2 panels, all of K, over blocks of panels that
// stay in L2. A tile that covers one segment of a long panel goes on from the sums its outputs hold.

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels/math_avx512.h"  // <immintrin.h>, with GCC 12's false warnings silenced
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/measured_choice.h"

namespace gemma4rt::kernels::detail {
namespace {

constexpr int64_t kPanelRows = kQuantPanelRows;

// What differs between the formats: a block of a panel's bytes, its 8 vpdpbusd operands, its scales.
struct Q8Panels {
  // Bytes of the stream per block: its 8 vectors and its scales.
  static constexpr int64_t kStreamBytesPerBlock = kQ8PanelBlockBytes;
  static int64_t panel_stride(int64_t cols) { return q8_panel_stride(cols); }
  static int64_t segment_bytes(int64_t cols) { return q8_panel_segment_bytes(cols); }
  static const uint8_t* block(const uint8_t* panel, int64_t b) { return panel + q8_panel_block_offset(b); }
  // Operands v and v + 1 (v even) of the block at `block`. With kScaledSecond, a format may hand out
  // the second operand times 16 (q4: one instruction fewer per vector); its chain is then divided back.
  template <bool kScaledSecond>
  static void operands(const uint8_t* block, int v, __m512i& first, __m512i& second) {
    first = _mm512_loadu_si512(block + 64 * v);
    second = _mm512_loadu_si512(block + 64 * (v + 1));
  }
  template <bool kScaledSecond>
  static __m512i unscale_second(__m512i chain) { return chain; }
  static __m512 scales(const uint8_t* panel, int64_t b) { return _mm512_loadu_ps(panel + q8_panel_scale_offset(b)); }
  // One token's tile walks a panel in units of kPanelUnitBytes: here one block, its codes then its scales.
  static constexpr int kBlocksPerUnit = 1;
  static const uint8_t* unit_codes(const uint8_t* unit, int) { return unit; }
  static __m512 unit_scales(const uint8_t* unit, int) { return scales(unit, 0); }
};
struct Q4Panels {
  // Blocks in pairs: the two blocks' 4 vectors each, then their scales (576 bytes a pair).
  static constexpr int64_t kStreamBytesPerBlock = kQ4PanelPairBytes / 2;
  static int64_t panel_stride(int64_t cols) { return q4_panel_stride(cols); }
  static int64_t segment_bytes(int64_t cols) { return q4_panel_segment_bytes(cols); }
  static const uint8_t* block(const uint8_t* panel, int64_t b) { return panel + q4_panel_block_offset(b); }
  // The high nibbles in place are 16 times the codes; a chain of only such products is a multiple of
  // 16, so an arithmetic shift divides it back exactly.
  template <bool kScaledSecond>
  static void operands(const uint8_t* block, int v, __m512i& first, __m512i& second) {
    const __m512i both = _mm512_loadu_si512(block + 32 * v), low = _mm512_set1_epi8(0x0f);
    first = _mm512_and_si512(both, low);
    if constexpr (kScaledSecond) {
      second = _mm512_andnot_si512(low, both);
    } else {
      second = _mm512_and_si512(_mm512_srli_epi16(both, 4), low);
    }
  }
  template <bool kScaledSecond>
  static __m512i unscale_second(__m512i chain) {
    if constexpr (kScaledSecond) return _mm512_srai_epi32(chain, 4);
    return chain;
  }
  static __m512 scales(const uint8_t* panel, int64_t b) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + q4_panel_scale_offset(b))));
  }
  // A unit is a pair: block k's codes, then both blocks' scales.
  static constexpr int kBlocksPerUnit = 2;
  static const uint8_t* unit_codes(const uint8_t* unit, int k) { return block(unit, k); }
  static __m512 unit_scales(const uint8_t* unit, int k) { return scales(unit, k); }
};
constexpr int64_t kPanelUnitBytes = kQ8PanelBlockBytes;
static_assert(kPanelUnitBytes == kQ4PanelPairBytes, "a q8 block and a q4 pair take the same bytes");

// Blocks ahead of the weight loads that a step of several tokens prefetches, beside the hardware
// prefetchers: 9 KiB of q8, 4.5 KiB of q4. Swept for q8 over 0-8 KiB on the Zen 5 (two threads, two
// rounds; bandwidth drifting by half) when the scales lay apart: a step of 8 tokens reached 65-82% of
// the probe at 4 KiB against 42-77% without, and without it one thread's step of 8 still takes 1.5-1.9
// times as long. With the scales in the panels (Zen 4, one thread, a step of 8, three rounds), q8 took
// 1.10-1.12 ms at 4 KiB, 1.01-1.04 at 8 blocks (4.5 KiB) and 0.94-0.95 at 12-16 blocks, q4 0.88-0.96
// whatever the distance. Where the lines go is measured (measured_choice.h): on the Zen 5 of
// 2026-12-06, one token's panels prefetching into L1 (T0) ran 15-25% slower than into L2 (T1), L1
// tracking far fewer misses at once (docs/benchmarks.md, "panel decode prefetches into L2"); on the
// full-speed Zen 5, L1 took 8-21% off a q8 step of 4 or 8 (16 blocks stayed the best distance there,
// against 32 and 64).
constexpr int64_t kStepPrefetchBlocks = 16;
// One token's single stream: on one Zen 5 VM the hardware prefetchers kept up with it, and prefetching
// 4-16 KiB ahead made a product 5-35% slower on one thread (1 KiB: the same); on another, 4 KiB ahead
// took a q4 token from 85-90% of the roofline to 91-95% (q8 the same; 8 KiB no better). So each thread
// measures both (measured_choice.h) and keeps the faster.
constexpr int64_t kOneTokenPrefetchBytes = 4096;
// Panels per cache block in prefill: the block's weights stay in L2 while every token tile passes.
constexpr int64_t kPrefillBlockBytes = 384 * 1024;
constexpr int kPrefillTokens = 6, kPrefillPanels = 2, kStepTokens = 8;

// What the tiles read of each token: its int8 activations, block scales and prepared superblocks (whose
// bytes 576 + 4 i of superblock s hold block 16 s + i's -c * sum(x), c = 128 for q8 and 8 for q4).
struct TokenOperands {
  const int8_t* values;
  const float* scales;
  const std::byte* superblocks;
};

// How far ahead of its weight loads a tile prefetches (0: not at all), and into which cache.
struct Prefetch {
  int64_t distance = 0;
  bool into_l1 = false;
};

// A weight's panels. Long ones lie in groups, segment-major (matmul.h); a short panel is one segment.
struct PanelOperands {
  const uint8_t* codes;    // the weight's first byte (codes and scales)
  int64_t blocks;          // per row
  int64_t panel_bytes;     // q8_panel_stride / q4_panel_stride
  int64_t panels;          // panel_count(rows)
  int64_t segment_blocks;  // blocks in kPanelSegmentBytes, or all of a short panel's
  int64_t segment_bytes;   // q8_panel_segment_bytes / q4_panel_segment_bytes

  int64_t segments() const { return (blocks + segment_blocks - 1) / segment_blocks; }
  // The first byte of panel p's segment s; its blocks follow as within a short panel (Panels::block).
  const uint8_t* run(int64_t p, int64_t s) const { return codes + panel_byte(p, s * segment_bytes, panels, panel_bytes, segment_bytes); }
};

// The measured choice of a step of several tokens, apart from one token's (tagged by Panels itself).
template <typename Panels>
struct StepOf {};

inline int32_t load_int32(const void* address) {
  int32_t value;
  std::memcpy(&value, address, sizeof(value));
  return value;
}

// Where a token's prepared superblocks hold block b's -c * sum(x) (TokenOperands).
inline uint64_t correction_offset(uint64_t b) { return b / 16 * 640 + 576 + 4 * (b % 16); }

// Prefetches lines [first, last) from `at`, into L1 or L2.
inline void prefetch_lines(const uint8_t* at, int first, int last, bool into_l1) {
#pragma GCC unroll 16
  for (int line = first; line < last; ++line) {
    const char* address = reinterpret_cast<const char*>(at + 64 * line);
    if (into_l1) {
      _mm_prefetch(address, _MM_HINT_T0);
    } else {
      _mm_prefetch(address, _MM_HINT_T1);
    }
  }
}

// sums[t][p] += the 16 rows of panel p of the tile against token t over blocks [b0, b1) of K, one
// segment, whose blocks in panel p begin at runs[p]. CHAINS integer chains per product (their sum is
// exact): a tile of one token's few products needs two to hide vpdpbusd's latency (one token against
// one panel takes one_token_tile below).
template <typename Panels, int MT, int NP, int CHAINS>
inline void panel_tile(const TokenOperands* tokens, const uint8_t* const (&runs)[NP], int64_t b0, int64_t b1, Prefetch prefetch,
                       __m512 (&sums)[MT][NP]) {
  static_assert(CHAINS == 1 || CHAINS == 2, "one or two chains");
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blocks[NP];
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) blocks[p] = Panels::block(runs[p], b - b0);
    if (prefetch.distance != 0) {
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p) prefetch_lines(blocks[p] + prefetch.distance, 0, (Panels::kStreamBytesPerBlock + 63) / 64, prefetch.into_l1);
    }
    const uint64_t correction_at = correction_offset(static_cast<uint64_t>(b));
    __m512i dots[MT][NP][CHAINS];
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const __m512i start = _mm512_set1_epi32(load_int32(tokens[t].superblocks + correction_at));
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p) {
        dots[t][p][0] = start;
        if constexpr (CHAINS == 2) dots[t][p][1] = _mm512_setzero_si512();
      }
    }
#pragma GCC unroll 4
    for (int v = 0; v < 8; v += 2) {
      __m512i first[NP], second[NP];
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p) Panels::template operands<CHAINS == 2>(blocks[p], v, first[p], second[p]);
#pragma GCC unroll 8
      for (int t = 0; t < MT; ++t) {
        const int8_t* x = tokens[t].values + kQ8BlockValues * b + 4 * v;
        const __m512i x_first = _mm512_set1_epi32(load_int32(x)), x_second = _mm512_set1_epi32(load_int32(x + 4));
#pragma GCC unroll 8
        for (int p = 0; p < NP; ++p) {
          dots[t][p][0] = _mm512_dpbusd_epi32(dots[t][p][0], first[p], x_first);
          dots[t][p][CHAINS - 1] = _mm512_dpbusd_epi32(dots[t][p][CHAINS - 1], second[p], x_second);
        }
      }
    }
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512 row_scales = Panels::scales(runs[p], b - b0);
#pragma GCC unroll 8
      for (int t = 0; t < MT; ++t) {
        __m512i dot = dots[t][p][0];
        if constexpr (CHAINS == 2) dot = _mm512_add_epi32(dot, Panels::template unscale_second<true>(dots[t][p][1]));
        const __m512 scale = _mm512_mul_ps(row_scales, _mm512_set1_ps(tokens[t].scales[b]));
        sums[t][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, sums[t][p]);
      }
    }
  }
}

// acc += w (u8) . x's 4 bytes (s8) broadcast, as _mm512_dpbusd_epi32 with the broadcast folded into
// the instruction's memory operand ({1to16}), which GCC 12 does not do from _mm512_set1_epi32.
inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

// One token's tile: sum += the 16 rows of one panel against the token over blocks [b0, b1) of K, one
// segment beginning at `run` (b0 even: segments hold whole q4 pairs). The same operations as
// panel_tile's in the same order, in fewer instructions per weight byte: each activation broadcast
// rides in its vpdpbusd, the addresses step unit by unit, and four chains of two products stand in for
// two of four. A core reading memory fast loses more of its bandwidth the more instructions it runs per
// line of the stream (docs/benchmarks.md, "one token's panels in fewer instructions"), and q4 runs
// about twice as many a line as q8.
template <typename Panels, int K>
inline void one_token_block(const uint8_t* unit, const TokenOperands& token, uint64_t b, __m512& sum) {
  const uint8_t* codes = Panels::unit_codes(unit, K);
  const int8_t* x = token.values + kQ8BlockValues * b;
  // Products of values 4v..4v+3 (first) and 4v+4..4v+7 (second) of the block; q4's second ones in place.
  __m512i firsts[2] = {_mm512_set1_epi32(load_int32(token.superblocks + correction_offset(b))), _mm512_setzero_si512()};
  __m512i seconds[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
  for (int v = 0; v < 8; v += 2) {
    __m512i first, second;
    Panels::template operands<true>(codes, v, first, second);
    firsts[v / 2 % 2] = dpbusd_broadcast(firsts[v / 2 % 2], first, x + 4 * v);
    seconds[v / 2 % 2] = dpbusd_broadcast(seconds[v / 2 % 2], second, x + 4 * v + 4);
  }
  const __m512i dot = _mm512_add_epi32(_mm512_add_epi32(firsts[0], firsts[1]),
                                       Panels::template unscale_second<true>(_mm512_add_epi32(seconds[0], seconds[1])));
  const __m512 scale = _mm512_mul_ps(Panels::unit_scales(unit, K), _mm512_set1_ps(token.scales[b]));
  sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, sum);
}

template <typename Panels>
inline void one_token_tile(const TokenOperands& token, const uint8_t* run, int64_t b0, int64_t b1, Prefetch prefetch, __m512& sum) {
  constexpr int kUnitBlocks = Panels::kBlocksPerUnit;
  constexpr int kUnitLines = kPanelUnitBytes / 64, kFirstLines = (kUnitLines + kUnitBlocks - 1) / kUnitBlocks;
  const uint64_t end = static_cast<uint64_t>(b1);
  uint64_t b = static_cast<uint64_t>(b0);
  const uint8_t* unit = run;
  for (; b + kUnitBlocks <= end; b += kUnitBlocks, unit += kPanelUnitBytes) {
    // The unit's lines ahead, spread over its blocks (a q4 pair's 9 lines: 5, then 4).
    if (prefetch.distance != 0) prefetch_lines(unit + prefetch.distance, 0, kFirstLines, prefetch.into_l1);
    one_token_block<Panels, 0>(unit, token, b, sum);
    if constexpr (kUnitBlocks == 2) {
      if (prefetch.distance != 0) prefetch_lines(unit + prefetch.distance, kFirstLines, kUnitLines, prefetch.into_l1);
      one_token_block<Panels, 1>(unit, token, b + 1, sum);
    }
  }
  if (b < end) one_token_block<Panels, 0>(unit, token, b, sum);  // a q4 panel's last, unpaired block
}

// Every segment of K, in one tile (run_tile's `segment`).
constexpr int64_t kEverySegment = -1;

// Runs a tile over segment `segment` of K, or over all of K with kEverySegment, and writes its outputs
// that fall in [row_begin, row_end). A segment past the first goes on from the sums the outputs hold
// (stored exactly as floats): every output is the same sequence of operations as in one pass.
template <typename Panels, int MT, int NP, int CHAINS>
inline void run_tile(const MatmulOperands& op, const PanelOperands& w, const TokenOperands* tokens, int64_t t0, int64_t first_panel,
                     int64_t row_begin, int64_t row_end, Prefetch prefetch, int64_t segment) {
  __m512 sums[MT][NP];
  __mmask16 lanes[NP];
  float* outputs[NP];  // token t0's outputs of the panel's rows; token t0 + t's are t * y_stride on
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    const int64_t r0 = (first_panel + p) * kPanelRows;
    const int64_t begin = row_begin > r0 ? row_begin - r0 : 0;
    const int64_t end = row_end < r0 + kPanelRows ? row_end - r0 : kPanelRows;
    lanes[p] = begin < end ? static_cast<__mmask16>(((1u << end) - 1u) & ~((1u << begin) - 1u)) : 0;
    outputs[p] = op.y + t0 * op.y_stride + r0 - op.y_first_row;
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) sums[t][p] = segment > 0 ? _mm512_maskz_loadu_ps(lanes[p], outputs[p] + t * op.y_stride) : _mm512_setzero_ps();
  }
  const int64_t first = segment == kEverySegment ? 0 : segment, last = segment == kEverySegment ? w.segments() : segment + 1;
  for (int64_t s = first; s < last; ++s) {
    const uint8_t* runs[NP];
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) runs[p] = w.run(first_panel + p, s);
    const int64_t b0 = s * w.segment_blocks, b1 = b0 + w.segment_blocks < w.blocks ? b0 + w.segment_blocks : w.blocks;
    if constexpr (MT == 1 && NP == 1) {
      one_token_tile<Panels>(tokens[t0], runs[0], b0, b1, prefetch, sums[0][0]);
    } else {
      panel_tile<Panels, MT, NP, CHAINS>(tokens + t0, runs, b0, b1, prefetch, sums);
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    if (lanes[p] == 0) continue;
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) _mm512_mask_storeu_ps(outputs[p] + t * op.y_stride, lanes[p], sums[t][p]);
  }
}

// Tokens [t0, t0 + count) (count <= 8) against NP panels from first_panel.
template <typename Panels, int NP>
void run_tokens(const MatmulOperands& op, const PanelOperands& w, const TokenOperands* tokens, int64_t t0, int64_t count,
                int64_t first_panel, int64_t row_begin, int64_t row_end, Prefetch prefetch, int64_t segment) {
  switch (count) {
    case 1: return run_tile<Panels, 1, NP, 2>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
    case 2: return run_tile<Panels, 2, NP, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
    case 3: return run_tile<Panels, 3, NP, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
    case 4: return run_tile<Panels, 4, NP, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
    case 5: return run_tile<Panels, 5, NP, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
    case 6: return run_tile<Panels, 6, NP, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
    case 7:
      if constexpr (NP == 1) return run_tile<Panels, 7, 1, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
      break;
    case 8:
      if constexpr (NP == 1) return run_tile<Panels, 8, 1, 1>(op, w, tokens, t0, first_panel, row_begin, row_end, prefetch, segment);
      break;
  }
  // Wider tiles than the registers hold: one panel at a time.
  for (int64_t p = 0; p < NP; ++p) run_tokens<Panels, 1>(op, w, tokens, t0, count, first_panel + p, row_begin, row_end, prefetch, segment);
}

// Calls visit(p, s) for segment s of every panel p in [first_panel, end_panel), in the order the panels
// lie: group by group, each group's panels taking turns per segment (short panels, one segment each,
// come one after another).
template <class Visit>
void in_stored_order(const PanelOperands& w, int64_t first_panel, int64_t end_panel, const Visit& visit) {
  for (int64_t group = first_panel; group < end_panel;) {
    const int64_t next_group = (group / kPanelGroup + 1) * kPanelGroup, group_end = next_group < end_panel ? next_group : end_panel;
    for (int64_t s = 0; s < w.segments(); ++s) {
      for (int64_t p = group; p < group_end; ++p) visit(p, s);
    }
    group = group_end;
  }
}

template <typename Panels>
void matmul_panels(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const int64_t blocks = q8_blocks_per_row(op.cols);
  const PanelOperands w{static_cast<const uint8_t*>(op.w), blocks, Panels::panel_stride(op.cols), panel_count(op.rows),
                        long_panels(op.cols) ? kPanelSegmentBytes / Panels::kStreamBytesPerBlock : blocks,
                        Panels::segment_bytes(op.cols)};
  // The tokens' operands, worked out once (a prefill's in pieces of 64).
  constexpr int64_t kTokenBatch = 64;
  TokenOperands tokens[kTokenBatch];
  const int64_t scales_per_token = op.x_stride / kQ8BlockValues, superblock_bytes_per_token = op.x_stride / 4 * 5;
  auto set_tokens = [&](int64_t first, int64_t count) {
    for (int64_t t = 0; t < count; ++t) {
      tokens[t] = {static_cast<const int8_t*>(op.x) + (first + t) * op.x_stride, op.x_scales + (first + t) * scales_per_token,
                   op.x_superblocks + (first + t) * superblock_bytes_per_token};
    }
  };
  const int64_t first_panel = row_begin / kPanelRows, end_panel = (row_end + kPanelRows - 1) / kPanelRows;
  MatmulOperands shifted = op;  // outputs are written relative to token first, so y moves with the batch

  if (op.tokens == 1) {
    // One panel per tile: four panels side by side are four streams, and one core reads four 12 KiB
    // streams (q4 panels of K = 1,536) at 20-25 GB/s against 30-33 for one (ReadSideBySide in
    // gemma4rt_kernel_bench; docs/benchmarks.md).
    set_tokens(0, 1);
    measured_choice<Panels>().run((end_panel - first_panel) * w.panel_bytes, [&](int way) {
      const Prefetch prefetch{way == 0 ? 0 : kOneTokenPrefetchBytes};
      in_stored_order(w, first_panel, end_panel,
                      [&](int64_t p, int64_t s) { run_tile<Panels, 1, 1, 2>(op, w, tokens, 0, p, row_begin, row_end, prefetch, s); });
    });
    return;
  }
  if (op.tokens <= kBatchMaxTokens) {
    // The first tile on a panel prefetches for the rest (into L2 or L1, whichever this thread measures
    // faster); tiles of tokens 9-16 find the panel in cache.
    set_tokens(0, op.tokens);
    measured_choice<StepOf<Panels>>().run((end_panel - first_panel) * w.panel_bytes, [&](int way) {
      const Prefetch ahead{kStepPrefetchBlocks * Panels::kStreamBytesPerBlock, way == 1};
      in_stored_order(w, first_panel, end_panel, [&](int64_t p, int64_t s) {
        for (int64_t t = 0; t < op.tokens; t += kStepTokens) {
          run_tokens<Panels, 1>(op, w, tokens, t, op.tokens - t < kStepTokens ? op.tokens - t : kStepTokens, p, row_begin, row_end,
                                t == 0 ? ahead : Prefetch{}, s);
        }
      });
    });
    return;
  }
  // Prefill: blocks of panels that stay in L2, each passed by every token in tiles of 6 x 2 panels.
  const int64_t block_panels = w.panel_bytes >= kPrefillBlockBytes ? 1 : kPrefillBlockBytes / w.panel_bytes;
  for (int64_t block = first_panel; block < end_panel; block += block_panels) {
    const int64_t block_end = block + block_panels < end_panel ? block + block_panels : end_panel;
    for (int64_t first = 0; first < op.tokens; first += kTokenBatch) {
      const int64_t batch = op.tokens - first < kTokenBatch ? op.tokens - first : kTokenBatch;
      set_tokens(first, batch);
      shifted.y = op.y + first * op.y_stride;
      for (int64_t t = 0; t < batch; t += kPrefillTokens) {
        const int64_t count = batch - t < kPrefillTokens ? batch - t : kPrefillTokens;
        int64_t p = block;
        for (; p + kPrefillPanels <= block_end; p += kPrefillPanels) {
          run_tokens<Panels, kPrefillPanels>(shifted, w, tokens, t, count, p, row_begin, row_end, Prefetch{}, kEverySegment);
        }
        if (p < block_end) run_tokens<Panels, 1>(shifted, w, tokens, t, count, p, row_begin, row_end, Prefetch{}, kEverySegment);
      }
    }
  }
}

}  // namespace

void matmul_q8_panels_avx512(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  matmul_panels<Q8Panels>(op, row_begin, row_end);
}

void matmul_q4_panels_avx512(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  matmul_panels<Q4Panels>(op, row_begin, row_end);
}

}  // namespace gemma4rt::kernels::detail
