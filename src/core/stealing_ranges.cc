#include "core/stealing_ranges.h"

#include <algorithm>

#include "core/error.h"

namespace gemma4rt {
namespace {

constexpr uint64_t pack(uint64_t front, uint64_t back) { return front << 32 | back; }
constexpr int64_t front_of(uint64_t bounds) { return static_cast<int64_t>(bounds >> 32); }
constexpr int64_t back_of(uint64_t bounds) { return static_cast<int64_t>(bounds & 0xffffffffu); }

}  // namespace

void StealingRanges::reset(int64_t count, int64_t granule, int64_t chunk, int threads) {
  if (count < 0 || count >= (int64_t{1} << 32)) fail("StealingRanges: count {} does not fit 32 bits", count);
  if (threads > capacity_) {
    slots_ = std::make_unique<Slot[]>(static_cast<size_t>(threads));
    capacity_ = threads;
  }
  threads_ = threads;
  chunk_ = std::max<int64_t>(chunk, 1);
  for (int thread = 0; thread < threads; ++thread) {
    const ThreadPool::Range range = ThreadPool::share(count, granule, thread, threads);
    slots_[thread].bounds.store(pack(static_cast<uint64_t>(range.begin), static_cast<uint64_t>(range.end)), std::memory_order_relaxed);
  }
}

bool StealingRanges::next(int thread, ThreadPool::Range& chunk) {
  // Own range: from the front.
  std::atomic<uint64_t>& own = slots_[thread].bounds;
  uint64_t bounds = own.load(std::memory_order_relaxed);
  while (front_of(bounds) < back_of(bounds)) {
    const int64_t front = front_of(bounds), take = std::min(chunk_, back_of(bounds) - front);
    if (own.compare_exchange_weak(bounds, pack(static_cast<uint64_t>(front + take), static_cast<uint64_t>(back_of(bounds))),
                                  std::memory_order_relaxed)) {
      chunk = {front, front + take};
      return true;
    }
  }
  // Then the others', from the back, nearest thread first.
  for (int step = 1; step < threads_; ++step) {
    std::atomic<uint64_t>& other = slots_[(thread + step) % threads_].bounds;
    bounds = other.load(std::memory_order_relaxed);
    while (front_of(bounds) < back_of(bounds)) {
      const int64_t back = back_of(bounds), take = std::min(chunk_, back - front_of(bounds));
      if (other.compare_exchange_weak(bounds, pack(static_cast<uint64_t>(front_of(bounds)), static_cast<uint64_t>(back - take)),
                                      std::memory_order_relaxed)) {
        chunk = {back - take, back};
        return true;
      }
    }
  }
  return false;
}

}  // namespace gemma4rt
