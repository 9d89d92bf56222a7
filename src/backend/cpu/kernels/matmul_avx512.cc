// AVX-512 matmul kernels (compiled with the AVX-512 flags; see CMakeLists.txt). Only plain loops over
// raw pointers and intrinsics, all inside an anonymous namespace: an inline or template function
// shared with other translation units could be kept by the linker in its AVX-512 form and crash older
// CPUs. The exported functions are declared in matmul.h (namespace detail).
//
// Every kernel is a register-blocked tile of (tokens x weight rows) dot products over the full K,
// each dot product accumulated in its own 16-lane fp32 register in k order and reduced by one fixed
// addition tree (reduce4): an output's value never depends on which tile or row range it was in.
// Decode of one token streams one weight row at a time, with software prefetch (K cut into chunks when
// the activations outgrow L1); 2-16 tokens take tiles of up to 8 tokens x 3 rows (run_batch; q8 and q4:
// 4 tokens x 3 rows of superblocks, superblock_tile; q8 steps of up to 8 tokens and q4 of up to 4:
// narrow tiles of one row, long rows in segments and q8's two rows at a time, takes_narrow_tiles);
// prefill walks L2-sized blocks of rows with tiles of up to 6 tokens x 4 rows. bf16 prefill with
// vdpbf16ps does not come here: it packs the weights into panels with the output rows in the lanes
// (prefill_panels_avx512.cc).

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernels/math_avx512.h"  // <immintrin.h>, with GCC 12's false warnings silenced
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/measured_choice.h"

namespace gemma4rt::kernels::detail {
namespace {

inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// Weight bytes per cache block: the rows of one block stay in L2 (1 MiB on Zen 4) while every token
// tile passes over them, so each weight byte comes from memory once per matmul call.
constexpr int64_t kWeightBlockBytes = 384 * 1024;

// [sum(a), sum(b), sum(c), sum(d)], each lane sum by the same tree whatever the input position.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit chunk i now holds the four partial lanes of input i.
  const __m512 quads = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 pairs = _mm512_add_ps(quads, _mm512_permute_ps(quads, 0x4E));
  const __m512 sums = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0xB1));
  const __m512i first_lanes = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first_lanes, sums));
}

// Decode streams each weight row once, row after row. Besides the hardware prefetchers, a software
// prefetch this far ahead of the loads (into L2) keeps enough lines in flight even when the work per
// line (q8) limits how far ahead out-of-order execution reaches; measured on Zen 4 with two threads,
// it takes q8 GEMV from about 80% to over 90% of the read-bandwidth probe.
constexpr int64_t kPrefetchBytes = 3072;
// q4 streams twice the values per byte of q8 and four times bf16's, so its lines are consumed sooner:
// with the probe at 49-61 GB/s, 3 KiB ahead held E2B q4 decode to 63-74% of the roofline and 6 KiB
// ahead reached 96% (bf16 fell from 90-93% to 81-83% at 6 KiB, q8 did not change).
constexpr int64_t kQ4PrefetchBytes = 6144;

inline void prefetch_line(const void* address, int64_t offset) {
  _mm_prefetch(static_cast<const char*>(address) + offset, _MM_HINT_T1);
}

inline __mmask16 mask16(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }
inline __mmask32 mask32(int64_t count) { return static_cast<__mmask32>((1ull << count) - 1u); }
inline __mmask64 mask64(int64_t count) { return count >= 64 ? ~0ull : (1ull << count) - 1u; }

// ---- per-format operand policies: how to load one k-step of a weight row / token and multiply-add ----

struct F32Fma {
  static constexpr int kStep = 16, kTokens = 6, kRows = 4, kBatchTokens = 8, kBatchRows = 3, kNarrowBatchTokens = 0;
  static constexpr int64_t kWeightBits = 32, kActivationBits = 32;
  struct Row { const float* values; };
  struct Token { const float* values; };
  using WVec = __m512;
  using XVec = __m512;
  static Row row(const MatmulOperands& op, int64_t r, int64_t) { return {static_cast<const float*>(op.w) + r * op.cols}; }
  static Token token(const MatmulOperands& op, int64_t t) {
    return {static_cast<const float*>(op.x) + t * op.x_stride};
  }
  static void prefetch(const Row& row, int64_t k, int64_t offset) { prefetch_line(row.values + k, offset); }
  static WVec load_w(const Row& row, int64_t k) { return _mm512_loadu_ps(row.values + k); }
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    return _mm512_maskz_loadu_ps(mask16(count), row.values + k);
  }
  static XVec load_x(const Token& token, int64_t k) { return _mm512_loadu_ps(token.values + k); }
  static __m512 madd(__m512 acc, XVec x, WVec w) { return _mm512_fmadd_ps(x, w, acc); }
};

// bf16 with vdpbf16ps: 32 products per instruction, pairs summed into 16 fp32 lanes.
struct Bf16Dot {
  static constexpr int kStep = 32, kTokens = 6, kRows = 4, kBatchTokens = 8, kBatchRows = 3, kNarrowBatchTokens = 0;
  static constexpr int64_t kWeightBits = 16, kActivationBits = 16;
  struct Row { const uint16_t* values; };
  struct Token { const uint16_t* values; };
  using WVec = __m512bh;
  using XVec = __m512bh;
  static Row row(const MatmulOperands& op, int64_t r, int64_t) { return {static_cast<const uint16_t*>(op.w) + r * op.cols}; }
  static Token token(const MatmulOperands& op, int64_t t) {
    return {static_cast<const uint16_t*>(op.x) + t * op.x_stride};
  }
  static void prefetch(const Row& row, int64_t k, int64_t offset) { prefetch_line(row.values + k, offset); }
  static WVec load_w(const Row& row, int64_t k) { return (__m512bh)_mm512_loadu_si512(row.values + k); }
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    return (__m512bh)_mm512_maskz_loadu_epi16(mask32(count), row.values + k);
  }
  static XVec load_x(const Token& token, int64_t k) { return (__m512bh)_mm512_loadu_si512(token.values + k); }
  static __m512 madd(__m512 acc, XVec x, WVec w) { return _mm512_dpbf16_ps(acc, x, w); }
};

