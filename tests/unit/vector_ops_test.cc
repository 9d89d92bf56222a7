// Vector kernels: every ISA level this CPU can run (scalar, AVX2, AVX-512, AVX-512+BF16) is forced in
// turn and compared with the reference kernels or a double-precision computation on random inputs,
// at sizes with every kind of tail. Tolerances are stated where they are checked.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "backend/host/isa.h"
#include "backend/reference/kernels.h"
#include "backend/cpu/kernels/vector_ops.h"

namespace gemma4rt::kernels {
namespace {

const std::vector<int64_t> kSizes = {1, 3, 15, 16, 17, 31, 33, 255, 256, 257, 512, 1536, 12288};

// Runs `body` once per ISA level up to detected_isa(), with that level forced; restores the level after.
void for_each_isa(const std::function<void(Isa)>& body) {
  const Isa previous = active_isa();
  for (int level = 0; level <= static_cast<int>(detected_isa()); ++level) {
    const Isa isa = static_cast<Isa>(level);
    set_active_isa(isa);
    SCOPED_TRACE(std::string("isa ") + isa_name(isa));
    body(isa);
  }
  set_active_isa(previous);
}

std::vector<float> random_floats(int64_t size, float low, float high, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(static_cast<size_t>(size));
  for (float& value : values) value = distribution(generator);
  values[0] = values[0] == 0.0f ? 0.5f : values[0];  // never all zeros
  return values;
}

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

TEST(VectorOps, RmsNormMatchesReference) {
  // fp32 sums over several accumulators vs the reference's double sum: the factor 1/rms differs by a
  // few 1e-7 relative, so each output is within 2e-6 relative of the reference.
  for_each_isa([](Isa) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      const std::vector<float> x = random_floats(size, -3.0f, 3.0f, 11 + static_cast<uint32_t>(size));
      const std::vector<float> weight = random_floats(size, 0.5f, 2.0f, 12);
      for (const float* w : {weight.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> expected(x.size()), actual(x.size());
        reference::rms_norm(x.data(), size, w, 1e-6f, expected.data());
        rms_norm(x.data(), size, w, 1e-6f, actual.data());
        for (int64_t i = 0; i < size; ++i) ASSERT_NEAR(actual[i], expected[i], 2e-6f * std::abs(expected[i])) << i;
        std::vector<float> in_place = x;  // out == x
        rms_norm(in_place.data(), size, w, 1e-6f, in_place.data());
        EXPECT_EQ(in_place, actual);
      }
    }
  });
}

TEST(VectorOps, RmsNormOfTinyValuesUsesEps) {
  for_each_isa([](Isa) {
    const std::vector<float> x = random_floats(100, -1e-4f, 1e-4f, 3);
    std::vector<float> expected(x.size()), actual(x.size());
    reference::rms_norm(x.data(), 100, nullptr, 1e-2f, expected.data());
    rms_norm(x.data(), 100, nullptr, 1e-2f, actual.data());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(actual[i], expected[i], 2e-6f * std::abs(expected[i]));
  });
}

// GELU-tanh in double, as x * sigmoid(2u): 0.5 x (1 + tanh(u)) without cancellation.
double exact_gelu(float x) {
  const double u = 0.7978845608028654 * (static_cast<double>(x) + 0.044715 * x * static_cast<double>(x) * x);
  return static_cast<double>(x) / (1.0 + std::exp(-2.0 * u));
}

TEST(VectorOps, GeluTanhMultiplyMatchesDouble) {
  // Every level is within 1e-6 (|x| + 1e-3) |up| of the double value; the SIMD levels also within
  // 2e-6 relative for x >= -3 (u's own fp32 rounding, amplified 2|u| times in exp(2u), limits them to
  // 8e-7 there). 0.5 x (1 + tanh(u)) in fp32 (the reference, the scalar level) only meets the first,
  // as 1 + tanh(u) cancels for negative x.
  for_each_isa([](Isa isa) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      const std::vector<float> gate = random_floats(size, -8.0f, 8.0f, 21 + static_cast<uint32_t>(size));
      const std::vector<float> up = random_floats(size, -2.0f, 2.0f, 22);
      std::vector<float> actual = gate;
      gelu_tanh_multiply(actual.data(), up.data(), size);
      std::vector<float> by_factor = gate;
      gelu_tanh_multiply_by(by_factor.data(), up.data(), size);
      EXPECT_EQ(by_factor, actual);
      // Into another buffer (the gates are const here): the same values.
      std::vector<float> elsewhere(static_cast<size_t>(size), -1.0f);
      gelu_tanh_multiply(gate.data(), up.data(), size, elsewhere.data());
      EXPECT_EQ(elsewhere, actual);
      for (int64_t i = 0; i < size; ++i) {
        const double expected = exact_gelu(gate[i]) * up[i];
        ASSERT_NEAR(actual[i], expected, 1e-6 * (std::abs(gate[i]) + 1e-3) * std::abs(up[i])) << "x " << gate[i];
        if (isa != Isa::kScalar && gate[i] >= -3.0f) {
          ASSERT_NEAR(actual[i], expected, 2e-6 * std::abs(expected)) << "x " << gate[i];
        }
        ASSERT_NEAR(actual[i], reference::gelu_tanh(gate[i]) * up[i], 1e-6 * (std::abs(gate[i]) + 1e-3) * std::abs(up[i]));
      }
    }
  });
}

