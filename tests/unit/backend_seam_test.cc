// The backend seam's promises, checked by wrapping a real backend in a decorator that counts and
// traces every call: a decode step uploads its inputs, issues ops, and downloads exactly once (the ids
// when greedy, the softcapped logits when sampling), twice with logprobs (the logits, then their
// normalisers); no step allocates; nothing is read back in the
// middle of a forward pass, MoE routing included. And the device-side argmax gives the goldens' tokens.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/registry.h"
#include "core/bf16.h"
#include "core/error.h"
#include "engine/transformer.h"
#include "test_support.h"

namespace gemma4rt {
namespace {

using backend::Buffer;
using backend::Weight;

const std::string kGoldenDir = GEMMA4RT_TEST_DATA "/golden/";

// A new buffer of `device` holding `values`, and `count` floats read back from one.
Buffer upload_floats(backend::Backend& device, const std::vector<float>& values) {
  const Buffer buffer = device.allocate(values.size() * sizeof(float));
  device.upload(buffer, 0, values.data(), values.size() * sizeof(float));
  return buffer;
}
std::vector<float> download_floats(backend::Backend& device, Buffer buffer, size_t count) {
  std::vector<float> values(count);
  device.download(buffer, 0, values.data(), count * sizeof(float));
  return values;
}

// Forwards everything to `inner`, counting allocations and transfers and tracing the order of calls:
// A allocate, U upload, B begin_step, O any op, E end_step, D download.
class CountingBackend : public backend::Backend {
 public:
  explicit CountingBackend(std::unique_ptr<backend::Backend> inner) : inner_(std::move(inner)) {}

  int allocations = 0;
  int downloads = 0;
  size_t download_bytes = 0;
  std::string trace;
  void reset() {
    allocations = downloads = 0;
    download_bytes = 0;
    trace.clear();
  }

  std::string name() const override { return inner_->name(); }
  std::string kernels() const override { return inner_->kernels(); }
  int threads() const override { return inner_->threads(); }
  int default_chunk_tokens() const override { return inner_->default_chunk_tokens(); }
  WeightFormat default_weight_format(DType stored) const override { return inner_->default_weight_format(stored); }
  KvFormat default_kv_format() const override { return inner_->default_kv_format(); }
  void check_formats(WeightFormat weights, KvFormat kv) const override { inner_->check_formats(weights, kv); }

  Buffer allocate(size_t bytes) override {
    ++allocations;
    trace += 'A';
    return inner_->allocate(bytes);
  }
  void upload(Buffer destination, size_t offset, const void* source, size_t bytes) override {
    trace += 'U';
    inner_->upload(destination, offset, source, bytes);
  }
  void download(Buffer source, size_t offset, void* destination, size_t bytes) override {
    ++downloads;
    download_bytes += bytes;
    trace += 'D';
    inner_->download(source, offset, destination, bytes);
  }
  Weight prepare_weight(const TensorView& view, WeightFormat format) override { return inner_->prepare_weight(view, format); }
  size_t weight_read_bytes(Weight weight) const override { return inner_->weight_read_bytes(weight); }
  size_t owned_weight_bytes() const override { return inner_->owned_weight_bytes(); }
  size_t buffer_bytes() const override { return inner_->buffer_bytes(); }
  double measure_read_bandwidth() override { return inner_->measure_read_bandwidth(); }

  bool begin_step(const backend::StepShape& shape) override {
    trace += 'B';
    return inner_->begin_step(shape);
  }
  void end_step() override {
    trace += 'E';
    inner_->end_step();
  }

