// A probe of the machine's memory read bandwidth: every thread streams its share of a buffer far
// larger than the caches with the widest loads the CPU has and several independent accumulators, so
// the figure is what memory can deliver, the ceiling for memory-bound decode.
#pragma once

#include <cstddef>

#include "backend/host/isa.h"
#include "core/thread_pool.h"
#include "core/weight_buffer.h"

namespace gemma4rt::kernels {

// A buffer far larger than the caches, written once, each thread's share by that thread (so pages
// live near the thread that reads them); measure() can then be called again and again cheaply. It sits
// on huge pages where the system gives them, as the weights do (core/weight_buffer.h): on 4 KiB pages
// the probe, not the memory, would set the ceiling that decode is measured against.
class ReadProbe {
 public:
  explicit ReadProbe(ThreadPool& pool, size_t buffer_bytes = size_t{1} << 30);
  // Bytes per second, the best of `repeats` passes over the buffer.
  double measure(int repeats = 5);

 private:
  ThreadPool& pool_;
  size_t bytes_ = 0;
  WeightBuffer<float> buffer_;
};

// One pass of reading [data, data + bytes) (bytes a multiple of 512); returns a value that depends on
// every byte so the reads cannot be optimised away.
float read_stream_scalar(const float* data, size_t bytes);
float read_stream_avx2(const float* data, size_t bytes);
float read_stream_avx512(const float* data, size_t bytes);
// The widest of the three that instruction set level `isa` runs.
using ReadStream = float (*)(const float* data, size_t bytes);
ReadStream read_stream_for(Isa isa);

}  // namespace gemma4rt::kernels
