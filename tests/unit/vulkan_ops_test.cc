// Every op of the Vulkan backend against the reference backend, on the same inputs through the same
// Backend interface (on lavapipe where there is no GPU): odd sizes, head dims up to 512, GQA groups
// 1-8, ring-buffer wrap-around, K=V, bf16 KV, MoE top-k ties. Tolerances are stated per op.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/cpu/kernels/matmul.h"
#include "backend/reference/kernels.h"
#include "backend/registry.h"
#include "core/argmax.h"
#include "core/bf16.h"
#include "engine/rope.h"
#include "test_support.h"

namespace gemma4rt {
namespace {

using backend::Backend;
using backend::Buffer;

std::vector<float> random_values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& value : values) value = normal(random);
  return values;
}

Buffer ints(Backend& device, const std::vector<int32_t>& values) {
  const Buffer buffer = device.allocate(values.size() * sizeof(int32_t));
  device.upload(buffer, 0, values.data(), values.size() * sizeof(int32_t));
  return buffer;
}

std::vector<float> read(Backend& device, Buffer buffer, size_t count) {
  std::vector<float> values(count);
  device.download(buffer, 0, values.data(), count * sizeof(float));
  return values;
}

class VulkanOps : public ::testing::Test {
 protected:
  void SetUp() override {
    reference_ = backend::make_backend({"reference", 1});
    vulkan_ = backend::make_backend({"vulkan", 1, testing::vulkan_test_device()});
  }
  // Runs `program` on both backends and expects the floats it returns to agree within
  // absolute + relative * |reference|.
  void expect_same(const std::function<std::vector<float>(Backend&)>& program, float absolute, float relative) {
    const std::vector<float> expected = program(*reference_);
    const std::vector<float> actual = program(*vulkan_);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(actual[i], expected[i], absolute + relative * std::fabs(expected[i])) << "element " << i;
    }
  }
  // y = x W^T for `tokens` rows: the reference multiplies `rounded` (the weights as the format stores
  // them) in f32; Vulkan gets `weights` in `format`. fp32 rounding of sums of `cols` products.
  void expect_same_product(const std::vector<float>& weights, const std::vector<float>& rounded, const std::vector<float>& x, int rows,
                           int cols, int tokens, WeightFormat format) {
    expect_same(
        [&](Backend& device) {
          const bool is_reference = device.name() == "reference";
          const backend::Weight weight = device.prepare_weight(testing::f32_view(is_reference ? rounded : weights, rows, cols), format);
          const Buffer input = device.upload_constant(x);
          const Buffer output = device.allocate(static_cast<size_t>(tokens) * rows * sizeof(float));
          device.matmul(input, tokens, weight, output);
          return read(device, output, static_cast<size_t>(tokens) * rows);
        },
        2e-5f * std::sqrt(static_cast<float>(cols)), 1e-5f);
  }
  std::unique_ptr<Backend> reference_, vulkan_;
};

// The weights as a backend stores them in `format`: the reference multiplies these in f32.
std::vector<float> as_stored(const std::vector<float>& weights, int rows, int cols, WeightFormat format) {
  std::vector<float> rounded = weights;
  if (format == WeightFormat::kBF16) {
    for (float& value : rounded) value = bf16_to_float(float_to_bf16(value));
  } else if (format == WeightFormat::kQ8) {
    std::vector<int8_t> values(rounded.size());
    std::vector<float> scales(static_cast<size_t>(rows) * q8_blocks_per_row(cols));
    kernels::quantize_q8(weights.data(), rows, cols, values.data(), scales.data());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) rounded[r * cols + c] = values[r * cols + c] * scales[r * q8_blocks_per_row(cols) + c / 32];
    }
  } else if (format == WeightFormat::kQ4) {
    // Codes and scales as quantize_q4 lays them out (its superblocks), read back by their own address.
    std::vector<uint8_t> packed(static_cast<size_t>(rows * q4_row_bytes(cols)));
    std::vector<uint16_t> scales(static_cast<size_t>(rows) * q4_blocks_per_row(cols));
    kernels::quantize_q4(weights.data(), rows, cols, packed.data(), scales.data());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const Q4NibbleAt at = q4_nibble_at(c, cols);
        const uint8_t byte = packed[r * q4_row_bytes(cols) + at.byte];
        const int code = (at.high ? byte >> 4 : byte & 0x0f) - 8;
        rounded[r * cols + c] = static_cast<float>(code) * f16_to_float(scales[r * q4_blocks_per_row(cols) + c / 32]);
      }
    }
  }
  return rounded;
}

