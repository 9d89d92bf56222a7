// The GPU backend on Vulkan compute: the device-resident design of the Inferentia2 port on any Vulkan
// 1.2 device (NVIDIA, AMD, Intel through their drivers; Mesa's lavapipe on any CI machine). Weights
// are uploaded once (f32, bf16 or q8; split into row chunks no larger than maxStorageBufferRange),
// activations and the KV cache live in device buffers, and each step's ops are recorded once per
// StepShape into a command buffer that later steps of the same shape replay with new inputs.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/vulkan/vulkan_device.h"

namespace gemma4rt::backend::vulkan {

class VulkanBackend : public Backend {
 public:
  explicit VulkanBackend(int device_index);
  ~VulkanBackend() override;

  std::string name() const override { return "vulkan"; }
  std::string kernels() const override;
  int threads() const override { return 1; }
  int default_chunk_tokens() const override { return 128; }
  WeightFormat default_weight_format(DType stored) const override;
  KvFormat default_kv_format() const override { return KvFormat::kBF16; }
  void check_formats(WeightFormat weights, KvFormat kv) const override;
  bool supports_tensor_parallel() const override { return false; }
  uint64_t memory_bytes() const override { return device_->info().device_local_bytes; }

  Buffer allocate(size_t bytes) override;
  void upload(Buffer destination, size_t offset, const void* source, size_t bytes) override;
  void download(Buffer source, size_t offset, void* destination, size_t bytes) override;
  Weight prepare_weight(const TensorView& view, WeightFormat format) override;
  size_t weight_read_bytes(Weight weight) const override;
  size_t owned_weight_bytes() const override { return weight_bytes_; }
  size_t buffer_bytes() const override { return buffer_bytes_; }
  double measure_read_bandwidth() override;

  bool begin_step(const StepShape& shape) override;
  void end_step() override;

  void matmul(Buffer x, int rows, Weight weight, Buffer y) override;
  void rms_norm(Buffer x, int64_t rows, int width, Buffer weight, float eps, Buffer out) override;
  void scale(Buffer x, int64_t count, float factor) override;
  void scale_columns(Buffer x, int rows, int width, Buffer weights, float factor) override;
  void add(Buffer y, Buffer x, int64_t count) override;
  void copy(Buffer source, Buffer destination, int64_t count) override;
  void gelu_multiply(Buffer gate, Buffer up, int rows, int width, int64_t up_stride, int64_t up_offset) override;
  void combine_per_layer_inputs(Buffer context, Buffer inputs, int64_t count, float embed_scale, float combine_scale) override;
  void rope(Buffer queries, int query_heads, Buffer keys, int key_heads, int rows, int head_dim, Buffer row_table,
            Buffer inverse_frequencies) override;
  void store_kv(Buffer source, int rows, int64_t row_elements, Buffer row_table, Buffer cache, int capacity, KvFormat format) override;
  void attention(Buffer queries, int rows, Buffer row_table, Buffer keys, Buffer values, const AttentionShape& shape, Buffer out) override;
  void route_experts(Buffer router_logits, int rows, int experts, int top_k, Buffer per_expert_scale, Buffer chosen_experts,
                     Buffer chosen_weights) override;
  void expert_feed_forward(Buffer input, int rows, Buffer chosen_experts, Buffer chosen_weights, const ExpertSet& experts,
                           Buffer out) override;
  void gather_rows(Buffer source, Buffer row_ids, int rows, int width, Buffer out) override;
  void softcap(Buffer values, int64_t count, float cap) override;
  void argmax(Buffer values, int rows, int width, Buffer ids) override;
  void log_sum_exp(Buffer values, int rows, int width, Buffer out) override;
  void all_reduce_sum(Buffer values, int64_t count, parallel::Communicator& communicator) override;
  void all_gather_rows(Buffer local, int rows, std::span<const size_t> counts, Buffer out, parallel::Communicator& communicator) override;

 private:
  struct WeightChunk {
    int64_t first_row = 0, rows = 0;
    DeviceBuffer values, scales;   // scales: q8 and q4 only
  };
  struct PreparedWeight {
    WeightFormat format = WeightFormat::kF32;
    int64_t rows = 0, cols = 0;
    std::vector<WeightChunk> chunks;
  };
  // Each product family lists its f32, bf16, q8, q4 variants in that order (weight_product relies on it).
  enum class Kernel {
    kMatmulF32, kMatmulBF16, kMatmulQ8, kMatmulQ4, kGatheredF32, kGatheredBF16, kGatheredQ8, kGatheredQ4,
    kTiledF32, kTiledBF16, kTiledQ8, kTiledQ4, kCoopmatF32, kCoopmatBF16, kCoopmatQ8, kCoopmatQ4,
    kRmsNorm, kElementwise, kRope, kStoreKvF32, kStoreKvBF16, kAttentionF32, kAttentionBF16,
    kRouteExperts, kExpertCombine, kArgmax, kLogSumExp, kReadBandwidth, kCount
  };
  // One dispatch: into the step being recorded, or submitted at once outside a step.
  void dispatch(Kernel kernel, std::initializer_list<VkBuffer> buffers, const void* push, uint32_t push_bytes, uint32_t groups_x,
                uint32_t groups_y = 1);
  void elementwise(uint32_t op, Buffer a, Buffer b, Buffer ids, int64_t count, uint32_t width, uint32_t stride, uint32_t offset,
                   float f0, float f1);
  void weight_product(Kernel plain, const PreparedWeight& weight, VkBuffer x, int tokens, VkBuffer y, int64_t y_stride,
                      const int32_t* expert, VkBuffer ids, int top_k);
  // The prefill product: 64 x 64 tiles of tokens x rows, `family` kTiledF32 or kCoopmatF32.
  void tiled_product(Kernel family, const PreparedWeight& weight, VkBuffer x, int tokens, VkBuffer y, int64_t y_stride);
  // Runs a small bf16 product through both tiled shaders; true when the cooperative one agrees.
  bool cooperative_matrix_agrees();
  VkBuffer handle(Buffer buffer) const { return buffers_.at(static_cast<size_t>(buffer.id)).buffer; }
  // A scratch buffer of at least `bytes`; a grown one replaces it, the old one kept alive for the
  // recordings that still use it.
  VkBuffer scratch(DeviceBuffer& buffer, size_t bytes);

  std::unique_ptr<Device> device_;
  Pipeline pipelines_[static_cast<int>(Kernel::kCount)];
  bool cooperative_matrix_ = false;  // prefill products run matmul_coopmat.comp
  std::vector<DeviceBuffer> buffers_;
  std::vector<PreparedWeight> weights_;
  std::vector<DeviceBuffer> retired_;
  DeviceBuffer dummy_, attention_scores_, expert_hidden_, expert_activated_, expert_output_;
  size_t buffer_bytes_ = 0, weight_bytes_ = 0;
  std::map<std::tuple<int, int, bool>, VkCommandBuffer> recorded_;
  VkCommandBuffer recording_ = VK_NULL_HANDLE;
  VkCommandBuffer replaying_ = VK_NULL_HANDLE;
};

}  // namespace gemma4rt::backend::vulkan
