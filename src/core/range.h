// A half-open run [first, first + count) of heads, rows, experts or vocabulary ids.
#pragma once

#include <cstdint>

namespace gemma4rt {

struct Range {
  int64_t first = 0;
  int64_t count = 0;

  int64_t end() const { return first + count; }
  bool contains(int64_t index) const { return index >= first && index < end(); }
  bool operator==(const Range&) const = default;
};

}  // namespace gemma4rt