// f32 products agree to fp32 rounding of the sums; bf16, q8 and q4 weights are compared with the
// reference multiplying the same rounded weights in f32.
TEST_F(VulkanOps, MatmulInEveryWeightFormat) {
  for (const WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
    for (const auto& [rows, cols] : {std::pair<int, int>{37, 67}, {5, 513}, {129, 32}}) {
      for (const int tokens : {1, 3, 9}) {
        SCOPED_TRACE(std::string(format_name(format)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " tokens " +
                     std::to_string(tokens));
        const std::vector<float> weights = random_values(static_cast<size_t>(rows) * cols, 11);
        const std::vector<float> rounded = as_stored(weights, rows, cols, format);
        const std::vector<float> x = random_values(static_cast<size_t>(tokens) * cols, 12);
        expect_same_product(weights, rounded, x, rows, cols, tokens, format);
      }
    }
  }
}

// Prefill-sized products (48 tokens and more run the tiled shader; fewer the GEMV, on the same
// weights): partial tiles of tokens, rows and k in every direction, several tiles of each.
TEST_F(VulkanOps, PrefillMatmulOnOddShapes) {
  for (const WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
    for (const int rows : {1, 37, 130}) {
      for (const int cols : {5, 33, 300}) {
        const std::vector<float> weights = random_values(static_cast<size_t>(rows) * cols, 41);
        const std::vector<float> rounded = as_stored(weights, rows, cols, format);
        for (const int tokens : {1, 7, 16, 33, 48, 64, 100, 257}) {
          SCOPED_TRACE(fmt::format("{} {}x{} tokens {}", format_name(format), rows, cols, tokens));
          const std::vector<float> x = random_values(static_cast<size_t>(tokens) * cols, 42);
          expect_same_product(weights, rounded, x, rows, cols, tokens, format);
        }
      }
    }
  }
}

// A prefill product recorded into a step and replayed with new inputs gives the new products.
TEST_F(VulkanOps, PrefillMatmulReplaysInRecordedSteps) {
  const int rows = 70, cols = 96, tokens = 80;
  const std::vector<float> weights = random_values(static_cast<size_t>(rows) * cols, 51);
  const std::vector<float> first = random_values(static_cast<size_t>(tokens) * cols, 52), second = random_values(first.size(), 53);
  expect_same(
      [&](Backend& device) {
        const backend::Weight weight = device.prepare_weight(testing::f32_view(weights, rows, cols), WeightFormat::kF32);
        const Buffer input = device.allocate(first.size() * sizeof(float));
        const Buffer output = device.allocate(static_cast<size_t>(tokens) * rows * sizeof(float));
        std::vector<float> results;
        for (const std::vector<float>* x : {&first, &second}) {
          device.upload(input, 0, x->data(), x->size() * sizeof(float));
          const backend::StepShape shape{tokens, 0, false};
          if (device.begin_step(shape)) device.matmul(input, tokens, weight, output);
          device.end_step();
          const std::vector<float> values = read(device, output, static_cast<size_t>(tokens) * rows);
          results.insert(results.end(), values.begin(), values.end());
        }
        return results;
      },
      2e-5f * std::sqrt(static_cast<float>(cols)), 1e-5f);
}

TEST_F(VulkanOps, RmsNormWithAndWithoutWeight) {
  for (const int width : {1, 7, 64, 513, 2048}) {
    for (const bool weighted : {true, false}) {
      SCOPED_TRACE("width " + std::to_string(width) + (weighted ? " weighted" : " weightless"));
      const std::vector<float> x = random_values(static_cast<size_t>(3) * width, 21, 3.0f);
      const std::vector<float> weight = random_values(static_cast<size_t>(width), 22);
      expect_same(
          [&](Backend& device) {
            const Buffer input = device.upload_constant(x);
            const Buffer out = device.allocate(x.size() * sizeof(float));
            device.rms_norm(input, 3, width, weighted ? device.upload_constant(weight) : Buffer{}, 1e-6f, out);
            return read(device, out, x.size());
          },
          1e-6f, 2e-6f);
    }
  }
}

TEST_F(VulkanOps, ElementwiseOps) {
  const int rows = 3, width = 37;
  const size_t count = static_cast<size_t>(rows) * width;
  const std::vector<float> a = random_values(count, 31, 4.0f), b = random_values(count * 3, 32, 2.0f), column = random_values(width, 33);
  using Op = std::function<void(Backend&, Buffer, Buffer)>;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"scale", [&](Backend& d, Buffer x, Buffer) { d.scale(x, static_cast<int64_t>(count), 0.37f); }},
      {"scale_columns", [&](Backend& d, Buffer x, Buffer) { d.scale_columns(x, rows, width, d.upload_constant(column), 0.5f); }},
      {"add", [&](Backend& d, Buffer x, Buffer y) { d.add(x, y, static_cast<int64_t>(count)); }},
      {"copy", [&](Backend& d, Buffer x, Buffer y) { d.copy(y, x, static_cast<int64_t>(count)); }},
      {"gelu_multiply", [&](Backend& d, Buffer x, Buffer y) { d.gelu_multiply(x, y, rows, width, width, 0); }},
      {"gelu_multiply strided", [&](Backend& d, Buffer x, Buffer y) { d.gelu_multiply(x, y, rows, width, 3 * width, 5); }},
      {"combine_per_layer_inputs", [&](Backend& d, Buffer x, Buffer y) { d.combine_per_layer_inputs(y, x, static_cast<int64_t>(count), 16.0f, 0.7071f); }},
      {"softcap", [&](Backend& d, Buffer x, Buffer) { d.softcap(x, static_cast<int64_t>(count), 3.0f); }},
  };
  for (const auto& [name, op] : ops) {
    SCOPED_TRACE(name);
    expect_same(
        [&](Backend& device) {
          const Buffer x = device.upload_constant(a);
          op(device, x, device.upload_constant(b));
          return read(device, x, count);
        },
        2e-6f, 2e-6f);
  }
  // gather_rows and argmax (ties go to the lowest index).
  expect_same(
      [&](Backend& device) {
        const Buffer out = device.allocate(count * sizeof(float));
        device.gather_rows(device.upload_constant(b), ints(device, {8, 0, 4}), rows, width, out);
        return read(device, out, count);
      },
      0.0f, 0.0f);
  std::vector<float> tied(1000, -1.0f);
  tied[17] = tied[420] = tied[999] = 5.0f;
  for (Backend* device : {reference_.get(), vulkan_.get()}) {
    const Buffer ids = device->allocate(2 * sizeof(int32_t));
    std::vector<float> two_rows = tied;
    two_rows.insert(two_rows.end(), tied.rbegin(), tied.rend());
    device->argmax(device->upload_constant(two_rows), 2, 1000, ids);
    std::vector<int32_t> result(2);
    device->download(ids, 0, result.data(), sizeof(int32_t) * 2);
    EXPECT_EQ(result, (std::vector<int32_t>{17, 0})) << device->name();
  }
  // As the host's argmax_of: NaN is never chosen (here the first value of several lanes, which a lane
  // once took unconditionally), +inf wins. A row with nothing above -inf (a broken forward pass: all NaN,
  // or -inf) gives the host's argmax_of 0, and every backend's argmax op -1 (Backend::argmax), which the
  // engine reports instead of decoding token 0.
  const float nan = std::numeric_limits<float>::quiet_NaN(), infinity = std::numeric_limits<float>::infinity();
  std::vector<float> special(5 * 1000, 2.0f);
  for (int i = 0; i < 64; i += 3) special[i] = nan;  // row 0: the largest value sits behind NaNs
  special[128] = 3.0f;
  std::fill(special.begin() + 1000, special.begin() + 2000, -infinity);  // row 1: nothing above -inf
  std::fill(special.begin() + 2000, special.begin() + 3000, nan);        // row 2: all NaN but one
  special[2000 + 700] = -5.0f;
  special[3000 + 999] = infinity;  // row 3
  special[3000 + 5] = nan;
  std::fill(special.begin() + 4000, special.begin() + 5000, nan);  // row 4: all NaN
  const std::vector<int32_t> host_expected = {128, 0, 700, 999, 0}, device_expected = {128, -1, 700, 999, -1};
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(argmax_of(special.data() + 1000 * r, 1000), host_expected[r]) << "host row " << r;
  const auto cpu = backend::make_backend({"cpu", 1});
  for (Backend* device : {cpu.get(), reference_.get(), vulkan_.get()}) {
    const Buffer ids = device->allocate(5 * sizeof(int32_t));
    device->argmax(device->upload_constant(special), 5, 1000, ids);
    std::vector<int32_t> result(5);
    device->download(ids, 0, result.data(), sizeof(int32_t) * 5);
    EXPECT_EQ(result, device_expected) << device->name();
  }
}

