// AVX2 + FMA bodies of the vector kernels (8 fp32 lanes; fp32 tails use maskload/maskstore, bf16
// tails plain scalar code). The algorithms are those of vector_ops_avx512.cc at half the width.
// This file is compiled for AVX2, so it holds only raw-pointer loops and intrinsics inside an anonymous
// namespace: no inline or template code that another translation unit could also instantiate.
// GCC 12's intrinsic headers start some results from a deliberately undefined vector, which -Wall
// reports as uninitialised once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels/head_blocks.h"
#include "backend/cpu/kernels/vector_ops.h"

namespace gemma4rt::kernels::detail {
namespace {

constexpr int64_t kLanes = 8;

int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// A window of 8 entries starting at kLaneMaskTable + 8 - n enables the first n lanes.
alignas(64) constexpr int32_t kLaneMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

__m256i first_lanes(int64_t remaining) {
  const int64_t enabled = remaining <= 0 ? 0 : smaller(remaining, kLanes);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneMaskTable + kLanes - enabled));
}

float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

float horizontal_max(__m256 v) {
  __m128 best = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  best = _mm_max_ps(best, _mm_movehl_ps(best, best));
  best = _mm_max_ss(best, _mm_movehdup_ps(best));
  return _mm_cvtss_f32(best);
}

// ---- Transcendentals (see vector_ops_avx512.cc for the derivations) -----------------------------

// exp(x) for x <= 0; 0 below ln(FLT_MIN); NaN stays NaN.
__m256 exp_nonpositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_max_ps(lowest, x);  // max returns its second operand for NaN, keeping NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693147182464599609375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-1.904654299957768e-09f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
  return _mm256_andnot_ps(underflow, result);
}

__m256 tanh_ps(__m256 x) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 magnitude = _mm256_andnot_ps(sign_bit, x);
  const __m256 square = _mm256_mul_ps(magnitude, magnitude);
  __m256 series = _mm256_set1_ps(6404582.0f / 10854718875.0f);
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(-929569.0f / 638512875.0f));
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(21844.0f / 6081075.0f));
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(-1382.0f / 155925.0f));
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(62.0f / 2835.0f));
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(-17.0f / 315.0f));
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(2.0f / 15.0f));
  series = _mm256_fmadd_ps(series, square, _mm256_set1_ps(-1.0f / 3.0f));
  series = _mm256_fmadd_ps(_mm256_mul_ps(series, square), magnitude, magnitude);
  const __m256 e = exp_nonpositive(_mm256_mul_ps(magnitude, _mm256_set1_ps(-2.0f)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 ratio = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 small = _mm256_cmp_ps(magnitude, _mm256_set1_ps(0.55f), _CMP_LT_OQ);
  const __m256 result = _mm256_blendv_ps(ratio, series, small);
  return _mm256_or_ps(result, _mm256_and_ps(x, sign_bit));
}

__m256 gelu_tanh_ps(__m256 x) {
  const __m256 square = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(square, _mm256_set1_ps(0.044715f)), x, x);
  const __m256 u = _mm256_mul_ps(inner, _mm256_set1_ps(0.7978845608028654f));
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), u);
  const __m256 e = exp_nonpositive(_mm256_mul_ps(magnitude, _mm256_set1_ps(-2.0f)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 negative = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 numerator = _mm256_blendv_ps(one, e, negative);  // sigmoid(2u) = 1/(1+e) or e/(1+e)
  return _mm256_mul_ps(x, _mm256_div_ps(numerator, _mm256_add_ps(one, e)));
}

// ---- Element-wise kernels -----------------------------------------------------------------------

float max_avx2(const float* values, int64_t size) {
  const __m256 lowest = _mm256_set1_ps(-__builtin_inff());
  __m256 best0 = lowest, best1 = lowest;
  int64_t i = 0;
  for (; i + 2 * kLanes <= size; i += 2 * kLanes) {
    best0 = _mm256_max_ps(best0, _mm256_loadu_ps(values + i));
    best1 = _mm256_max_ps(best1, _mm256_loadu_ps(values + i + kLanes));
  }
  for (; i < size; i += kLanes) {
    const __m256i mask = first_lanes(size - i);
    const __m256 loaded = _mm256_blendv_ps(lowest, _mm256_maskload_ps(values + i, mask), _mm256_castsi256_ps(mask));
    best0 = _mm256_max_ps(best0, loaded);
  }
  return horizontal_max(_mm256_max_ps(best0, best1));
}

int64_t argmax_lanes_avx2(const float* values, int64_t size, float* lane_values, int32_t* lane_indices) {
  __m256 best = _mm256_set1_ps(-__builtin_inff());
  __m256 best_index = _mm256_setzero_ps();  // int32 lanes, blended as floats
  __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    const __m256 v = _mm256_loadu_ps(values + i);
    const __m256 better = _mm256_cmp_ps(v, best, _CMP_GT_OQ);  // false for NaN; ties keep the earlier
    best = _mm256_blendv_ps(best, v, better);
    best_index = _mm256_blendv_ps(best_index, _mm256_castsi256_ps(index), better);
    index = _mm256_add_epi32(index, _mm256_set1_epi32(kLanes));
  }
  _mm256_store_ps(lane_values, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_indices), _mm256_castps_si256(best_index));
  return i;
}

