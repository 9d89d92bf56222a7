#include "backend/host/compute_peak.h"

#include <algorithm>
#include <chrono>

#include "backend/host/isa.h"

namespace gemma4rt::kernels {

ComputePeak measure_compute_peak(ThreadPool& pool, WeightFormat format) {
  const Isa isa = active_isa();
  float (*chains)(int64_t) = nullptr;
  ComputePeak peak;
  double ops_per_instruction = 0.0;
  const bool integer = format == WeightFormat::kQ8 || format == WeightFormat::kQ4;
  if (integer && isa >= Isa::kAvx512) {
    chains = multiply_add_chains_int8_avx512, ops_per_instruction = 128, peak.instruction = "vpdpbusd zmm";
  } else if (format == WeightFormat::kBF16 && isa >= Isa::kAvx512Bf16) {
    chains = multiply_add_chains_bf16_avx512, ops_per_instruction = 64, peak.instruction = "vdpbf16ps zmm";
  } else if (!integer && isa >= Isa::kAvx512) {
    chains = multiply_add_chains_f32_avx512, ops_per_instruction = 32, peak.instruction = "vfmadd231ps zmm";
  } else if (!integer && isa >= Isa::kAvx2) {
    chains = multiply_add_chains_f32_avx2, ops_per_instruction = 16, peak.instruction = "vfmadd231ps ymm";
  }
  if (chains == nullptr) return peak;
  constexpr int64_t kIterations = 2'000'000;  // ~7 ms per pass at one instruction per cycle
  volatile float sink = 0.0f;
  chains(kIterations / 10);  // the clock settles
  // The best of 20 passes (~0.15 s): five once read half the peak on a host busy for their 35 ms.
  double best = 0.0;
  for (int pass = 0; pass < 20; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    pool.run([&](int, int) { sink = sink + chains(kIterations); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(pool.size()) * kIterations * 12 * ops_per_instruction / seconds);
  }
  peak.ops_per_second = best;
  return peak;
}

}  // namespace gemma4rt::kernels