// bf16 without BF16 instructions: a bf16 is the top half of a float, so the even elements of 32 are a
// 16-bit left shift and the odd ones a mask away from fp32.
struct Bf16Widen {
  static constexpr int kStep = 32, kTokens = 4, kRows = 4, kBatchTokens = 8, kBatchRows = 2, kNarrowBatchTokens = 0;
  static constexpr int64_t kWeightBits = 16, kActivationBits = 16;
  struct Row { const uint16_t* values; };
  struct Token { const uint16_t* values; };
  struct Pair { __m512 even, odd; };
  using WVec = Pair;
  using XVec = Pair;
  static Pair widen(__m512i bits) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static Row row(const MatmulOperands& op, int64_t r, int64_t) { return {static_cast<const uint16_t*>(op.w) + r * op.cols}; }
  static Token token(const MatmulOperands& op, int64_t t) {
    return {static_cast<const uint16_t*>(op.x) + t * op.x_stride};
  }
  static void prefetch(const Row& row, int64_t k, int64_t offset) { prefetch_line(row.values + k, offset); }
  static WVec load_w(const Row& row, int64_t k) { return widen(_mm512_loadu_si512(row.values + k)); }
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) {
    return widen(_mm512_maskz_loadu_epi16(mask32(count), row.values + k));
  }
  static XVec load_x(const Token& token, int64_t k) { return widen(_mm512_loadu_si512(token.values + k)); }
  static __m512 madd(__m512 acc, XVec x, WVec w) {
    return _mm512_fmadd_ps(x.odd, w.odd, _mm512_fmadd_ps(x.even, w.even, acc));
  }
};

// q8 and q4 with VNNI, one superblock of 512 values per step (layouts: pack_q8 in matmul.h, q4 in
// core/formats.h). The weights come as eight vectors of unsigned codes (w + 128, or the nibble q + 8)
// that hold 4 values of each of the 16 blocks, lane by lane, as the prepared activations do; the codes
// are vpdpbusd's unsigned operand and the int8 activations its signed one. Eight vpdpbusd into one
// register, started from each lane's prepared -128 * sum(x) or -8 * sum(x), give every block's exact
// sum(w * x) in its own lane, which is converted and scaled by w_scale * x_scale once per superblock.
// A token's operands for a superblock are 640 contiguous prepared bytes, so one pointer per token
// suffices. The policies (Q8Vnni, Q4Vnni) say how a row's codes and scales load: load_codes gives
// vectors 2v and 2v + 1 of a superblock of `blocks` blocks (16, or fewer in a row's last one, whose
// vectors are 4 * blocks bytes apart; missing lanes load as code 0 with scale 0, against zero
// activations), load_scales its blocks' scales.
struct SuperblockVnni {
  static_assert(kQ8BlockValues == 32 && kQ4BlockValues == 32 && kQ4SuperblockValues == 512, "a step is 16 blocks");
  static constexpr int kStep = 512, kTokens = 4, kRows = 3, kBatchTokens = 4, kBatchRows = 3, kNarrowBatchTokens = 0;
  static constexpr int kNarrowLongRows = 1;
  static constexpr int64_t kActivationBits = 10;  // 640 prepared bytes per 512 values
  struct Token { const std::byte* superblocks; };
  struct Codes { __m512i low, high; };
  struct WVec { __m512i codes[8]; __m512 scales; };
  using XVec = const std::byte*;
  static Token token(const MatmulOperands& op, int64_t t) { return {op.x_superblocks + t * op.x_stride / 4 * 5}; }
  static XVec load_x(const Token& token, int64_t k) { return token.superblocks + k / 4 * 5; }
  // Offsets in a token's 640 bytes: the int8 vectors, the 16 block scales, the 16 corrections.
  static constexpr int kScalesAt = 512, kCorrectionsAt = 576;
  // Four integer chains of two vpdpbusd each, not one of eight: a single token's superblock is then not
  // held up by the instruction's latency (integer sums, so the result is the same).
  static __m512i dot_products(XVec x, const WVec& w) {
    __m512i part[4];
    part[0] = _mm512_dpbusd_epi32(_mm512_load_si512(x + kCorrectionsAt), w.codes[0], _mm512_load_si512(x));
#pragma GCC unroll 4
    for (int s = 1; s < 4; ++s) part[s] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.codes[s], _mm512_load_si512(x + 64 * s));
#pragma GCC unroll 4
    for (int s = 4; s < 8; ++s) part[s - 4] = _mm512_dpbusd_epi32(part[s - 4], w.codes[s], _mm512_load_si512(x + 64 * s));
    return _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]), _mm512_add_epi32(part[2], part[3]));
  }
  // acc + (each block's integer dot product) * w_scale * x_scale: the one float step per superblock.
  static __m512 scale_add(__m512 acc, __m512i dots, __m512 w_scales, XVec x) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots),
                           _mm512_mul_ps(w_scales, _mm512_load_ps(reinterpret_cast<const float*>(x + kScalesAt))), acc);
  }
  static __m512 madd(__m512 acc, XVec x, const WVec& w) { return scale_add(acc, dot_products(x, w), w.scales, x); }
};

// A superblock's eight code vectors and scales for the single-row tile.
template <class P>
typename P::WVec superblock_weights(const typename P::Row& row, int64_t k, int blocks) {
  typename P::WVec w;
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    const typename P::Codes codes = P::load_codes(row, k, v, blocks);
    w.codes[2 * v] = codes.low;
    w.codes[2 * v + 1] = codes.high;
  }
  w.scales = P::load_scales(row, k, blocks);
  return w;
}

inline int tail_blocks(int64_t count) { return static_cast<int>((count + kQ4BlockValues - 1) / kQ4BlockValues); }

// The single-row tile's loads for a superblock format P (Q8Vnni, Q4Vnni), from P's load_codes and
// load_scales.
template <class P>
struct SuperblockRowLoads : SuperblockVnni {
  template <class Row>
  static WVec load_w(const Row& row, int64_t k) { return superblock_weights<P>(row, k, 16); }
  template <class Row>
  static WVec load_w_tail(const Row& row, int64_t k, int64_t count) { return superblock_weights<P>(row, k, tail_blocks(count)); }
};

