// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsic headers as
// uninitialised (GCC bug 105593) once they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "backend/host/compute_peak.h"

namespace gemma4rt::kernels {

// The empty asm keeps an operand opaque, so the compiler cannot fold the chains away or hoist them.
float multiply_add_chains_bf16_avx512(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x0001);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  __m512 total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm512_add_ps(total, acc[i]);
  return _mm512_reduce_add_ps(total);
}

float multiply_add_chains_int8_avx512(int64_t iterations) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  __m512i total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm512_add_epi32(total, acc[i]);
  return static_cast<float>(_mm512_reduce_add_epi32(total));
}

float multiply_add_chains_f32_avx512(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-7f);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    __asm__ volatile("" : "+v"(a));
  }
  __m512 total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm512_add_ps(total, acc[i]);
  return _mm512_reduce_add_ps(total);
}

}  // namespace gemma4rt::kernels
