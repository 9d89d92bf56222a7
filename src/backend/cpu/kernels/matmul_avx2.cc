// AVX2 + FMA matmul kernels (compiled with -mavx2 -mfma -mf16c). Only plain loops over raw pointers
// and intrinsics inside an anonymous namespace, so no inline or template function shared with other
// translation units is ever compiled for AVX2. Exported functions are declared in matmul.h (detail).
//
// Register tiles of (tokens x weight rows) dot products over the full K, each in its own 8-lane fp32
// accumulator (bf16: two), reduced by one fixed tree (reduce4). Steps of up to 16 tokens go row by
// row (run); q8, q4 and f32 prompts take the tiles inside a cache-blocked loop over rows, bf16 prompts
// the fp32 panels of prefill_panels_avx2.cc.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels/matmul.h"

namespace gemma4rt::kernels::detail {
namespace {

inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int64_t kWeightBlockBytes = 384 * 1024;

// Decode's software prefetch distance (see matmul_avx512.cc).
constexpr int64_t kPrefetchBytes = 3072;

inline void prefetch_ahead(const void* address) {
  _mm_prefetch(static_cast<const char*>(address) + kPrefetchBytes, _MM_HINT_T1);
}

// [sum(a), sum(b), sum(c), sum(d)] with the same addition tree for every input position.
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 quads = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1));
}

// AVX2 has no byte-masked loads: a row's last partial vector is copied into a zeroed buffer.
template <typename T, int kCount>
__m256i load_partial(const T* source, int64_t count) {
  alignas(32) T buffer[kCount];
  for (int i = 0; i < kCount; ++i) buffer[i] = i < count ? source[i] : T{0};
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buffer));
}

// A policy's running sum per output: one vector, added to at every k-step (Bf16Widen keeps two).
struct OneSum {
  using Acc = __m256;
  static Acc zero() { return _mm256_setzero_ps(); }
  static __m256 total(Acc acc) { return acc; }
};

struct F32Fma : OneSum {
  static constexpr int kStep = 8, kTokens = 2, kRows = 4;
  static constexpr int64_t kWeightBits = 32;
  struct Row { const float* values; };
  struct Token { const float* values; };
  using WVec = __m256;
  using XVec = __m256;
  static Row row(const MatmulOperands& op, int64_t r) { return {static_cast<const float*>(op.w) + r * op.cols}; }
  static Token token(const MatmulOperands& op, int64_t t) {
    return {static_cast<const float*>(op.x) + t * op.x_stride};
  }
  static void prefetch(const Row& row, int64_t k) { prefetch_ahead(row.values + k); }
  static WVec load_w(const Row& row, int64_t k) { return _mm256_loadu_ps(row.values + k); }
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    return _mm256_castsi256_ps(load_partial<float, 8>(row.values + k, count));
  }
  static XVec load_x(const Token& token, int64_t k) { return _mm256_loadu_ps(token.values + k); }
  static __m256 madd(__m256 acc, XVec x, WVec w) { return _mm256_fmadd_ps(x, w, acc); }
};

// bf16 widened to fp32: even elements by a 16-bit left shift, odd ones by masking the low half. Steps
// only: prompts take prefill_bf16_panels_avx2, which widens each weight once per call.
struct Bf16Widen {
  static constexpr int kStep = 16;
  static constexpr int64_t kWeightBits = 16;
  struct Row { const uint16_t* values; };
  struct Token { const uint16_t* values; };
  struct Pair { __m256 even, odd; };
  using WVec = Pair;
  using XVec = Pair;
  static Pair widen(__m256i bits) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static Row row(const MatmulOperands& op, int64_t r) { return {static_cast<const uint16_t*>(op.w) + r * op.cols}; }
  static Token token(const MatmulOperands& op, int64_t t) {
    return {static_cast<const uint16_t*>(op.x) + t * op.x_stride};
  }
  static void prefetch(const Row& row, int64_t k) { prefetch_ahead(row.values + k); }
  static WVec load_w(const Row& row, int64_t k) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.values + k)));
  }
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    return widen(load_partial<uint16_t, 16>(row.values + k, count));
  }
  static XVec load_x(const Token& token, int64_t k) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(token.values + k)));
  }
  // Two sums per output, the even products' and the odd ones', added at the end. Steps go row by row
  // with at most four tokens' outputs at once, where one sum taking both FMAs of a k-step in a chain
  // waited on the FMA latency (8 cycles a step): one token read 12288 x 1536 at 13.4 GB/s a thread on
  // Zen 3, with two sums at 19.4-21.0. Adding each step's two products first (fma(even, mul(odd)),
  // then add) ran at 15-17 and moved greedy tokens of the golden tests' random models away from the
  // reference (FastPathAgreement: 269 steps agreeing, against 306 chained and 305 with two sums).
  struct Acc { __m256 even, odd; };
  static Acc zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static __m256 total(Acc acc) { return _mm256_add_ps(acc.even, acc.odd); }
  static Acc madd(Acc acc, XVec x, WVec w) {
    return {_mm256_fmadd_ps(x.even, w.even, acc.even), _mm256_fmadd_ps(x.odd, w.odd, acc.odd)};
  }
};