float exp_shifted_sum_avx2(const float* values, int64_t size, float shift, float* out) {
  const __m256 offset = _mm256_set1_ps(shift);
  __m256 total0 = _mm256_setzero_ps(), total1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 * kLanes <= size; i += 2 * kLanes) {
    const __m256 first = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(values + i), offset));
    const __m256 second = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(values + i + kLanes), offset));
    if (out != nullptr) {
      _mm256_storeu_ps(out + i, first);
      _mm256_storeu_ps(out + i + kLanes, second);
    }
    total0 = _mm256_add_ps(total0, first);
    total1 = _mm256_add_ps(total1, second);
  }
  for (; i < size; i += kLanes) {
    const __m256i mask = first_lanes(size - i);
    const __m256 result = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(values + i, mask), offset)),
                                        _mm256_castsi256_ps(mask));
    if (out != nullptr) _mm256_maskstore_ps(out + i, mask, result);
    total0 = _mm256_add_ps(total0, result);
  }
  return horizontal_sum(_mm256_add_ps(total0, total1));
}

float sum_squares_avx2(const float* x, int64_t size) {
  __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps(), sum2 = _mm256_setzero_ps(), sum3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 4 * kLanes <= size; i += 4 * kLanes) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + kLanes);
    const __m256 c = _mm256_loadu_ps(x + i + 2 * kLanes), d = _mm256_loadu_ps(x + i + 3 * kLanes);
    sum0 = _mm256_fmadd_ps(a, a, sum0);
    sum1 = _mm256_fmadd_ps(b, b, sum1);
    sum2 = _mm256_fmadd_ps(c, c, sum2);
    sum3 = _mm256_fmadd_ps(d, d, sum3);
  }
  for (; i < size; i += kLanes) {
    const __m256 a = _mm256_maskload_ps(x + i, first_lanes(size - i));
    sum0 = _mm256_fmadd_ps(a, a, sum0);
  }
  return horizontal_sum(_mm256_add_ps(_mm256_add_ps(sum0, sum1), _mm256_add_ps(sum2, sum3)));
}

void scale_into_avx2(const float* x, int64_t size, float factor, const float* weight, float* out) {
  const __m256 scale = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    __m256 result = _mm256_mul_ps(_mm256_loadu_ps(x + i), scale);
    if (weight != nullptr) result = _mm256_mul_ps(result, _mm256_loadu_ps(weight + i));
    _mm256_storeu_ps(out + i, result);
  }
  if (i < size) {
    const __m256i mask = first_lanes(size - i);
    __m256 result = _mm256_mul_ps(_mm256_maskload_ps(x + i, mask), scale);
    if (weight != nullptr) result = _mm256_mul_ps(result, _mm256_maskload_ps(weight + i, mask));
    _mm256_maskstore_ps(out + i, mask, result);
  }
}

void gelu_tanh_multiply_avx2(const float* gate, const float* up, int64_t size, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu_tanh_ps(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  }
  if (i < size) {
    const __m256i mask = first_lanes(size - i);
    const __m256 result = _mm256_mul_ps(gelu_tanh_ps(_mm256_maskload_ps(gate + i, mask)), _mm256_maskload_ps(up + i, mask));
    _mm256_maskstore_ps(out + i, mask, result);
  }
}