  void matmul(Buffer x, int rows, Weight weight, Buffer y) override { op(), inner_->matmul(x, rows, weight, y); }
  void rms_norm(Buffer x, int64_t rows, int width, Buffer weight, float eps, Buffer out) override {
    op(), inner_->rms_norm(x, rows, width, weight, eps, out);
  }
  void scale(Buffer x, int64_t count, float factor) override { op(), inner_->scale(x, count, factor); }
  void scale_columns(Buffer x, int rows, int width, Buffer weights, float factor) override {
    op(), inner_->scale_columns(x, rows, width, weights, factor);
  }
  void add(Buffer y, Buffer x, int64_t count) override { op(), inner_->add(y, x, count); }
  void copy(Buffer source, Buffer destination, int64_t count) override { op(), inner_->copy(source, destination, count); }
  void gelu_multiply(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset) override {
    op(), inner_->gelu_multiply(gate, up, rows, width, up_stride, up_offset);
  }
  void combine_per_layer_inputs(Buffer context, Buffer inputs, int64_t count, float embed_scale, float combine_scale) override {
    op(), inner_->combine_per_layer_inputs(context, inputs, count, embed_scale, combine_scale);
  }
  void rope(Buffer queries, int query_heads, Buffer keys, int key_heads, int rows, int head_dim, Buffer row_table,
            Buffer inverse_frequencies) override {
    op(), inner_->rope(queries, query_heads, keys, key_heads, rows, head_dim, row_table, inverse_frequencies);
  }
  void store_kv(Buffer source, int rows, int64_t row_elements, Buffer row_table, Buffer cache, int capacity, KvFormat format) override {
    op(), inner_->store_kv(source, rows, row_elements, row_table, cache, capacity, format);
  }
  void attention(Buffer queries, int rows, Buffer row_table, Buffer keys, Buffer values, const backend::AttentionShape& shape,
                 Buffer out) override {
    op(), inner_->attention(queries, rows, row_table, keys, values, shape, out);
  }
  void route_experts(Buffer router_logits, int rows, int experts, int top_k, Buffer per_expert_scale, Buffer chosen_experts,
                     Buffer chosen_weights) override {
    op(), inner_->route_experts(router_logits, rows, experts, top_k, per_expert_scale, chosen_experts, chosen_weights);
  }
  void expert_feed_forward(Buffer input, int rows, Buffer chosen_experts, Buffer chosen_weights, const backend::ExpertSet& experts,
                           Buffer out) override {
    op(), inner_->expert_feed_forward(input, rows, chosen_experts, chosen_weights, experts, out);
  }
  void gather_rows(Buffer source, Buffer row_ids, int rows, int width, Buffer out) override {
    op(), inner_->gather_rows(source, row_ids, rows, width, out);
  }
  void softcap(Buffer values, int64_t count, float cap) override { op(), inner_->softcap(values, count, cap); }
  void argmax(Buffer values, int rows, int width, Buffer ids) override { op(), inner_->argmax(values, rows, width, ids); }
  void log_sum_exp(Buffer values, int rows, int width, Buffer out) override { op(), inner_->log_sum_exp(values, rows, width, out); }
  void all_reduce_sum(Buffer values, int64_t count, parallel::Communicator& communicator) override {
    op(), inner_->all_reduce_sum(values, count, communicator);
  }
  void all_gather_rows(Buffer local, int rows, std::span<const size_t> counts, Buffer out, parallel::Communicator& communicator) override {
    op(), inner_->all_gather_rows(local, rows, counts, out, communicator);
  }

