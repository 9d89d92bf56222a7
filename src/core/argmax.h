// The index of the largest of a row of floats, as every argmax in the project defines it: the lowest
// index on ties, NaN never chosen, 0 when nothing is larger than -inf. Host code (the sampler, the
// verifier) and the reference kernels share this one loop; the CPU backend's vector kernel must agree.
#pragma once

#include <cstdint>

namespace gemma4rt {

int64_t argmax_of(const float* values, int64_t size);

// A row of logits with nothing above -inf (every value NaN, or -inf) gives no token: the forward pass
// broke, usually on NaN or inf weights. Said instead of decoding id 0 over and over.
inline constexpr const char* kNoFiniteLogitError =
    "the forward pass gave no finite logit (every value NaN or -inf): the weights may hold NaN or inf values "
    "(gemma4rt doctor checks a checkpoint)";

}  // namespace gemma4rt
