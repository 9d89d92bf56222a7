// Which x86-64 instruction sets the fast kernels may use. Detected once from CPUID (and the OS's
// saved-register support); tests and benchmarks can force a lower level to exercise every path.
#pragma once

namespace gemma4rt::kernels {

enum class Isa {
  kScalar = 0,      // plain C++: runs anywhere, the reference every other path is tested against
  kAvx2 = 1,        // AVX2 + FMA + F16C
  kAvx512 = 2,      // AVX-512 F/BW/VL/DQ + VNNI (int8 dot products)
  kAvx512Bf16 = 3,  // kAvx512 + AVX512_BF16 (vdpbf16ps)
};

const char* isa_name(Isa isa);
Isa detected_isa();   // the best level this CPU and OS support
Isa active_isa();     // the level kernels use now (detected_isa() unless forced)
// Forces kernels to `isa`; throws gemma4rt::Error if the CPU cannot run it. Not thread-safe against
// running kernels: call it before starting work (tests, benchmarks, --isa flags).
void set_active_isa(Isa isa);

}  // namespace gemma4rt::kernels