TEST(VectorOps, GeluTanhSaturatesForLargeInputs) {
  // For |x| up to 1e4 (x^3 = 1e12, tanh argument ~3.6e10): gelu(x) = x above, -0 below, never NaN.
  for_each_isa([](Isa) {
    std::vector<float> gate = {1e4f, -1e4f, 3e3f, -3e3f, 100.0f, -100.0f, 30.0f, -30.0f, 10.0f, -10.0f,
                               0.0f, -0.0f, 1e-20f, -1e-20f, 5.0f, -5.0f, 1e-3f};
    const std::vector<float> up(gate.size(), 1.0f);
    const std::vector<float> input = gate;
    gelu_tanh_multiply(gate.data(), up.data(), static_cast<int64_t>(gate.size()));
    ASSERT_TRUE(all_finite(gate));
    for (size_t i = 0; i < gate.size(); ++i) {
      const double expected = exact_gelu(input[i]);
      EXPECT_NEAR(gate[i], expected, 1e-6 * std::abs(input[i]) + 1e-30) << "x " << input[i];
      if (input[i] >= 10.0f) {
        EXPECT_EQ(gate[i], input[i]);
      } else if (input[i] <= -30.0f) {
        EXPECT_EQ(gate[i], 0.0f);
      }
    }
  });
}

TEST(VectorOps, SoftmaxMatchesReference) {
  // Within 1e-6 relative of the reference (double sum) plus 1e-12 absolute for exp's flush of values
  // below exp(-87.3) to zero.
  for_each_isa([](Isa) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      for (float range : {1.0f, 30.0f}) {
        const std::vector<float> input = random_floats(size, -range, range, 31 + static_cast<uint32_t>(size));
        std::vector<float> expected = input, actual = input;
        reference::softmax(expected.data(), size);
        softmax(actual.data(), size);
        for (int64_t i = 0; i < size; ++i) ASSERT_NEAR(actual[i], expected[i], 1e-6f * expected[i] + 1e-12f) << i;
      }
    }
  });
}

TEST(VectorOps, SoftmaxOfWidelySpreadValues) {
  for_each_isa([](Isa) {
    for (int64_t size : {2, 17, 40}) {
      std::vector<float> values(static_cast<size_t>(size), -1000.0f);
      values[static_cast<size_t>(size) / 2] = 1000.0f;
      softmax(values.data(), size);
      for (int64_t i = 0; i < size; ++i) EXPECT_EQ(values[i], i == size / 2 ? 1.0f : 0.0f) << i;  // exact
    }
    std::vector<float> huge = random_floats(257, -1e4f, 1e4f, 41);
    softmax(huge.data(), 257);
    ASSERT_TRUE(all_finite(huge));
    double total = 0.0;
    for (float p : huge) total += p;
    EXPECT_NEAR(total, 1.0, 1e-6);
    std::vector<float> equal(33, 7.0f);
    softmax(equal.data(), 33);
    for (float p : equal) EXPECT_NEAR(p, 1.0f / 33.0f, 1e-7f);
  });
}

