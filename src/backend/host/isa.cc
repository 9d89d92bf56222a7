#include "backend/host/isa.h"

#include <atomic>
#include <cpuid.h>
#include <cstdint>

#include "core/error.h"

namespace gemma4rt::kernels {
namespace {

uint64_t read_xcr0() {
  uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<uint64_t>(high) << 32) | low;
}

Isa detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(1, 0, &eax, &ebx, &ecx, &edx)) return Isa::kScalar;
  const bool osxsave = ecx & (1u << 27);
  const bool fma = ecx & (1u << 12);
  const bool f16c = ecx & (1u << 29);
  if (!osxsave) return Isa::kScalar;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return Isa::kScalar;
  const bool avx2 = ebx & (1u << 5);
  const bool avx512f = ebx & (1u << 16);
  const bool avx512dq = ebx & (1u << 17);
  const bool avx512bw = ebx & (1u << 30);
  const bool avx512vl = ebx & (1u << 31);
  const bool avx512vnni = ecx & (1u << 11);
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  const bool avx512bf16 = __get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1) && (eax1 & (1u << 5));

  if (!(ymm_state && avx2 && fma && f16c)) return Isa::kScalar;
  if (!(zmm_state && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni)) return Isa::kAvx2;
  return avx512bf16 ? Isa::kAvx512Bf16 : Isa::kAvx512;
}

std::atomic<int> forced{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  const int value = forced.load(std::memory_order_relaxed);
  return value < 0 ? detected_isa() : static_cast<Isa>(value);
}

void set_active_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) {
    fail("this CPU cannot run the {} kernels (best available: {})", isa_name(isa), isa_name(detected_isa()));
  }
  forced.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace gemma4rt::kernels