// q8, one superblock of 512 values per step (pack_q8's layout, matmul.h), taken as two halves of 8
// blocks. vpmaddubsw needs one unsigned operand, so it multiplies |x| by w carrying x's sign
// (vpsignb); with |x|, |w| <= 127 the int16 pair sums cannot saturate. Each half sums its 8 blocks'
// exact dot products in int32 lanes, then converts and scales them once per superblock.
struct Q8Sign : OneSum {
  static_assert(kQ8BlockValues == 32, "a step is one superblock of 16 blocks");
  // Prompts: tiles of 4 tokens x 1 row over L2-sized blocks of rows (2 x 2 took 20-28% longer).
  static constexpr int kStep = 512, kTokens = 4, kRows = 1;
  static constexpr int64_t kWeightBits = 8;
  // A row's superblocks and scales are found through q8_packed_address (long rows are stored
  // segment-major), superblock by superblock.
  struct Row { const uint8_t* weights; const float* scales; int64_t r, cols; };
  struct Token { const std::byte* superblocks; };
  struct WVec { const uint8_t* codes; __m256 scales[2]; };
  using XVec = const std::byte*;
  static Row row(const MatmulOperands& op, int64_t r) { return {static_cast<const uint8_t*>(op.w), op.w_scales, r, op.cols}; }
  static const uint8_t* codes(const Row& row, int64_t k) { return row.weights + q8_packed_address(row.r, k, row.cols); }
  static const float* scales(const Row& row, int64_t k) { return row.scales + q8_scale_index(row.r, k / kQ8BlockValues, row.cols); }
  static Token token(const MatmulOperands& op, int64_t t) { return {op.x_superblocks + t * op.x_stride / 4 * 5}; }
  static void prefetch(const Row& row, int64_t k) {
    for (int line = 0; line < 8; ++line) prefetch_ahead(codes(row, k) + 64 * line);
  }
  static WVec load_w(const Row& row, int64_t k) {
    return {codes(row, k), {_mm256_loadu_ps(scales(row, k)), _mm256_loadu_ps(scales(row, k) + 8)}};
  }
  // A row's last superblock of fewer than 16 blocks, spread to the full layout (missing lanes 0 with
  // scale 0, against zero activations) in the next of a few per-thread buffers: a tile holds at most
  // kRows of them at once.
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    alignas(32) static thread_local uint8_t buffers[2 * kRows][512];
    static thread_local int next = 0;
    uint8_t* spread = buffers[next];
    next = (next + 1) % (2 * kRows);
    const int64_t blocks = (count + kQ8BlockValues - 1) / kQ8BlockValues;
    std::memset(spread, 128, 512);
    for (int c = 0; c < 8; ++c) std::memcpy(spread + 64 * c, codes(row, k) + 4 * blocks * c, static_cast<size_t>(4 * blocks));
    alignas(32) float block_scales[16] = {};
    std::memcpy(block_scales, scales(row, k), static_cast<size_t>(blocks) * sizeof(float));
    return {spread, {_mm256_load_ps(block_scales), _mm256_load_ps(block_scales + 8)}};
  }
  static XVec load_x(const Token& token, int64_t k) { return token.superblocks + k / 4 * 5; }
  static __m256i load(const void* address) { return _mm256_load_si256(static_cast<const __m256i*>(address)); }
  static __m256 madd(__m256 acc, XVec x, const WVec& w) {
    const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
      __m256i dot = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i weights = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.codes + 64 * c + 32 * h)), offset);
        const __m256i values = load(x + 64 * c + 32 * h);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(values), _mm256_sign_epi8(weights, values));
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(w.scales[h], _mm256_load_ps(reinterpret_cast<const float*>(x + 512 + 32 * h))), acc);
    }
    return acc;
  }
};