void apply_rope_avx2(float* heads, int64_t head_count, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < head_count; ++h) {
    float* head = heads + h * head_dim;
    for (int64_t j = 0; j < half; j += kLanes) {
      const __m256i mask = first_lanes(half - j);
      const __m256 first = _mm256_maskload_ps(head + j, mask);
      const __m256 second = _mm256_maskload_ps(head + half + j, mask);
      const __m256 rotated_first = _mm256_fmsub_ps(first, _mm256_maskload_ps(cos + j, mask),
                                                   _mm256_mul_ps(second, _mm256_maskload_ps(sin + j, mask)));
      const __m256 rotated_second = _mm256_fmadd_ps(second, _mm256_maskload_ps(cos + half + j, mask),
                                                    _mm256_mul_ps(first, _mm256_maskload_ps(sin + half + j, mask)));
      _mm256_maskstore_ps(head + j, mask, rotated_first);
      _mm256_maskstore_ps(head + half + j, mask, rotated_second);
    }
  }
}

void add_avx2(float* y, const float* x, int64_t size) {
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  if (i < size) {
    const __m256i mask = first_lanes(size - i);
    _mm256_maskstore_ps(y + i, mask, _mm256_add_ps(_mm256_maskload_ps(y + i, mask), _mm256_maskload_ps(x + i, mask)));
  }
}

void softcap_avx2(float* values, int64_t size, float cap) {
  const __m256 inverse = _mm256_set1_ps(1.0f / cap);
  const __m256 limit = _mm256_set1_ps(cap);
  for (int64_t i = 0; i < size; i += kLanes) {
    const __m256i mask = first_lanes(size - i);
    const __m256 capped = _mm256_mul_ps(tanh_ps(_mm256_mul_ps(_mm256_maskload_ps(values + i, mask), inverse)), limit);
    _mm256_maskstore_ps(values + i, mask, capped);
  }
}

// Round to nearest even on the bit pattern, NaN kept quiet: the same bits as float_to_bf16.
uint16_t bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void store_bf16_row_avx2(const float* source, int64_t size, uint16_t* destination) {
  const __m256i magnitude_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(source + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    // Magnitudes are non-negative as signed integers, so the signed compare finds the NaNs.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude_mask), infinity);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, nan);
    // Every value fits 16 bits, so the saturating pack is exact; it packs per 128-bit lane.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(destination + i), _mm256_castsi256_si128(packed));
  }
  for (; i < size; ++i) destination[i] = bf16_bits(source[i]);
}

// ---- Attention (structure and prefetching as in vector_ops_avx512.cc) ----------------------------
//
// Head tiles of 4, 2 and 1 (16 ymm registers); the first head_dim - head_dim % 8 dimensions run in
// vectors, the rest in scalar code.

constexpr int64_t kSlotBlock = 64;
// Keys are prefetched about 8 KiB of rows ahead, into L2.
int64_t prefetch_rows(int64_t row_bytes) { return 8192 / row_bytes + 1; }

const char* cache_row(const void* base, int64_t slot, int64_t row_stride, int64_t element_bytes) {
  return static_cast<const char*>(base) + slot * row_stride * element_bytes;
}

template <bool kBf16>
__m256 load_cached(const char* row, int64_t offset) {
  if constexpr (kBf16) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + offset));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + offset);
  }
}

template <bool kBf16>
float cached_scalar(const char* row, int64_t offset) {
  if constexpr (kBf16) {
    uint16_t half;
    std::memcpy(&half, row + offset * 2, sizeof(half));
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  } else {
    float value;
    std::memcpy(&value, row + offset * 4, sizeof(value));
    return value;
  }
}

// Lane i of the result is the sum of the lanes of sums[i].
__m256 transpose_sum8(const __m256 (&sums)[8]) {
  const __m256 pair01 = _mm256_hadd_ps(sums[0], sums[1]);
  const __m256 pair23 = _mm256_hadd_ps(sums[2], sums[3]);
  const __m256 pair45 = _mm256_hadd_ps(sums[4], sums[5]);
  const __m256 pair67 = _mm256_hadd_ps(sums[6], sums[7]);
  const __m256 quad0123 = _mm256_hadd_ps(pair01, pair23);  // per 128-bit lane: partial sums of 0..3
  const __m256 quad4567 = _mm256_hadd_ps(pair45, pair67);
  return _mm256_add_ps(_mm256_permute2f128_ps(quad0123, quad4567, 0x20), _mm256_permute2f128_ps(quad0123, quad4567, 0x31));
}