TEST(VectorOps, LogSumExpMatchesDoubleReference) {
  // log(sum exp(v)) in double, with the maximum subtracted. Bound: each exp is within 7.5e-8 relative and
  // each lane sums at most 4096 / 16 terms in fp32 (2^-24 relative per addition), so the total is within
  // about 256 * 6e-8 = 1.5e-5 relative in the worst case; that is the error of its log, plus the float
  // rounding of the result.
  for_each_isa([](Isa) {
    std::vector<int64_t> sizes = kSizes;
    sizes.push_back(262144);  // a Gemma-4 vocabulary row
    for (int64_t size : sizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      for (float range : {1.0f, 30.0f, 300.0f}) {
        const std::vector<float> input = random_floats(size, -range, range, 43 + static_cast<uint32_t>(size));
        double maximum = input[0];
        for (float v : input) maximum = std::max<double>(maximum, v);
        double total = 0.0;
        for (float v : input) total += std::exp(static_cast<double>(v) - maximum);
        const double expected = maximum + std::log(total);
        ASSERT_NEAR(log_sum_exp(input.data(), size), expected, 1.5e-5 + 1.2e-7 * std::abs(expected));
      }
    }
  });
}

TEST(VectorOps, LogSumExpEdgeCases) {
  const float infinity = std::numeric_limits<float>::infinity();
  for_each_isa([&](Isa) {
    const float one = 2.5f;
    EXPECT_EQ(log_sum_exp(&one, 1), 2.5f);  // exp(0) = 1, log 1 = 0: exact
    EXPECT_EQ(log_sum_exp(nullptr, 0), -infinity);
    // Masked tokens (-inf) add nothing: two equal survivors give max + log 2.
    std::vector<float> masked(300, -infinity);
    masked[7] = masked[299] = 4.0f;
    EXPECT_NEAR(log_sum_exp(masked.data(), 300), 4.0 + std::log(2.0), 1e-6);
    std::vector<float> all_masked(40, -infinity);
    EXPECT_EQ(log_sum_exp(all_masked.data(), 40), -infinity);
    std::vector<float> with_infinity(40, 1.0f);
    with_infinity[33] = infinity;
    EXPECT_EQ(log_sum_exp(with_infinity.data(), 40), infinity);
    // Far below the maximum, exp underflows to 0 without harm.
    std::vector<float> spread(64, -1e4f);
    spread[5] = 1e4f;
    EXPECT_EQ(log_sum_exp(spread.data(), 64), 1e4f);
  });
}

TEST(VectorOps, ArgmaxIsTheFirstLargestValue) {
  // Exact: the index a plain scan finds, on random rows and on ties placed in every lane and tail.
  const float infinity = std::numeric_limits<float>::infinity();
  for_each_isa([&](Isa) {
    std::vector<int64_t> sizes = kSizes;
    sizes.push_back(262144);
    for (int64_t size : sizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      std::vector<float> values = random_floats(size, -30.0f, 30.0f, 47 + static_cast<uint32_t>(size));
      int64_t expected = 0;
      for (int64_t i = 1; i < size; ++i) expected = values[i] > values[expected] ? i : expected;
      EXPECT_EQ(argmax(values.data(), size), expected);
      // The same largest value at two places: the lower index wins wherever the two fall.
      for (int64_t second : {size - 1, size / 2, int64_t{16}, int64_t{8}}) {
        for (int64_t first : {int64_t{0}, int64_t{1}, int64_t{9}, size / 3}) {
          if (first >= second || second >= size) continue;
          std::vector<float> tied = values;
          tied[static_cast<size_t>(first)] = tied[static_cast<size_t>(second)] = 100.0f;
          ASSERT_EQ(argmax(tied.data(), size), first) << first << " and " << second;
        }
      }
    }
    // NaN is never chosen; masked (-inf) rows give 0; +inf wins.
    std::vector<float> with_nan = {1.0f, std::nanf(""), 3.0f, std::nanf("")};
    with_nan.resize(40, 2.0f);
    with_nan[0] = std::nanf("");
    EXPECT_EQ(argmax(with_nan.data(), 40), 2);
    std::vector<float> masked(70, -infinity);
    EXPECT_EQ(argmax(masked.data(), 70), 0);
    masked[69] = -1e30f;
    EXPECT_EQ(argmax(masked.data(), 70), 69);
    masked[20] = infinity;
    EXPECT_EQ(argmax(masked.data(), 70), 20);
    EXPECT_EQ(argmax(masked.data(), 0), 0);
  });
}