 private:
  void op() {
    if (trace.empty() || trace.back() != 'O') trace += 'O';  // a run of ops is one O
  }
  std::unique_ptr<backend::Backend> inner_;
};

struct Engine {
  std::unique_ptr<Model> model;
  CountingBackend* counting = nullptr;
  std::unique_ptr<Transformer> transformer;
};

Engine make_engine(const std::string& name, const std::string& backend_name, int sequences = 1) {
  Engine engine;
  engine.model = Model::load(kGoldenDir + name);
  auto counting = std::make_unique<CountingBackend>(backend::make_backend({backend_name, 1}));
  engine.counting = counting.get();
  EngineOptions options;
  options.backend = backend_name;
  options.context_tokens = 64;
  options.sequences = sequences;
  engine.transformer = std::make_unique<Transformer>(*engine.model, options, std::move(counting));
  return engine;
}

// One step: inputs uploaded, ops issued, one download at the end; no allocation, no read-back between ops.
const std::regex kOneStep("U+BOED");

class BackendSeam : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendSeam, GreedyDecodeStepDownloadsOnlyTheIds) {
  Engine engine = make_engine(GetParam(), "cpu");
  const std::vector<int32_t> prompt = {2, 81, 52, 29};
  EXPECT_GT(engine.counting->allocations, 0);  // everything is allocated while loading
  engine.counting->reset();
  int32_t token = engine.transformer->forward_greedy(prompt, 0);
  EXPECT_EQ(engine.counting->downloads, 1);
  EXPECT_EQ(engine.counting->download_bytes, sizeof(int32_t));
  EXPECT_TRUE(std::regex_match(engine.counting->trace, kOneStep)) << engine.counting->trace;
  for (int position = static_cast<int>(prompt.size()); position < 12; ++position) {
    engine.counting->reset();
    token = engine.transformer->forward_greedy(std::span<const int32_t>(&token, 1), position);
    EXPECT_EQ(engine.counting->allocations, 0) << "step at position " << position;
    EXPECT_EQ(engine.counting->downloads, 1);
    EXPECT_EQ(engine.counting->download_bytes, sizeof(int32_t));
    EXPECT_TRUE(std::regex_match(engine.counting->trace, kOneStep)) << engine.counting->trace;
  }
}

TEST_P(BackendSeam, SamplingDecodeStepDownloadsOnlyTheLogits) {
  Engine engine = make_engine(GetParam(), "cpu");
  const std::vector<int32_t> prompt = {2, 81, 52, 29};
  engine.transformer->forward(prompt, 0);
  const size_t vocab = static_cast<size_t>(engine.model->config().vocab_size);
  int32_t token = 100;
  for (int position = static_cast<int>(prompt.size()); position < 10; ++position) {
    engine.counting->reset();
    engine.transformer->forward(std::span<const int32_t>(&token, 1), position);
    EXPECT_EQ(engine.counting->allocations, 0);
    EXPECT_EQ(engine.counting->downloads, 1);
    EXPECT_EQ(engine.counting->download_bytes, vocab * sizeof(float));
    EXPECT_TRUE(std::regex_match(engine.counting->trace, kOneStep)) << engine.counting->trace;
    ++token;
  }
}

TEST_P(BackendSeam, LogprobsStepAlsoDownloadsTheNormalisersAtTheEnd) {
  Engine engine = make_engine(GetParam(), "cpu");
  const std::vector<int32_t> prompt = {2, 81, 52, 29};
  engine.transformer->forward(prompt, 0);
  const size_t vocab = static_cast<size_t>(engine.model->config().vocab_size);
  engine.counting->reset();
  float log_normaliser = 0.0f;
  const int32_t token = 100;
  engine.transformer->forward(std::span<const int32_t>(&token, 1), 4, 0, &log_normaliser);
  EXPECT_EQ(engine.counting->allocations, 0);
  EXPECT_EQ(engine.counting->downloads, 2);
  EXPECT_EQ(engine.counting->download_bytes, (vocab + 1) * sizeof(float));
  EXPECT_TRUE(std::regex_match(engine.counting->trace, std::regex("U+BOEDD"))) << engine.counting->trace;
}

TEST_P(BackendSeam, BatchedDecodeStepIsOneStepWithOneDownload) {
  Engine engine = make_engine(GetParam(), "cpu", 3);
  for (int sequence = 0; sequence < 3; ++sequence) {
    const std::vector<int32_t> prompt = {2, 81 + sequence, 52};
    engine.transformer->forward_greedy(prompt, 0, sequence);
  }
  const std::vector<BatchRow> rows = {{0, 3, 100}, {1, 3, 200}, {2, 3, 300}};
  const std::vector<int> logit_rows = {0, 1, 2};
  std::vector<int32_t> ids(3, -1);
  engine.counting->reset();
  engine.transformer->forward_greedy(rows, logit_rows, ids.data());
  EXPECT_EQ(engine.counting->allocations, 0);
  EXPECT_EQ(engine.counting->downloads, 1);
  EXPECT_EQ(engine.counting->download_bytes, 3 * sizeof(int32_t));
  EXPECT_TRUE(std::regex_match(engine.counting->trace, kOneStep)) << engine.counting->trace;
  for (int32_t id : ids) EXPECT_GE(id, 0);
}

// The device-side argmax (softcap skipped) picks the Hugging Face greedy tokens, through the reference
// backend, and decorating a backend changes nothing.
TEST_P(BackendSeam, DeviceArgmaxGivesTheGoldenGreedyTokens) {
  Engine engine = make_engine(GetParam(), "reference");
  const nlohmann::json golden = testing::read_json_file(kGoldenDir + GetParam() + "/golden.json");
  for (const auto& prompt : golden["prompts"]) {
    SCOPED_TRACE(prompt["name"].get<std::string>());
    const auto input_ids = prompt["input_ids"].get<std::vector<int32_t>>();
    const auto expected = prompt["greedy"]["tokens"].get<std::vector<int32_t>>();
    if (input_ids.size() + expected.size() > 64) continue;
    std::vector<int32_t> tokens = {engine.transformer->forward_greedy(input_ids, 0)};
    int position = static_cast<int>(input_ids.size());
    while (tokens.size() < expected.size()) tokens.push_back(engine.transformer->forward_greedy(std::span<const int32_t>(&tokens.back(), 1), position++));
    EXPECT_EQ(tokens, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, BackendSeam,
                         ::testing::Values("tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b"),
                         testing::string_param_name);

TEST(BackendRegistry, UnknownBackendNamesTheKnownOnes) {
  try {
    backend::make_backend({"tpu", 1});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tpu"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("cpu, reference"), std::string::npos);
  }
}

// A device with its own memory is checked with the planner's arithmetic before anything is uploaded.
TEST(BackendRegistry, ModelThatDoesNotFitTheDeviceIsRefusedBeforeUpload) {
  struct SmallDevice : CountingBackend {
    using CountingBackend::CountingBackend;
    uint64_t memory_bytes() const override { return 64 << 10; }  // 64 KiB
  };
  auto model = Model::load(kGoldenDir + "tiny-e2b");
  auto device = std::make_unique<SmallDevice>(backend::make_backend({"cpu", 1}));
  EngineOptions options;
  options.context_tokens = 64;
  try {
    Transformer transformer(*model, options, std::move(device));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("does not fit the cpu device"), std::string::npos) << message;
    EXPECT_NE(message.find("GB"), std::string::npos) << message;
  }
}

// Products of one input issued together (q, k, v; gate, up) give bitwise what they give one by one,
// in every weight format, for one row and for a prefill's worth, and where one's width differs (the
// input is then read at each weight's own width).
TEST(BackendRegistry, CpuMatmulEachMatchesSeparateProducts) {
  const std::unique_ptr<backend::Backend> cpu = backend::make_backend({.name = "cpu", .threads = 2});
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
    for (const int64_t other_cols : {int64_t{640}, int64_t{704}}) {
      SCOPED_TRACE(::testing::Message() << format_name(format) << ", third weight " << other_cols << " wide");
      const std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 640}, {112, 640}, {128, other_cols}};
      std::vector<std::vector<float>> values;
      std::vector<Weight> weights;
      uint32_t seed = 3;
      for (const auto& [rows, cols] : shapes) {
        values.emplace_back(static_cast<size_t>(rows * cols));
        for (float& value : values.back()) value = testing::next_centered(seed);
        weights.push_back(cpu->prepare_weight(testing::f32_view(values.back(), rows, cols), format));
      }
      for (const int rows : {1, 20}) {
        std::vector<float> input(static_cast<size_t>(rows) * 704);
        for (float& value : input) value = testing::next_centered(seed);
        const Buffer x = cpu->allocate(input.size() * sizeof(float));
        cpu->upload(x, 0, input.data(), input.size() * sizeof(float));
        std::vector<Buffer> together, alone;
        for (const auto& shape : shapes) {
          together.push_back(cpu->allocate(static_cast<size_t>(rows * shape.first) * sizeof(float)));
          alone.push_back(cpu->allocate(static_cast<size_t>(rows * shape.first) * sizeof(float)));
        }
        const size_t count = shapes.size();  // a third weight of another width: each product on its own
        cpu->matmul_each(x, rows, std::span(weights.data(), count), std::span<const Buffer>(together.data(), count));
        for (size_t i = 0; i < count; ++i) cpu->matmul(x, rows, weights[i], alone[i]);
        for (size_t i = 0; i < count; ++i) {
          std::vector<float> a(static_cast<size_t>(rows * shapes[i].first)), b(a.size());
          cpu->download(together[i], 0, a.data(), a.size() * sizeof(float));
          cpu->download(alone[i], 0, b.data(), b.size() * sizeof(float));
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "weight " << i << ", " << rows << " rows";
        }
      }
    }
  }
}

