#include "core/argmax.h"

#include <limits>

namespace gemma4rt {

int64_t argmax_of(const float* values, int64_t size) {
  // Two steps: the largest value of each block, in independent lanes the compiler turns into vector
  // compares (NaN fails every compare, so it is never taken), keeping the first block that holds the
  // largest; then the first index in that block holding it. A compare and branch per value, with the
  // index carried along, took 0.15-0.18 ms per 262,144 logits (this way 0.04), once per sequence of a
  // server step that returns logits.
  constexpr int64_t kLanes = 16, kBlock = 1024;
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  float best_value = kLowest;
  int64_t best_block = -1;
  for (int64_t start = 0; start < size; start += kBlock) {
    const int64_t count = size - start < kBlock ? size - start : kBlock;
    const float* block = values + start;
    float lanes[kLanes];
    for (float& lane : lanes) lane = kLowest;
    int64_t i = 0;
    for (; i + kLanes <= count; i += kLanes) {
      for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] = block[i + lane] > lanes[lane] ? block[i + lane] : lanes[lane];
    }
    float block_best = kLowest;
    for (const float lane : lanes) block_best = lane > block_best ? lane : block_best;
    for (; i < count; ++i) block_best = block[i] > block_best ? block[i] : block_best;
    if (block_best > best_value) {
      best_value = block_best;
      best_block = start;
    }
  }
  if (best_block < 0) return 0;  // nothing above -inf
  int64_t best = best_block;
  while (!(values[best] == best_value)) ++best;
  return best;
}

}  // namespace gemma4rt
