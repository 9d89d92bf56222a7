#include <immintrin.h>

#include "backend/host/compute_peak.h"

namespace gemma4rt::kernels {

float multiply_add_chains_f32_avx2(int64_t iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-7f);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
    __asm__ volatile("" : "+x"(a));
  }
  __m256 total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm256_add_ps(total, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

}  // namespace gemma4rt::kernels
