// AVX-512 bodies of the vector kernels (16 fp32 lanes; tails use masked loads and stores).
// This file is compiled for AVX-512, so it holds only raw-pointer loops and intrinsics inside an
// anonymous namespace: no inline or template code that another translation unit could also
// instantiate (the linker could keep this copy and run it on a CPU without AVX-512).
// GCC 12's intrinsic headers start many results from a deliberately undefined vector, which -Wall
// reports as uninitialised once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels/head_blocks.h"
#include "backend/cpu/kernels/math_avx512.h"
#include "backend/cpu/kernels/vector_ops.h"

namespace gemma4rt::kernels::detail {
namespace {

constexpr int64_t kLanes = 16;

int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// Lanes [0, remaining) of a 16-lane vector.
__mmask16 first_lanes(int64_t remaining) {
  if (remaining <= 0) return 0;
  if (remaining >= kLanes) return 0xffff;
  return static_cast<__mmask16>((1u << remaining) - 1u);
}

// ---- Transcendentals ----------------------------------------------------------------------------

// tanh: the odd Taylor series up to x^17 for |x| < 0.55 (where (1 - e) / (1 + e) would lose bits to
// cancellation), (1 - e) / (1 + e) with e = exp(-2|x|) above; saturates to +-1 for large |x|.
__m512 tanh_ps(__m512 x) {
  const __m512 sign_bit = _mm512_set1_ps(-0.0f);
  const __m512 magnitude = _mm512_andnot_ps(sign_bit, x);
  const __m512 square = _mm512_mul_ps(magnitude, magnitude);
  __m512 series = _mm512_set1_ps(6404582.0f / 10854718875.0f);
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(-929569.0f / 638512875.0f));
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(21844.0f / 6081075.0f));
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(-1382.0f / 155925.0f));
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(62.0f / 2835.0f));
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(-17.0f / 315.0f));
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(2.0f / 15.0f));
  series = _mm512_fmadd_ps(series, square, _mm512_set1_ps(-1.0f / 3.0f));
  series = _mm512_fmadd_ps(_mm512_mul_ps(series, square), magnitude, magnitude);
  const __m512 e = exp_nonpositive(_mm512_mul_ps(magnitude, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 ratio = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __mmask16 small = _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(0.55f), _CMP_LT_OQ);
  const __m512 result = _mm512_mask_mov_ps(ratio, small, series);
  return _mm512_or_ps(result, _mm512_and_ps(x, sign_bit));
}

// ---- Element-wise kernels -----------------------------------------------------------------------

float max_avx512(const float* values, int64_t size) {
  const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
  __m512 best0 = lowest, best1 = lowest;
  int64_t i = 0;
  for (; i + 2 * kLanes <= size; i += 2 * kLanes) {
    best0 = _mm512_max_ps(best0, _mm512_loadu_ps(values + i));
    best1 = _mm512_max_ps(best1, _mm512_loadu_ps(values + i + kLanes));
  }
  for (; i < size; i += kLanes) {
    best0 = _mm512_mask_max_ps(best0, first_lanes(size - i), best0, _mm512_maskz_loadu_ps(first_lanes(size - i), values + i));
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(best0, best1));
}

int64_t argmax_lanes_avx512(const float* values, int64_t size, float* lane_values, int32_t* lane_indices) {
  __m512 best = _mm512_set1_ps(-__builtin_inff());
  __m512i best_index = _mm512_setzero_si512();
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(values + i);
    const __mmask16 better = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);  // false for NaN; ties keep the earlier
    best = _mm512_mask_mov_ps(best, better, v);
    best_index = _mm512_mask_mov_epi32(best_index, better, index);
    index = _mm512_add_epi32(index, _mm512_set1_epi32(kLanes));
  }
  _mm512_store_ps(lane_values, best);
  _mm512_store_si512(lane_indices, best_index);
  return i;
}

float exp_shifted_sum_avx512(const float* values, int64_t size, float shift, float* out) {
  const __m512 offset = _mm512_set1_ps(shift);
  __m512 total0 = _mm512_setzero_ps(), total1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 * kLanes <= size; i += 2 * kLanes) {
    const __m512 first = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(values + i), offset));
    const __m512 second = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(values + i + kLanes), offset));
    if (out != nullptr) {
      _mm512_storeu_ps(out + i, first);
      _mm512_storeu_ps(out + i + kLanes, second);
    }
    total0 = _mm512_add_ps(total0, first);
    total1 = _mm512_add_ps(total1, second);
  }
  for (; i < size; i += kLanes) {
    const __mmask16 mask = first_lanes(size - i);
    const __m512 result = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, values + i), offset));
    if (out != nullptr) _mm512_mask_storeu_ps(out + i, mask, result);
    total0 = _mm512_mask_add_ps(total0, mask, total0, result);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(total0, total1));
}