// log_sum_exp per row (the logprobs' normaliser): a vocabulary-sized row, a short one, one with masked
// (-inf) entries. Each of the 64 lanes sums its share of exp in fp32, GLSL's exp is within 3 + 2|x| ulp.
TEST_F(VulkanOps, LogSumExpOfRows) {
  for (const int width : {37, 5000, 262144}) {
    SCOPED_TRACE("width " + std::to_string(width));
    std::vector<float> rows = random_values(static_cast<size_t>(3) * width, 51, 30.0f);
    for (int i = 0; i < width; i += 3) rows[static_cast<size_t>(2) * width + i] = -std::numeric_limits<float>::infinity();
    expect_same(
        [&](Backend& device) {
          const Buffer out = device.allocate(3 * sizeof(float));
          device.log_sum_exp(device.upload_constant(rows), 3, width, out);
          return read(device, out, 3);
        },
        width > 5000 ? 1e-4f : 2e-5f, 1e-6f);
  }
}

// RoPE at long positions: the GPU's cos/sin of large fp32 angles are within 2e-3 of libm's.
TEST_F(VulkanOps, RopeDefaultAndProportional) {
  RopeConfig sliding;
  sliding.type = "default";
  sliding.theta = 10000.0;
  RopeConfig full;
  full.type = "proportional";
  full.theta = 1000000.0;
  full.partial_rotary_factor = 0.25;
  for (const auto& [rope, head_dim] : {std::pair<RopeConfig, int>{sliding, 64}, {sliding, 256}, {full, 512}}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const RopeTable table(rope, head_dim);
    const std::vector<int32_t> rows = {0, 0, 0, 0, 5, 0, 1, 1000, 0, 0, 4000, 0};
    const std::vector<float> q = random_values(static_cast<size_t>(4) * 3 * head_dim, 41), k = random_values(static_cast<size_t>(4) * head_dim, 42);
    expect_same(
        [&](Backend& device) {
          const Buffer queries = device.upload_constant(q), keys = device.upload_constant(k);
          device.rope(queries, 3, keys, 1, 4, head_dim, ints(device, rows), device.upload_constant(table.inverse_frequencies()));
          std::vector<float> out = read(device, queries, q.size());
          const std::vector<float> rotated_keys = read(device, keys, k.size());
          out.insert(out.end(), rotated_keys.begin(), rotated_keys.end());
          return out;
        },
        2e-3f, 1e-5f);
  }
}

