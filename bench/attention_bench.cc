// Decode attention of one K=V layer through the cpu backend (Google Benchmark), one thread:
//
//   Attention/cpu/<keys>/<kv>/slots:S/head_dim:512/kv_heads:4/group:8
//
// keys = stored: K and V both cached (two tensors); derived: only V cached, each key rebuilt as
// RoPE(V * k_norm) from the proportional-RoPE rotation table (what 31B's global layers run). One row at
// position S-1 attends all S keys. GB/s counts the cache bytes the variant reads (K and V, or V only),
// so the two variants' times compare directly and their GB/s say how close each is to streaming.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "backend/registry.h"
#include "core/bf16.h"
#include "engine/rope.h"

namespace gemma4rt {
namespace {

std::vector<float> random_floats(size_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> distribution(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

void attention_benchmark(benchmark::State& state, bool derived, KvFormat format, int slots) {
  constexpr int kHeadDim = 512, kKvHeads = 4, kGroup = 8;
  auto device = backend::make_backend({"cpu", 1});
  RopeConfig rope_config;
  rope_config.type = "proportional";
  rope_config.theta = 1000000.0;
  rope_config.partial_rotary_factor = 0.25;
  const RopeTable rope(rope_config, kHeadDim);
  const int64_t kv_row = int64_t{kKvHeads} * kHeadDim;
  // Fill the cache for positions 0..slots-1 of sequence 0.
  std::vector<int32_t> rows;
  for (int position = 0; position < slots; ++position) rows.insert(rows.end(), {0, position, 0});
  const backend::Buffer all_rows = device->allocate(rows.size() * sizeof(int32_t));
  device->upload(all_rows, 0, rows.data(), rows.size() * sizeof(int32_t));
  const size_t cache_bytes = static_cast<size_t>(slots) * kv_row * kv_element_bytes(format);
  const backend::Buffer values = device->allocate(cache_bytes), keys = derived ? backend::Buffer{} : device->allocate(cache_bytes);
  const std::vector<float> content = random_floats(static_cast<size_t>(slots) * kv_row, 1);
  device->store_kv(device->upload_constant(content), slots, kv_row, all_rows, values, slots, format);
  if (!derived) device->store_kv(device->upload_constant(content), slots, kv_row, all_rows, keys, slots, format);

  backend::AttentionShape shape{kHeadDim, kKvHeads * kGroup, kKvHeads, 0, 0, kGroup, slots, 0, format, {}};
  if (derived) {
    shape.derived_keys = {device->upload_constant(random_floats(kHeadDim, 2)), device->upload_constant(rope.rotations(slots)),
                          rope.rotated_pairs()};
  }
  const std::vector<int32_t> last = {0, slots - 1, 0};
  const backend::Buffer row = device->allocate(last.size() * sizeof(int32_t));
  device->upload(row, 0, last.data(), last.size() * sizeof(int32_t));
  const backend::Buffer queries = device->upload_constant(random_floats(static_cast<size_t>(kKvHeads) * kGroup * kHeadDim, 3));
  const backend::Buffer out = device->allocate(static_cast<size_t>(kKvHeads) * kGroup * kHeadDim * sizeof(float));
  for (auto _ : state) device->attention(queries, 1, row, keys, values, shape, out);
  const double bytes = static_cast<double>(cache_bytes) * (derived ? 1 : 2);
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void register_attention_benchmarks() {
  for (const KvFormat format : {KvFormat::kBF16, KvFormat::kF32}) {
    for (const int slots : {4096, 16384}) {
      for (const bool derived : {false, true}) {
        const std::string label = std::string("Attention/cpu/") + (derived ? "derived" : "stored") + "/" + format_name(format) +
                                  "/slots:" + std::to_string(slots) + "/head_dim:512/kv_heads:4/group:8";
        benchmark::RegisterBenchmark(label.c_str(), attention_benchmark, derived, format, slots)->Unit(benchmark::kMillisecond);
      }
    }
  }
}

const bool registered = (register_attention_benchmarks(), true);

}  // namespace
}  // namespace gemma4rt
