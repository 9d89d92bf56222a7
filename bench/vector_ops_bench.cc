// Vector kernel microbenchmarks (Google Benchmark), single-threaded, one run per ISA level this CPU
// supports:
//
//   VectorOps/RmsNorm/<isa>/<size>              GB/s counts x, weight and out
//   VectorOps/GeluTanhMultiply/<isa>/<size>     GB/s counts gate read + written and up
//   VectorOps/Softmax/<isa>/<size>              GB/s counts the values read and written once
//   VectorOps/AttendGroup/bf16/<isa>/slots:S/head_dim:D/group:G[/cold]
//                                               one KV head, G query heads; GB/s counts the K and V
//                                               rows read (2 * S * D * 2 bytes). Hot: the same cache
//                                               every iteration (it fits in L3 up to 8 MiB); cold: the
//                                               iterations rotate over copies totalling >= 256 MiB,
//                                               as a decode step walks every layer's cache.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/bf16.h"
#include "backend/host/isa.h"
#include "backend/cpu/kernels/vector_ops.h"

namespace gemma4rt::kernels {
namespace {

std::vector<float> random_floats(int64_t size, float low, float high, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(static_cast<size_t>(size));
  for (float& value : values) value = distribution(generator);
  return values;
}

// Forces `isa` for one benchmark run and restores the detected level afterwards.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) { set_active_isa(isa); }
  ~IsaScope() { set_active_isa(detected_isa()); }
};

void report_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_iteration * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void rms_norm_benchmark(benchmark::State& state, Isa isa, int64_t size) {
  const IsaScope scope(isa);
  const std::vector<float> x = random_floats(size, -2.0f, 2.0f, 1);
  const std::vector<float> weight = random_floats(size, 0.5f, 1.5f, 2);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    rms_norm(x.data(), size, weight.data(), 1e-6f, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  report_bytes(state, 3.0 * 4.0 * static_cast<double>(size));
}

void gelu_benchmark(benchmark::State& state, Isa isa, int64_t size) {
  const IsaScope scope(isa);
  const std::vector<float> original = random_floats(size, -4.0f, 4.0f, 3);
  const std::vector<float> up = random_floats(size, -2.0f, 2.0f, 4);
  std::vector<float> gate = original;
  for (auto _ : state) {
    // Same input every time: refreshing it costs a copy, which is timed (about 5% at these sizes).
    std::copy(original.begin(), original.end(), gate.begin());
    gelu_tanh_multiply(gate.data(), up.data(), size);
    benchmark::DoNotOptimize(gate.data());
    benchmark::ClobberMemory();
  }
  report_bytes(state, 3.0 * 4.0 * static_cast<double>(size));
}

void softmax_benchmark(benchmark::State& state, Isa isa, int64_t size) {
  const IsaScope scope(isa);
  const std::vector<float> original = random_floats(size, -10.0f, 10.0f, 5);
  std::vector<float> values = original;
  for (auto _ : state) {
    std::copy(original.begin(), original.end(), values.begin());
    softmax(values.data(), size);
    benchmark::DoNotOptimize(values.data());
    benchmark::ClobberMemory();
  }
  report_bytes(state, 2.0 * 4.0 * static_cast<double>(size));
}

// 256 MiB each of bf16 keys and values, filled once and shared by the attention benchmarks.
constexpr int64_t kPoolElements = int64_t{128} * 1024 * 1024;

struct KvPool {
  std::vector<uint16_t> keys, values;
};

const KvPool& kv_pool() {
  static const KvPool pool = [] {
    KvPool filled;
    filled.keys.resize(static_cast<size_t>(kPoolElements));
    filled.values.resize(static_cast<size_t>(kPoolElements));
    constexpr int64_t kBlock = int64_t{1} << 20;  // random blocks, repeated
    const std::vector<float> source = random_floats(2 * kBlock, -1.0f, 1.0f, 6);
    std::vector<uint16_t> block(static_cast<size_t>(2 * kBlock));
    store_kv_row(source.data(), 2 * kBlock, KvFormat::kBF16, block.data());
    for (int64_t offset = 0; offset < kPoolElements; offset += kBlock) {
      std::memcpy(filled.keys.data() + offset, block.data(), kBlock * sizeof(uint16_t));
      std::memcpy(filled.values.data() + offset, block.data() + kBlock, kBlock * sizeof(uint16_t));
    }
    return filled;
  }();
  return pool;
}

void attend_group_benchmark(benchmark::State& state, Isa isa, int64_t slots_count, int64_t head_dim, int64_t group,
                            bool cold) {
  const IsaScope scope(isa);
  const KvPool& pool = kv_pool();
  const int64_t elements = slots_count * head_dim;  // one KV head: row_stride == head_dim
  const int64_t copies = cold ? kPoolElements / elements : 1;
  std::vector<int32_t> slots(static_cast<size_t>(slots_count));
  for (int64_t i = 0; i < slots_count; ++i) slots[i] = static_cast<int32_t>(i);
  const float range = 3.0f / std::sqrt(static_cast<float>(head_dim));
  const std::vector<float> queries = random_floats(group * head_dim, -range, range, 7);
  std::vector<float> scores(static_cast<size_t>(group * slots_count)), out(static_cast<size_t>(group * head_dim));
  int64_t copy = 0;
  for (auto _ : state) {
    attend_group(queries.data(), group, head_dim, pool.keys.data() + copy * elements, pool.values.data() + copy * elements,
                 KvFormat::kBF16, head_dim, slots, scores.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    copy = copy + 1 == copies ? 0 : copy + 1;
  }
  report_bytes(state, 2.0 * 2.0 * static_cast<double>(elements));
}

bool register_benchmarks() {
  for (int level = 0; level <= static_cast<int>(detected_isa()); ++level) {
    const Isa isa = static_cast<Isa>(level);
    const std::string name = isa_name(isa);
    for (int64_t size : {1536, 12288}) {
      benchmark::RegisterBenchmark(("VectorOps/RmsNorm/" + name + "/" + std::to_string(size)).c_str(), rms_norm_benchmark, isa, size);
      benchmark::RegisterBenchmark(("VectorOps/GeluTanhMultiply/" + name + "/" + std::to_string(size)).c_str(), gelu_benchmark, isa, size);
    }
    benchmark::RegisterBenchmark(("VectorOps/Softmax/" + name + "/4096").c_str(), softmax_benchmark, isa, int64_t{4096});
    // Group 8 as in the brief; group 1 (plain attend) at the largest shape shows the memory-bound case.
    struct Shape {
      int64_t slots, head_dim, group;
    };
    for (const Shape shape : {Shape{512, 256, 8}, Shape{512, 512, 8}, Shape{4096, 256, 8}, Shape{4096, 512, 8}, Shape{4096, 512, 1}}) {
      for (bool cold : {false, true}) {
        const std::string label = "VectorOps/AttendGroup/bf16/" + name + "/slots:" + std::to_string(shape.slots) + "/head_dim:" +
                                  std::to_string(shape.head_dim) + "/group:" + std::to_string(shape.group) + (cold ? "/cold" : "");
        benchmark::RegisterBenchmark(label.c_str(), attend_group_benchmark, isa, shape.slots, shape.head_dim, shape.group, cold)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  return true;
}

const bool registered = register_benchmarks();

}  // namespace
}  // namespace gemma4rt::kernels
