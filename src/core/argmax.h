// The index of the largest of a row of floats, as every argmax in the project defines it: the lowest
// index on ties, NaN never chosen, 0 when nothing is larger than -inf. Host code (the sampler, the
// verifier) and the reference kernels share this one loop; the CPU backend's vector kernel must agree.
#pragma once

#include <cstdint>
#include <limits>

namespace gemma4rt {

int64_t argmax_of(const float* values, int64_t size);

// `best` (argmax_of's choice, or a backend's that agrees with it) when the row has a value above -inf;
// -1 when it has none (every value NaN or -inf): no token can be chosen.
inline int64_t chosen_or_none(const float* values, int64_t size, int64_t best) {
  return size > 0 && values[best] > -std::numeric_limits<float>::infinity() ? best : -1;
}

// A row of logits with nothing above -inf (every value NaN, or -inf) gives no token: the forward pass
// broke, usually on NaN or inf weights. Said instead of decoding id 0 over and over.
inline constexpr const char* kNoFiniteLogitError =
    "the forward pass gave no finite logit (every value NaN or -inf): the weights may hold NaN or inf values "
    "(gemma4rt doctor names the tensors that hold them)";

}  // namespace gemma4rt
