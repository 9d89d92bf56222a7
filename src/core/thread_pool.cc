#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace gemma4rt {
namespace {

// How long a thread polls before it sleeps on a condition variable, counted in time (a pause
// instruction costs 26 ns on this Zen 4 and differs tenfold between CPUs). Polling longer bridges more
// of a decode step's serial gaps (half a millisecond cut an E2B q4 decode's worker sleeps from ~1,000
// to ~100 in 48 tokens), but when more threads are runnable than there are cores (two processes, ctest
// -j2) a polling thread holds a core the thread with work needs: two `verify` runs side by side took
// 14.1 s with 500 us against 1.9 s with 52 us. So ~50 us, as before (docs/benchmarks.md).
constexpr std::chrono::microseconds kSpinTime{50};

inline void cpu_relax() { __builtin_ia32_pause(); }

// Polls `done` until it holds or kSpinTime has passed; says whether it holds.
template <class Condition>
bool spin_until(const Condition& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  while (true) {
    for (int poll = 0; poll < 32; ++poll) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

int available_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) > 0) return CPU_COUNT(&mask);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) {
  if (threads > kMaxThreads) fail("{} threads requested; at most {} (this process may use {} cores)", threads, kMaxThreads, available_cores());
  if (threads <= 0) threads = available_cores();
  for (int index = 1; index < threads; ++index) workers_.emplace_back([this, index] { worker_loop(index); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run(const std::function<void(int, int)>& work) {
  const int count = size();
  if (count == 1) {
    work(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_ = &work;
    remaining_.store(count - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  work(0, count);
  // Wait for the workers: spin first (regions are short), then sleep.
  if (!spin_until([this] { return remaining_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return remaining_.load(std::memory_order_acquire) == 0; });
  }
}

void ThreadPool::parallel_for(int64_t count, int64_t granule, const std::function<void(int64_t, int64_t)>& work) {
  if (count <= 0) return;
  granule = std::max<int64_t>(granule, 1);
  const int64_t granules = (count + granule - 1) / granule;
  const int threads = static_cast<int>(std::min<int64_t>(size(), granules));
  if (threads <= 1) {
    work(0, count);
    return;
  }
  run([&](int thread, int) {
    if (thread >= threads) return;
    const Range range = share(count, granule, thread, threads);
    if (range.begin < range.end) work(range.begin, range.end);
  });
}

ThreadPool::Range ThreadPool::share(int64_t count, int64_t granule, int thread, int threads) {
  granule = std::max<int64_t>(granule, 1);
  const int64_t granules = (count + granule - 1) / granule;
  return {std::min(count, granules * thread / threads * granule), std::min(count, granules * (thread + 1) / threads * granule)};
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    // Spin for new work briefly, then sleep on the condition variable.
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load()) return;
    (*work_)(index, size());
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

}  // namespace gemma4rt