// q4, one superblock of 512 values per step (layout in core/formats.h), taken as two halves of 8
// blocks: the nibbles (q + 8) are vpmaddubsw's unsigned operand and the int8 activations its signed
// one. A product pair is at most 15 * 127 * 2 = 3,810, so a half's eight vpmaddubsw results add up
// exactly in int16 (8 * 3,810 < 32,767) and need one vpmaddwd instead of eight: on AVX2-only CPUs the
// multiplies are the bound. Each half then adds its 8 blocks' exact dot products to the prepared
// -8 * sum(x) in int32 lanes, converts and scales them once per superblock.
struct Q4Unsigned : OneSum {
  static_assert(kQ4BlockValues == 32 && kQ4SuperblockValues == 512, "a step is one superblock of 16 blocks");
  // Prompts: tiles of 4 tokens x 1 row over L2-sized blocks of rows (2 x 2 took 20-28% longer).
  static constexpr int kStep = 512, kTokens = 4, kRows = 1;
  static constexpr int64_t kWeightBits = 4;
  struct Row { const uint8_t* nibbles; const uint16_t* scales; };
  struct Token { const std::byte* superblocks; };
  struct WVec { const uint8_t* nibbles; __m256 scales[2]; };
  using XVec = const std::byte*;
  static Row row(const MatmulOperands& op, int64_t r) {
    return {static_cast<const uint8_t*>(op.w) + r * q4_row_bytes(op.cols), op.w_half_scales + r * q4_blocks_per_row(op.cols)};
  }
  static Token token(const MatmulOperands& op, int64_t t) { return {op.x_superblocks + t * op.x_stride / 4 * 5}; }
  static void prefetch(const Row& row, int64_t k) {
    for (int line = 0; line < 4; ++line) prefetch_ahead(row.nibbles + k / 2 + 64 * line);
  }
  static void load_scales(WVec& w, const uint16_t* scales) {
    const auto* halves = reinterpret_cast<const __m128i*>(scales);
    w.scales[0] = _mm256_cvtph_ps(_mm_loadu_si128(halves));
    w.scales[1] = _mm256_cvtph_ps(_mm_loadu_si128(halves + 1));
  }
  static WVec load_w(const Row& row, int64_t k) {
    WVec w;
    w.nibbles = row.nibbles + k / 2;
    load_scales(w, row.scales + k / kQ4BlockValues);
    return w;
  }
  // A row's last superblock of fewer than 16 blocks, copied to the full layout (missing lanes code 0
  // with scale 0; the activations there are zero) into the next of a few per-thread buffers: a tile
  // holds at most kRows of them at once.
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    alignas(32) static thread_local uint8_t buffers[2 * kRows][kQ4SuperblockBytes];
    static thread_local int next = 0;
    uint8_t* spread = buffers[next];
    next = (next + 1) % (2 * kRows);
    const int64_t blocks = (count + kQ4BlockValues - 1) / kQ4BlockValues;
    std::memset(spread, 0, kQ4SuperblockBytes);
    for (int v = 0; v < 4; ++v) std::memcpy(spread + 64 * v, row.nibbles + k / 2 + 4 * blocks * v, static_cast<size_t>(4 * blocks));
    alignas(16) uint16_t scales[16] = {};
    std::memcpy(scales, row.scales + k / kQ4BlockValues, static_cast<size_t>(blocks) * sizeof(uint16_t));
    WVec w;
    w.nibbles = spread;
    load_scales(w, scales);
    return w;
  }
  static XVec load_x(const Token& token, int64_t k) { return token.superblocks + k / 4 * 5; }
  static __m256i load(const void* address) { return _mm256_load_si256(static_cast<const __m256i*>(address)); }
  static __m256 madd(__m256 acc, XVec x, const WVec& w) {
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
      __m256i pairs = _mm256_setzero_si256();
      for (int v = 0; v < 4; ++v) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.nibbles + 64 * v + 32 * h));
        const __m256i low = _mm256_and_si256(packed, low_nibbles);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(low, load(x + 128 * v + 32 * h)));
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(high, load(x + 128 * v + 64 + 32 * h)));
      }
      const __m256i dot = _mm256_add_epi32(load(x + 576 + 32 * h), _mm256_madd_epi16(pairs, ones));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(w.scales[h], _mm256_load_ps(reinterpret_cast<const float*>(x + 512 + 32 * h))), acc);
    }
    return acc;
  }
};

