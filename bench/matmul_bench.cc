// Matmul microbenchmarks (Google Benchmark).
//
//   ReadBandwidth/threads:N    the memory read probe: the widest loads, 8 independent accumulators, each
//                              thread streaming its half of a 1 GiB buffer (>> L3). Decode's ceiling.
//   ReadSideBySide/streams:S/segment:B/threads:1
//                              one core reading the probe's buffer as a tile reads S weight panels or
//                              rows side by side: groups of S segments of B bytes, 256 bytes of each in
//                              turn. With S = 1, one stream front to back.
//   ReadAndCompute/dpbusd_per_line:K/threads:N
//                              the probe's stream with K vpdpbusd on each line it loads, in turn with
//                              the plain probe: kept (plain time over computing time), GB/s of each.
//   PeakBf16/threads:N         vdpbf16ps on registers only: the compute ceiling for bf16 prefill.
//   Decode/<fmt>/<isa>/<rows>x<cols>/tokens:T/threads:N
//                              memory-bound GEMV / small batches. Shapes that fit in L3 rotate over
//                              copies of the weight totalling >= 256 MiB, as a decode step streams every
//                              layer's weights. Counters: GB/s of weight bytes read, % of the probe with
//                              the same thread count (run right after the case), tok/s if this matmul
//                              were the whole step.
//   LongRows/<whole|chunks>/bf16/<isa>/1536x12288/tokens:1/threads:N
//   OneTokenPrefetch/<none|ahead>/<q8|q4>-panels/<isa>/12288x1536/tokens:1/threads:N
//                              the two ways of the kernels that have two (detail::kernel_way): one
//                              token's long rows whole or in K chunks, one token's panels without or
//                              with a software prefetch. Which is faster depends on the host; the
//                              engine measures both and keeps the faster.
//   Prefill/<fmt>/<isa>/<rows>x<cols>/tokens:T/threads:N
//                              compute-bound; GFLOP/s counts 2 * tokens * rows * cols.
//   Warm/<fmt>/<isa>/<rows>x<cols>/tokens:T/threads:N
//                              the same products on one small weight that stays in L2 between calls:
//                              the compute side of a step of T sequences, GFLOP/s against the peak.
//   BatchCost/<fmt>/<isa>/<rows>x<cols>/tokens:T/threads:N
//                              the Decode product for one token and for T in turn, call by call, so both
//                              see the same bandwidth: step_ratio (T tokens' time over one's) and speedup
//                              (T / step_ratio), the figures behind "8 streams >= 6x one".
//   WayCost/<q8|q4>-panels/<isa>/<rows>x<cols>/tokens:T/threads:N
//                              a step's panels prefetching into L2 (the first way) and into L1 (the
//                              second), in turn as in BatchCost: second_over_first, the time ratio.
//   GatedFeedForward/<fused|unfused>/<width>x<hidden>/tokens:T/threads:N
//                              a bf16 prompt's gate and up products into down_proj's prepared input:
//                              GELU x up in the prefill tiles (kernels::gelu_gate_up), or the two
//                              products stored as floats, then GELU x up and the bf16 conversion row
//                              by row (as the CPU backend ran it before); GFLOP/s counts the products.
//   Prepare/<fmt>/...          the once-per-matmul activation conversion.
// Threads: the calling thread plus persistent std::threads, each taking an equal share of the rows
// (a multiple of 16 rows), as the engine's pool does.
// GCC 12 reports its own _mm512_undefined_*() placeholders in the intrinsic headers as uninitialised
// (GCC bug 105593) once they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "backend/host/bandwidth.h"
#include "backend/host/compute_peak.h"
#include "backend/host/isa.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/vector_ops.h"
#include "core/weight_buffer.h"

