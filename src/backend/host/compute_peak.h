// A probe of the machine's compute ceiling for one weight format: every thread runs twelve independent
// chains of the widest multiply-add instruction the matmul kernels use for that format, on registers
// only, so neither memory nor the kernels under test limit the figure. Prefill is held to it.
#pragma once

#include <cstdint>

#include "core/formats.h"
#include "core/thread_pool.h"

namespace gemma4rt::kernels {

struct ComputePeak {
  double ops_per_second = 0.0;      // 2 per multiply-add (the FLOP count of a product); 0: no probe
  const char* instruction = "";     // what was timed, e.g. "vdpbf16ps zmm"
};

// The best of a few passes on every thread of `pool`. Formats whose kernels at the active ISA have no
// probe here (q8 and q4 without VNNI, the scalar level) give ops_per_second 0.
ComputePeak measure_compute_peak(ThreadPool& pool, WeightFormat format);

// `iterations` rounds of 12 independent multiply-adds each; the result depends on all of them.
float multiply_add_chains_bf16_avx512(int64_t iterations);   // vdpbf16ps: 64 ops each
float multiply_add_chains_int8_avx512(int64_t iterations);   // vpdpbusd: 128 ops each
float multiply_add_chains_f32_avx512(int64_t iterations);    // vfmadd231ps zmm: 32 ops each
float multiply_add_chains_f32_avx2(int64_t iterations);      // vfmadd231ps ymm: 16 ops each

}  // namespace gemma4rt::kernels