struct Q8Vnni : SuperblockRowLoads<Q8Vnni> {
  static constexpr int64_t kWeightBits = 8;
  // Steps of up to 8 tokens take tiles of 8 tokens x one row (takes_narrow_tiles, below): on a 2-core
  // Zen 5 such q8 products (K = 1536 and 2048, LM head included) took 20-35% less time at 2-8 tokens
  // than in 4 x 3 tiles (interleaved A/B); at 16 tokens and in bf16 one row measured slower.
  static constexpr int kNarrowBatchTokens = 8;
  // Long rows, read in segments, take two rows per tile: each activation vector then feeds two
  // vpdpbusd, and 16 integer chains run side by side instead of 8. E2B's down projections at 8 tokens
  // (1536x6144: 757-956 us against 1,005-1,221 per call, Zen 5, two threads), and 8-sequence q8 decode
  // steps 5-7% faster at the median (thirteen of fifteen interleaved pairs).
  static constexpr int kNarrowLongRows = 2;
  // codes + k and scales + k / 32 address value k's code and block scale within the row's segment that
  // holds k0 (a tile's K range lies in one segment: q8_packed_address, q8_scale_index).
  struct Row { const uint8_t* codes; const float* scales; };
  static Row row(const MatmulOperands& op, int64_t r, int64_t k0) {
    const int64_t segment_begin = k0 / kQ8SegmentValues * kQ8SegmentValues;
    const int64_t address = q8_packed_address(r, segment_begin, op.cols);
    return {static_cast<const uint8_t*>(op.w) + (address - segment_begin), op.w_scales + (address - segment_begin) / kQ8BlockValues};
  }
  static void prefetch(const Row& row, int64_t k, int64_t offset) {
    for (int line = 0; line < 8; ++line) prefetch_line(row.codes + k + offset, 64 * line);
  }
  static Codes load_codes(const Row& row, int64_t k, int v, int blocks) {
    if (blocks == 16) return {_mm512_loadu_si512(row.codes + k + 128 * v), _mm512_loadu_si512(row.codes + k + 128 * v + 64)};
    const __mmask64 lanes = mask64(4 * blocks);
    return {_mm512_maskz_loadu_epi8(lanes, row.codes + k + 8 * blocks * v),
            _mm512_maskz_loadu_epi8(lanes, row.codes + k + 8 * blocks * v + 4 * blocks)};
  }
  static __m512 load_scales(const Row& row, int64_t k, int blocks) {
    const float* scales = row.scales + k / kQ8BlockValues;
    return blocks == 16 ? _mm512_loadu_ps(scales) : _mm512_maskz_loadu_ps(mask16(blocks), scales);
  }
};

// Each of a q4 superblock's four 64-byte vectors gives two vectors of codes: low nibbles, high nibbles.
struct Q4Vnni : SuperblockRowLoads<Q4Vnni> {
  static constexpr int64_t kWeightBits = 4;
  // q4's rows carry half q8's bytes, so its arithmetic weighs more: one-row tiles measured 10-33% faster
  // at 2-4 tokens on the Zen 5, and 8-30% slower at 8 (where 4 x 3 tiles keep it closer to the compute roof).
  // Two rows per tile on long rows measured slower at 3-4 tokens (five of six cases, by up to 13%).
  static constexpr int kNarrowBatchTokens = 4;
  struct Row { const uint8_t* nibbles; const uint16_t* scales; };
  static Row row(const MatmulOperands& op, int64_t r, int64_t) {
    return {static_cast<const uint8_t*>(op.w) + r * q4_row_bytes(op.cols), op.w_half_scales + r * q4_blocks_per_row(op.cols)};
  }
  static void prefetch(const Row& row, int64_t k, int64_t offset) {
    for (int line = 0; line < 4; ++line) prefetch_line(row.nibbles + k / 2 + offset, 64 * line);
  }
  static Codes load_codes(const Row& row, int64_t k, int v, int blocks) {
    const __m512i packed = blocks == 16 ? _mm512_loadu_si512(row.nibbles + k / 2 + 64 * v)
                                        : _mm512_maskz_loadu_epi8(mask64(4 * blocks), row.nibbles + k / 2 + 4 * blocks * v);
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
    return {_mm512_and_si512(packed, low_nibbles), _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles)};
  }
  static __m512 load_scales(const Row& row, int64_t k, int blocks) {
    const uint16_t* scales = row.scales + k / kQ4BlockValues;
    return _mm512_cvtph_ps(blocks == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales))
                                        : _mm256_maskz_loadu_epi16(mask16(blocks), scales));
  }
};

// Bytes of `values` consecutive weights of a row in policy P's storage.
template <class P>
constexpr int64_t weight_bytes_of(int64_t values) { return values * P::kWeightBits / 8; }

// Whether P's weights of these operands are stored segment-major (q8's long rows: q8_packed_address).
template <class P>
bool segmented(const MatmulOperands& op) { return P::kWeightBits == 8 && q8_segmented(op.cols); }

// Where value k of row r lies, in bytes from the start of the weights.
template <class P>
int64_t weight_offset(const MatmulOperands& op, int64_t r, int64_t k) {
  if (P::kWeightBits == 8) return q8_packed_address(r, k, op.cols);
  return r * weight_bytes_of<P>(op.cols) + weight_bytes_of<P>(k);
}

// ---- the tile and the cache-blocked drivers, shared by all formats ----

// The part of K one tile call covers. A dot product split over several calls carries its accumulators
// in memory between them, so it performs exactly the operations of a single call.
struct KRange {
  int64_t begin = 0, end = 0;     // multiples of kStep, except end == cols: this call finishes the sums
  __m512* carried = nullptr;      // [MT][NR] accumulators, when [begin, end) is not all of K
  int64_t prefetch_offset = 0;    // bytes from each weight load to the line prefetched (0: none)
};

// A tile's weight rows: rows past row_count repeat the last valid one.
template <class P, int NR>
inline void tile_rows(const MatmulOperands& op, int64_t r0, int64_t row_count, int64_t k0, typename P::Row (&rows)[NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) rows[i] = P::row(op, r0 + (i < row_count ? i : row_count - 1), k0);
}

// The tokens' operands for the superblock tiles (at most a decode step's kBatchMaxTokens, or a prefill
// tile's), set once by the drivers and passed to every tile. Worked out in each tile (and spilled), they
// made a one-row q8 tile of 8 tokens at K = 1,536 take 72-76 cycles per row-superblock on warm weights
// instead of 64-66. (`tile`, the float formats' tile and one token's, works out its own: passing them
// measured no gain there.)
template <class P>
struct TokenOperands {
  static_assert(P::kTokens <= kBatchMaxTokens, "a prefill tile's tokens fit");
  typename P::Token token[kBatchMaxTokens];
  TokenOperands(const MatmulOperands& op, int64_t t0, int64_t count) {
    for (int64_t t = 0; t < count; ++t) token[t] = P::token(op, t0 + t);
  }
};

