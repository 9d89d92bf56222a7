#include "backend/host/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/host/isa.h"

namespace gemma4rt::kernels {

float read_stream_scalar(const float* data, size_t bytes) {
  float sums[8] = {};
  const size_t count = bytes / sizeof(float);
  for (size_t i = 0; i < count; i += 8) {
    for (int lane = 0; lane < 8; ++lane) sums[lane] += data[i + lane];
  }
  float total = 0.0f;
  for (float sum : sums) total += sum;
  return total;
}

double measure_read_bandwidth(ThreadPool& pool, size_t buffer_bytes, int repeats) {
  buffer_bytes = std::max<size_t>(buffer_bytes / (512 * pool.size()) * 512 * pool.size(), 512 * pool.size());
  auto release = [](float* pointer) { std::free(pointer); };
  std::unique_ptr<float, decltype(release)> buffer(static_cast<float*>(std::aligned_alloc(64, buffer_bytes)), release);
  const size_t share = buffer_bytes / pool.size();
  // Each thread touches its own share first, so pages live near the thread that reads them.
  pool.run([&](int thread, int) {
    std::memset(reinterpret_cast<char*>(buffer.get()) + share * thread, 1, share);
  });
  auto stream = active_isa() >= Isa::kAvx512 ? read_stream_avx512 : active_isa() >= Isa::kAvx2 ? read_stream_avx2 : read_stream_scalar;
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    pool.run([&](int thread, int) {
      const float* data = reinterpret_cast<const float*>(reinterpret_cast<const char*>(buffer.get()) + share * thread);
      sink = sink + stream(data, share);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(buffer_bytes) / seconds);
  }
  return best;
}

}  // namespace gemma4rt::kernels
