// One Vulkan device for compute: its discovery (every device the loader sees, with the features the
// backend cares about), the choice among them, device buffers, staged transfers and compute pipelines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_api.h"

namespace gemma4rt::backend::vulkan {

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string type;                  // "discrete", "integrated", "virtual", "cpu", "other"
  uint32_t api_version = 0;
  uint64_t device_local_bytes = 0;   // the largest device-local heap
  uint32_t subgroup_size = 0;
  uint64_t max_storage_buffer_range = 0;
  bool storage_16bit = false;        // storageBuffer16BitAccess
  bool storage_8bit = false;         // storageBuffer8BitAccess
  bool subgroup_arithmetic = false;  // subgroup add/max in compute shaders
  bool integer_dot_product = false;  // VK_KHR_shader_integer_dot_product
  bool cooperative_matrix = false;   // VK_KHR_cooperative_matrix
  bool cooperative_matrix_nv = false;  // VK_NV_cooperative_matrix
  // VK_NV_cooperative_matrix with what matmul_coopmat.comp needs: the cooperativeMatrix feature, a
  // 16x16x16 f16 x f16 -> f32 subgroup shape, shaderFloat16, vulkanMemoryModel and subgroups of 32.
  // Enabled at device creation when true.
  bool cooperative_matrix_nv_f16 = false;
  bool push_descriptor = false;      // VK_KHR_push_descriptor (required)
};

std::string version_string(uint32_t version);

// Every Vulkan device the loader finds. Throws Error with one clear line when there is no loader, no
// driver, or no device.
std::vector<DeviceInfo> list_devices();

// The device `--backend vulkan` runs on: `requested` (>= 0, or GEMMA4RT_VULKAN_DEVICE) if given, else
// the first discrete GPU, then the first integrated one. A CPU device (lavapipe) only when named.
int choose_device(const std::vector<DeviceInfo>& devices, int requested);

struct DeviceBuffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  size_t bytes = 0;
};

struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout descriptors = VK_NULL_HANDLE;
  int bindings = 0;
  uint32_t push_constant_bytes = 0;
};

class Device {
 public:
  explicit Device(int requested_device);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  const VulkanApi& api() const { return api_; }
  VkDevice handle() const { return device_; }

  // A device-local storage buffer of at least `bytes` (zeroed).
  DeviceBuffer create_buffer(size_t bytes);
  void destroy_buffer(DeviceBuffer& buffer);
  // Host -> device: staged and recorded, then submitted with the next submission (a step's inputs
  // travel in the same vkQueueSubmit as the step). `source` may be reused as soon as this returns.
  void upload(const DeviceBuffer& destination, size_t offset, const void* source, size_t bytes);
  // Device -> host, after everything submitted or staged before; waits for the copy.
  void download(const DeviceBuffer& source, size_t offset, void* destination, size_t bytes);
  // Submits the staged uploads now.
  void flush();

  // A compute pipeline from SPIR-V with `bindings` storage buffers (push descriptors) and push constants.
  Pipeline create_pipeline(std::span<const uint32_t> spirv, int bindings, uint32_t push_constant_bytes);

  VkCommandBuffer allocate_command_buffer();
  void free_command_buffer(VkCommandBuffer command_buffer);
  // Submits the staged uploads and `command_buffer` together, and waits for completion.
  void submit_and_wait(VkCommandBuffer command_buffer);

 private:
  uint32_t memory_type(uint32_t allowed, VkMemoryPropertyFlags wanted) const;
  void record_copy(VkBuffer from, size_t from_offset, VkBuffer to, size_t to_offset, size_t bytes);
  void open_transfers();
  void close_transfers();

  VulkanApi api_;
  DeviceInfo info_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer transfer_commands_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_properties_{};
  DeviceBuffer staging_;
  void* staging_mapped_ = nullptr;
  size_t staged_bytes_ = 0;      // staging bytes holding uploads not yet submitted
  bool transfers_open_ = false;  // transfer_commands_ is recording staged uploads
  std::vector<Pipeline> pipelines_;
};

}  // namespace gemma4rt::backend::vulkan