// A tile's sums at the start of `range`: those carried from the call before it, or zeros.
template <int MT, int NR>
inline void start_sums(const KRange& range, __m512 (&acc)[MT][NR]) {
  const bool resume = range.carried != nullptr && range.begin > 0;
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) acc[t][i] = resume ? _mm512_load_ps(range.carried + t * NR + i) : _mm512_setzero_ps();
  }
}

// Keeps a tile's sums for the call that continues them over the rest of K.
template <int MT, int NR>
inline void carry_sums(const KRange& range, const __m512 (&acc)[MT][NR]) {
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) _mm512_store_ps(range.carried + t * NR + i, acc[t][i]);
  }
}

// Writes a tile's sums (rows past row_count are not stored), four at a time through reduce4: four
// tokens of one row, two tokens of two rows, or four rows of one token. (The superblock tiles reduced
// one token's sums at a time, three of reduce4's four inputs zero when a tile has one row.)
template <int MT, int NR>
inline void store_sums(const MatmulOperands& op, int64_t t0, int64_t r0, int64_t row_count, const __m512 (&acc)[MT][NR]) {
  const __m512 zero = _mm512_setzero_ps();
  auto out = [&](int64_t t) { return op.y + (t0 + t) * op.y_stride + r0 - op.y_first_row; };
  if constexpr (NR == 1) {
#pragma GCC unroll 8
    for (int t = 0; t < MT; t += 4) {
      alignas(16) float sums[4];
      _mm_store_ps(sums, reduce4(acc[t][0], t + 1 < MT ? acc[t + 1][0] : zero, t + 2 < MT ? acc[t + 2][0] : zero,
                                 t + 3 < MT ? acc[t + 3][0] : zero));
      for (int i = 0; i < 4 && t + i < MT; ++i) *out(t + i) = sums[i];
    }
  } else if constexpr (NR == 2) {
    const __mmask8 rows = row_count >= 2 ? 3 : 1;
#pragma GCC unroll 8
    for (int t = 0; t < MT; t += 2) {
      const __m128 sums = reduce4(acc[t][0], acc[t][1], t + 1 < MT ? acc[t + 1][0] : zero, t + 1 < MT ? acc[t + 1][1] : zero);
      _mm_mask_storeu_ps(out(t), rows, sums);
      if (t + 1 < MT) _mm_mask_storeu_ps(out(t + 1), rows, _mm_movehl_ps(sums, sums));
    }
  } else {
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
#pragma GCC unroll 4
      for (int g = 0; g < NR; g += 4) {
        const __m128 sums = reduce4(acc[t][g], g + 1 < NR ? acc[t][g + 1] : zero, g + 2 < NR ? acc[t][g + 2] : zero,
                                    g + 3 < NR ? acc[t][g + 3] : zero);
        const int64_t valid = row_count - g;
        if (valid >= 4) {
          _mm_storeu_ps(out(t) + g, sums);
        } else if (valid > 0) {
          _mm_mask_storeu_ps(out(t) + g, static_cast<__mmask8>((1u << valid) - 1u), sums);
        }
      }
    }
  }
}

// Tokens [t0, t0 + MT) x rows [r0, r0 + row_count), row_count <= NR, over K range `range`. Missing rows
// repeat the last valid one (read again from cache) and are not stored.
template <class P, int MT, int NR>
void tile(const MatmulOperands& op, int64_t t0, int64_t r0, int64_t row_count, const KRange& range) {
  typename P::Row rows[NR];
  tile_rows<P, NR>(op, r0, row_count, range.begin, rows);
  typename P::Token tokens[MT];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) tokens[t] = P::token(op, t0 + t);

  // One chain per output, also for a single token: its sums are then those of any multi-token tile, so
  // a sequence decoding alone gets the bits it gets batched with others (steps of up to 16 rows).
  __m512 acc[MT][NR];
  start_sums(range, acc);
  auto step = [&](int64_t k) {
    if (range.prefetch_offset != 0) {
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) P::prefetch(rows[i], k, range.prefetch_offset);
    }
    typename P::WVec w[NR];
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) w[i] = P::load_w(rows[i], k);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const typename P::XVec x = P::load_x(tokens[t], k);
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) acc[t][i] = P::madd(acc[t][i], x, w[i]);
    }
  };

  const int64_t cols = op.cols;
  const int64_t full = cols - cols % P::kStep;
  const int64_t stop = range.end < full ? range.end : full;
  int64_t k = range.begin;
  if constexpr (MT * NR == 1) {
    // One token's row (bf16 decode): unrolled, a line of weights costs 4 instructions instead of 8, and
    // more rows' chains fit the out-of-order window. Decode/bf16 in the kernel bench: one thread 20-40%
    // faster, two 0-15%; E2B bf16 one stream 3-6% (docs/benchmarks.md). The bits are the same.
#pragma GCC unroll 4
    for (; k < stop; k += P::kStep) step(k);
  } else {
    for (; k < stop; k += P::kStep) step(k);
  }
  if (range.end < cols) return carry_sums(range, acc);
  if (k < cols) {  // activations are zero padded, so only the weights need masking
    typename P::WVec w[NR];
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) w[i] = P::load_w_tail(rows[i], k, cols - k);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const typename P::XVec x = P::load_x(tokens[t], k);
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) acc[t][i] = P::madd(acc[t][i], x, w[i]);
    }
  }

  store_sums(op, t0, r0, row_count, acc);
}

// A loaded vector the compiler must keep in a register: otherwise it folds the load into each of the
// NR vpdpbusd that read it (their signed operand may be memory), and loads, not products, set the pace.
inline __m512i in_register(__m512i value) {
  asm("" : "+v"(value));
  return value;
}