TEST(VectorOps, SoftcapMatchesDoubleTanh) {
  // tanh(v / cap) * cap within 1e-6 relative of double (the small-|x| branch is a series, so tiny
  // values stay accurate too); saturates at +-cap.
  for_each_isa([](Isa) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      for (float cap : {30.0f, 15.0f}) {
        std::vector<float> values = random_floats(size, -100.0f, 100.0f, 51 + static_cast<uint32_t>(size));
        if (size > 3) values[1] = 1e-5f, values[2] = -0.3f;
        const std::vector<float> input = values;
        softcap(values.data(), size, cap);
        for (int64_t i = 0; i < size; ++i) {
          const double expected = std::tanh(static_cast<double>(input[i]) / cap) * cap;
          ASSERT_NEAR(values[i], expected, 1e-6 * std::abs(expected)) << "v " << input[i];
        }
      }
    }
    std::vector<float> large = {1e4f, -1e4f, 1e30f, -1e30f, 500.0f, -500.0f, 0.0f};
    softcap(large.data(), 7, 30.0f);
    EXPECT_EQ(large, (std::vector<float>{30.0f, -30.0f, 30.0f, -30.0f, 30.0f, -30.0f, 0.0f}));
  });
}

TEST(VectorOps, RopeMatchesReference) {
  // FMA rounds once where the reference rounds twice: within 1e-6 of the pair's magnitude.
  for_each_isa([](Isa) {
    for (int64_t head_dim : {2, 6, 16, 32, 34, 64, 128, 256, 512}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      const int64_t heads = 3;
      const std::vector<float> input = random_floats(heads * head_dim, -2.0f, 2.0f, 61 + static_cast<uint32_t>(head_dim));
      const std::vector<float> angles = random_floats(head_dim, -3.0f, 3.0f, 62);
      std::vector<float> cos(angles.size()), sin(angles.size());
      for (size_t j = 0; j < angles.size(); ++j) cos[j] = std::cos(angles[j]), sin[j] = std::sin(angles[j]);
      std::vector<float> expected = input, actual = input;
      for (int64_t h = 0; h < heads; ++h) reference::apply_rope(expected.data() + h * head_dim, head_dim, cos.data(), sin.data());
      apply_rope(actual.data(), heads, head_dim, cos.data(), sin.data());
      const int64_t half = head_dim / 2;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < half; ++j) {
          const int64_t first = h * head_dim + j, second = first + half;
          const float magnitude = std::abs(input[first]) + std::abs(input[second]);
          ASSERT_NEAR(actual[first], expected[first], 1e-6f * magnitude);
          ASSERT_NEAR(actual[second], expected[second], 1e-6f * magnitude);
        }
      }
    }
  });
}

TEST(VectorOps, AddAndScaleAreExact) {
  for_each_isa([](Isa) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      const std::vector<float> x = random_floats(size, -5.0f, 5.0f, 71);
      const std::vector<float> y = random_floats(size, -5.0f, 5.0f, 72);
      std::vector<float> sum = y, scaled = y, expected_sum(y.size()), expected_scaled(y.size());
      for (int64_t i = 0; i < size; ++i) expected_sum[i] = y[i] + x[i], expected_scaled[i] = y[i] * 0.37f;
      add(sum.data(), x.data(), size);
      scale(scaled.data(), 0.37f, size);
      EXPECT_EQ(sum, expected_sum);
      EXPECT_EQ(scaled, expected_scaled);
    }
  });
}

