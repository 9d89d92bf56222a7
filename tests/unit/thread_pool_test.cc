// ThreadPool: every thread runs each region exactly once, ranges cover [0, count) without overlap,
// and many back-to-back regions (as in a decode step) complete.
#include <atomic>
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

TEST(ThreadPool, ManyShortRegions) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int region = 0; region < 20000; ++region) pool.run([&](int index, int) { total += index + 1; });
  EXPECT_EQ(total.load(), 20000 * 3);
}

}  // namespace
}  // namespace gemma4rt