// Weights the CPU backend reads in place from the checkpoint's map are copied into memory of its own
// while the engine's budget allows (large ones only, each within what is left), and a copy multiplies
// to the same bits as the map's values and no longer depends on them.
TEST(BackendRegistry, CpuCopiesInPlaceWeightsWithinTheBudget) {
  const std::unique_ptr<backend::Backend> cpu = backend::make_backend({.name = "cpu", .threads = 2});
  constexpr int64_t kRows = 1024, kCols = 1024;  // 2 MiB in bf16, 4 MiB in f32
  uint32_t seed = 11;
  std::vector<float> floats(static_cast<size_t>(kRows * kCols));
  for (float& value : floats) value = testing::next_centered(seed);
  std::vector<uint16_t> halves(floats.size());
  for (size_t i = 0; i < floats.size(); ++i) halves[i] = float_to_bf16(floats[i]);
  TensorView bf16_view = testing::f32_view(floats, kRows, kCols);
  bf16_view.dtype = DType::kBF16;
  bf16_view.data = reinterpret_cast<const std::byte*>(halves.data());
  const std::vector<float> small(64 * 64, 0.25f);

  const Weight in_place = cpu->prepare_weight(bf16_view, WeightFormat::kBF16);  // no budget yet
  EXPECT_EQ(cpu->owned_weight_bytes(), 0u);
  cpu->allow_weight_copies((3u << 20) + (64u * 64u * 4u));
  cpu->prepare_weight(testing::f32_view(small, 64, 64), WeightFormat::kF32);  // 16 KiB: stays in place
  EXPECT_EQ(cpu->owned_weight_bytes(), 0u);
  const Weight copied = cpu->prepare_weight(bf16_view, WeightFormat::kBF16);
  EXPECT_EQ(cpu->owned_weight_bytes(), size_t{2} << 20);
  cpu->prepare_weight(testing::f32_view(floats, kRows, kCols), WeightFormat::kF32);  // 4 MiB: past the 1 MiB left
  EXPECT_EQ(cpu->owned_weight_bytes(), size_t{2} << 20);

  for (const int rows : {1, 5}) {
    std::vector<float> input(static_cast<size_t>(rows * kCols));
    for (float& value : input) value = testing::next_centered(seed);
    const Buffer x = cpu->allocate(input.size() * sizeof(float));
    cpu->upload(x, 0, input.data(), input.size() * sizeof(float));
    const Buffer from_map = cpu->allocate(static_cast<size_t>(rows * kRows) * sizeof(float));
    const Buffer from_copy = cpu->allocate(static_cast<size_t>(rows * kRows) * sizeof(float));
    cpu->matmul(x, rows, in_place, from_map);
    std::vector<uint16_t> saved = halves;
    std::fill(halves.begin(), halves.end(), uint16_t{0});  // the map's values gone: the copy must not care
    cpu->matmul(x, rows, copied, from_copy);
    halves = saved;
    std::vector<float> a(static_cast<size_t>(rows * kRows)), b(a.size());
    cpu->download(from_map, 0, a.data(), a.size() * sizeof(float));
    cpu->download(from_copy, 0, b.data(), b.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << rows << " rows";
    EXPECT_NE(a[0], 0.0f);
  }
}

// The CPU backend feeds a prompt's GELU product straight to the matmul's prepared input: bitwise the
// result of gelu_multiply then matmul, in every weight format, for up rows of their own and for up rows
// beside the gates (the PLE layout), from one row (the two ops) to a prompt's rows on two threads.
TEST(BackendRegistry, CpuGeluMultiplyMatmulMatchesTheTwoOps) {
  constexpr int64_t kWidth = 640, kOutputs = 96;
  const std::unique_ptr<backend::Backend> cpu = backend::make_backend({.name = "cpu", .threads = 2});
  uint32_t seed = 17;
  auto random_values = [&](size_t count) {
    std::vector<float> values(count);
    for (float& value : values) value = 4.0f * testing::next_centered(seed);
    return values;
  };
  auto upload = [&](const std::vector<float>& values) { return upload_floats(*cpu, values); };
  auto download = [&](Buffer buffer, size_t count) { return download_floats(*cpu, buffer, count); };
  const std::vector<float> weight_values = random_values(static_cast<size_t>(kOutputs * kWidth));
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
    const Weight weight = cpu->prepare_weight(testing::f32_view(weight_values, kOutputs, kWidth), format);
    for (const int rows : {1, 3, 40}) {
      for (const int64_t up_stride : {kWidth, 3 * kWidth}) {
        SCOPED_TRACE(::testing::Message() << format_name(format) << ", " << rows << " rows, up stride " << up_stride);
        const int64_t up_offset = up_stride == kWidth ? 0 : kWidth;
        const std::vector<float> gates = random_values(static_cast<size_t>(rows * kWidth));
        const std::vector<float> ups = random_values(static_cast<size_t>(rows * up_stride));
        const Buffer two_ops_gate = upload(gates), fused_gate = upload(gates), up = upload(ups);
        const Buffer two_ops_y = cpu->allocate(static_cast<size_t>(rows * kOutputs) * sizeof(float));
        const Buffer fused_y = cpu->allocate(static_cast<size_t>(rows * kOutputs) * sizeof(float));
        cpu->gelu_multiply(two_ops_gate, up, rows, kWidth, up_stride, up_offset);
        cpu->matmul(two_ops_gate, rows, weight, two_ops_y);
        cpu->gelu_multiply_matmul(fused_gate, up, rows, kWidth, up_stride, up_offset, weight, fused_y);
        const std::vector<float> expected = download(two_ops_y, static_cast<size_t>(rows * kOutputs));
        const std::vector<float> got = download(fused_y, expected.size());
        EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
        // The products did depend on the GELU: they differ from the plain gates' product.
        const Buffer plain_y = cpu->allocate(static_cast<size_t>(rows * kOutputs) * sizeof(float));
        cpu->matmul(upload(gates), rows, weight, plain_y);
        const std::vector<float> plain = download(plain_y, expected.size());
        EXPECT_NE(std::memcmp(plain.data(), expected.data(), plain.size() * sizeof(float)), 0);
      }
    }
  }
}