TEST(VectorOps, StoreKvRowRoundsLikeFloatToBf16) {
  for_each_isa([](Isa) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE("size " + std::to_string(size));
      std::vector<float> row = random_floats(size, -100.0f, 100.0f, 81 + static_cast<uint32_t>(size));
      const std::vector<float> specials = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                           -std::numeric_limits<float>::infinity(), -0.0f, 1e-40f, 3.4e38f,
                                           1.00390625f /* tie: rounds to even 1.0 */, 1.01171875f /* tie: rounds up */,
                                           std::bit_cast<float>(0x7f800001u) /* signalling NaN */};
      for (size_t i = 0; i < specials.size() && i < row.size(); ++i) row[i * row.size() / specials.size()] = specials[i];
      std::vector<uint16_t> stored(row.size() + 1, 0xabcd);
      store_kv_row(row.data(), size, KvFormat::kBF16, stored.data());
      for (int64_t i = 0; i < size; ++i) ASSERT_EQ(stored[i], float_to_bf16(row[i])) << i;
      EXPECT_EQ(stored[size], 0xabcd);  // nothing written past the row
      std::vector<float> copied(row.size() + 1, 42.0f);
      store_kv_row(row.data(), size, KvFormat::kF32, copied.data());
      for (int64_t i = 0; i < size; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(copied[i]), std::bit_cast<uint32_t>(row[i]));
      EXPECT_EQ(copied[size], 42.0f);
    }
  });
}

// A KV cache of `capacity` rows holding `kv_heads` heads each, filled with random values through
// store_kv_row, with the fp32 values the reference reads (the bf16-rounded ones for a bf16 cache).
struct TestCache {
  TestCache(KvFormat format, int64_t capacity, int64_t kv_heads, int64_t head_dim, uint32_t seed)
      : format(format), row_stride(kv_heads * head_dim) {
    const int64_t elements = capacity * row_stride;
    keys_f32 = random_floats(elements, -1.0f, 1.0f, seed);
    values_f32 = random_floats(elements, -1.0f, 1.0f, seed + 1);
    const size_t bytes = static_cast<size_t>(elements) * (format == KvFormat::kF32 ? 4 : 2);
    keys.resize(bytes);
    values.resize(bytes);
    for (int64_t row = 0; row < capacity; ++row) {
      const int64_t offset = row * row_stride;
      const size_t byte_offset = static_cast<size_t>(offset) * (format == KvFormat::kF32 ? 4 : 2);
      store_kv_row(keys_f32.data() + offset, row_stride, format, keys.data() + byte_offset);
      store_kv_row(values_f32.data() + offset, row_stride, format, values.data() + byte_offset);
    }
    if (format == KvFormat::kBF16) {
      for (float& v : keys_f32) v = round_to_bf16(v);
      for (float& v : values_f32) v = round_to_bf16(v);
    }
  }
  // Base pointers of one KV head, in the cache format and as the reference's floats.
  const void* key_head(int64_t head, int64_t head_dim) const { return keys.data() + head * head_dim * element_bytes(); }
  const void* value_head(int64_t head, int64_t head_dim) const { return values.data() + head * head_dim * element_bytes(); }
  int64_t element_bytes() const { return format == KvFormat::kF32 ? 4 : 2; }

  KvFormat format;
  int64_t row_stride;
  std::vector<float> keys_f32, values_f32;
  std::vector<uint8_t> keys, values;
};

std::vector<int32_t> ring_slots(int64_t capacity, int64_t first, int64_t count) {
  std::vector<int32_t> slots;
  for (int64_t i = 0; i < count; ++i) slots.push_back(static_cast<int32_t>((first + i) % capacity));
  return slots;
}

