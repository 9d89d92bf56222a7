#include "engine/rope.h"

#include <cmath>

namespace gemma4rt {

RopeTable::RopeTable(const RopeConfig& rope, int head_dim) : head_dim_(head_dim) {
  const int half = head_dim / 2;
  inverse_frequencies_.assign(half, 0.0f);
  // Proportional RoPE keeps the full head dim in the exponent's denominator and zeroes the
  // frequencies past the rotated fraction; default RoPE rotates every pair.
  const int rotated = rope.type == "proportional" ? static_cast<int>(rope.partial_rotary_factor * head_dim / 2) : half;
  for (int i = 0; i < rotated && i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inverse_frequencies_[i] = 1.0f / std::pow(static_cast<float>(rope.theta), exponent) / static_cast<float>(rope.factor);
  }
}

void RopeTable::angles(int position, float* cos, float* sin) const {
  const int half = head_dim_ / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inverse_frequencies_[i];
    cos[i] = cos[i + half] = std::cos(angle);
    sin[i] = sin[i + half] = std::sin(angle);
  }
}

int RopeTable::rotated_pairs() const {
  int pairs = static_cast<int>(inverse_frequencies_.size());
  while (pairs > 0 && inverse_frequencies_[static_cast<size_t>(pairs - 1)] == 0.0f) --pairs;
  return pairs;
}

std::vector<float> RopeTable::rotations(int positions) const {
  const int pairs = rotated_pairs();
  std::vector<float> table(static_cast<size_t>(positions) * 2 * pairs);
  for (int position = 0; position < positions; ++position) {
    float* cos = table.data() + static_cast<size_t>(position) * 2 * pairs;
    for (int i = 0; i < pairs; ++i) {
      const float angle = static_cast<float>(position) * inverse_frequencies_[static_cast<size_t>(i)];
      cos[i] = std::cos(angle);
      cos[pairs + i] = std::sin(angle);
    }
  }
  return table;
}

}  // namespace gemma4rt