// The CPU backend's dense MLP on a prompt applies GELU x up as the gate and up products leave the bf16
// prefill tiles: bitwise what matmul_each and gelu_multiply_matmul give, in every weight format (only
// bf16 takes the fused path), on two threads, for a width that ends inside a panel, from a decode
// step's rows to a prompt's.
TEST(BackendRegistry, CpuGeluFeedForwardMatchesTheUnfusedOps) {
  constexpr int64_t kHidden = 640, kWidth = 200;
  const std::unique_ptr<backend::Backend> cpu = backend::make_backend({.name = "cpu", .threads = 2});
  uint32_t seed = 23;
  auto random_values = [&](size_t count, float scale) {
    std::vector<float> values(count);
    for (float& value : values) value = scale * testing::next_centered(seed);
    return values;
  };
  auto upload = [&](const std::vector<float>& values) { return upload_floats(*cpu, values); };
  auto download = [&](Buffer buffer, size_t count) { return download_floats(*cpu, buffer, count); };
  const std::vector<float> gate_values = random_values(static_cast<size_t>(kWidth * kHidden), 0.1f);
  const std::vector<float> up_values = random_values(static_cast<size_t>(kWidth * kHidden), 0.1f);
  const std::vector<float> down_values = random_values(static_cast<size_t>(kHidden * kWidth), 0.1f);
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8, WeightFormat::kQ4}) {
    const Weight gate = cpu->prepare_weight(testing::f32_view(gate_values, kWidth, kHidden), format);
    const Weight up = cpu->prepare_weight(testing::f32_view(up_values, kWidth, kHidden), format);
    const Weight down = cpu->prepare_weight(testing::f32_view(down_values, kHidden, kWidth), format);
    for (const int rows : {3, 16, 17, 70}) {
      SCOPED_TRACE(::testing::Message() << format_name(format) << ", " << rows << " rows");
      const Buffer x = upload(random_values(static_cast<size_t>(rows * kHidden), 2.0f));
      const size_t products = static_cast<size_t>(rows * kWidth), outputs = static_cast<size_t>(rows * kHidden);
      const Buffer gate_out = cpu->allocate(products * sizeof(float)), up_out = cpu->allocate(products * sizeof(float));
      const Buffer unfused_y = cpu->allocate(outputs * sizeof(float)), fused_y = cpu->allocate(outputs * sizeof(float));
      const Weight weights[] = {gate, up};
      const Buffer outs[] = {gate_out, up_out};
      cpu->matmul_each(x, rows, weights, outs);
      cpu->gelu_multiply_matmul(gate_out, up_out, rows, kWidth, kWidth, 0, down, unfused_y);
      cpu->gelu_feed_forward(x, rows, gate, up, kWidth, down, gate_out, up_out, fused_y);
      const std::vector<float> expected = download(unfused_y, outputs);
      const std::vector<float> got = download(fused_y, outputs);
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), outputs * sizeof(float)), 0);
      double magnitude = 0.0;
      for (float value : expected) magnitude += std::fabs(value);
      EXPECT_GT(magnitude, 0.0);
    }
  }
}

