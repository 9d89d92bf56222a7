// A choice between two ways of running a kernel that give the same bits, made by timing both on the
// host at hand (detail::kernel_way in matmul.h says which kernels have one). Included only by the
// AVX-512 kernel files; everything is in an anonymous namespace, as the note atop matmul_avx512.cc
// explains.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/matmul.h"

namespace gemma4rt::kernels::detail {
namespace {

// One thread's trials of one kernel: its first 2 * kCallsPerWay calls take turns between the ways
// (so a drift of the memory's speed meets both alike; consecutive calls are mostly chunks of the same
// product), each timed in TSC cycles per weight byte; then the faster way is kept for the process.
struct MeasuredChoice {
  static constexpr int64_t kCallsPerWay = 64;
  double cycles[2] = {};
  double bytes[2] = {};
  int64_t calls = 0;
  int chosen = -1;

  // Runs run_way(0) or run_way(1) for a call that reads `call_bytes` of weights.
  template <class RunWay>
  void run(int64_t call_bytes, const RunWay& run_way) {
    const KernelWay forced = kernel_way();
    if (forced != KernelWay::kMeasure) return run_way(forced == KernelWay::kFirst ? 0 : 1);
    if (chosen >= 0) return run_way(chosen);
    const int way = static_cast<int>(calls % 2);
    const uint64_t start = __builtin_ia32_rdtsc();
    run_way(way);
    cycles[way] += static_cast<double>(__builtin_ia32_rdtsc() - start);
    bytes[way] += static_cast<double>(call_bytes);
    if (++calls == 2 * kCallsPerWay) chosen = cycles[0] / bytes[0] <= cycles[1] / bytes[1] ? 0 : 1;
  }
};

// The calling thread's trials for the kernel identified by Tag (its operand policy: one choice each).
template <class Tag>
MeasuredChoice& measured_choice() {
  thread_local MeasuredChoice choice;
  return choice;
}

}  // namespace
}  // namespace gemma4rt::kernels::detail
