// Two kinds of decode step timed side by side: this VM's memory bandwidth moves by half within minutes,
// so rates measured one after the other compare the machine's moods, not the steps.
#pragma once

#include <algorithm>
#include <chrono>

namespace gemma4rt::tools {

struct AlternatingSeconds {
  double first = 0.0, second = 0.0;  // time spent in each kind of step
};

// Runs first(position) then second(position) over positions [begin, end) in alternating blocks of 8.
template <class First, class Second>
AlternatingSeconds time_alternating_blocks(int begin, int end, First&& first, Second&& second) {
  constexpr int kBlock = 8;
  using Clock = std::chrono::steady_clock;
  AlternatingSeconds seconds;
  for (int block = begin; block < end; block += kBlock) {
    const int block_end = std::min(end, block + kBlock);
    auto start = Clock::now();
    for (int position = block; position < block_end; ++position) first(position);
    seconds.first += std::chrono::duration<double>(Clock::now() - start).count();
    start = Clock::now();
    for (int position = block; position < block_end; ++position) second(position);
    seconds.second += std::chrono::duration<double>(Clock::now() - start).count();
  }
  return seconds;
}

}  // namespace gemma4rt::tools