// K/V stores and attention over several steps of two interleaved sequences: chunked prefill rows,
// then decode rows, sliding rings that wrap, every GQA grouping up to 8, f32 and bf16 caches. K=V
// cases cache only values and rebuild keys as RoPE(value * key_norm); on the reference that equals
// attention over keys rotated on the host and cached explicitly.
TEST_F(VulkanOps, AttentionMatchesReference) {
  struct Case {
    int head_dim, kv_heads, group, window, capacity;
    bool k_eq_v;
  };
  const std::vector<Case> cases = {{64, 1, 1, 0, 24, false}, {64, 2, 2, 0, 24, false}, {256, 1, 3, 5, 7, false},
                                   {128, 2, 4, 0, 24, true}, {512, 1, 8, 6, 8, true},   {72, 1, 5, 4, 6, false},
                                   {512, 2, 2, 0, 24, true}};
  RopeConfig proportional;
  proportional.type = "proportional";
  proportional.theta = 1000000.0;
  proportional.partial_rotary_factor = 0.25;
  constexpr int kPositions = 20;
  for (const Case& c : cases) {
    // Full-attention K=V layers use proportional RoPE (a quarter of the pairs rotate); the sliding
    // case rotates every pair.
    const RopeTable rope(c.window > 0 ? RopeConfig{} : proportional, c.head_dim);
    const std::vector<float> key_norm = random_values(static_cast<size_t>(c.head_dim), 7, 0.3f);
    for (const KvFormat format : {KvFormat::kF32, KvFormat::kBF16}) {
      SCOPED_TRACE(fmt::format("head_dim {} kv_heads {} group {} window {} capacity {} k=v {} {}", c.head_dim, c.kv_heads, c.group, c.window,
                               c.capacity, c.k_eq_v, format_name(format)));
      const int query_heads = c.kv_heads * c.group;
      const int64_t kv_row = static_cast<int64_t>(c.kv_heads) * c.head_dim;
      // Steps of (sequence, position) rows: a 3-row chunk per sequence, then single decode rows.
      std::vector<std::vector<std::pair<int, int>>> steps;
      for (int start = 0; start < 9; start += 3) {
        steps.push_back({{0, start}, {0, start + 1}, {0, start + 2}});
        steps.push_back({{1, start}, {1, start + 1}, {1, start + 2}});
      }
      for (int position = 9; position < kPositions; ++position) steps.push_back({{0, position}, {1, position}});
      // explicit_keys: K=V keys rotated here and cached as keys (the reference path without derivation).
      auto program = [&](Backend& device, bool explicit_keys) {
        const bool is_reference = device.name() == "reference";
        const KvFormat stored = is_reference ? KvFormat::kF32 : format;
        const bool derived = c.k_eq_v && !explicit_keys;
        const size_t cache_bytes = static_cast<size_t>(2) * c.capacity * kv_row * kv_element_bytes(stored);
        const Buffer values = device.allocate(cache_bytes), keys = derived ? Buffer{} : device.allocate(cache_bytes);
        backend::AttentionShape shape{c.head_dim, query_heads, c.kv_heads, 0, 0, c.group, c.capacity, c.window, stored, {}};
        if (derived) shape.derived_keys = {device.upload_constant(key_norm), device.upload_constant(rope.rotations(kPositions)), rope.rotated_pairs()};
        std::vector<float> outputs;
        uint32_t seed = 100;
        for (const auto& step : steps) {
          const int rows = static_cast<int>(step.size());
          std::vector<int32_t> table;
          for (const auto& [sequence, position] : step) table.insert(table.end(), {sequence, position, 0});
          const Buffer row_table = ints(device, table);
          std::vector<float> k = random_values(static_cast<size_t>(rows) * kv_row, seed++), v = random_values(k.size(), seed++);
          if (format == KvFormat::kBF16) {  // what a bf16 cache keeps, so both backends attend over the same values
            for (float& value : k) value = bf16_to_float(float_to_bf16(value));
            for (float& value : v) value = bf16_to_float(float_to_bf16(value));
          }
          if (explicit_keys) {  // K = RoPE(V * key_norm) per row and head, at the row's position
            std::vector<float> cos(static_cast<size_t>(c.head_dim)), sin(cos.size());
            for (int r = 0; r < rows; ++r) {
              rope.angles(step[static_cast<size_t>(r)].second, cos.data(), sin.data());
              for (int h = 0; h < c.kv_heads; ++h) {
                float* head = k.data() + (static_cast<int64_t>(r) * c.kv_heads + h) * c.head_dim;
                const float* value = v.data() + (static_cast<int64_t>(r) * c.kv_heads + h) * c.head_dim;
                for (int d = 0; d < c.head_dim; ++d) head[d] = value[d] * key_norm[static_cast<size_t>(d)];
                reference::apply_rope(head, c.head_dim, cos.data(), sin.data());
              }
            }
          }
          if (!derived) device.store_kv(device.upload_constant(k), rows, kv_row, row_table, keys, c.capacity, stored);
          device.store_kv(device.upload_constant(v), rows, kv_row, row_table, values, c.capacity, stored);
          const std::vector<float> q = random_values(static_cast<size_t>(rows) * query_heads * c.head_dim, seed++, 0.3f);
          const Buffer out = device.allocate(q.size() * sizeof(float));
          device.attention(device.upload_constant(q), rows, row_table, keys, values, shape, out);
          const std::vector<float> result = read(device, out, q.size());
          outputs.insert(outputs.end(), result.begin(), result.end());
        }
        return outputs;
      };
      expect_same([&](Backend& device) { return program(device, false); }, 2e-5f, 2e-5f);
      if (c.k_eq_v && format == KvFormat::kF32) {
        const std::vector<float> derived = program(*reference_, false), rotated = program(*reference_, true);
        ASSERT_EQ(derived.size(), rotated.size());
        for (size_t i = 0; i < derived.size(); ++i) ASSERT_NEAR(derived[i], rotated[i], 1e-5f + 1e-5f * std::fabs(rotated[i])) << "element " << i;
      }
    }
  }
}

