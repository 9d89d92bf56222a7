// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsic headers as
// uninitialised (GCC bug 105593) once they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "backend/host/bandwidth.h"

namespace gemma4rt::kernels {

// Eight 64-byte loads per step into eight accumulators: a whole 512-byte stretch in flight per step,
// so the add latency never limits how many loads are outstanding.
float read_stream_avx512(const float* data, size_t bytes) {
  __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0, sum2 = sum0, sum3 = sum0, sum4 = sum0, sum5 = sum0, sum6 = sum0, sum7 = sum0;
  const size_t count = bytes / sizeof(float);
  for (size_t i = 0; i < count; i += 128) {
    sum0 = _mm512_add_ps(sum0, _mm512_load_ps(data + i));
    sum1 = _mm512_add_ps(sum1, _mm512_load_ps(data + i + 16));
    sum2 = _mm512_add_ps(sum2, _mm512_load_ps(data + i + 32));
    sum3 = _mm512_add_ps(sum3, _mm512_load_ps(data + i + 48));
    sum4 = _mm512_add_ps(sum4, _mm512_load_ps(data + i + 64));
    sum5 = _mm512_add_ps(sum5, _mm512_load_ps(data + i + 80));
    sum6 = _mm512_add_ps(sum6, _mm512_load_ps(data + i + 96));
    sum7 = _mm512_add_ps(sum7, _mm512_load_ps(data + i + 112));
  }
  const __m512 total = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(sum0, sum1), _mm512_add_ps(sum2, sum3)),
                                     _mm512_add_ps(_mm512_add_ps(sum4, sum5), _mm512_add_ps(sum6, sum7)));
  return _mm512_reduce_add_ps(total);
}

}  // namespace gemma4rt::kernels