float sum_squares_avx512(const float* x, int64_t size) {
  // Four accumulators hide the FMA latency and keep each partial sum short.
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps(), sum2 = _mm512_setzero_ps(), sum3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 4 * kLanes <= size; i += 4 * kLanes) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + kLanes);
    const __m512 c = _mm512_loadu_ps(x + i + 2 * kLanes), d = _mm512_loadu_ps(x + i + 3 * kLanes);
    sum0 = _mm512_fmadd_ps(a, a, sum0);
    sum1 = _mm512_fmadd_ps(b, b, sum1);
    sum2 = _mm512_fmadd_ps(c, c, sum2);
    sum3 = _mm512_fmadd_ps(d, d, sum3);
  }
  for (; i < size; i += kLanes) {
    const __m512 a = _mm512_maskz_loadu_ps(first_lanes(size - i), x + i);
    sum0 = _mm512_fmadd_ps(a, a, sum0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum0, sum1), _mm512_add_ps(sum2, sum3)));
}

void scale_into_avx512(const float* x, int64_t size, float factor, const float* weight, float* out) {
  const __m512 scale = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 mask = first_lanes(size - i);
    __m512 result = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), scale);
    if (weight != nullptr) result = _mm512_mul_ps(result, _mm512_maskz_loadu_ps(mask, weight + i));
    _mm512_mask_storeu_ps(out + i, mask, result);
  }
}

void gelu_tanh_multiply_avx512(const float* gate, const float* up, int64_t size, float* out) {
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 mask = first_lanes(size - i);
    const __m512 result = _mm512_mul_ps(gelu_tanh_ps(_mm512_maskz_loadu_ps(mask, gate + i)), _mm512_maskz_loadu_ps(mask, up + i));
    _mm512_mask_storeu_ps(out + i, mask, result);
  }
}

void apply_rope_avx512(float* heads, int64_t head_count, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < head_count; ++h) {
    float* head = heads + h * head_dim;
    for (int64_t j = 0; j < half; j += kLanes) {
      const __mmask16 mask = first_lanes(half - j);
      const __m512 first = _mm512_maskz_loadu_ps(mask, head + j);
      const __m512 second = _mm512_maskz_loadu_ps(mask, head + half + j);
      const __m512 rotated_first = _mm512_fmsub_ps(first, _mm512_maskz_loadu_ps(mask, cos + j),
                                                   _mm512_mul_ps(second, _mm512_maskz_loadu_ps(mask, sin + j)));
      const __m512 rotated_second = _mm512_fmadd_ps(second, _mm512_maskz_loadu_ps(mask, cos + half + j),
                                                    _mm512_mul_ps(first, _mm512_maskz_loadu_ps(mask, sin + half + j)));
      _mm512_mask_storeu_ps(head + j, mask, rotated_first);
      _mm512_mask_storeu_ps(head + half + j, mask, rotated_second);
    }
  }
}

void add_avx512(float* y, const float* x, int64_t size) {
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 mask = first_lanes(size - i);
    _mm512_mask_storeu_ps(y + i, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y + i), _mm512_maskz_loadu_ps(mask, x + i)));
  }
}

void softcap_avx512(float* values, int64_t size, float cap) {
  const __m512 inverse = _mm512_set1_ps(1.0f / cap);
  const __m512 limit = _mm512_set1_ps(cap);
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 mask = first_lanes(size - i);
    const __m512 capped = _mm512_mul_ps(tanh_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, values + i), inverse)), limit);
    _mm512_mask_storeu_ps(values + i, mask, capped);
  }
}

// Round to nearest even on the bit pattern, NaN kept quiet: the same bits as float_to_bf16.
void store_bf16_row_avx512(const float* source, int64_t size, uint16_t* destination) {
  const __m512i magnitude_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 mask = first_lanes(size - i);
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, source + i));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, magnitude_mask), infinity);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __m512i result = _mm512_mask_mov_epi32(rounded, nan, quiet_nan);
    _mm256_mask_storeu_epi16(destination + i, mask, _mm512_cvtepi32_epi16(result));
  }
}