// Routing with tied probabilities picks the lower expert index on both; the experts' products and
// their combination agree to fp32 rounding.
TEST_F(VulkanOps, RouteExpertsAndExpertFeedForward) {
  const int rows = 4, experts = 6, top_k = 2, hidden = 13, width = 7;
  std::vector<float> logits = random_values(static_cast<size_t>(rows) * experts, 51);
  logits[0 * experts + 1] = logits[0 * experts + 4] = logits[0 * experts + 5] = 9.0f;  // a three-way tie for the top
  logits[2 * experts + 0] = logits[2 * experts + 3] = 7.5f;
  const std::vector<float> scale = {1.0f, 0.5f, 2.0f, 1.5f, 0.25f, 1.0f};
  std::vector<std::vector<float>> gate_up, down;
  for (int e = 0; e < experts; ++e) {
    gate_up.push_back(random_values(static_cast<size_t>(2) * width * hidden, 60 + e));
    down.push_back(random_values(static_cast<size_t>(hidden) * width, 70 + e));
  }
  const std::vector<float> input = random_values(static_cast<size_t>(rows) * hidden, 52);
  std::vector<std::vector<int32_t>> chosen_ids;
  expect_same(
      [&](Backend& device) {
        const Buffer router = device.upload_constant(logits);
        const Buffer chosen = device.allocate(static_cast<size_t>(rows) * top_k * sizeof(int32_t));
        const Buffer weights = device.allocate(static_cast<size_t>(rows) * top_k * sizeof(float));
        device.route_experts(router, rows, experts, top_k, device.upload_constant(scale), chosen, weights);
        std::vector<int32_t> ids(static_cast<size_t>(rows) * top_k);
        device.download(chosen, 0, ids.data(), ids.size() * sizeof(int32_t));
        chosen_ids.push_back(ids);
        std::vector<backend::Weight> gate_up_weights, down_weights;
        for (int e = 0; e < experts; ++e) {
          gate_up_weights.push_back(device.prepare_weight(testing::f32_view(gate_up[e], 2 * width, hidden), WeightFormat::kF32));
          down_weights.push_back(device.prepare_weight(testing::f32_view(down[e], hidden, width), WeightFormat::kF32));
        }
        const Buffer out = device.allocate(static_cast<size_t>(rows) * hidden * sizeof(float));
        device.expert_feed_forward(device.upload_constant(input), rows, chosen, weights,
                                   backend::ExpertSet{gate_up_weights, down_weights, width, hidden, top_k}, out);
        std::vector<float> result = read(device, weights, static_cast<size_t>(rows) * top_k);
        const std::vector<float> ffn = read(device, out, static_cast<size_t>(rows) * hidden);
        result.insert(result.end(), ffn.begin(), ffn.end());
        return result;
      },
      1e-5f, 1e-5f);
  ASSERT_EQ(chosen_ids.size(), 2u);
  EXPECT_EQ(chosen_ids[1], chosen_ids[0]);
  EXPECT_EQ(chosen_ids[0][0], 1);  // the tie at the top goes to the lowest index, then the next
  EXPECT_EQ(chosen_ids[0][1], 4);
  EXPECT_EQ(chosen_ids[0][4], 0);
  EXPECT_EQ(chosen_ids[0][5], 3);
}

}  // namespace
}  // namespace gemma4rt
