// AVX-512 arithmetic shared by the AVX-512 kernel files (vector_ops_avx512.cc, matmul_avx512.cc,
// prefill_panels_avx512.cc) and included only by them: everything is in an anonymous namespace, so each
// file keeps its own copy and none can reach code built for older CPUs. One definition keeps the
// element-wise GELU and the prompt's fused gate/up epilogue bit for bit the same function.
#pragma once

// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsic headers as
// uninitialised (GCC bug 105593) once they are inlined into these kernels.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace gemma4rt::kernels::detail {
namespace {

// exp(x) for x <= 0: x = n ln2 + r with |r| <= ln2/2, e^r from its degree-7 Taylor polynomial
// (truncation < 6e-9), 2^n built in the exponent field. Below ln(FLT_MIN) the result is 0 rather
// than a subnormal; NaN stays NaN.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.33654f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ);
  x = _mm512_max_ps(lowest, x);  // max returns its second operand for NaN, keeping NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 split in two so that n * ln2 keeps its full precision.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147182464599609375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-1.904654299957768e-09f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i two_to_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 result = _mm512_mul_ps(p, _mm512_castsi512_ps(two_to_n));
  return _mm512_mask_mov_ps(result, underflow, _mm512_setzero_ps());
}

// GELU-tanh as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function as
// 0.5 x (1 + tanh(u)) without its cancellation for negative x. e = exp(-2|u|) never overflows.
inline __m512 gelu_tanh_ps(__m512 x) {
  const __m512 square = _mm512_mul_ps(x, x);
  const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(square, _mm512_set1_ps(0.044715f)), x, x);
  const __m512 u = _mm512_mul_ps(inner, _mm512_set1_ps(0.7978845608028654f));
  const __m512 magnitude = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), u);
  const __m512 e = exp_nonpositive(_mm512_mul_ps(magnitude, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 negative = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 numerator = _mm512_mask_mov_ps(one, negative, e);  // sigmoid(2u) = 1/(1+e) or e/(1+e)
  return _mm512_mul_ps(x, _mm512_div_ps(numerator, _mm512_add_ps(one, e)));
}

// bf16 bits (in the low half of each 32-bit lane) of 16 floats, the same arithmetic as float_to_bf16:
// add 0x7fff plus the lowest kept bit, keep the top half; NaNs stay quiet NaNs.
inline __m512i round_to_bf16_bits(__m512i bits) {
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  return _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
}

}  // namespace
}  // namespace gemma4rt::kernels::detail