// ---- Attention ----------------------------------------------------------------------------------
//
// Scores: tiles of kHeads query heads x kKeys key rows keep kHeads * kKeys <= 16 accumulators in
// registers; each key chunk is widened once and used by every head of the tile. Weighted values: tiles
// of kHeads heads x kVectors output vectors stay in registers over a block of slots; each value chunk is
// widened once per tile. Groups decompose into head tiles of 8, 4, 2 and 1; slots are walked in blocks
// small enough to stay in L1/L2 while every head tile of the group reads them. Both phases prefetch
// (into L2) the rows they need next, as the ring order or a row stride of several KV heads hides
// the pattern from the hardware prefetchers: single-head attention then streams at DRAM speed.

constexpr int64_t kSlotBlock = 64;
// Keys are prefetched about 8 KiB of rows ahead, into L2 (measured best on Zen 4: T0 was slower).
int64_t prefetch_rows(int64_t row_bytes) { return 8192 / row_bytes + 1; }

const char* cache_row(const void* base, int64_t slot, int64_t row_stride, int64_t element_bytes) {
  return static_cast<const char*>(base) + slot * row_stride * element_bytes;
}

// 16 elements of a cached row as fp32 (bf16 is the top half of an fp32: widening is exact).
template <bool kBf16>
__m512 load_cached(const char* row, int64_t offset) {
  if constexpr (kBf16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + offset));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + offset);
  }
}

template <bool kBf16>
__m512 load_cached_masked(const char* row, int64_t offset, __mmask16 mask) {
  if constexpr (kBf16) {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const uint16_t*>(row) + offset);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + offset);
  }
}