// Tokens [t0, t0 + MT) x rows [r0, r0 + row_count), row_count <= NR; missing rows repeat the last
// valid one and are not stored.
template <class P, int MT, int NR>
void tile(const MatmulOperands& op, int64_t t0, int64_t r0, int64_t row_count) {
  typename P::Row rows[NR];
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) rows[i] = P::row(op, r0 + (i < row_count ? i : row_count - 1));
  typename P::Token tokens[MT];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) tokens[t] = P::token(op, t0 + t);

  typename P::Acc sums[MT][NR];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) sums[t][i] = P::zero();
  }

  const int64_t cols = op.cols;
  const int64_t full = cols - cols % P::kStep;
  int64_t k = 0;
  for (; k < full; k += P::kStep) {
    if constexpr (NR == 1) P::prefetch(rows[0], k);
    typename P::WVec w[NR];
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) w[i] = P::load_w(rows[i], k);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const typename P::XVec x = P::load_x(tokens[t], k);
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) sums[t][i] = P::madd(sums[t][i], x, w[i]);
    }
  }
  if (k < cols) {  // activations are zero padded, so only the weights need the partial load
    typename P::WVec w[NR];
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) w[i] = P::load_w_tail(rows[i], k, cols - k);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const typename P::XVec x = P::load_x(tokens[t], k);
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) sums[t][i] = P::madd(sums[t][i], x, w[i]);
    }
  }

  __m256 acc[MT][NR];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) acc[t][i] = P::total(sums[t][i]);
  }
  const __m256 zero = _mm256_setzero_ps();
  if constexpr (NR == 1) {  // one row: reduce four tokens at a time
#pragma GCC unroll 8
    for (int t = 0; t < MT; t += 4) {
      alignas(16) float sums[4];
      _mm_store_ps(sums, reduce4(acc[t][0], t + 1 < MT ? acc[t + 1][0] : zero, t + 2 < MT ? acc[t + 2][0] : zero,
                                 t + 3 < MT ? acc[t + 3][0] : zero));
      for (int i = 0; i < 4 && t + i < MT; ++i) op.y[(t0 + t + i) * op.y_stride + r0 - op.y_first_row] = sums[i];
    }
  } else {  // four rows of one token at a time
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      float* out = op.y + (t0 + t) * op.y_stride + r0 - op.y_first_row;
#pragma GCC unroll 4
      for (int g = 0; g < NR; g += 4) {
        const __m128 sums = reduce4(acc[t][g], g + 1 < NR ? acc[t][g + 1] : zero, g + 2 < NR ? acc[t][g + 2] : zero,
                                    g + 3 < NR ? acc[t][g + 3] : zero);
        const int64_t valid = row_count - g;
        if (valid >= 4) {
          _mm_storeu_ps(out + g, sums);
        } else {
          alignas(16) float lanes[4];
          _mm_store_ps(lanes, sums);
          for (int64_t i = 0; i < valid; ++i) out[g + i] = lanes[i];
        }
      }
    }
  }
}

template <class P, int MT, int NR>
void tile_for_tokens(int64_t token_count, const MatmulOperands& op, int64_t t0, int64_t r0, int64_t row_count) {
  if constexpr (MT > 1) {
    if (token_count < MT) return tile_for_tokens<P, MT - 1, NR>(token_count, op, t0, r0, row_count);
  }
  tile<P, MT, NR>(op, t0, r0, row_count);
}

// Decode and steps of several sequences: each weight row by itself, one sequential stream for the
// prefetchers (see matmul_avx512.cc), its tokens in groups of kDecodeTokens, the later groups reading
// the row from L1. Four tokens keep a quantised tile's accumulators and temporaries in the 16 ymm
// registers. A step of 8 tokens took 33-53% less time (q8, q4) than in the prompts' blocks of rows
// (then tiles of 2 tokens x 2 rows), bf16 within 10% either way (Zen 3, docs/benchmarks.md).
constexpr int kDecodeTokens = 4;
constexpr int kStepMaxTokens = 16;

template <class P>
void run_steps(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t t0 = 0; t0 < op.tokens; t0 += kDecodeTokens) {
      tile_for_tokens<P, kDecodeTokens, 1>(smaller(kDecodeTokens, op.tokens - t0), op, t0, r, 1);
    }
  }
}