// The multi-token tile of the superblock formats: each pair of code vectors of MT x NR rows' superblock
// is loaded once and feeds MT tokens, each activation vector NR rows, into MT x NR integer sums that
// stay in registers for the superblock (2 * MT * NR + 2 * NR + 1 of the 32 vector registers, with the
// float sums; where that is more, the float sums live in memory: superblock_tile). Per pair, a
// superblock then costs 8 vpdpbusd and one convert, multiply and add: scale_add, in one chain
// superblock after superblock whatever the tile's size, so a value does not depend on which
// multi-token tile it came from.
template <class P, int MT, int NR, bool kTail>
inline void superblock_step(const typename P::Row (&rows)[NR], const typename P::Token* tokens, int64_t k,
                            int blocks, int64_t prefetch_offset, __m512 (&acc)[MT][NR]) {
  if (prefetch_offset != 0) {
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) P::prefetch(rows[i], k, prefetch_offset);
  }
  const int lanes = kTail ? blocks : 16;
  typename P::XVec x[MT];
  __m512i dots[MT][NR];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
    x[t] = P::load_x(tokens[t], k);
    const __m512i correction = _mm512_load_si512(x[t] + P::kCorrectionsAt);
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) dots[t][i] = correction;
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    typename P::Codes codes[NR];
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) codes[i] = P::load_codes(rows[i], k, v, lanes);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const __m512i low = in_register(_mm512_load_si512(x[t] + 128 * v));
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) dots[t][i] = _mm512_dpbusd_epi32(dots[t][i], codes[i].low, low);
    }
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const __m512i high = in_register(_mm512_load_si512(x[t] + 128 * v + 64));
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) dots[t][i] = _mm512_dpbusd_epi32(dots[t][i], codes[i].high, high);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i) {
    const __m512 w_scales = P::load_scales(rows[i], k, lanes);
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) acc[t][i] = P::scale_add(acc[t][i], dots[t][i], w_scales, x[t]);
  }
}

// Float sums that must stay in memory (the asm claims to read and write them): with 8 tokens x 2 rows
// the 16 integer sums and the code vectors fill the registers, and the compiler would otherwise spill
// integer vectors inside the superblock instead of these, touched once per superblock (without it: 39
// zmm spills in run_batch<Q8Vnni, 8, 2> against 2, and 1536x6144 at 8 tokens 947-1,134 us a call
// against 711-887).
template <int MT, int NR>
inline void keep_in_memory(__m512 (&acc)[MT][NR]) {
  asm volatile("" : "+m"(acc));
}

template <class P, int MT, int NR>
void superblock_tile(const MatmulOperands& op, const typename P::Token* tokens, int64_t t0, int64_t r0, int64_t row_count,
                     const KRange& range) {
  static_assert(NR <= 4, "one reduce4 per token");
  constexpr bool kSumsInMemory = 2 * MT * NR + 2 * NR + 1 > 32;
  typename P::Row rows[NR];
  tile_rows<P, NR>(op, r0, row_count, range.begin, rows);
  __m512 acc[MT][NR];
  start_sums(range, acc);
  const int64_t cols = op.cols;
  const int64_t full = cols - cols % P::kStep;
  const int64_t stop = range.end < full ? range.end : full;
  int64_t k = range.begin;
  for (; k < stop; k += P::kStep) {
    if constexpr (kSumsInMemory) keep_in_memory(acc);
    superblock_step<P, MT, NR, false>(rows, tokens, k, 16, range.prefetch_offset, acc);
  }
  if constexpr (kSumsInMemory) keep_in_memory(acc);
  if (range.end < cols) return carry_sums(range, acc);
  if (k < cols) superblock_step<P, MT, NR, true>(rows, tokens, k, tail_blocks(cols - k), 0, acc);
  store_sums(op, t0, r0, row_count, acc);
}

template <class P, int MT, int NR>
void tile_for_tokens(int64_t token_count, const MatmulOperands& op, const typename P::Token* tokens, int64_t t0, int64_t r0,
                     int64_t row_count, const KRange& range) {
  if constexpr (MT > 1) {
    if (token_count < MT) return tile_for_tokens<P, MT - 1, NR>(token_count, op, tokens, t0, r0, row_count, range);
  }
  if constexpr (P::kStep == kQ4SuperblockValues && MT * NR > 1) {
    superblock_tile<P, MT, NR>(op, tokens, t0, r0, row_count, range);
  } else {
    tile<P, MT, NR>(op, t0, r0, row_count, range);
  }
}

// One token (the decode step of one sequence): each weight row is read by a single-row tile, one
// sequential stream being what the hardware prefetchers follow best (interleaving four rows measured
// a third slower on one Zen 4 core), and the work per weight byte is small.
// A step's K is cut into chunks (decode_chunk) when the activations every row reads (all its tokens)
// are more than L1 holds (32 KiB); one token's float rows already when they take more than half of it
// (one_token_chunk) ...
constexpr int64_t kDecodeActivationLimit = 32 * 1024;
// ... into chunks whose activations take at most half of it, blocks of this many rows taking turns per
// chunk (cutting rows whose activations fit anyway measured slower).
constexpr int64_t kDecodeChunkBytes = 16 * 1024;
constexpr int kDecodeBlockRows = 8;
// q8 and q4 tiles do more work per activation byte: their chunks measured fastest at 80 KiB (8 tokens x
// 8192 values), where the activations come partly from L2, rather than in more, shorter passes: at
// 16 KiB a step of 8 sequences through a 1536 x 12288 q8 weight took 1.2-1.3x as long.
constexpr int64_t kSuperblockChunkBytes = 80 * 1024;

// Bytes of the prepared activations of all the step's tokens over the whole of K.
template <class P>
int64_t activation_bytes(const MatmulOperands& op) { return op.tokens * op.cols * P::kActivationBits / 8; }

// Values of K, a multiple of `unit` and at least one, whose activations (all tokens) take at most `bytes`.
template <class P>
int64_t values_within(const MatmulOperands& op, int64_t bytes, int64_t unit) {
  const int64_t values = bytes * 8 / (op.tokens * P::kActivationBits) / unit * unit;
  return values < unit ? unit : values;
}

// Values of K per chunk: all of it while the tokens' activations fit L1, else what fills half of it.
template <class P>
int64_t decode_chunk(const MatmulOperands& op) {
  if (activation_bytes<P>(op) <= kDecodeActivationLimit) return op.cols;
  const int64_t chunk_bytes = P::kStep == kQ4SuperblockValues ? kSuperblockChunkBytes : kDecodeChunkBytes;
  return values_within<P>(op, chunk_bytes, 2 * P::kStep);
}

