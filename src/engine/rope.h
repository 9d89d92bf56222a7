// Rotary position embedding tables, one per attention type (architecture doc §3.4): default RoPE on
// sliding layers, proportional partial RoPE on full layers (only the first
// partial_rotary_factor * head_dim / 2 frequencies rotate; the rest have frequency 0 and pass through).
#pragma once

#include <vector>

#include "model/config.h"

namespace gemma4rt {

class RopeTable {
 public:
  RopeTable(const RopeConfig& rope, int head_dim);
  // cos and sin of every head dimension at `position`, each head_dim long (the angle list repeated twice).
  void angles(int position, float* cos, float* sin) const;
  const std::vector<float>& inverse_frequencies() const { return inverse_frequencies_; }
  // Pairs (i, i + head_dim / 2) that rotate: those up to the last non-zero frequency.
  int rotated_pairs() const;
  // cos then sin of the rotated pairs' angles at positions 0 .. positions-1: [position][2 * rotated_pairs()],
  // the same angles as angles() (K=V attention rebuilds keys from it).
  std::vector<float> rotations(int positions) const;
  int head_dim() const { return head_dim_; }

 private:
  int head_dim_;
  std::vector<float> inverse_frequencies_;  // head_dim / 2 entries
};

}  // namespace gemma4rt
