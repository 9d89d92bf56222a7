// A persistent pool of worker threads. Threads are created once; each parallel call wakes them, runs
// one function on every thread (the caller takes part as thread 0) and waits for all of them. Workers
// spin briefly before sleeping so the hundreds of small parallel regions of a decode step do not pay
// a kernel wake-up each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gemma4rt {

// CPUs this process may run on: its affinity mask (taskset, a container's cpuset, mpirun's binding),
// not the machine's count.
int available_cores();

// The most threads a pool takes. More threads than cores only slow the products down, and a count far
// beyond any machine (a typo) would spend minutes and gigabytes creating threads.
inline constexpr int kMaxThreads = 512;

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: one per available core; more than kMaxThreads is an Error
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls work(thread_index, thread_count) once on every thread and returns when all have finished.
  // Not re-entrant: call it from one thread at a time.
  void run(const std::function<void(int, int)>& work);

  // Splits [0, count) into size() contiguous ranges, each a multiple of `granule` except the last,
  // and calls work(begin, end) for each non-empty range.
  void parallel_for(int64_t count, int64_t granule, const std::function<void(int64_t, int64_t)>& work);

  // Thread `thread` of `threads`' range of [0, count) as parallel_for splits it (possibly empty).
  struct Range {
    int64_t begin = 0, end = 0;
  };
  static Range share(int64_t count, int64_t granule, int thread, int threads);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* work_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
};

}  // namespace gemma4rt