// Values of K per chunk of one token's float rows read in chunks: all of it while its activations take
// at most half of a 32 KiB L1, else the fewest equal chunks that do. On a Zen 4 and on one Zen 5 VM a
// whole row of bf16 activations of 24 KiB (K = 12,288) did not stay in L1 beside the weight stream:
// one thread streamed 1536 x 12288 at 17-19 GB/s whole and at 20.5-23 GB/s in two chunks of 12 KiB
// (three of 8 KiB: 21-22); on another Zen 5 VM whole rows were the faster (1,058-1,248 us against
// 1,286-1,341 in two chunks; docs/benchmarks.md), hence the measured choice in run_decode. 1536 x 6144
// (12 KiB) whole at 29 GB/s, but 47-70% slower cut into chunks of 2-8 KiB. Superblock formats keep
// decode_chunk.
template <class P>
int64_t one_token_chunk(const MatmulOperands& op) {
  if constexpr (P::kStep == kQ4SuperblockValues) return decode_chunk<P>(op);
  const int64_t bytes = activation_bytes<P>(op);
  if (bytes <= kDecodeChunkBytes) return op.cols;
  const int64_t chunks = (bytes + kDecodeChunkBytes - 1) / kDecodeChunkBytes, unit = 2 * P::kStep;
  return ((op.cols + chunks - 1) / chunks + unit - 1) / unit * unit;
}

// Values of K per chunk of a step of several tokens. bf16 tiles on vdpbf16ps take the whole of K, the
// activations coming from L2 (at most 16 tokens x 12,288 values, 384 KiB) while each row streams front
// to back. With the tokens' rows off the 4 KiB stride as well (PreparedActivations::reshape), 8 tokens
// through E2B's 1536 x 12288 down projections took 3-7% longer than one token, against 22-33% in
// chunks of 16 KiB kept in L1 on the page stride (1536 x 6144: 19-50% against 37-67%; docs/benchmarks.md).
template <class P>
int64_t batch_chunk(const MatmulOperands& op) {
  if constexpr (std::is_same_v<P, Bf16Dot>) return op.cols;
  return decode_chunk<P>(op);
}

// One token over segment-major q8 rows (q8_packed_address): each block of rows is read front to back,
// segment after segment, each row's sum kept between its segments. Within a block a segment's rows lie
// one after another, so the next row's codes and scales are the current ones' plus a segment. (Through
// `tile`, with its per-call set-up every 4 superblocks, 1536 x 6144 took 6-16% longer than whole rows of
// the row-major layout; this loop is within 2% of them, either way.)
// The weights are read in address order here, so the prefetch runs a fixed distance ahead: 2 KiB
// measured 3-5% faster than decode's 3 KiB, 1-1.5 KiB no better, 4 KiB 6% slower.
constexpr int64_t kSegmentPrefetchBytes = 2048;
[[gnu::flatten]] void decode_segments(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  using P = Q8Vnni;
  const P::Token token = P::token(op, 0);
  const int64_t row_bytes = q8_packed_row_bytes(op.cols);
  const int64_t full = op.cols - op.cols % P::kStep;
  alignas(64) __m512 sums[kQ8SegmentRows];
  for (int64_t first = row_begin; first < row_end;) {
    const int64_t last = smaller(row_end, (first / kQ8SegmentRows + 1) * kQ8SegmentRows);  // this block's rows
    for (int64_t k0 = 0; k0 < op.cols; k0 += kQ8SegmentValues) {
      const int64_t length = smaller(kQ8SegmentValues, row_bytes - k0);  // bytes of each row in this segment
      const int64_t stop = smaller(k0 + kQ8SegmentValues, full);
      P::Row row = P::row(op, first, k0);
      for (int64_t r = first; r < last; ++r, row.codes += length, row.scales += length / kQ8BlockValues) {
        __m512 acc = k0 == 0 ? _mm512_setzero_ps() : sums[r - first];
        int64_t k = k0;
        for (; k < stop; k += P::kStep) {
          P::prefetch(row, k, kSegmentPrefetchBytes);
          acc = P::madd(acc, P::load_x(token, k), P::load_w(row, k));
        }
        if (k < op.cols && k0 + length >= row_bytes) acc = P::madd(acc, P::load_x(token, k), P::load_w_tail(row, k, op.cols - k));
        sums[r - first] = acc;
      }
    }
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = first; r < last; r += 4) {
      alignas(16) float four[4];
      const int64_t i = r - first;
      _mm_store_ps(four, reduce4(sums[i], r + 1 < last ? sums[i + 1] : zero, r + 2 < last ? sums[i + 2] : zero,
                                 r + 3 < last ? sums[i + 3] : zero));
      for (int64_t j = 0; j < 4 && r + j < last; ++j) op.y[r + j - op.y_first_row] = four[j];
    }
    first = last;
  }
}

// Flattened (every call inlined into the row loop): GCC's own choice moved with unrelated edits to this
// file (tile<Q8Vnni, 1, 1> once became a call per row). Flattened, one-token rows of K = 1,536 on warm
// weights took 9-24% less time than with GCC's choices before (q8 23 -> 20.5, q4 16 -> 12.2, bf16 54 ->
// 49 cycles per 512 values); on cold weights equal or 1-5% less in ten of ten pairs.
template <class P>
[[gnu::flatten]] void decode_whole_rows(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  const KRange whole{0, op.cols, nullptr, P::kWeightBits == 4 ? kQ4PrefetchBytes : kPrefetchBytes};
  for (int64_t r = row_begin; r < row_end; ++r) tile<P, 1, 1>(op, 0, r, 1, whole);
}

// Long rows in chunks: the weights are read in segments of `chunk` values, row after row within a
// block, then the next chunk. Each segment prefetches the one read after it, at the same offset.
template <class P>
[[gnu::flatten]] void decode_row_chunks(const MatmulOperands& op, int64_t row_begin, int64_t row_end, int64_t chunk) {
  alignas(64) __m512 carried[kDecodeBlockRows];  // each row's sums between chunks
  const int64_t row_bytes = weight_bytes_of<P>(op.cols);
  for (int64_t block = row_begin; block < row_end; block += kDecodeBlockRows) {
    const int64_t block_rows = smaller(kDecodeBlockRows, row_end - block);
    for (int64_t k0 = 0; k0 < op.cols; k0 += chunk) {
      const int64_t k1 = op.cols - k0 <= chunk ? op.cols : k0 + chunk;
      for (int64_t i = 0; i < block_rows; ++i) {
        const int64_t here = (block + i) * row_bytes + weight_bytes_of<P>(k0);
        const int64_t next = i + 1 < block_rows ? here + row_bytes
                             : k1 < op.cols     ? block * row_bytes + weight_bytes_of<P>(k1)
                                                : (block + block_rows) * row_bytes;
        tile<P, 1, 1>(op, 0, block + i, 1, KRange{k0, k1, &carried[i], next - here});
      }
    }
  }
}