constexpr int keys_per_tile(int heads) { return heads >= 4 ? 2 : heads >= 2 ? 4 : 8; }
constexpr int vectors_per_tile(int heads) { return heads >= 4 ? 2 : heads >= 2 ? 4 : 8; }

// scores[h * count + k] = queries[h] . key(slots[k]) for h < kHeads, k < kKeys; `ahead`: kKeys rows to
// prefetch meanwhile.
template <int kHeads, int kKeys, bool kBf16>
void score_tile(const float* queries, int64_t head_dim, const void* keys, int64_t row_stride, const int32_t* slots,
                const char* const* ahead, float* scores, int64_t count) {
  constexpr int64_t element_bytes = kBf16 ? 2 : 4;
  const char* rows[kKeys];
  for (int k = 0; k < kKeys; ++k) rows[k] = cache_row(keys, slots[k], row_stride, element_bytes);
  __m256 sums[8];
  for (int i = 0; i < 8; ++i) sums[i] = _mm256_setzero_ps();
  const int64_t vector_end = head_dim - head_dim % kLanes;
  for (int64_t d = 0; d < vector_end; d += kLanes) {
    __m256 key[kKeys];
    for (int k = 0; k < kKeys; ++k) {
      _mm_prefetch(ahead[k] + d * element_bytes, _MM_HINT_T1);
      key[k] = load_cached<kBf16>(rows[k], d);
    }
    for (int h = 0; h < kHeads; ++h) {
      __m256 query = _mm256_loadu_ps(queries + h * head_dim + d);
      // Held in a register for all kKeys FMAs: GCC would otherwise fold a fresh load into each.
      if constexpr (kKeys > 1) __asm__("" : "+x"(query));
      for (int k = 0; k < kKeys; ++k) sums[k * kHeads + h] = _mm256_fmadd_ps(query, key[k], sums[k * kHeads + h]);
    }
  }
  alignas(32) float totals[8];
  _mm256_store_ps(totals, transpose_sum8(sums));
  for (int k = 0; k < kKeys; ++k) {
    for (int h = 0; h < kHeads; ++h) {
      float total = totals[k * kHeads + h];
      for (int64_t d = vector_end; d < head_dim; ++d) total += queries[h * head_dim + d] * cached_scalar<kBf16>(rows[k], d);
      scores[h * count + k] = total;
    }
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
    for_head_blocks<4>(group, [&]<int kHeads>(int64_t h) {
      score_range<kHeads, kBf16>(queries + h * head_dim, head_dim, keys, row_stride, slots, begin, end, scores + h * count, count);
    });
  }
}

void attention_scores_avx2(const float* queries, int64_t group, int64_t head_dim, const void* keys, KvFormat format,
                           int64_t row_stride, const int32_t* slots, int64_t count, float* scores) {
  if (format == KvFormat::kBF16) {
    attention_scores_format<true>(queries, group, head_dim, keys, row_stride, slots, count, scores);
  } else {
    attention_scores_format<false>(queries, group, head_dim, keys, row_stride, slots, count, scores);
  }
}

// out[h][d, d + 8 kVectors) += sum over k in [begin, end) of weights[(k - begin) * kHeads + h] * value(slots[k]).
template <int kHeads, int kVectors, bool kBf16>
void accumulate_tile(const float* weights, const void* values, int64_t row_stride, const int32_t* slots, int64_t begin,
                     int64_t end, int64_t count, float* out, int64_t head_dim, int64_t d) {
  constexpr int64_t element_bytes = kBf16 ? 2 : 4;
  __m256 sums[kHeads][kVectors];
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVectors; ++v) sums[h][v] = _mm256_loadu_ps(out + h * head_dim + d + v * kLanes);
  }
  for (int64_t k = begin; k < end; ++k, weights += kHeads) {
    const char* row = cache_row(values, slots[k], row_stride, element_bytes);
    // The same columns of the next block's rows: they are needed one block of work from now.
    if (k + kSlotBlock < count) {
      const char* ahead = cache_row(values, slots[k + kSlotBlock], row_stride, element_bytes) + d * element_bytes;
      for (int64_t offset = 0; offset < kVectors * kLanes * element_bytes; offset += 64) _mm_prefetch(ahead + offset, _MM_HINT_T1);
    }
    __m256 value[kVectors];
    for (int v = 0; v < kVectors; ++v) value[v] = load_cached<kBf16>(row, d + v * kLanes);
    for (int h = 0; h < kHeads; ++h) {
      const __m256 weight = _mm256_broadcast_ss(weights + h);
      for (int v = 0; v < kVectors; ++v) sums[h][v] = _mm256_fmadd_ps(weight, value[v], sums[h][v]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVectors; ++v) _mm256_storeu_ps(out + h * head_dim + d + v * kLanes, sums[h][v]);
  }
}