// Prompts: blocks of rows that stay in L2, each swept by tiles of P::kTokens tokens x P::kRows rows.
template <class P>
void run(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || op.tokens <= 0) return;
  if (op.tokens <= kStepMaxTokens) return run_steps<P>(op, row_begin, row_end);
  const int64_t row_bytes = op.cols * P::kWeightBits / 8 + 64;
  int64_t block_rows = kWeightBlockBytes / row_bytes / P::kRows * P::kRows;
  if (block_rows < P::kRows) block_rows = P::kRows;
  for (int64_t block = row_begin; block < row_end; block += block_rows) {
    const int64_t block_end = smaller(block + block_rows, row_end);
    for (int64_t t0 = 0; t0 < op.tokens; t0 += P::kTokens) {
      const int64_t token_count = smaller(P::kTokens, op.tokens - t0);
      for (int64_t r0 = block; r0 < block_end; r0 += P::kRows) {
        tile_for_tokens<P, P::kTokens, P::kRows>(token_count, op, t0, r0, smaller(P::kRows, block_end - r0));
      }
    }
  }
}

}  // namespace

void matmul_f32_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<F32Fma>(operands, row_begin, row_end);
}

void matmul_bf16_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  if (operands.tokens <= kStepMaxTokens) return run_steps<Bf16Widen>(operands, row_begin, row_end);
  prefill_bf16_panels_avx2(operands, row_begin, row_end);
}

void matmul_q8_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<Q8Sign>(operands, row_begin, row_end);
}

void matmul_q4_avx2(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<Q4Unsigned>(operands, row_begin, row_end);
}

// Same arithmetic as float_to_bf16 (round to nearest even, NaNs stay quiet NaNs).
void round_to_bf16_avx2(const float* source, int64_t count, uint16_t* out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  const __m256i round_bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m256i halves[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + i + 8 * h));
      // Signed compare is safe: both sides are below 2^31 after clearing the sign.
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), infinity);
      const __m256i high = _mm256_srli_epi32(bits, 16);
      const __m256i rounded =
          _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(round_bias, _mm256_and_si256(high, one))), 16);
      halves[h] = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
    }
    // packus works per 128-bit lane; the permute puts the eight results of each half back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  for (; i < count; ++i) {  // the scalar formula, for the last few values
    uint32_t bits;
    __builtin_memcpy(&bits, source + i, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      out[i] = static_cast<uint16_t>((bits >> 16) | 0x40);
    } else {
      out[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
  }
}

// Same arithmetic as the scalar quantize_q8 (absmax / 127, x / scale rounded to nearest even, clamp).
void quantize_q8_row_avx2(const float* source, int64_t cols, int8_t* values, float* block_scales) {
  const __m256 sign_clear = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i low = _mm256_set1_epi32(-127), high = _mm256_set1_epi32(127);
  for (int64_t start = 0, block = 0; start < cols; start += kQ8BlockValues, ++block) {
    const int64_t count = smaller(kQ8BlockValues, cols - start);
    alignas(32) float padded[kQ8BlockValues];
    for (int i = 0; i < kQ8BlockValues; ++i) padded[i] = i < count ? source[start + i] : 0.0f;
    __m256 parts[4];
    __m256 magnitude = _mm256_setzero_ps();
    for (int p = 0; p < 4; ++p) {
      parts[p] = _mm256_load_ps(padded + 8 * p);
      magnitude = _mm256_max_ps(magnitude, _mm256_and_ps(parts[p], sign_clear));
    }
    __m128 folded = _mm_max_ps(_mm256_castps256_ps128(magnitude), _mm256_extractf128_ps(magnitude, 1));
    folded = _mm_max_ps(folded, _mm_movehl_ps(folded, folded));
    folded = _mm_max_ss(folded, _mm_movehdup_ps(folded));
    const float scale = _mm_cvtss_f32(folded) / 127.0f;
    block_scales[block] = scale;
    alignas(32) int32_t quantized[kQ8BlockValues];
    if (scale == 0.0f) {
      for (int i = 0; i < kQ8BlockValues; ++i) quantized[i] = 0;
    } else {
      const __m256 divisor = _mm256_set1_ps(scale);
      for (int p = 0; p < 4; ++p) {
        const __m256i q = _mm256_cvtps_epi32(_mm256_div_ps(parts[p], divisor));
        _mm256_store_si256(reinterpret_cast<__m256i*>(quantized + 8 * p), _mm256_min_epi32(high, _mm256_max_epi32(low, q)));
      }
    }
    for (int64_t i = 0; i < count; ++i) values[start + i] = static_cast<int8_t>(quantized[i]);
  }
}

}  // namespace gemma4rt::kernels::detail