template <class P>
void run_decode(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  if constexpr (std::is_same_v<P, Q8Vnni>) {
    if (segmented<P>(op)) return decode_segments(op, row_begin, row_end);
  }
  const int64_t chunk = one_token_chunk<P>(op);
  if (chunk == op.cols) return decode_whole_rows<P>(op, row_begin, row_end);
  measured_choice<P>().run((row_end - row_begin) * weight_bytes_of<P>(op.cols), [&](int way) {
    if (way == 0) return decode_whole_rows<P>(op, row_begin, row_end);
    decode_row_chunks<P>(op, row_begin, row_end, chunk);
  });
}

// Steps of a policy's kNarrowBatchTokens tokens or fewer read the weights one row at a time (q8's long
// rows two at a time, kNarrowLongRows), in order, like a single token: the stream a core's prefetchers
// follow best. The activations a row segment meets stay in L1 beside it: at most this many bytes
// (20 KiB: 8 q8 tokens of 2048 values); longer rows are cut into segments of that many values, blocks
// of rows taking turns per segment as in run_decode. With 30 KiB, every row took them from L2 (one-row
// tiles up to a quarter slower than 4 x 3).
constexpr int64_t kNarrowActivationBytes = 20 * 1024;

// Whether a step takes narrow tiles: few enough tokens, and short rows or more than half the policy's
// count. Long rows cut into segments paid off at 6-8 q8 tokens and 4 q4 tokens (1536x6144
// and 1536x12288: 8-17% less time than 4 x 3 tiles), not at 2-4 q8 tokens (2-10% more).
template <class P>
bool takes_narrow_tiles(const MatmulOperands& op) {
  if (op.tokens > P::kNarrowBatchTokens) return false;
  return activation_bytes<P>(op) <= kNarrowActivationBytes || 2 * op.tokens > P::kNarrowBatchTokens;
}

// Values of K per segment of a narrow step: all of it, or what keeps the activations within
// kNarrowActivationBytes (whole superblocks).
template <class P>
int64_t narrow_chunk(const MatmulOperands& op) {
  const int64_t chunk = values_within<P>(op, kNarrowActivationBytes, P::kStep);
  return chunk >= op.cols ? op.cols : chunk;
}

// A few tokens (a decode step of several sequences): tiles of up to kBatchTokens tokens x kBatchRows
// rows, so each weight vector loaded feeds several tokens and each activation vector several rows
// (single-row tiles spend a load on every multiply-add and stay below the compute roof). Except for
// bf16 on vdpbf16ps (batch_chunk), K is cut as in run_decode into chunks whose activations (all tokens)
// stay in L1 while blocks of rows take turns per chunk; every token tile of a group of rows reads the
// group's chunk from L1, and the first prefetches the segment read after it. Steps of few tokens take
// narrow tiles instead (takes_narrow_tiles, above), with `chunk` from narrow_chunk. Spreading the
// prefetches over all token tiles of a group, two groups ahead, measured 4-6% faster for 8 q8 tokens
// in 4 x 3 tiles on a Zen 5, but those products now take narrow tiles, and where 4 x 3 tiles remain
// (16 tokens, long K, q4 at 8) it measured 3-9% slower.
constexpr int64_t kBatchBlockRows = 12;  // a multiple of every kBatchRows
static_assert(kBatchBlockRows == kQ8SegmentRows, "a block of rows is one of segment-major q8's");
constexpr int64_t kStagedRows = 4 * kBatchBlockRows;  // 48 outputs: 3 cache lines per token

template <class P, int MT = P::kBatchTokens, int NR = P::kBatchRows>
void run_batch(const MatmulOperands& op, int64_t row_begin, int64_t row_end, int64_t chunk) {
  static_assert(kBatchBlockRows % NR == 0, "blocks hold whole groups of rows");
  const int64_t tiles = (op.tokens + MT - 1) / MT;
  alignas(64) __m512 carried[kBatchBlockRows / NR][(kBatchMaxTokens + MT - 1) / MT][MT * NR];
  // Outputs are staged here and copied out every kStagedRows rows, whole cache lines per token: the
  // tiles' few floats per token would otherwise land in rows y_stride apart, and where that is a power
  // of two (the LM head's 262,144 rows: 1 MiB) every token's line falls in the same cache set, more
  // lines than the set has ways (16 tokens through the head took 3.6x as long as 8).
  alignas(64) float staged[kBatchMaxTokens * kStagedRows];
  MatmulOperands local = op;
  local.y = staged;
  local.y_stride = kStagedRows;
  auto segment = [&](int64_t row, int64_t k) { return weight_offset<P>(op, row, k); };
  const TokenOperands<P> operands(op, 0, op.tokens);
  for (int64_t stage = row_begin; stage < row_end; stage += kStagedRows) {
    const int64_t stage_end = smaller(stage + kStagedRows, row_end);
    local.y_first_row = stage;
    for (int64_t block = stage; block < stage_end; block += kBatchBlockRows) {
      const int64_t block_end = smaller(block + kBatchBlockRows, stage_end);
      for (int64_t k0 = 0; k0 < op.cols; k0 += chunk) {
        const int64_t k1 = op.cols - k0 <= chunk ? op.cols : k0 + chunk;
        for (int64_t r0 = block, group = 0; r0 < block_end; r0 += NR, ++group) {
          const int64_t here = segment(r0, k0);
          // What the first tile prefetches: the segment read next after this group's, or for one-row
          // tiles the one after that (2-5% faster at 4 and 8 tokens on the Zen 5; with long rows cut
          // into segments, counting past the block's last row into the next segment or block).
          const int64_t skip = NR == 1 ? 2 : NR, in_block = block_end - block, i = r0 - block;
          const int64_t past = NR == 1 ? smaller(i + skip - in_block, in_block - 1) : 0;
          const int64_t prefetched = i + skip < in_block ? segment(r0 + skip, k0)
                                     : k1 < op.cols      ? segment(block + past, k1)
                                                         : segment(block_end + past, 0);
          for (int64_t tile_index = 0; tile_index < tiles; ++tile_index) {
            // Equal tiles (16 tokens: 8 + 8, 12: 6 + 6): none left with a token or two. A single tile
            // skips the divisions: with the epilogue above, 11% of a warm 8-token q8 row at K = 1,536.
            const int64_t t0 = tiles == 1 ? 0 : op.tokens * tile_index / tiles;
            const int64_t t1 = tiles == 1 ? op.tokens : op.tokens * (tile_index + 1) / tiles;
            const KRange range{k0, k1, chunk == op.cols ? nullptr : carried[group][tile_index], tile_index == 0 ? prefetched - here : 0};
            tile_for_tokens<P, MT, NR>(t1 - t0, local, operands.token + t0, t0, r0, smaller(NR, block_end - r0), range);
          }
        }
      }
    }
    for (int64_t t = 0; t < op.tokens; ++t) {
      std::memcpy(op.y + t * op.y_stride + stage - op.y_first_row, staged + t * kStagedRows,
                  static_cast<size_t>(stage_end - stage) * sizeof(float));
    }
  }
}

