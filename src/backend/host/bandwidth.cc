#include "backend/host/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>

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

ReadProbe::ReadProbe(ThreadPool& pool, size_t buffer_bytes) : pool_(pool) {
  const size_t unit = 512 * static_cast<size_t>(pool.size());
  bytes_ = std::max(buffer_bytes / unit * unit, unit);
  buffer_.resize(bytes_ / sizeof(float), "the bandwidth probe's buffer");
  const size_t share = bytes_ / pool.size();
  pool.run([&](int thread, int) { std::memset(reinterpret_cast<char*>(buffer_.data()) + share * thread, 1, share); });
}

ReadStream read_stream_for(Isa isa) {
  return isa >= Isa::kAvx512 ? read_stream_avx512 : isa >= Isa::kAvx2 ? read_stream_avx2 : read_stream_scalar;
}

double ReadProbe::measure(int repeats) {
  const ReadStream stream = read_stream_for(active_isa());
  const size_t share = bytes_ / pool_.size();
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    pool_.run([&](int thread, int) {
      const float* data = reinterpret_cast<const float*>(reinterpret_cast<const char*>(buffer_.data()) + share * thread);
      sink = sink + stream(data, share);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes_) / seconds);
  }
  return best;
}

}  // namespace gemma4rt::kernels