// Lane i of the result is the sum of the lanes of sums[i].
inline __attribute__((always_inline)) __m512 transpose_sum16(const __m512 (&sums)[16]) {
  __m512 pairs[8];  // per 128-bit block: partial sums of sums[2i] in lanes 0, 2 and of sums[2i+1] in 1, 3
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(sums[2 * i], sums[2 * i + 1]), _mm512_unpackhi_ps(sums[2 * i], sums[2 * i + 1]));
  }
  __m512 quads[4];  // per 128-bit block: block sums of sums[4i .. 4i+3]
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    const __m512d low = _mm512_unpacklo_pd(_mm512_castps_pd(pairs[2 * i]), _mm512_castps_pd(pairs[2 * i + 1]));
    const __m512d high = _mm512_unpackhi_pd(_mm512_castps_pd(pairs[2 * i]), _mm512_castps_pd(pairs[2 * i + 1]));
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(low), _mm512_castpd_ps(high));
  }
  // Add the four 128-bit blocks of each quad: first pairwise, then across the two halves.
  const __m512 halves01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 halves23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(halves01, halves23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(halves01, halves23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Tile shapes: kHeads * kKeys <= 16 accumulators for the scores (measured on Zen 4); two output vectors
// per head when 8 heads share the value loads (one left the Zen 5's two FMAs a cycle waiting on 9 loads
// per 8 FMAs; two measured 5-23% faster decode attention over 4,096 bf16 slots, 15-42% with derived
// keys), more for smaller tiles (Zen 4).
constexpr int keys_per_tile(int heads) { return heads >= 8 ? 2 : heads >= 4 ? 4 : 8; }
constexpr int vectors_per_tile(int heads) { return heads >= 8 ? 2 : heads >= 4 ? 4 : 8; }

// scores[h * count + k] = queries[h] . key(slots[k]) for h < kHeads, k < kKeys.
// `ahead`: rows to prefetch while this tile computes (kKeys of them). Its loops are unrolled and the
// reduction inlined so that the 16 sums are registers only: as an array GCC cleared them in memory with
// `rep stos` at every tile (in a 512-token prompt's profile the scores had 3.8% as many samples as the
// panel tiles, now 3.1%).
template <int kHeads, int kKeys, bool kBf16>
void score_tile(const float* queries, int64_t head_dim, const void* keys, int64_t row_stride, const int32_t* slots,
                const char* const* ahead, float* scores, int64_t count) {
  constexpr int64_t element_bytes = kBf16 ? 2 : 4;
  const char* rows[kKeys];
#pragma GCC unroll 16
  for (int k = 0; k < kKeys; ++k) rows[k] = cache_row(keys, slots[k], row_stride, element_bytes);
  __m512 sums[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) sums[i] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + kLanes <= head_dim; d += kLanes) {
    __m512 key[kKeys];
#pragma GCC unroll 16
    for (int k = 0; k < kKeys; ++k) {
      _mm_prefetch(ahead[k] + d * element_bytes, _MM_HINT_T1);
      key[k] = load_cached<kBf16>(rows[k], d);
    }
#pragma GCC unroll 16
    for (int h = 0; h < kHeads; ++h) {
      __m512 query = _mm512_loadu_ps(queries + h * head_dim + d);
      // Held in a register for all kKeys FMAs: GCC would otherwise fold a fresh load into each.
      if constexpr (kKeys > 1) __asm__("" : "+v"(query));
#pragma GCC unroll 16
      for (int k = 0; k < kKeys; ++k) sums[k * kHeads + h] = _mm512_fmadd_ps(query, key[k], sums[k * kHeads + h]);
    }
  }
  if (d < head_dim) {
    const __mmask16 mask = first_lanes(head_dim - d);
    __m512 key[kKeys];
#pragma GCC unroll 16
    for (int k = 0; k < kKeys; ++k) key[k] = load_cached_masked<kBf16>(rows[k], d, mask);
#pragma GCC unroll 16
    for (int h = 0; h < kHeads; ++h) {
      const __m512 query = _mm512_maskz_loadu_ps(mask, queries + h * head_dim + d);
#pragma GCC unroll 16
      for (int k = 0; k < kKeys; ++k) sums[k * kHeads + h] = _mm512_fmadd_ps(query, key[k], sums[k * kHeads + h]);
    }
  }
  alignas(64) float totals[16];
  _mm512_store_ps(totals, transpose_sum16(sums));
#pragma GCC unroll 16
  for (int k = 0; k < kKeys; ++k) {
#pragma GCC unroll 16
    for (int h = 0; h < kHeads; ++h) scores[h * count + k] = totals[k * kHeads + h];
  }
}

template <int kHeads, bool kBf16>
void score_range(const float* queries, int64_t head_dim, const void* keys, int64_t row_stride, const int32_t* slots,
                 int64_t begin, int64_t end, float* scores, int64_t count) {
  constexpr int kKeys = keys_per_tile(kHeads);
  constexpr int64_t element_bytes = kBf16 ? 2 : 4;
  // Rows this far ahead are prefetched; past the end the tile re-touches its own rows.
  const int64_t distance = prefetch_rows(head_dim * element_bytes);
  const char* ahead[kKeys];
  int64_t k = begin;
  for (; k + kKeys <= end; k += kKeys) {
    for (int i = 0; i < kKeys; ++i) {
      const int64_t index = k + i + distance < count ? k + i + distance : k + i;
      ahead[i] = cache_row(keys, slots[index], row_stride, element_bytes);
    }
    score_tile<kHeads, kKeys, kBf16>(queries, head_dim, keys, row_stride, slots + k, ahead, scores + k, count);
  }
  for (; k < end; ++k) {
    const int64_t index = k + distance < count ? k + distance : k;
    ahead[0] = cache_row(keys, slots[index], row_stride, element_bytes);
    score_tile<kHeads, 1, kBf16>(queries, head_dim, keys, row_stride, slots + k, ahead, scores + k, count);
  }
}

template <bool kBf16>
void attention_scores_format(const float* queries, int64_t group, int64_t head_dim, const void* keys, int64_t row_stride,
                             const int32_t* slots, int64_t count, float* scores) {
  for (int64_t begin = 0; begin < count; begin += kSlotBlock) {
    const int64_t end = smaller(begin + kSlotBlock, count);
    for_head_blocks<8>(group, [&]<int kHeads>(int64_t h) {
      score_range<kHeads, kBf16>(queries + h * head_dim, head_dim, keys, row_stride, slots, begin, end, scores + h * count, count);
    });
  }
}

void attention_scores_avx512(const float* queries, int64_t group, int64_t head_dim, const void* keys, KvFormat format,
                             int64_t row_stride, const int32_t* slots, int64_t count, float* scores) {
  if (format == KvFormat::kBF16) {
    attention_scores_format<true>(queries, group, head_dim, keys, row_stride, slots, count, scores);
  } else {
    attention_scores_format<false>(queries, group, head_dim, keys, row_stride, slots, count, scores);
  }
}

// out[h][d, d + 16 kVectors) += sum over k in [begin, end) of weights[(k - begin) * kHeads + h] * value(slots[k]).
// kMasked: the tile reaches past head_dim.
template <int kHeads, int kVectors, bool kBf16, bool kMasked>
void accumulate_tile(const float* weights, const void* values, int64_t row_stride, const int32_t* slots, int64_t begin,
                     int64_t end, int64_t count, float* out, int64_t head_dim, int64_t d) {
  constexpr int64_t element_bytes = kBf16 ? 2 : 4;
  __mmask16 masks[kVectors];
  for (int v = 0; v < kVectors; ++v) masks[v] = kMasked ? first_lanes(head_dim - d - v * kLanes) : 0xffff;
  __m512 sums[kHeads][kVectors];
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVectors; ++v) sums[h][v] = _mm512_maskz_loadu_ps(masks[v], out + h * head_dim + d + v * kLanes);
  }
  for (int64_t k = begin; k < end; ++k, weights += kHeads) {
    const char* row = cache_row(values, slots[k], row_stride, element_bytes);
    // The same columns of the next block's rows: they are needed one block of work from now.
    if (k + kSlotBlock < count) {
      const char* ahead = cache_row(values, slots[k + kSlotBlock], row_stride, element_bytes) + d * element_bytes;
      for (int64_t offset = 0; offset < kVectors * kLanes * element_bytes; offset += 64) _mm_prefetch(ahead + offset, _MM_HINT_T1);
    }
    __m512 value[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      value[v] = kMasked ? load_cached_masked<kBf16>(row, d + v * kLanes, masks[v]) : load_cached<kBf16>(row, d + v * kLanes);
    }
    for (int h = 0; h < kHeads; ++h) {
      const __m512 weight = _mm512_set1_ps(weights[h]);
      for (int v = 0; v < kVectors; ++v) sums[h][v] = _mm512_fmadd_ps(weight, value[v], sums[h][v]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVectors; ++v) _mm512_mask_storeu_ps(out + h * head_dim + d + v * kLanes, masks[v], sums[h][v]);
  }
}

