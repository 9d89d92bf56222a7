// How the SIMD attention kernels walk a KV group's query heads: blocks of the widest count the kernel
// has registers for, then at most one block each of the smaller powers of two (a group of 7 at width 4
// runs 4, 2, 1), so every head is computed by a kernel specialised for its block size.
#pragma once

#include <cstdint>

namespace gemma4rt::kernels {

// Calls work.template operator()<kHeads>(first_head) for each block covering heads [0, group).
template <int kWidest, typename Work>
inline void for_head_blocks(int64_t group, Work&& work) {
  static_assert(kWidest == 8 || kWidest == 4, "blocks of 8 or 4 heads, then 2 and 1");
  int64_t h = 0;
  for (; h + kWidest <= group; h += kWidest) work.template operator()<kWidest>(h);
  if constexpr (kWidest > 4) {
    if (h + 4 <= group) {
      work.template operator()<4>(h);
      h += 4;
    }
  }
  if (h + 2 <= group) {
    work.template operator()<2>(h);
    h += 2;
  }
  if (h < group) work.template operator()<1>(h);
}

}  // namespace gemma4rt::kernels