template <int kHeads, bool kBf16>
void accumulate_range(const float* probabilities, int64_t count, const void* values, int64_t row_stride,
                      const int32_t* slots, int64_t begin, int64_t end, float* out, int64_t head_dim) {
  constexpr int kVectors = vectors_per_tile(kHeads);
  constexpr int64_t tile = kVectors * kLanes;
  // The block's probabilities slot-major, so that one pointer walks them all.
  alignas(32) float weights[kSlotBlock * kHeads];
  for (int64_t k = begin; k < end; ++k) {
    for (int h = 0; h < kHeads; ++h) weights[(k - begin) * kHeads + h] = probabilities[h * count + k];
  }
  const int64_t vector_end = head_dim - head_dim % kLanes;
  int64_t d = 0;
  for (; d + tile <= vector_end; d += tile) {
    accumulate_tile<kHeads, kVectors, kBf16>(weights, values, row_stride, slots, begin, end, count, out, head_dim, d);
  }
  for (; d < vector_end; d += kLanes) {
    accumulate_tile<kHeads, 1, kBf16>(weights, values, row_stride, slots, begin, end, count, out, head_dim, d);
  }
  if (vector_end == head_dim) return;
  constexpr int64_t element_bytes = kBf16 ? 2 : 4;
  for (int64_t k = begin; k < end; ++k) {
    const char* row = cache_row(values, slots[k], row_stride, element_bytes);
    for (int h = 0; h < kHeads; ++h) {
      const float weight = weights[(k - begin) * kHeads + h];
      for (int64_t e = vector_end; e < head_dim; ++e) out[h * head_dim + e] += weight * cached_scalar<kBf16>(row, e);
    }
  }
}

template <bool kBf16>
void attention_accumulate_format(const float* probabilities, int64_t group, int64_t head_dim, const void* values,
                                 int64_t row_stride, const int32_t* slots, int64_t count, float* out) {
  for (int64_t begin = 0; begin < count; begin += kSlotBlock) {
    const int64_t end = smaller(begin + kSlotBlock, count);
    for_head_blocks<4>(group, [&]<int kHeads>(int64_t h) {
      accumulate_range<kHeads, kBf16>(probabilities + h * count, count, values, row_stride, slots, begin, end, out + h * head_dim, head_dim);
    });
  }
}

void attention_accumulate_avx2(const float* probabilities, int64_t group, int64_t head_dim, const void* values,
                               KvFormat format, int64_t row_stride, const int32_t* slots, int64_t count, float* out) {
  if (format == KvFormat::kBF16) {
    attention_accumulate_format<true>(probabilities, group, head_dim, values, row_stride, slots, count, out);
  } else {
    attention_accumulate_format<false>(probabilities, group, head_dim, values, row_stride, slots, count, out);
  }
}

constexpr VectorOpsTable kAvx2Table = {
    .max = max_avx2,
    .exp_shifted_sum = exp_shifted_sum_avx2,
    .sum_squares = sum_squares_avx2,
    .argmax_lanes = argmax_lanes_avx2,
    .scale_into = scale_into_avx2,
    .gelu_tanh_multiply = gelu_tanh_multiply_avx2,
    .apply_rope = apply_rope_avx2,
    .add = add_avx2,
    .softcap = softcap_avx2,
    .store_bf16_row = store_bf16_row_avx2,
    .attention_scores = attention_scores_avx2,
    .attention_accumulate = attention_accumulate_avx2,
};

}  // namespace

const VectorOpsTable& vector_ops_avx2() { return kAvx2Table; }

}  // namespace gemma4rt::kernels::detail
