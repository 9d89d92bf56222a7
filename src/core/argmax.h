// The index of the largest of a row of floats, as every argmax in the project defines it: the lowest
// index on ties, NaN never chosen, 0 when nothing is larger than -inf. Host code (the sampler, the
// verifier) and the reference kernels share this one loop; the CPU backend's vector kernel must agree.
#pragma once

#include <cstdint>

namespace gemma4rt {

int64_t argmax_of(const float* values, int64_t size);

}  // namespace gemma4rt
