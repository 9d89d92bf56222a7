#include "backend/vulkan/vulkan_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "backend/cpu/kernels/matmul.h"
#include "backend/vulkan/vulkan_shaders.h"
#include "core/bf16.h"
#include "core/error.h"

namespace gemma4rt::backend::vulkan {
namespace {

constexpr uint32_t kPushBytes = 64;
constexpr uint32_t kMaxGroups = 65535;

uint32_t groups_for(int64_t invocations, uint32_t per_group = 64) {
  const int64_t groups = (invocations + per_group - 1) / per_group;
  return static_cast<uint32_t>(std::clamp<int64_t>(groups, 1, kMaxGroups));
}

// The element-wise ops of elementwise.comp.
enum ElementwiseOp : uint32_t {
  kScale = 0, kScaleColumns = 1, kAdd = 2, kCopy = 3, kGeluMultiply = 4, kCombine = 5, kSoftcap = 6, kGeluGateUp = 7, kGatherRows = 8,
};

struct MatmulPush {
  uint32_t rows, cols, tokens, row_offset, y_stride, expert, top_k, rows_per_group;
};
struct TiledPush {
  uint32_t rows, cols, tokens, row_offset, y_stride, token_base;
};

// The tile edge of matmul_tiled.comp and matmul_coopmat.comp, in tokens and in rows.
constexpr int64_t kTile = 64;
// From this many tokens on, products run tiled. The GEMV reads every weight row once per 8 tokens and
// computes no padding; the tiled shader reads it once per 64 tokens but computes whole 64-token tiles.
// On lavapipe (compute-bound) a 64x64 tile costs about what the GEMV spends on 50 tokens: measured on
// a 512-wide model, prefill of 32 tokens ran 0.7x as fast tiled, 48 tokens 0.95x, 64 tokens 1.3x,
// 256 tokens 1.25x. From 48 tokens (tiles at least 3/4 full) the two are even there, and on
// memory-bound GPUs tiling pays off earlier still; decode and small batches stay on the GEMV.
constexpr int kTiledMinTokens = 48;

// Where a weight format's variant sits within a product family of Kernel (f32, bf16, q8, q4).
int format_offset(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return 0;
    case WeightFormat::kBF16: return 1;
    case WeightFormat::kQ8: return 2;
    case WeightFormat::kQ4: return 3;
  }
  return 0;
}

// q4 as the shaders read it (weights.glsl): each row's values in order, 8 nibbles per 32-bit word, the
// lowest first, each q + 8, rows of whole blocks of 32. `superblocks` is a WeightFormat::kQ4 matrix's
// rows (core/formats.h), whose addressing is the CPU kernels'.
std::vector<uint8_t> q4_rows_in_order(const uint8_t* superblocks, int64_t rows, int64_t cols) {
  const int64_t row_bytes = q4_row_bytes(cols);
  std::vector<uint8_t> ordered(static_cast<size_t>(rows * row_bytes)), codes(static_cast<size_t>(2 * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    kernels::unpack_q4_row(superblocks + r * row_bytes, cols, codes.data());
    uint8_t* target = ordered.data() + r * row_bytes;
    for (int64_t j = 0; j < row_bytes; ++j) target[j] = static_cast<uint8_t>(codes[2 * j] | codes[2 * j + 1] << 4);
  }
  return ordered;
}

struct ElementwisePush {
  uint32_t op, count, width, stride, offset;
  float f0, f1;
};
struct AttentionPush {
  uint32_t query_heads, kv_heads, head_dim, first_query_head, first_kv_head, group_size, capacity, window, max_keys, pair_base, derived_keys,
      rotated_pairs;
};

}  // namespace

VulkanBackend::VulkanBackend(int device_index) : device_(std::make_unique<Device>(device_index)) {
  struct KernelSource {
    Kernel kernel;
    const char* shader;
    int bindings;
  };
  const KernelSource sources[] = {
      {Kernel::kMatmulF32, "matmul_f32", 5},         {Kernel::kMatmulBF16, "matmul_bf16", 5},
      {Kernel::kMatmulQ8, "matmul_q8", 5},           {Kernel::kMatmulQ4, "matmul_q4", 5},
      {Kernel::kGatheredF32, "gathered_f32", 5},     {Kernel::kGatheredBF16, "gathered_bf16", 5},
      {Kernel::kGatheredQ8, "gathered_q8", 5},       {Kernel::kGatheredQ4, "gathered_q4", 5},
      {Kernel::kTiledF32, "tiled_f32", 4},           {Kernel::kTiledBF16, "tiled_bf16", 4},
      {Kernel::kTiledQ8, "tiled_q8", 4},             {Kernel::kTiledQ4, "tiled_q4", 4},
      {Kernel::kRmsNorm, "rms_norm", 3},             {Kernel::kElementwise, "elementwise", 3},
      {Kernel::kRope, "rope", 4},                    {Kernel::kStoreKvF32, "store_kv_f32", 3},
      {Kernel::kStoreKvBF16, "store_kv_bf16", 3},    {Kernel::kAttentionF32, "attention_f32", 8},
      {Kernel::kAttentionBF16, "attention_bf16", 8},
      {Kernel::kRouteExperts, "route_experts", 4},   {Kernel::kExpertCombine, "expert_combine", 4},
      {Kernel::kArgmax, "argmax", 2},                {Kernel::kLogSumExp, "log_sum_exp", 2},
      {Kernel::kReadBandwidth, "read_bandwidth", 2},
  };
  for (const KernelSource& source : sources) {
    pipelines_[static_cast<int>(source.kernel)] = device_->create_pipeline(shader_spirv(source.shader), source.bindings, kPushBytes);
  }
  dummy_ = device_->create_buffer(16);
  // Cooperative matrices only where the device offers the shape (never lavapipe), unless disabled, and
  // only once a product on this device agrees with the plain tiled shader: no device here runs them.
  const char* disabled = std::getenv("GEMMA4RT_VULKAN_NO_COOPMAT");
  if (device_->info().cooperative_matrix_nv_f16 && !(disabled != nullptr && std::string_view(disabled) == "1")) {
    try {
      const std::pair<Kernel, const char*> cooperative[] = {
          {Kernel::kCoopmatF32, "coopmat_f32"}, {Kernel::kCoopmatBF16, "coopmat_bf16"}, {Kernel::kCoopmatQ8, "coopmat_q8"},
          {Kernel::kCoopmatQ4, "coopmat_q4"}};
      for (const auto& [kernel, shader] : cooperative) {
        pipelines_[static_cast<int>(kernel)] = device_->create_pipeline(shader_spirv(shader), 4, kPushBytes);
      }
      cooperative_matrix_ = cooperative_matrix_agrees();
    } catch (const Error&) {
      cooperative_matrix_ = false;  // a driver that rejects the pipeline: the plain tiled shader serves
    }
  }
}

VulkanBackend::~VulkanBackend() {
  for (auto& [shape, command_buffer] : recorded_) device_->free_command_buffer(command_buffer);
  for (DeviceBuffer& buffer : buffers_) device_->destroy_buffer(buffer);
  for (DeviceBuffer& buffer : retired_) device_->destroy_buffer(buffer);
  for (PreparedWeight& weight : weights_) {
    for (WeightChunk& chunk : weight.chunks) {
      device_->destroy_buffer(chunk.values);
      device_->destroy_buffer(chunk.scales);
    }
  }
  for (DeviceBuffer* buffer : {&dummy_, &attention_scores_, &expert_hidden_, &expert_activated_, &expert_output_}) device_->destroy_buffer(*buffer);
}

std::string VulkanBackend::kernels() const {
  const DeviceInfo& info = device_->info();
  return fmt::format("{} ({}, Vulkan {}){}", info.name, info.type, version_string(info.api_version),
                     cooperative_matrix_ ? ", cooperative matrix" : "");
}

WeightFormat VulkanBackend::default_weight_format(DType stored) const {
  if (stored == DType::kQ8) return WeightFormat::kQ8;
  if (stored == DType::kQ4) return WeightFormat::kQ4;
  return stored == DType::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16;
}

// Every weight format has its shaders and both KV formats theirs.
void VulkanBackend::check_formats(WeightFormat, KvFormat) const {}

// ---- memory ----

Buffer VulkanBackend::allocate(size_t bytes) {
  buffers_.push_back(device_->create_buffer(bytes));
  buffer_bytes_ += buffers_.back().bytes;
  return Buffer{static_cast<int32_t>(buffers_.size() - 1)};
}

void VulkanBackend::upload(Buffer destination, size_t offset, const void* source, size_t bytes) {
  if (bytes > 0) device_->upload(buffers_.at(static_cast<size_t>(destination.id)), offset, source, bytes);
}

void VulkanBackend::download(Buffer source, size_t offset, void* destination, size_t bytes) {
  if (bytes > 0) device_->download(buffers_.at(static_cast<size_t>(source.id)), offset, destination, bytes);
}

Weight VulkanBackend::prepare_weight(const TensorView& view, WeightFormat format) {
  PreparedWeight weight;
  weight.format = format;
  weight.rows = view.shape.at(0);
  weight.cols = view.element_count() / weight.rows;
  const int64_t cols = weight.cols;
  // Rows per chunk: within the device's largest storage buffer and one dispatch's workgroups.
  const int64_t row_bytes = format == WeightFormat::kF32    ? cols * 4
                            : format == WeightFormat::kBF16 ? cols * 2
                            : format == WeightFormat::kQ8   ? cols
                                                            : q4_row_bytes(cols);
  const int64_t chunk_rows = std::clamp<int64_t>(static_cast<int64_t>(device_->info().max_storage_buffer_range) / std::max<int64_t>(row_bytes, 1) - 1,
                                                 1, kMaxGroups);
  std::vector<float> floats;
  std::vector<uint16_t> halves;
  std::vector<int8_t> bytes;
  std::vector<float> scales;
  for (int64_t first = 0; first < weight.rows; first += chunk_rows) {
    WeightChunk chunk;
    chunk.first_row = first;
    chunk.rows = std::min(chunk_rows, weight.rows - first);
    const int64_t elements = chunk.rows * cols;
    switch (format) {
      case WeightFormat::kF32:
        floats.resize(static_cast<size_t>(elements));
        view.read_floats(first * cols, elements, floats.data());
        chunk.values = device_->create_buffer(floats.size() * sizeof(float));
        device_->upload(chunk.values, 0, floats.data(), floats.size() * sizeof(float));
        break;
      case WeightFormat::kBF16:
        halves.resize(static_cast<size_t>(elements));
        if (view.dtype == DType::kBF16) {
          std::memcpy(halves.data(), view.data + first * cols * 2, static_cast<size_t>(elements) * 2);
        } else {
          floats.resize(static_cast<size_t>(elements));
          view.read_floats(first * cols, elements, floats.data());
          for (int64_t i = 0; i < elements; ++i) halves[i] = float_to_bf16(floats[i]);
        }
        chunk.values = device_->create_buffer(halves.size() * 2);
        device_->upload(chunk.values, 0, halves.data(), halves.size() * 2);
        break;
      case WeightFormat::kQ8: {
        const int64_t blocks = q8_blocks_per_row(cols);
        bytes.resize(static_cast<size_t>(elements));
        scales.resize(static_cast<size_t>(chunk.rows * blocks));
        if (view.dtype == DType::kQ8) {
          std::memcpy(bytes.data(), view.data + first * cols, static_cast<size_t>(elements));
          std::memcpy(scales.data(), view.q8_scales + first * blocks, scales.size() * sizeof(float));
        } else {
          floats.resize(static_cast<size_t>(elements));
          view.read_floats(first * cols, elements, floats.data());
          kernels::quantize_q8(floats.data(), chunk.rows, cols, bytes.data(), scales.data());
        }
        chunk.values = device_->create_buffer(bytes.size());
        device_->upload(chunk.values, 0, bytes.data(), bytes.size());
        chunk.scales = device_->create_buffer(scales.size() * sizeof(float));
        device_->upload(chunk.scales, 0, scales.data(), scales.size() * sizeof(float));
        break;
      }
      case WeightFormat::kQ4: {
        // The checkpoint's own codes when it is q4 (no second rounding), else quantised here as the
        // CPU backend quantises; either way reordered from the superblock layout into row order.
        const int64_t blocks = q4_blocks_per_row(cols), row_bytes = q4_row_bytes(cols);
        std::vector<uint8_t> superblocks(static_cast<size_t>(chunk.rows * row_bytes));
        // An even count, padded with 0: the shader reads the scales in pairs.
        halves.assign(static_cast<size_t>(chunk.rows * blocks + 1) / 2 * 2, 0);
        if (view.dtype == DType::kQ4) {
          std::memcpy(superblocks.data(), view.data + first * row_bytes, superblocks.size());
          std::memcpy(halves.data(), view.q4_scales + first * blocks, static_cast<size_t>(chunk.rows * blocks) * 2);
        } else {
          floats.resize(static_cast<size_t>(elements));
          view.read_floats(first * cols, elements, floats.data());
          kernels::quantize_q4(floats.data(), chunk.rows, cols, superblocks.data(), halves.data());
        }
        const std::vector<uint8_t> ordered = q4_rows_in_order(superblocks.data(), chunk.rows, cols);
        chunk.values = device_->create_buffer(ordered.size());
        device_->upload(chunk.values, 0, ordered.data(), ordered.size());
        chunk.scales = device_->create_buffer(halves.size() * 2);
        device_->upload(chunk.scales, 0, halves.data(), halves.size() * 2);
        break;
      }
    }
    weight_bytes_ += chunk.values.bytes + chunk.scales.bytes;
    weight.chunks.push_back(chunk);
  }
  weights_.push_back(std::move(weight));
  return Weight{static_cast<int32_t>(weights_.size() - 1), weights_.back().rows, cols};
}

size_t VulkanBackend::weight_read_bytes(Weight weight) const {
  const PreparedWeight& prepared = weights_.at(static_cast<size_t>(weight.id));
  return static_cast<size_t>(gemma4rt::weight_bytes(prepared.rows, prepared.cols, prepared.format));
}

VkBuffer VulkanBackend::scratch(DeviceBuffer& buffer, size_t bytes) {
  if (buffer.bytes < bytes) {
    if (buffer.buffer != VK_NULL_HANDLE) retired_.push_back(buffer);
    buffer = device_->create_buffer(bytes);
  }
  return buffer.buffer;
}

double VulkanBackend::measure_read_bandwidth() {
  const size_t bytes = std::min<size_t>(size_t{1} << 30, device_->info().max_storage_buffer_range / 16 * 16);
  DeviceBuffer data = device_->create_buffer(bytes);
  DeviceBuffer sums = device_->create_buffer(kMaxGroups * sizeof(float));
  const uint32_t count = static_cast<uint32_t>(bytes / 16);
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    dispatch(Kernel::kReadBandwidth, {data.buffer, sums.buffer}, &count, sizeof(count), groups_for(count / 8, 256));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  device_->destroy_buffer(data);
  device_->destroy_buffer(sums);
  return static_cast<double>(bytes) / best;
}

// ---- steps: recorded once per shape, replayed after ----

bool VulkanBackend::begin_step(const StepShape& shape) {
  const auto key = std::make_tuple(shape.rows, shape.logit_rows, shape.greedy);
  if (auto found = recorded_.find(key); found != recorded_.end()) {
    replaying_ = found->second;
    return false;
  }
  recording_ = device_->allocate_command_buffer();
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  check(device_->api().vkBeginCommandBuffer(recording_, &begin), "vkBeginCommandBuffer");
  recorded_[key] = recording_;
  return true;
}

void VulkanBackend::end_step() {
  if (recording_ != VK_NULL_HANDLE) {
    check(device_->api().vkEndCommandBuffer(recording_), "vkEndCommandBuffer");
    replaying_ = recording_;
    recording_ = VK_NULL_HANDLE;
  }
  if (replaying_ != VK_NULL_HANDLE) device_->submit_and_wait(replaying_);
  replaying_ = VK_NULL_HANDLE;
}

void VulkanBackend::dispatch(Kernel kernel, std::initializer_list<VkBuffer> buffers, const void* push, uint32_t push_bytes, uint32_t groups_x,
                             uint32_t groups_y) {
  const VulkanApi& api = device_->api();
  const Pipeline& pipeline = pipelines_[static_cast<int>(kernel)];
  const bool eager = recording_ == VK_NULL_HANDLE;
  VkCommandBuffer commands = recording_;
  if (eager) {
    commands = device_->allocate_command_buffer();
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(api.vkBeginCommandBuffer(commands, &begin), "vkBeginCommandBuffer");
  }
  std::vector<VkDescriptorBufferInfo> infos;
  std::vector<VkWriteDescriptorSet> writes;
  infos.reserve(buffers.size());
  for (VkBuffer buffer : buffers) infos.push_back({buffer != VK_NULL_HANDLE ? buffer : dummy_.buffer, 0, VK_WHOLE_SIZE});
  for (size_t binding = 0; binding < infos.size(); ++binding) {
    VkWriteDescriptorSet write{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    write.dstBinding = static_cast<uint32_t>(binding);
    write.descriptorCount = 1;
    write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    write.pBufferInfo = &infos[binding];
    writes.push_back(write);
  }
  api.vkCmdBindPipeline(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline);
  api.vkCmdPushDescriptorSetKHR(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, static_cast<uint32_t>(writes.size()), writes.data());
  if (push_bytes > 0) api.vkCmdPushConstants(commands, pipeline.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  api.vkCmdDispatch(commands, groups_x, groups_y, 1);
  // Every op reads what the one before wrote: a full compute barrier between dispatches.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT;
  api.vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                           0, 1, &barrier, 0, nullptr, 0, nullptr);
  if (eager) {
    check(api.vkEndCommandBuffer(commands), "vkEndCommandBuffer");
    device_->submit_and_wait(commands);
    device_->free_command_buffer(commands);
  }
}

// ---- ops ----

void VulkanBackend::weight_product(Kernel plain, const PreparedWeight& weight, VkBuffer x, int tokens, VkBuffer y, int64_t y_stride,
                                   const int32_t* expert, VkBuffer ids, int top_k) {
  if (plain == Kernel::kMatmulF32 && tokens >= kTiledMinTokens) {
    tiled_product(cooperative_matrix_ ? Kernel::kCoopmatF32 : Kernel::kTiledF32, weight, x, tokens, y, y_stride);
    return;
  }
  const int kernel = static_cast<int>(plain) + format_offset(weight.format);
  // One row per subgroup: a 64-wide workgroup holds 64 / subgroup size of them.
  const uint32_t rows_per_group = std::max<uint32_t>(1, 64 / std::max<uint32_t>(1, device_->info().subgroup_size));
  for (const WeightChunk& chunk : weight.chunks) {
    const MatmulPush push{static_cast<uint32_t>(chunk.rows), static_cast<uint32_t>(weight.cols), static_cast<uint32_t>(tokens),
                          static_cast<uint32_t>(chunk.first_row), static_cast<uint32_t>(y_stride),
                          expert ? static_cast<uint32_t>(*expert) : 0u, static_cast<uint32_t>(top_k), rows_per_group};
    dispatch(static_cast<Kernel>(kernel), {x, chunk.values.buffer, y, chunk.scales.buffer, ids}, &push, sizeof(push),
             static_cast<uint32_t>((chunk.rows + rows_per_group - 1) / rows_per_group), static_cast<uint32_t>((tokens + 7) / 8));
  }
}

void VulkanBackend::tiled_product(Kernel family, const PreparedWeight& weight, VkBuffer x, int tokens, VkBuffer y, int64_t y_stride) {
  const Kernel kernel = static_cast<Kernel>(static_cast<int>(family) + format_offset(weight.format));
  constexpr int64_t kTokensPerDispatch = kTile * kMaxGroups;
  for (const WeightChunk& chunk : weight.chunks) {
    for (int64_t first_token = 0; first_token < tokens; first_token += kTokensPerDispatch) {
      const TiledPush push{static_cast<uint32_t>(chunk.rows), static_cast<uint32_t>(weight.cols), static_cast<uint32_t>(tokens),
                           static_cast<uint32_t>(chunk.first_row), static_cast<uint32_t>(y_stride), static_cast<uint32_t>(first_token)};
      const int64_t dispatch_tokens = std::min<int64_t>(kTokensPerDispatch, tokens - first_token);
      dispatch(kernel, {x, chunk.values.buffer, y, chunk.scales.buffer}, &push, sizeof(push),
               static_cast<uint32_t>((chunk.rows + kTile - 1) / kTile), static_cast<uint32_t>((dispatch_tokens + kTile - 1) / kTile));
    }
  }
}

bool VulkanBackend::cooperative_matrix_agrees() {
  const int tokens = 64, rows = 96, cols = 160;
  // Values in [-1, 1) from a fixed linear congruential sequence: the same check on every start.
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
  };
  std::vector<float> x(static_cast<size_t>(tokens) * cols);
  std::vector<uint16_t> w(static_cast<size_t>(rows) * cols);
  for (float& value : x) value = next();
  for (uint16_t& value : w) value = float_to_bf16(next());
  PreparedWeight weight;
  weight.format = WeightFormat::kBF16;
  weight.rows = rows;
  weight.cols = cols;
  WeightChunk chunk;
  chunk.rows = rows;
  chunk.values = device_->create_buffer(w.size() * sizeof(uint16_t));
  device_->upload(chunk.values, 0, w.data(), w.size() * sizeof(uint16_t));
  weight.chunks.push_back(chunk);
  DeviceBuffer input = device_->create_buffer(x.size() * sizeof(float));
  device_->upload(input, 0, x.data(), x.size() * sizeof(float));
  const size_t outputs = static_cast<size_t>(tokens) * rows;
  DeviceBuffer plain = device_->create_buffer(outputs * sizeof(float)), cooperative = device_->create_buffer(outputs * sizeof(float));
  tiled_product(Kernel::kTiledF32, weight, input.buffer, tokens, plain.buffer, rows);
  tiled_product(Kernel::kCoopmatF32, weight, input.buffer, tokens, cooperative.buffer, rows);
  std::vector<float> expected(outputs), actual(outputs);
  device_->download(plain, 0, expected.data(), outputs * sizeof(float));
  device_->download(cooperative, 0, actual.data(), outputs * sizeof(float));
  for (DeviceBuffer* buffer : {&chunk.values, &input, &plain, &cooperative}) device_->destroy_buffer(*buffer);
  // Sums of 160 products of magnitude below 1: f16 activations leave errors near 1e-3, a wrong layout
  // or a missing tile errors of order 1. The negated comparison also rejects NaN.
  for (size_t i = 0; i < outputs; ++i) {
    if (!(std::fabs(actual[i] - expected[i]) <= 0.02f + 0.01f * std::fabs(expected[i]))) return false;
  }
  return true;
}

void VulkanBackend::matmul(Buffer x, int rows, Weight weight, Buffer y) {
  weight_product(Kernel::kMatmulF32, weights_.at(static_cast<size_t>(weight.id)), handle(x), rows, handle(y), weight.rows, nullptr,
                 VK_NULL_HANDLE, 0);
}

void VulkanBackend::rms_norm(Buffer x, int64_t rows, int width, Buffer weight, float eps, Buffer out) {
  for (int64_t first = 0; first < rows; first += kMaxGroups) {
    struct {
      uint32_t width, has_weight;
      float eps;
      uint32_t row_base;
    } push{static_cast<uint32_t>(width), weight.valid() ? 1u : 0u, eps, static_cast<uint32_t>(first)};
    dispatch(Kernel::kRmsNorm, {handle(x), weight.valid() ? handle(weight) : VK_NULL_HANDLE, handle(out)}, &push, sizeof(push),
             static_cast<uint32_t>(std::min<int64_t>(kMaxGroups, rows - first)));
  }
}

void VulkanBackend::elementwise(uint32_t op, Buffer a, Buffer b, Buffer ids, int64_t count, uint32_t width, uint32_t stride, uint32_t offset,
                                float f0, float f1) {
  const ElementwisePush push{op, static_cast<uint32_t>(count), width, stride, offset, f0, f1};
  dispatch(Kernel::kElementwise, {handle(a), b.valid() ? handle(b) : VK_NULL_HANDLE, ids.valid() ? handle(ids) : VK_NULL_HANDLE}, &push,
           sizeof(push), groups_for(count));
}

void VulkanBackend::scale(Buffer x, int64_t count, float factor) { elementwise(kScale, x, {}, {}, count, 0, 0, 0, factor, 0.0f); }

void VulkanBackend::scale_columns(Buffer x, int rows, int width, Buffer weights, float factor) {
  elementwise(kScaleColumns, x, weights, {}, static_cast<int64_t>(rows) * width, static_cast<uint32_t>(width), 0, 0, factor, 0.0f);
}

void VulkanBackend::add(Buffer y, Buffer x, int64_t count) { elementwise(kAdd, y, x, {}, count, 0, 0, 0, 0.0f, 0.0f); }

void VulkanBackend::copy(Buffer source, Buffer destination, int64_t count) {
  elementwise(kCopy, destination, source, {}, count, 0, 0, 0, 0.0f, 0.0f);
}

void VulkanBackend::gelu_multiply(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset) {
  elementwise(kGeluMultiply, gate, up, {}, static_cast<int64_t>(rows) * width, static_cast<uint32_t>(width), static_cast<uint32_t>(up_stride),
              static_cast<uint32_t>(up_offset), 0.0f, 0.0f);
}

void VulkanBackend::combine_per_layer_inputs(Buffer context, Buffer inputs, int64_t count, float embed_scale, float combine_scale) {
  elementwise(kCombine, inputs, context, {}, count, 0, 0, 0, embed_scale, combine_scale);
}

void VulkanBackend::rope(Buffer queries, int query_heads, Buffer keys, int key_heads, int rows, int head_dim, Buffer row_table,
                         Buffer inverse_frequencies) {
  const uint32_t push[4] = {static_cast<uint32_t>(rows), static_cast<uint32_t>(query_heads), static_cast<uint32_t>(key_heads),
                            static_cast<uint32_t>(head_dim)};
  dispatch(Kernel::kRope, {handle(queries), handle(keys), handle(row_table), handle(inverse_frequencies)}, push, sizeof(push),
           groups_for(static_cast<int64_t>(rows) * (query_heads + key_heads) * (head_dim / 2)));
}

void VulkanBackend::store_kv(Buffer source, int rows, int64_t row_elements, Buffer row_table, Buffer cache, int capacity, KvFormat format) {
  if (format == KvFormat::kBF16 && row_elements % 2 != 0) fail("Vulkan: a bf16 KV row needs an even number of elements, got {}", row_elements);
  const uint32_t push[3] = {static_cast<uint32_t>(rows), static_cast<uint32_t>(row_elements), static_cast<uint32_t>(capacity)};
  dispatch(format == KvFormat::kBF16 ? Kernel::kStoreKvBF16 : Kernel::kStoreKvF32, {handle(source), handle(row_table), handle(cache)}, push,
           sizeof(push), groups_for(rows * row_elements));
}

void VulkanBackend::attention(Buffer queries, int rows, Buffer row_table, Buffer keys, Buffer values, const AttentionShape& shape, Buffer out) {
  if (shape.head_dim > 512) fail("Vulkan: attention supports head dims up to 512, got {}", shape.head_dim);
  // Scratch for every key a row can see at most; the shader loops over the keys each row really sees.
  const int max_keys = shape.sliding_window > 0 ? std::min(shape.cache_capacity, shape.sliding_window) : shape.cache_capacity;
  const int64_t pairs = static_cast<int64_t>(rows) * shape.query_heads;
  const VkBuffer scores = scratch(attention_scores_, static_cast<size_t>(pairs * max_keys) * sizeof(float));
  const Kernel kernel = shape.kv_format == KvFormat::kBF16 ? Kernel::kAttentionBF16 : Kernel::kAttentionF32;
  const bool derived = shape.keys_derived();
  for (int64_t first = 0; first < pairs; first += kMaxGroups) {
    const AttentionPush push{static_cast<uint32_t>(shape.query_heads), static_cast<uint32_t>(shape.kv_heads), static_cast<uint32_t>(shape.head_dim),
                             static_cast<uint32_t>(shape.first_query_head), static_cast<uint32_t>(shape.first_kv_head),
                             static_cast<uint32_t>(shape.group_size), static_cast<uint32_t>(shape.cache_capacity),
                             static_cast<uint32_t>(shape.sliding_window), static_cast<uint32_t>(max_keys), static_cast<uint32_t>(first),
                             derived ? 1u : 0u, static_cast<uint32_t>(shape.derived_keys.rotated_pairs)};
    dispatch(kernel,
             {handle(queries), handle(row_table), derived ? handle(values) : handle(keys), handle(values), scores, handle(out),
              derived ? handle(shape.derived_keys.key_norm) : VK_NULL_HANDLE, derived ? handle(shape.derived_keys.rotations) : VK_NULL_HANDLE},
             &push, sizeof(push),
             static_cast<uint32_t>(std::min<int64_t>(kMaxGroups, pairs - first)));
  }
}

void VulkanBackend::route_experts(Buffer router_logits, int rows, int experts, int top_k, Buffer per_expert_scale, Buffer chosen_experts,
                                  Buffer chosen_weights) {
  const uint32_t push[3] = {static_cast<uint32_t>(rows), static_cast<uint32_t>(experts), static_cast<uint32_t>(top_k)};
  dispatch(Kernel::kRouteExperts, {handle(router_logits), handle(per_expert_scale), handle(chosen_experts), handle(chosen_weights)}, push,
           sizeof(push), groups_for(rows));
}

// Each expert's dispatches compute only the assignments that chose it; workgroups with none read no
// weights. The combine adds each row's experts in ascending index order, as the reference does.
void VulkanBackend::expert_feed_forward(Buffer input, int rows, Buffer chosen_experts, Buffer chosen_weights, const ExpertSet& experts,
                                        Buffer out) {
  const int64_t assignments = static_cast<int64_t>(rows) * experts.top_k;
  const VkBuffer hidden = scratch(expert_hidden_, static_cast<size_t>(assignments) * 2 * experts.width * sizeof(float));
  const VkBuffer activated = scratch(expert_activated_, static_cast<size_t>(assignments) * experts.width * sizeof(float));
  const VkBuffer output = scratch(expert_output_, static_cast<size_t>(assignments) * experts.hidden * sizeof(float));
  for (size_t expert = 0; expert < experts.gate_up.size(); ++expert) {
    if (!experts.gate_up[expert].present()) fail("Vulkan: expert {} was not prepared", expert);
    const int32_t id = static_cast<int32_t>(expert);
    weight_product(Kernel::kGatheredF32, weights_.at(static_cast<size_t>(experts.gate_up[expert].id)), handle(input), static_cast<int>(assignments),
                   hidden, 2 * experts.width, &id, handle(chosen_experts), experts.top_k);
  }
  const ElementwisePush push{kGeluGateUp, static_cast<uint32_t>(assignments * experts.width), static_cast<uint32_t>(experts.width), 0, 0, 0.0f, 0.0f};
  dispatch(Kernel::kElementwise, {activated, hidden, VK_NULL_HANDLE}, &push, sizeof(push), groups_for(assignments * experts.width));
  for (size_t expert = 0; expert < experts.down.size(); ++expert) {
    const int32_t id = static_cast<int32_t>(expert);
    weight_product(Kernel::kGatheredF32, weights_.at(static_cast<size_t>(experts.down[expert].id)), activated, static_cast<int>(assignments), output,
                   experts.hidden, &id, handle(chosen_experts), 0);
  }
  const uint32_t combine[3] = {static_cast<uint32_t>(rows), static_cast<uint32_t>(experts.hidden), static_cast<uint32_t>(experts.top_k)};
  dispatch(Kernel::kExpertCombine, {output, handle(chosen_experts), handle(chosen_weights), handle(out)}, combine, sizeof(combine),
           groups_for(static_cast<int64_t>(rows) * experts.hidden));
}

void VulkanBackend::gather_rows(Buffer source, Buffer row_ids, int rows, int width, Buffer out) {
  elementwise(kGatherRows, out, source, row_ids, static_cast<int64_t>(rows) * width, static_cast<uint32_t>(width), 0, 0, 0.0f, 0.0f);
}

void VulkanBackend::softcap(Buffer values, int64_t count, float cap) { elementwise(kSoftcap, values, {}, {}, count, 0, 0, 0, cap, 0.0f); }

void VulkanBackend::argmax(Buffer values, int rows, int width, Buffer ids) {
  const uint32_t push = static_cast<uint32_t>(width);
  dispatch(Kernel::kArgmax, {handle(values), handle(ids)}, &push, sizeof(push), static_cast<uint32_t>(rows));
}

void VulkanBackend::log_sum_exp(Buffer values, int rows, int width, Buffer out) {
  const uint32_t push = static_cast<uint32_t>(width);
  dispatch(Kernel::kLogSumExp, {handle(values), handle(out)}, &push, sizeof(push), static_cast<uint32_t>(rows));
}

void VulkanBackend::all_reduce_sum(Buffer, int64_t, parallel::Communicator&) {
  fail("the vulkan backend does not run tensor parallelism; use the cpu backend for --tp");
}

void VulkanBackend::all_gather_rows(Buffer, int, std::span<const size_t>, Buffer, parallel::Communicator&) {
  fail("the vulkan backend does not run tensor parallelism; use the cpu backend for --tp");
}

}  // namespace gemma4rt::backend::vulkan