TEST(VectorOps, AttendMatchesReference) {
  // fp32 dot products (vs the reference's doubles) err by ~1e-7 of sum |q_i k_i|, and a probability
  // moves by its score's error: with scores of standard deviation `sharpness`, probabilities are within
  // 3e-6 * sharpness relative (+1e-9) and outputs within 1e-6 * sharpness of the reference (K/V in [-1, 1]).
  struct SlotCase {
    const char* name;
    int64_t capacity, first, count;
  };
  const std::vector<SlotCase> slot_cases = {
      {"ring 5,6,7,0,1,2", 8, 5, 6}, {"one slot", 8, 3, 1}, {"long ring", 1500, 1100, 1300}};
  for_each_isa([&](Isa) {
    for (KvFormat format : {KvFormat::kF32, KvFormat::kBF16}) {
      for (int64_t head_dim : {1, 3, 16, 24, 32, 40, 64, 200, 256, 512}) {
        for (const SlotCase& slot_case : slot_cases) {
          for (float sharpness : {1.0f, 8.0f}) {
            SCOPED_TRACE(std::string(format_name(format)) + " head_dim " + std::to_string(head_dim) + " " + slot_case.name +
                         " sharpness " + std::to_string(sharpness));
            const TestCache cache(format, slot_case.capacity, 2, head_dim, 90 + static_cast<uint32_t>(head_dim));
            const std::vector<int32_t> slots = ring_slots(slot_case.capacity, slot_case.first, slot_case.count);
            // Scores of standard deviation about `sharpness`.
            const float query_range = sharpness * 3.0f / std::sqrt(static_cast<float>(head_dim));
            const std::vector<float> query = random_floats(head_dim, -query_range, query_range, 99);
            std::vector<float> expected(head_dim), expected_scores(slots.size());
            reference::attend(query.data(), head_dim, cache.keys_f32.data() + head_dim, cache.values_f32.data() + head_dim,
                              cache.row_stride, slots, expected_scores.data(), expected.data());
            std::vector<float> actual(head_dim, 123.0f), scores(slots.size());
            attend(query.data(), head_dim, cache.key_head(1, head_dim), cache.value_head(1, head_dim), format,
                   cache.row_stride, slots, scores.data(), actual.data());
            for (int64_t d = 0; d < head_dim; ++d) ASSERT_NEAR(actual[d], expected[d], 1e-6f * sharpness) << d;
            for (size_t k = 0; k < slots.size(); ++k) {
              ASSERT_NEAR(scores[k], expected_scores[k], 3e-6f * sharpness * expected_scores[k] + 1e-9f) << k;
            }
          }
        }
      }
    }
  });
}

TEST(VectorOps, AttendGroupEqualsAttendPerHead) {
  // Sharing the K/V reads does not change the arithmetic of any head: the results are bit-equal.
  for_each_isa([](Isa) {
    for (KvFormat format : {KvFormat::kF32, KvFormat::kBF16}) {
      for (int64_t head_dim : {16, 40, 256, 512}) {
        const TestCache cache(format, 300, 1, head_dim, 7);
        const std::vector<int32_t> slots = ring_slots(300, 250, 203);
        for (int64_t group : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
          SCOPED_TRACE(std::string(format_name(format)) + " head_dim " + std::to_string(head_dim) + " group " + std::to_string(group));
          const float range = 3.0f / std::sqrt(static_cast<float>(head_dim));
          const std::vector<float> queries = random_floats(group * head_dim, -range, range, 5 + static_cast<uint32_t>(group));
          const size_t count = slots.size();
          std::vector<float> out(group * head_dim), scores(group * count);
          attend_group(queries.data(), group, head_dim, cache.keys.data(), cache.values.data(), format, cache.row_stride,
                       slots, scores.data(), out.data());
          for (int64_t h = 0; h < group; ++h) {
            std::vector<float> head_out(head_dim), head_scores(count);
            attend(queries.data() + h * head_dim, head_dim, cache.keys.data(), cache.values.data(), format, cache.row_stride,
                   slots, head_scores.data(), head_out.data());
            ASSERT_EQ(std::vector<float>(out.begin() + h * head_dim, out.begin() + (h + 1) * head_dim), head_out) << "head " << h;
            ASSERT_EQ(std::vector<float>(scores.begin() + h * count, scores.begin() + (h + 1) * count), head_scores) << "head " << h;
          }
        }
      }
    }
  });
}

TEST(VectorOps, AttendWithoutSlotsGivesZeros) {
  for_each_isa([](Isa) {
    const TestCache cache(KvFormat::kBF16, 4, 1, 32, 1);
    const std::vector<float> queries = random_floats(64, -1.0f, 1.0f, 2);
    std::vector<float> out(64, 5.0f);
    float scores[1];
    attend_group(queries.data(), 2, 32, cache.keys.data(), cache.values.data(), KvFormat::kBF16, 32, {}, scores, out.data());
    EXPECT_EQ(out, std::vector<float>(64, 0.0f));
  });
}

}  // namespace
}  // namespace gemma4rt::kernels
