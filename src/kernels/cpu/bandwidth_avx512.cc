#include <immintrin.h>

#include "kernels/cpu/bandwidth.h"

namespace gemma4rt::kernels {

// Four 64-byte loads per step into four accumulators: enough loads in flight to saturate memory.
float read_stream_avx512(const float* data, size_t bytes) {
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps(), sum2 = _mm512_setzero_ps(), sum3 = _mm512_setzero_ps();
  const size_t count = bytes / sizeof(float);
  for (size_t i = 0; i < count; i += 64) {
    sum0 = _mm512_add_ps(sum0, _mm512_load_ps(data + i));
    sum1 = _mm512_add_ps(sum1, _mm512_load_ps(data + i + 16));
    sum2 = _mm512_add_ps(sum2, _mm512_load_ps(data + i + 32));
    sum3 = _mm512_add_ps(sum3, _mm512_load_ps(data + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum0, sum1), _mm512_add_ps(sum2, sum3)));
}

}  // namespace gemma4rt::kernels