template <int kHeads, bool kBf16>
void accumulate_range(const float* probabilities, int64_t count, const void* values, int64_t row_stride,
                      const int32_t* slots, int64_t begin, int64_t end, float* out, int64_t head_dim) {
  constexpr int kVectors = vectors_per_tile(kHeads);
  constexpr int64_t tile = kVectors * kLanes;
  // The block's probabilities slot-major, so that one pointer walks them all.
  alignas(64) float weights[kSlotBlock * kHeads];
  for (int64_t k = begin; k < end; ++k) {
    for (int h = 0; h < kHeads; ++h) weights[(k - begin) * kHeads + h] = probabilities[h * count + k];
  }
  int64_t d = 0;
  for (; d + tile <= head_dim; d += tile) {
    accumulate_tile<kHeads, kVectors, kBf16, false>(weights, values, row_stride, slots, begin, end, count, out, head_dim, d);
  }
  for (; d < head_dim; d += kLanes) {  // the last partial tile, one vector at a time
    accumulate_tile<kHeads, 1, kBf16, true>(weights, values, row_stride, slots, begin, end, count, out, head_dim, d);
  }
}

template <bool kBf16>
void attention_accumulate_format(const float* probabilities, int64_t group, int64_t head_dim, const void* values,
                                 int64_t row_stride, const int32_t* slots, int64_t count, float* out) {
  for (int64_t begin = 0; begin < count; begin += kSlotBlock) {
    const int64_t end = smaller(begin + kSlotBlock, count);
    for_head_blocks<8>(group, [&]<int kHeads>(int64_t h) {
      accumulate_range<kHeads, kBf16>(probabilities + h * count, count, values, row_stride, slots, begin, end, out + h * head_dim, head_dim);
    });
  }
}

void attention_accumulate_avx512(const float* probabilities, int64_t group, int64_t head_dim, const void* values,
                                 KvFormat format, int64_t row_stride, const int32_t* slots, int64_t count, float* out) {
  if (format == KvFormat::kBF16) {
    attention_accumulate_format<true>(probabilities, group, head_dim, values, row_stride, slots, count, out);
  } else {
    attention_accumulate_format<false>(probabilities, group, head_dim, values, row_stride, slots, count, out);
  }
}

constexpr VectorOpsTable kAvx512Table = {
    .max = max_avx512,
    .exp_shifted_sum = exp_shifted_sum_avx512,
    .sum_squares = sum_squares_avx512,
    .argmax_lanes = argmax_lanes_avx512,
    .scale_into = scale_into_avx512,
    .gelu_tanh_multiply = gelu_tanh_multiply_avx512,
    .apply_rope = apply_rope_avx512,
    .add = add_avx512,
    .softcap = softcap_avx512,
    .store_bf16_row = store_bf16_row_avx512,
    .attention_scores = attention_scores_avx512,
    .attention_accumulate = attention_accumulate_avx512,
};

}  // namespace

const VectorOpsTable& vector_ops_avx512() { return kAvx512Table; }

}  // namespace gemma4rt::kernels::detail