namespace gemma4rt::kernels {
namespace {

// ---- a persistent fork-join runner: worker threads spin (then yield) between jobs ----

class Runner {
 public:
  explicit Runner(int threads) {
    for (int index = 1; index < threads; ++index) workers_.emplace_back([this, index] { loop(index); });
  }
  ~Runner() {
    stop_.store(true);
    generation_.fetch_add(1);
    for (std::thread& worker : workers_) worker.join();
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls job(thread) on every thread, the caller being thread 0, and waits for all.
  void run(const std::function<void(int)>& job) {
    job_ = &job;
    remaining_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1, std::memory_order_release);
    job(0);
    while (remaining_.load(std::memory_order_acquire) != 0) _mm_pause();
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        if (++spins < 20000) {
          _mm_pause();
        } else {
          std::this_thread::yield();
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      (*job_)(index);
      remaining_.fetch_sub(1, std::memory_order_release);
    }
  }

  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stop_{false};
};

Runner& runner(int threads) {
  static std::map<int, std::unique_ptr<Runner>> runners;
  auto& slot = runners[threads];
  if (!slot) slot = std::make_unique<Runner>(threads);
  return *slot;
}

// Weights and the probe's buffer in the engine's weight storage (huge pages where the system gives
// them), so the products and the probe see the memory as a decode step does.
using Buffer = WeightBuffer<std::byte>;

Buffer allocate(size_t bytes) {
  Buffer buffer;
  buffer.resize(bytes);
  return buffer;
}

// ---- the read-bandwidth probe ----

// The engine's own read loop for the widest ISA this CPU has (backend/host/bandwidth.h): the probe
// must run on every machine the kernels do, AVX2-only ones included.
float read_stream(const std::byte* data, size_t bytes) {
  return read_stream_for(detected_isa())(reinterpret_cast<const float*>(data), bytes);
}

constexpr size_t kProbeBytes = size_t{1} << 30;

// Best of `repeats` passes, in bytes per second.
double probe_bandwidth(int threads, int repeats) {
  Buffer buffer = allocate(kProbeBytes);
  const size_t share = kProbeBytes / threads;
  runner(threads).run([&](int thread) { std::memset(buffer.data() + share * thread, 1, share); });
  double best = 0.0;
  std::atomic<float> sink{0.0f};
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    runner(threads).run([&](int thread) { sink.store(read_stream(buffer.data() + share * thread, share)); });
    best = std::max(best, kProbeBytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

void ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Buffer buffer = allocate(kProbeBytes);
  const size_t share = kProbeBytes / threads;
  runner(threads).run([&](int thread) { std::memset(buffer.data() + share * thread, 1, share); });
  std::atomic<float> sink{0.0f};
  for (auto _ : state) {
    runner(threads).run([&](int thread) { sink.store(read_stream(buffer.data() + share * thread, share)); });
  }
  state.counters["GB/s"] = benchmark::Counter(kProbeBytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Groups of `streams` segments of `segment` bytes, 256 bytes of each segment in turn (AVX2 loads, so it
// runs wherever the kernels' fast paths do).
__attribute__((target("avx2"))) float read_side_by_side(const std::byte* data, size_t bytes, int streams, size_t segment) {
  __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0, sum2 = sum0, sum3 = sum0;
  const size_t group = segment * static_cast<size_t>(streams);
  for (size_t first = 0; first + group <= bytes; first += group) {
    for (size_t offset = 0; offset < segment; offset += 256) {
      for (int stream = 0; stream < streams; ++stream) {
        const float* piece = reinterpret_cast<const float*>(data + first + segment * static_cast<size_t>(stream) + offset);
        for (int i = 0; i < 64; i += 32) {
          sum0 = _mm256_add_ps(sum0, _mm256_loadu_ps(piece + i));
          sum1 = _mm256_add_ps(sum1, _mm256_loadu_ps(piece + i + 8));
          sum2 = _mm256_add_ps(sum2, _mm256_loadu_ps(piece + i + 16));
          sum3 = _mm256_add_ps(sum3, _mm256_loadu_ps(piece + i + 24));
        }
      }
    }
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(sum0, sum1), _mm256_add_ps(sum2, sum3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

void ReadSideBySide(benchmark::State& state) {
  if (detected_isa() < Isa::kAvx2) return state.SkipWithError("needs AVX2");
  const int streams = static_cast<int>(state.range(0));
  const size_t segment = static_cast<size_t>(state.range(1));
  Buffer buffer = allocate(kProbeBytes);
  std::memset(buffer.data(), 1, kProbeBytes);
  const size_t read = kProbeBytes / (segment * streams) * (segment * streams);
  std::atomic<float> sink{0.0f};
  for (auto _ : state) sink.store(read_side_by_side(buffer.data(), kProbeBytes, streams, segment));
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(read) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The probe's stream with `per_line` vpdpbusd on each 64-byte line just loaded, the stream its only
// memory operand. How much bandwidth a core keeps while it computes on what it reads: one token's q8
// panels run about 5 instructions a line, q4's about 9.
template <int kPerLine>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t read_and_compute(const std::byte* data, size_t bytes) {
  __m512i sums[8];
  for (__m512i& sum : sums) sum = _mm512_setzero_si512();
  const __m512i x = _mm512_set1_epi32(0x01020304);
  for (size_t offset = 0; offset < bytes; offset += 256) {
#pragma GCC unroll 4
    for (int line = 0; line < 4; ++line) {
      const __m512i w = _mm512_load_si512(data + offset + 64 * line);
#pragma GCC unroll 8
      for (int k = 0; k < kPerLine; ++k) sums[(line * kPerLine + k) % 8] = _mm512_dpbusd_epi32(sums[(line * kPerLine + k) % 8], w, x);
    }
  }
  __m512i total = sums[0];
  for (int i = 1; i < 8; ++i) total = _mm512_add_epi32(total, sums[i]);
  return _mm512_reduce_add_epi32(total);
}

// That stream against the plain probe, pass by pass in turn so both meet the same bandwidth: GB/s of
// each and kept (the plain pass's time over the computing one's).
template <int kPerLine>
void ReadAndCompute(benchmark::State& state) {
  if (detected_isa() < Isa::kAvx512) return state.SkipWithError("needs AVX-512 VNNI");
  const int threads = static_cast<int>(state.range(0));
  Buffer buffer = allocate(kProbeBytes);
  const size_t share = kProbeBytes / threads;
  runner(threads).run([&](int thread) { std::memset(buffer.data() + share * thread, 1, share); });
  std::atomic<int64_t> sink{0};
  double seconds[2] = {0.0, 0.0};
  for (auto _ : state) {
    for (int computing = 0; computing < 2; ++computing) {
      const auto start = std::chrono::steady_clock::now();
      runner(threads).run([&](int thread) {
        const std::byte* mine = buffer.data() + share * thread;
        sink.store(computing ? read_and_compute<kPerLine>(mine, share) : static_cast<int64_t>(read_stream(mine, share)));
      });
      seconds[computing] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  const double bytes = static_cast<double>(kProbeBytes) * static_cast<double>(state.iterations());
  state.counters["plain_GB/s"] = bytes / seconds[0] * 1e-9;
  state.counters["computing_GB/s"] = bytes / seconds[1] * 1e-9;
  state.counters["kept"] = seconds[0] / seconds[1];
}

// ---- the compute ceiling: the engine's own probe (backend/host/compute_peak.h) ----

void PeakBf16(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  if (detected_isa() < Isa::kAvx512Bf16) return state.SkipWithError("needs AVX512_BF16");
  constexpr int64_t kIterations = 1'000'000;
  std::atomic<float> sink{0.0f};
  for (auto _ : state) {
    runner(threads).run([&](int) { sink.store(multiply_add_chains_bf16_avx512(kIterations)); });
  }
  state.counters["GFLOP/s"] = benchmark::Counter(threads * kIterations * 12 * 64 * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// ---- weights: random values in the format, several copies when one would stay in L3 ----

constexpr size_t kColdWorkingSet = size_t{256} << 20;

struct WeightSet {
  WeightFormat format;
  QuantLayout layout;
  int64_t rows = 0, cols = 0;
  std::vector<Buffer> values, scales;
  std::vector<WeightMatrix> copies;
  size_t bytes_per_copy = 0;
};

uint64_t next_random(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return state >> 33;
}

// One weight set is kept between calls of the same benchmark (Google Benchmark calls a function
// several times while it settles the iteration count).
const WeightSet& weights(WeightFormat format, int64_t rows, int64_t cols, bool cold, QuantLayout layout = QuantLayout::kSuperblocks) {
  static std::unique_ptr<WeightSet> cached;
  if (cached && cached->format == format && cached->layout == layout && cached->rows == rows && cached->cols == cols &&
      (cached->copies.size() > 1) == (cold && cached->bytes_per_copy < kColdWorkingSet / 2)) {
    return *cached;
  }
  cached.reset();
  auto set = std::make_unique<WeightSet>();
  set->format = format;
  set->layout = layout;
  set->rows = rows;
  set->cols = cols;
  const size_t elements = static_cast<size_t>(rows) * cols;
  const bool panels = layout == QuantLayout::kPanels;
  const size_t scale_count = panels                          ? 0  // the panels hold their scales
                             : format == WeightFormat::kQ8 ? static_cast<size_t>(q8_packed_scale_count(rows, cols))
                                                           : static_cast<size_t>(rows) * q8_blocks_per_row(cols);
  set->bytes_per_copy = static_cast<size_t>(weight_bytes(rows, cols, format));
  const size_t value_bytes = format == WeightFormat::kQ4   ? static_cast<size_t>(panels ? q4_panel_bytes(rows, cols) : rows * q4_row_bytes(cols))
                             : format == WeightFormat::kF32 ? elements * 4
                             : format == WeightFormat::kBF16 ? elements * 2
                             : panels                        ? static_cast<size_t>(q8_panel_bytes(rows, cols))
                                                             : static_cast<size_t>(q8_packed_bytes(rows, cols));
  size_t copies = 1;
  if (cold && set->bytes_per_copy < kColdWorkingSet / 2) copies = (kColdWorkingSet + set->bytes_per_copy - 1) / set->bytes_per_copy;
  uint64_t seed = 12345;
  for (size_t copy = 0; copy < copies; ++copy) {
    Buffer values = allocate(value_bytes);
    Buffer scales;
    WeightMatrix matrix{format, rows, cols, values.data(), nullptr};
    matrix.layout = layout;
    switch (format) {
      case WeightFormat::kF32: {
        auto* data = reinterpret_cast<float*>(values.data());
        for (size_t i = 0; i < elements; ++i) data[i] = static_cast<float>(next_random(seed) % 2001) * 1e-4f - 0.1f;
        break;
      }
      case WeightFormat::kBF16: {
        auto* data = reinterpret_cast<uint16_t*>(values.data());
        // Normal-range values of both signs, |w| < 0.25.
        for (size_t i = 0; i < elements; ++i) data[i] = static_cast<uint16_t>(0x3c00 + (next_random(seed) & 0x3ff) + ((i & 1) << 15));
        break;
      }
      case WeightFormat::kQ8: {
        auto* data = reinterpret_cast<int8_t*>(values.data());
        for (size_t i = 0; i < value_bytes; ++i) data[i] = static_cast<int8_t>(static_cast<int>(next_random(seed) % 255) - 127);
        scales = allocate(scale_count * sizeof(float));
        auto* scale = reinterpret_cast<float*>(scales.data());
        for (size_t i = 0; i < scale_count; ++i) scale[i] = 1e-3f * static_cast<float>(1 + next_random(seed) % 16);
        matrix.block_scales = scale;
        if (panels) {  // the scales in the panels: normal floats, as a checkpoint's
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t b = 0; b < q8_blocks_per_row(cols); ++b) {
              const float value = 1e-3f * static_cast<float>(1 + next_random(seed) % 16);
              std::memcpy(values.data() + q8_panel_scale_address(r, b, rows, cols), &value, sizeof(value));
            }
          }
        }
        break;
      }
      case WeightFormat::kQ4: {
        auto* data = reinterpret_cast<uint8_t*>(values.data());
        for (size_t i = 0; i < value_bytes; ++i) data[i] = static_cast<uint8_t>(next_random(seed));
        scales = allocate(scale_count * sizeof(uint16_t));
        auto* scale = reinterpret_cast<uint16_t*>(scales.data());
        for (size_t i = 0; i < scale_count; ++i) scale[i] = static_cast<uint16_t>(0x1400 + next_random(seed) % 1024);  // ~1e-3
        matrix.half_scales = scale;
        if (panels) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t b = 0; b < q4_blocks_per_row(cols); ++b) {
              const auto value = static_cast<uint16_t>(0x1400 + next_random(seed) % 1024);
              std::memcpy(values.data() + q4_panel_scale_address(r, b, rows, cols), &value, sizeof(value));
            }
          }
        }
        break;
      }
    }
    set->copies.push_back(matrix);
    set->values.push_back(std::move(values));
    set->scales.push_back(std::move(scales));
  }
  cached = std::move(set);
  return *cached;
}

struct MatmulCase {
  WeightFormat format;
  Isa isa;
  int64_t rows, cols, tokens;
  int threads;
  bool decode;
  QuantLayout layout = QuantLayout::kSuperblocks;  // q8, q4: panels are what load gives the AVX-512 kernels
  detail::KernelWay way = detail::KernelWay::kMeasure;  // kernels with two ways (LongRows, OneTokenPrefetch)
};

// Panels are the AVX-512 kernels' layout; below that, load keeps q8 and q4 in superblocks and a panel
// product would time the scalar reference.
bool has_panels(WeightFormat format) {
  return (format == WeightFormat::kQ8 || format == WeightFormat::kQ4) && detected_isa() >= Isa::kAvx512;
}

std::string format_label(WeightFormat format, QuantLayout layout = QuantLayout::kSuperblocks) {
  return std::string(format_name(format)) + (layout == QuantLayout::kPanels ? "-panels" : "");
}

// One product over the case's threads, each taking an equal share of the rows (a multiple of 16).
void run_product(const MatmulCase& c, const PreparedActivations& prepared, const WeightMatrix& matrix, float* y) {
  const int64_t share = (c.rows / c.threads + 15) / 16 * 16;
  runner(c.threads).run([&](int thread) {
    const int64_t begin = std::min(c.rows, thread * share);
    const int64_t end = thread + 1 == c.threads ? c.rows : std::min(c.rows, begin + share);
    matmul(prepared, matrix, y, c.rows, begin, end);
  });
}

std::vector<float> random_activations(int64_t tokens, int64_t cols, uint64_t seed = 99) {
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (float& value : x) value = static_cast<float>(next_random(seed) % 2001) * 1e-3f - 1.0f;
  return x;
}

void RunMatmul(benchmark::State& state, MatmulCase c) {
  if (c.isa > detected_isa()) return state.SkipWithError("this CPU cannot run that instruction set");
  const Isa saved = active_isa();
  set_active_isa(c.isa);
  detail::set_kernel_way(c.way);
  const WeightSet& set = weights(c.format, c.rows, c.cols, c.decode, c.layout);
  const std::vector<float> x = random_activations(c.tokens, c.cols);
  PreparedActivations prepared;
  prepared.prepare(x.data(), c.tokens, c.cols, c.format);
  std::vector<float> y(static_cast<size_t>(c.tokens * c.rows));
  size_t copy = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    run_product(c, prepared, set.copies[copy], y.data());
    copy = copy + 1 == set.copies.size() ? 0 : copy + 1;
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  set_active_isa(saved);
  detail::set_kernel_way(detail::KernelWay::kMeasure);
  const double flops = 2.0 * c.tokens * c.rows * c.cols;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (c.decode) {
    state.counters["GB/s"] = benchmark::Counter(set.bytes_per_copy * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["tok/s"] = benchmark::Counter(static_cast<double>(c.tokens), benchmark::Counter::kIsIterationInvariantRate);
    const double bytes_per_second = set.bytes_per_copy * static_cast<double>(state.iterations()) / seconds;
    // Memory bandwidth on a shared or virtual machine drifts, so the probe runs right after each case.
    state.counters["%probe"] = 100.0 * bytes_per_second / probe_bandwidth(c.threads, 3);
  }
}

// Two runs of the product on one weight, call by call, each call on the next cold copy: their total
// times. Memory bandwidth on this kind of host drifts by half within a minute, so two separate Decode
// cases can land in different phases; interleaved, both see the same drift and their ratio holds.
struct ProductRun {
  const MatmulCase* operands;
  const PreparedActivations* prepared;
  detail::KernelWay way;
};
std::pair<double, double> time_in_turn(benchmark::State& state, const WeightSet& set, const ProductRun& a, const ProductRun& b,
                                       float* y) {
  size_t copy = 0;
  double seconds[2] = {0.0, 0.0};
  for (auto _ : state) {
    for (int run = 0; run < 2; ++run) {
      const ProductRun& product = run == 0 ? a : b;
      detail::set_kernel_way(product.way);
      const auto start = std::chrono::steady_clock::now();
      run_product(*product.operands, *product.prepared, set.copies[copy], y);
      seconds[run] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      copy = copy + 1 == set.copies.size() ? 0 : copy + 1;
    }
    benchmark::DoNotOptimize(y);
  }
  detail::set_kernel_way(detail::KernelWay::kMeasure);
  return {seconds[0], seconds[1]};
}

// A step of T sequences against one sequence's, on the same weight, in turn (time_in_turn).
// Counters: step_ratio (time for T tokens over time for one) and speedup (T / step_ratio: the
// aggregate gain of T streams over one, were the whole step made of this product).
void RunBatchCost(benchmark::State& state, MatmulCase c) {
  if (c.isa > detected_isa()) return state.SkipWithError("this CPU cannot run that instruction set");
  const Isa saved = active_isa();
  set_active_isa(c.isa);
  const WeightSet& set = weights(c.format, c.rows, c.cols, true, c.layout);
  MatmulCase one = c;
  one.tokens = 1;
  const std::vector<float> x = random_activations(c.tokens, c.cols);
  PreparedActivations single, batch;
  single.prepare(x.data(), 1, c.cols, c.format);
  batch.prepare(x.data(), c.tokens, c.cols, c.format);
  std::vector<float> y(static_cast<size_t>(c.tokens * c.rows));
  const auto [single_seconds, batch_seconds] = time_in_turn(state, set, {&one, &single, detail::KernelWay::kMeasure},
                                                            {&c, &batch, detail::KernelWay::kMeasure}, y.data());
  set_active_isa(saved);
  const double ratio = batch_seconds / single_seconds;
  state.counters["step_ratio"] = ratio;
  state.counters["speedup"] = static_cast<double>(c.tokens) / ratio;
}

// The two ways of a kernel that has two (detail::kernel_way), in turn (time_in_turn): second_over_first
// is the second way's time over the first's (below 1: the second is faster).
void RunWayCost(benchmark::State& state, MatmulCase c) {
  if (c.isa > detected_isa()) return state.SkipWithError("this CPU cannot run that instruction set");
  const Isa saved = active_isa();
  set_active_isa(c.isa);
  const WeightSet& set = weights(c.format, c.rows, c.cols, true, c.layout);
  const std::vector<float> x = random_activations(c.tokens, c.cols);
  PreparedActivations prepared;
  prepared.prepare(x.data(), c.tokens, c.cols, c.format);
  std::vector<float> y(static_cast<size_t>(c.tokens * c.rows));
  const auto [first_seconds, second_seconds] =
      time_in_turn(state, set, {&c, &prepared, detail::KernelWay::kFirst}, {&c, &prepared, detail::KernelWay::kSecond}, y.data());
  set_active_isa(saved);
  state.counters["second_over_first"] = second_seconds / first_seconds;
}

void RunGatedFeedForward(benchmark::State& state, int64_t width, int64_t hidden, int64_t tokens, int threads, bool fused) {
  if (detected_isa() < Isa::kAvx512Bf16) return state.SkipWithError("the fused products need AVX-512 BF16");
  // Gate rows, then up rows, of one weight set.
  const WeightSet& set = weights(WeightFormat::kBF16, 2 * width, hidden, false);
  WeightMatrix gate = set.copies[0];
  gate.rows = width;
  WeightMatrix up = gate;
  up.values = static_cast<const uint16_t*>(gate.values) + width * hidden;
  const std::vector<float> x = random_activations(tokens, hidden);
  PreparedActivations prepared, products;
  prepared.prepare(x.data(), tokens, hidden, WeightFormat::kBF16);
  std::vector<float> gates(static_cast<size_t>(tokens * width)), ups(gates.size());
  std::vector<std::vector<float>> rows(static_cast<size_t>(threads), std::vector<float>(static_cast<size_t>(width)));
  auto share = [&](int64_t count, int64_t granule, int thread) {
    const int64_t each = (count / threads + granule - 1) / granule * granule;
    const int64_t begin = std::min(count, thread * each);
    return std::pair{begin, thread + 1 == threads ? count : std::min(count, begin + each)};
  };
  for (auto _ : state) {
    products.reshape(tokens, width, WeightFormat::kBF16);
    if (fused) {
      runner(threads).run([&](int thread) {
        const auto [begin, end] = share(width, 32, thread);
        gelu_gate_up(prepared, gate, up, gates.data(), ups.data(), products, begin, end);
      });
    } else {
      runner(threads).run([&](int thread) {
        const auto [begin, end] = share(width, 16, thread);
        matmul(prepared, gate, gates.data(), width, begin, end);
        matmul(prepared, up, ups.data(), width, begin, end);
      });
      runner(threads).run([&](int thread) {
        const auto [begin, end] = share(tokens, 1, thread);
        std::vector<float>& row = rows[static_cast<size_t>(thread)];
        for (int64_t t = begin; t < end; ++t) {
          gelu_tanh_multiply(gates.data() + t * width, ups.data() + t * width, width, row.data());
          products.convert_row(row.data(), t);
        }
      });
    }
    benchmark::DoNotOptimize(products.bf16_values());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * tokens * width * hidden * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void RunPrepare(benchmark::State& state, WeightFormat format, int64_t tokens, int64_t cols) {
  const std::vector<float> x = random_activations(tokens, cols, 7);
  PreparedActivations prepared;
  for (auto _ : state) {
    prepared.prepare(x.data(), tokens, cols, format);
    benchmark::DoNotOptimize(prepared.f32_values());
  }
  state.counters["Melem/s"] = benchmark::Counter(tokens * cols * 1e-6, benchmark::Counter::kIsIterationInvariantRate);
}

struct Shape {
  int64_t rows, cols;
};

std::string case_name(const char* kind, const MatmulCase& c) {
  return std::string(kind) + "/" + format_label(c.format, c.layout) + "/" + isa_name(c.isa) + "/" + std::to_string(c.rows) + "x" +
         std::to_string(c.cols) + "/tokens:" + std::to_string(c.tokens) + "/threads:" + std::to_string(c.threads);
}

void add_matmul(const char* kind, const MatmulCase& c) {
  benchmark::RegisterBenchmark(case_name(kind, c).c_str(), RunMatmul, c)->UseRealTime()->Unit(benchmark::kMicrosecond);
}

// Full-size E2B shapes: [rows = out features] x [cols = in features].
const Shape kDecodeShapes[] = {{12288, 1536}, {262144, 1536}, {2048, 1536}, {1536, 2048}, {6144, 1536}, {1536, 6144}, {1536, 12288}};
// Weights that stay in L2 (about 600 KiB in q8), so a batch's products show their compute cost alone.
const Shape kWarmShapes[] = {{384, 1536}, {96, 6144}};
const Shape kPrefillShapes[] = {{6144, 1536}, {1536, 6144}, {2048, 1536}, {1536, 2048}, {12288, 1536}, {1536, 12288}, {256, 1536}};

const bool kRegistered = [] {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(("ReadBandwidth/threads:" + std::to_string(threads)).c_str(), ReadBandwidth)
        ->Arg(threads)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("PeakBf16/threads:" + std::to_string(threads)).c_str(), PeakBf16)
        ->Arg(threads)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (int threads : {1, 2}) {
    const std::string suffix = "/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(("ReadAndCompute/dpbusd_per_line:2" + suffix).c_str(), ReadAndCompute<2>)->Arg(threads)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("ReadAndCompute/dpbusd_per_line:4" + suffix).c_str(), ReadAndCompute<4>)->Arg(threads)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("ReadAndCompute/dpbusd_per_line:8" + suffix).c_str(), ReadAndCompute<8>)->Arg(threads)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  // One stream, then four side by side over segments of a q4 panel of K = 1,536 / 6,144 (12 / 48 KiB)
  // and a bf16 row of K = 1,536 (3 KiB).
  for (int64_t segment : {3072, 12288, 49152}) {
    for (int64_t streams : {1, 4}) {
      if (streams == 1 && segment != 12288) continue;
      benchmark::RegisterBenchmark(("ReadSideBySide/streams:" + std::to_string(streams) + "/segment:" + std::to_string(segment) + "/threads:1").c_str(),
                                   ReadSideBySide)
          ->Args({streams, segment})->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }
  const Isa all_levels[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2, Isa::kScalar};
  for (int threads : {1, 2}) {
    for (const Shape& shape : kDecodeShapes) {
      for (WeightFormat format : {WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
        for (int64_t tokens : {1, 2, 4, 8, 16}) {
          add_matmul("Decode", {format, detected_isa(), shape.rows, shape.cols, tokens, threads, true});
          if (has_panels(format)) {
            add_matmul("Decode", {format, detected_isa(), shape.rows, shape.cols, tokens, threads, true, QuantLayout::kPanels});
          }
        }
      }
    }
    // The kernels with two ways (detail::kernel_way; the engine times both and keeps the faster):
    // one token's long rows whole or in chunks, one token's q8/q4 panels without or with a prefetch.
    for (const auto& [label, way] : {std::pair{"whole", detail::KernelWay::kFirst}, std::pair{"chunks", detail::KernelWay::kSecond}}) {
      MatmulCase c{WeightFormat::kBF16, detected_isa(), 1536, 12288, 1, threads, true};
      c.way = way;
      add_matmul((std::string("LongRows/") + label).c_str(), c);
    }
    for (const auto& [label, way] : {std::pair{"none", detail::KernelWay::kFirst}, std::pair{"ahead", detail::KernelWay::kSecond}}) {
      for (WeightFormat format : {WeightFormat::kQ8, WeightFormat::kQ4}) {
        if (!has_panels(format)) continue;
        MatmulCase c{format, detected_isa(), 12288, 1536, 1, threads, true, QuantLayout::kPanels};
        c.way = way;
        add_matmul((std::string("OneTokenPrefetch/") + label).c_str(), c);
      }
    }
    // Every path on one GEMV shape (bf16 is a different kernel at each AVX-512 level); the best
    // bf16, q8 and q4 paths ran above.
    for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
      for (Isa isa : all_levels) {
        if (format != WeightFormat::kBF16 && isa == Isa::kAvx512Bf16) continue;
        if (format != WeightFormat::kF32 && isa == detected_isa()) continue;
        add_matmul("Decode", {format, isa, 12288, 1536, 1, threads, true});
      }
    }
    for (const Shape& shape : kDecodeShapes) {
      for (WeightFormat format : {WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
        for (int64_t tokens : {4, 8, 16}) {
          for (QuantLayout layout : {QuantLayout::kSuperblocks, QuantLayout::kPanels}) {
            if (layout == QuantLayout::kPanels && !has_panels(format)) continue;
            const MatmulCase c{format, detected_isa(), shape.rows, shape.cols, tokens, threads, true, layout};
            benchmark::RegisterBenchmark(case_name("BatchCost", c).c_str(), RunBatchCost, c)->UseRealTime()->Unit(benchmark::kMicrosecond);
          }
        }
        // A step's panels prefetching into L2 (first way) or L1 (second).
        if (!has_panels(format)) continue;
        for (int64_t tokens : {4, 8}) {
          const MatmulCase c{format, detected_isa(), shape.rows, shape.cols, tokens, threads, true, QuantLayout::kPanels};
          benchmark::RegisterBenchmark(case_name("WayCost", c).c_str(), RunWayCost, c)->UseRealTime()->Unit(benchmark::kMicrosecond);
        }
      }
    }
    for (const Shape& shape : kWarmShapes) {
      for (WeightFormat format : {WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
        for (int64_t tokens : {1, 4, 8, 16}) {
          add_matmul("Warm", {format, detected_isa(), shape.rows, shape.cols, tokens, threads, false});
          if (has_panels(format)) add_matmul("Warm", {format, detected_isa(), shape.rows, shape.cols, tokens, threads, false, QuantLayout::kPanels});
        }
      }
    }
    for (const Shape& shape : kPrefillShapes) {
      add_matmul("Prefill", {WeightFormat::kBF16, detected_isa(), shape.rows, shape.cols, 512, threads, false});
    }
    // Short prompts and a server step's mix of prompt and decode rows: just past the batch tiles' 16.
    for (int64_t tokens : {17, 24, 32, 48, 64, 128}) {
      add_matmul("Prefill", {WeightFormat::kBF16, detected_isa(), 6144, 1536, tokens, threads, false});
    }
    for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
      for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2}) {
        if (format != WeightFormat::kBF16 && isa == Isa::kAvx512Bf16) continue;
        if (format == WeightFormat::kBF16 && isa == detected_isa()) continue;  // ran above
        add_matmul("Prefill", {format, isa, 6144, 1536, 512, threads, false});
        if (has_panels(format) && isa >= Isa::kAvx512) add_matmul("Prefill", {format, isa, 6144, 1536, 512, threads, false, QuantLayout::kPanels});
      }
    }
  }
  // E2B's MLP widths (K in one stretch) and E4B's (K = 2,560: two stretches), a 256-token prompt chunk.
  for (const Shape& shape : {Shape{6144, 1536}, Shape{12288, 1536}, Shape{10240, 2560}}) {
    for (const bool fused : {true, false}) {
      const std::string name = std::string("GatedFeedForward/") + (fused ? "fused/" : "unfused/") + std::to_string(shape.rows) + "x" +
                               std::to_string(shape.cols) + "/tokens:256/threads:2";
      benchmark::RegisterBenchmark(name.c_str(), RunGatedFeedForward, shape.rows, shape.cols, int64_t{256}, 2, fused)
          ->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
    for (int64_t tokens : {1, 512}) {
      for (int64_t cols : {1536, 6144}) {
        benchmark::RegisterBenchmark((std::string("Prepare/") + format_label(format) + "/tokens:" + std::to_string(tokens) +
                                      "/cols:" + std::to_string(cols)).c_str(),
                                     RunPrepare, format, tokens, cols)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace gemma4rt::kernels
