// Splits [0, count) among the threads of one parallel region like ThreadPool::share, but lets a thread
// that has finished its own range take chunks from the back of another's. Each thread still streams
// one contiguous range front to back (what a memory-bound product wants), and when one core runs
// slower than the other (on a shared VM they often differ by 5-10% in bandwidth) the faster takes over
// the slower one's tail instead of waiting for it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/thread_pool.h"

namespace gemma4rt {

class StealingRanges {
 public:
  StealingRanges() = default;
  StealingRanges(const StealingRanges&) = delete;
  StealingRanges& operator=(const StealingRanges&) = delete;

  // Before the parallel region: `threads` ranges as ThreadPool::share(count, granule, ...) gives them,
  // handed out `chunk` items at a time (chunk >= 1). count must be below 2^32.
  void reset(int64_t count, int64_t granule, int64_t chunk, int threads);

  // Inside it: the next chunk for `thread`, from the front of its own range while any is left, then
  // from the back of the others'. False once every range is taken. Every item is handed out once.
  bool next(int thread, ThreadPool::Range& chunk);

 private:
  // A range as one word, so its owner (moving the front) and a thief (moving the back) never both
  // take an item: front in the high 32 bits, back in the low.
  struct alignas(64) Slot {
    std::atomic<uint64_t> bounds{0};
  };
  std::unique_ptr<Slot[]> slots_;
  int capacity_ = 0, threads_ = 0;
  int64_t chunk_ = 1;
};

}  // namespace gemma4rt
