#include <immintrin.h>

#include "backend/host/bandwidth.h"

namespace gemma4rt::kernels {

float read_stream_avx2(const float* data, size_t bytes) {
  __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps(), sum2 = _mm256_setzero_ps(), sum3 = _mm256_setzero_ps();
  const size_t count = bytes / sizeof(float);
  for (size_t i = 0; i < count; i += 32) {
    sum0 = _mm256_add_ps(sum0, _mm256_load_ps(data + i));
    sum1 = _mm256_add_ps(sum1, _mm256_load_ps(data + i + 8));
    sum2 = _mm256_add_ps(sum2, _mm256_load_ps(data + i + 16));
    sum3 = _mm256_add_ps(sum3, _mm256_load_ps(data + i + 24));
  }
  const __m256 total = _mm256_add_ps(_mm256_add_ps(sum0, sum1), _mm256_add_ps(sum2, sum3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

}  // namespace gemma4rt::kernels
