// StealingRanges: every item is handed out exactly once, a thread takes its own range front to back
// before anything else, and a thread with nothing of its own finishes the others' ranges from the back.
#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/stealing_ranges.h"
#include "core/thread_pool.h"

namespace gemma4rt {
namespace {

TEST(StealingRanges, OneThreadTakesItsRangeInOrder) {
  StealingRanges ranges;
  ranges.reset(100, 16, 48, 1);
  ThreadPool::Range chunk;
  std::vector<std::pair<int64_t, int64_t>> taken;
  while (ranges.next(0, chunk)) taken.emplace_back(chunk.begin, chunk.end);
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 48}, {48, 96}, {96, 100}};
  EXPECT_EQ(taken, expected);
}

// Thread 1 never comes: thread 0 takes its own range [0, 64) from the front, then thread 1's [64, 128)
// from the back, chunk by chunk.
TEST(StealingRanges, AnIdleThreadsRangeIsTakenFromTheBack) {
  StealingRanges ranges;
  ranges.reset(128, 16, 32, 2);
  ThreadPool::Range chunk;
  std::vector<std::pair<int64_t, int64_t>> taken;
  while (ranges.next(0, chunk)) taken.emplace_back(chunk.begin, chunk.end);
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 32}, {32, 64}, {96, 128}, {64, 96}};
  EXPECT_EQ(taken, expected);
  EXPECT_FALSE(ranges.next(1, chunk));
}

// The owner and a thief meet in the middle of a range: the owner's front chunk and the thief's back
// chunk never overlap, even when less than two chunks are left.
TEST(StealingRanges, OwnerAndThiefNeverTakeTheSameItem) {
  StealingRanges ranges;
  ranges.reset(200, 16, 48, 2);  // thread 0: [0, 96), thread 1: [96, 200)
  ThreadPool::Range chunk;
  ASSERT_TRUE(ranges.next(1, chunk));  // 1 takes [96, 144) of its own
  EXPECT_EQ(chunk.begin, 96);
  EXPECT_EQ(chunk.end, 144);
  ASSERT_TRUE(ranges.next(0, chunk));  // 0 takes [0, 48)
  ASSERT_TRUE(ranges.next(0, chunk));  // and [48, 96): its own range is done
  ASSERT_TRUE(ranges.next(0, chunk));  // then [152, 200) from the back of thread 1's
  EXPECT_EQ(chunk.begin, 152);
  EXPECT_EQ(chunk.end, 200);
  ASSERT_TRUE(ranges.next(1, chunk));  // 1's front: only [144, 152) is left
  EXPECT_EQ(chunk.begin, 144);
  EXPECT_EQ(chunk.end, 152);
  EXPECT_FALSE(ranges.next(0, chunk));
  EXPECT_FALSE(ranges.next(1, chunk));
}

TEST(StealingRanges, ThreadsRacingCoverEveryItemOnce) {
  ThreadPool pool(4);
  StealingRanges ranges;
  for (int64_t count : {0, 1, 17, 1000, 262144}) {
    for (int64_t chunk_size : {1, 16, 48, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
      ranges.reset(count, 16, chunk_size, pool.size());
      pool.run([&](int thread, int) {
        ThreadPool::Range chunk;
        while (ranges.next(thread, chunk)) {
          ASSERT_LT(chunk.begin, chunk.end);
          ASSERT_LE(chunk.end - chunk.begin, chunk_size);
          for (int64_t i = chunk.begin; i < chunk.end; ++i) hits[static_cast<size_t>(i)]++;
          if (thread == 0) std::this_thread::yield();  // one slow thread: the others steal from it
        }
      });
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << count << " " << chunk_size << " " << i;
    }
  }
}

TEST(StealingRanges, RefusesCountsOverThirtyTwoBits) {
  StealingRanges ranges;
  EXPECT_THROW(ranges.reset(int64_t{1} << 32, 16, 48, 2), Error);
}

}  // namespace
}  // namespace gemma4rt