// Prefill: rows are taken in blocks that fit L2; inside a block every token tile sweeps all its rows,
// so the token tile's activations stay in L1 while weight rows stream from L2 (from memory once).
template <class P>
void run(const MatmulOperands& op, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || op.tokens <= 0) return;
  if (op.tokens == 1) return run_decode<P>(op, row_begin, row_end);
  // Segment-major rows are read a segment at a time (no K range crosses one).
  const int64_t segment = segmented<P>(op) ? kQ8SegmentValues : op.cols;
  if constexpr (P::kNarrowBatchTokens > 0) {
    if (takes_narrow_tiles<P>(op)) {
      const int64_t chunk = narrow_chunk<P>(op);
      if (chunk < op.cols) return run_batch<P, P::kNarrowBatchTokens, P::kNarrowLongRows>(op, row_begin, row_end, smaller(chunk, segment));
      return run_batch<P, P::kNarrowBatchTokens, 1>(op, row_begin, row_end, smaller(chunk, segment));
    }
  }
  if (op.tokens <= kBatchMaxTokens) return run_batch<P>(op, row_begin, row_end, smaller(batch_chunk<P>(op), segment));
  const KRange whole{0, op.cols, nullptr, 0};
  const int64_t row_bytes = weight_bytes_of<P>(op.cols) + 64;
  int64_t block_rows = kWeightBlockBytes / row_bytes / P::kRows * P::kRows;
  if (block_rows < P::kRows) block_rows = P::kRows;
  for (int64_t block = row_begin; block < row_end; block += block_rows) {
    const int64_t block_end = smaller(block + block_rows, row_end);
    for (int64_t t0 = 0; t0 < op.tokens; t0 += P::kTokens) {
      const int64_t token_count = smaller(P::kTokens, op.tokens - t0);
      const TokenOperands<P> operands(op, t0, token_count);
      for (int64_t r0 = block; r0 < block_end; r0 += P::kRows) {
        const int64_t row_count = smaller(P::kRows, block_end - r0);
        if (segment >= op.cols) {
          tile_for_tokens<P, P::kTokens, P::kRows>(token_count, op, operands.token, t0, r0, row_count, whole);
          continue;
        }
        alignas(64) __m512 carried[P::kTokens * P::kRows];  // the tile's sums between segments
        for (int64_t k0 = 0; k0 < op.cols; k0 += segment) {
          const KRange range{k0, smaller(k0 + segment, op.cols), carried, 0};
          tile_for_tokens<P, P::kTokens, P::kRows>(token_count, op, operands.token, t0, r0, row_count, range);
        }
      }
    }
  }
}

}  // namespace

void matmul_f32_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<F32Fma>(operands, row_begin, row_end);
}

void matmul_bf16_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<Bf16Widen>(operands, row_begin, row_end);
}

void matmul_bf16_avx512bf16(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  if (operands.tokens > kBatchMaxTokens) return prefill_bf16_panels_avx512bf16(operands, row_begin, row_end);
  run<Bf16Dot>(operands, row_begin, row_end);
}

void matmul_q8_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<Q8Vnni>(operands, row_begin, row_end);
}

void matmul_q4_avx512(const MatmulOperands& operands, int64_t row_begin, int64_t row_end) {
  run<Q4Vnni>(operands, row_begin, row_end);
}

// Same arithmetic as float_to_bf16 (round_to_bf16_bits).
void round_to_bf16_avx512(const float* source, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = count - i >= 16 ? static_cast<__mmask16>(0xffff) : mask16(count - i);
    _mm512_mask_cvtepi32_storeu_epi16(out + i, lanes, round_to_bf16_bits(_mm512_maskz_loadu_epi32(lanes, source + i)));
  }
}

// Same arithmetic as the scalar quantize_q8: absmax / 127 as the scale, x / scale rounded to nearest
// even (the default MXCSR mode), clamped to +-127.
void quantize_q8_row_avx512(const float* source, int64_t cols, int8_t* values, float* block_scales) {
  const __m512 sign_clear = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i low = _mm512_set1_epi32(-127), high = _mm512_set1_epi32(127);
  for (int64_t start = 0, block = 0; start < cols; start += kQ8BlockValues, ++block) {
    const int64_t count = smaller(kQ8BlockValues, cols - start);
    const __mmask16 first = count >= 16 ? static_cast<__mmask16>(0xffff) : mask16(count);
    const __mmask16 second = count >= 32 ? static_cast<__mmask16>(0xffff) : count > 16 ? mask16(count - 16) : 0;
    const __m512 a = _mm512_maskz_loadu_ps(first, source + start);
    const __m512 b = _mm512_maskz_loadu_ps(second, source + start + 16);
    const float absmax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, sign_clear), _mm512_and_ps(b, sign_clear)));
    const float scale = absmax / 127.0f;
    block_scales[block] = scale;
    if (scale == 0.0f) {
      _mm512_mask_cvtepi32_storeu_epi8(values + start, first, _mm512_setzero_si512());
      _mm512_mask_cvtepi32_storeu_epi8(values + start + 16, second, _mm512_setzero_si512());
      continue;
    }
    const __m512 divisor = _mm512_set1_ps(scale);
    const __m512i qa = _mm512_min_epi32(high, _mm512_max_epi32(low, _mm512_cvtps_epi32(_mm512_div_ps(a, divisor))));
    const __m512i qb = _mm512_min_epi32(high, _mm512_max_epi32(low, _mm512_cvtps_epi32(_mm512_div_ps(b, divisor))));
    _mm512_mask_cvtepi32_storeu_epi8(values + start, first, qa);
    _mm512_mask_cvtepi32_storeu_epi8(values + start + 16, second, qb);
  }
}

}  // namespace gemma4rt::kernels::detail
