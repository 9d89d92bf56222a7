// ThreadPool: every thread runs each region exactly once, ranges cover [0, count) without overlap,
// and many back-to-back regions (as in a decode step) complete.
#include <atomic>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/thread_pool.h"

namespace gemma4rt {
namespace {

TEST(ThreadPool, RunsEveryThreadOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    std::vector<std::atomic<int>> calls(threads);
    pool.run([&](int index, int count) {
      EXPECT_EQ(count, threads);
      calls[index]++;
    });
    for (auto& count : calls) EXPECT_EQ(count.load(), 1);
  }
}

// A thread count far past any machine is refused at once, naming the bound, instead of creating
// hundreds of thousands of threads.
TEST(ThreadPool, RefusesMoreThanTheMostThreads) {
  try {
    ThreadPool pool(100000);
    FAIL() << "a pool of 100000 threads was created";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("100000 threads requested; at most 512"), std::string::npos) << error.what();
  }
}

TEST(ThreadPool, ParallelForCoversRangeInGranules) {
  ThreadPool pool(3);
  for (int64_t count : {1, 5, 16, 17, 1000, 12289}) {
    std::vector<std::atomic<int>> hits(count);
    pool.parallel_for(count, 16, [&](int64_t begin, int64_t end) {
      EXPECT_EQ(begin % 16, 0);
      for (int64_t i = begin; i < end; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << count << " " << i;
  }
}

// share() is parallel_for's split: contiguous ranges in granules that cover [0, count) once.
TEST(ThreadPool, ShareSplitsLikeParallelFor) {
  for (int threads : {1, 2, 3}) {
    for (int64_t count : {0, 1, 15, 16, 17, 203, 12289}) {
      int64_t next = 0;
      for (int thread = 0; thread < threads; ++thread) {
        const ThreadPool::Range range = ThreadPool::share(count, 16, thread, threads);
        EXPECT_EQ(range.begin, next) << threads << " " << count << " " << thread;
        EXPECT_LE(range.begin, range.end);
        if (range.end < count) {
          EXPECT_EQ(range.end % 16, 0);
        }
        next = range.end;
      }
      EXPECT_EQ(next, count) << threads << " " << count;
    }
  }
}

TEST(ThreadPool, ManyShortRegions) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int region = 0; region < 20000; ++region) pool.run([&](int index, int) { total += index + 1; });
  EXPECT_EQ(total.load(), 20000 * 3);
}

}  // namespace
}  // namespace gemma4rt