// A prompt's rows of the row-wise element-wise ops are shared over the pool (above 65,536 elements):
// two threads give bitwise what one gives, for norms, RoPE (each row at its own position) and GELU
// (dense rows, and gate and up side by side in one buffer).
TEST(BackendRegistry, RowWiseOpsOnTwoThreadsMatchOneThread) {
  constexpr int kRows = 300, kWidth = 512, kQueryHeads = 4, kKeyHeads = 2, kHeadDim = 64;
  uint32_t seed = 11;
  auto random_values = [&](size_t count) {
    std::vector<float> values(count);
    for (float& value : values) value = testing::next_centered(seed);
    return values;
  };
  const std::vector<float> x = random_values(static_cast<size_t>(kRows) * kWidth);
  const std::vector<float> norm_weight = random_values(kWidth);
  const std::vector<float> gate_up = random_values(static_cast<size_t>(kRows) * 2 * kWidth);
  const std::vector<float> queries = random_values(static_cast<size_t>(kRows) * kQueryHeads * kHeadDim);
  const std::vector<float> keys = random_values(static_cast<size_t>(kRows) * kKeyHeads * kHeadDim);
  std::vector<int32_t> row_table;
  for (int row = 0; row < kRows; ++row) row_table.insert(row_table.end(), {0, row * 7 % 1000, 0});
  std::vector<float> frequencies(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) frequencies[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / kHeadDim);

  struct Results {
    std::vector<float> norm, dense_gelu, side_by_side_gelu, rotated_queries, rotated_keys;
  };
  auto run = [&](int threads) {
    const std::unique_ptr<backend::Backend> cpu = backend::make_backend({.name = "cpu", .threads = threads});
    auto upload = [&](const void* data, size_t bytes) {
      const Buffer buffer = cpu->allocate(bytes);
      cpu->upload(buffer, 0, data, bytes);
      return buffer;
    };
    auto download = [&](Buffer buffer, size_t count) {
      std::vector<float> values(count);
      cpu->download(buffer, 0, values.data(), count * sizeof(float));
      return values;
    };
    const size_t cells = static_cast<size_t>(kRows) * kWidth;
    Results results;
    const Buffer normed = cpu->allocate(cells * sizeof(float));
    cpu->rms_norm(upload(x.data(), cells * sizeof(float)), kRows, kWidth, upload(norm_weight.data(), kWidth * sizeof(float)), 1e-6f, normed);
    results.norm = download(normed, cells);
    // Each row of gate_up holds its gate, then its up: once split into two dense buffers, once side by side.
    std::vector<float> gates(cells), ups(cells);
    for (size_t row = 0; row < static_cast<size_t>(kRows); ++row) {
      std::memcpy(gates.data() + row * kWidth, gate_up.data() + row * 2 * kWidth, kWidth * sizeof(float));
      std::memcpy(ups.data() + row * kWidth, gate_up.data() + row * 2 * kWidth + kWidth, kWidth * sizeof(float));
    }
    const Buffer dense_gate = upload(gates.data(), cells * sizeof(float));
    cpu->gelu_multiply(dense_gate, upload(ups.data(), cells * sizeof(float)), kRows, kWidth, kWidth, 0);
    results.dense_gelu = download(dense_gate, cells);
    const Buffer gate = upload(gates.data(), cells * sizeof(float));
    cpu->gelu_multiply(gate, upload(gate_up.data(), 2 * cells * sizeof(float)), kRows, kWidth, 2 * kWidth, kWidth);
    results.side_by_side_gelu = download(gate, cells);
    const Buffer q = upload(queries.data(), queries.size() * sizeof(float));
    const Buffer k = upload(keys.data(), keys.size() * sizeof(float));
    cpu->rope(q, kQueryHeads, k, kKeyHeads, kRows, kHeadDim, upload(row_table.data(), row_table.size() * sizeof(int32_t)),
              upload(frequencies.data(), frequencies.size() * sizeof(float)));
    results.rotated_queries = download(q, queries.size());
    results.rotated_keys = download(k, keys.size());
    return results;
  };
  const Results one = run(1), two = run(2);
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(one.norm, two.norm));
  EXPECT_TRUE(same_bits(one.dense_gelu, two.dense_gelu));
  EXPECT_TRUE(same_bits(one.side_by_side_gelu, two.side_by_side_gelu));
  EXPECT_TRUE(same_bits(one.rotated_queries, two.rotated_queries));
  EXPECT_TRUE(same_bits(one.rotated_keys, two.rotated_keys));
  // The ops did run: a later row's keys are rotated (row 299 sits at position 93), and both GELU
  // layouts multiply the same gate by the same up.
  EXPECT_GT(std::fabs(two.rotated_keys.back() - keys.back()), 1e-6f);
  EXPECT_TRUE(same_bits(two.dense_gelu, two.side_by_side_gelu));
  EXPECT_GT(std::fabs(two.norm.back() - x.back()), 1e-6f);
}

TEST(BackendRegistry, MatmulEachOfNoWeightsDoesNothing) {
  const std::unique_ptr<backend::Backend> cpu = backend::make_backend({.name = "cpu", .threads = 2});
  const Buffer x = cpu->allocate(64 * sizeof(float));
  cpu->matmul_each(x, 1, {}, {});
  EXPECT_THROW(cpu->matmul_each(x, 1, {}, std::span<const Buffer>(&x, 1)), Error);  // outputs without weights
}

TEST(BackendRegistry, ReferenceBackendRefusesBf16) {
  auto model = Model::load(kGoldenDir + "tiny-e2b");
  EngineOptions options;
  options.backend = "reference";
  options.context_tokens = 16;
  options.weight_format = WeightFormat::kBF16;
  EXPECT_THROW(Transformer(*model, options), Error);
  options.weight_format.reset();
  options.kv_format = KvFormat::kBF16;
  EXPECT_THROW(Transformer(*model, options), Error);
}

}  // namespace
}  // namespace gemma4rt
