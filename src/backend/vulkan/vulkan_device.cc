#include "backend/vulkan/vulkan_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace gemma4rt::backend::vulkan {
namespace {

constexpr size_t kStagingBytes = size_t{64} << 20;

VkInstance create_instance(VulkanApi& api) {
  api.load_loader();
  uint32_t loader_version = VK_API_VERSION_1_0;
  if (api.vkEnumerateInstanceVersion != nullptr) api.vkEnumerateInstanceVersion(&loader_version);
  if (loader_version < VK_API_VERSION_1_2) fail("Vulkan: the loader supports Vulkan {}; gemma4rt needs 1.2", version_string(loader_version));
  VkApplicationInfo application{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  application.pApplicationName = "gemma4rt";
  application.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo create{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  create.pApplicationInfo = &application;
  VkInstance instance = VK_NULL_HANDLE;
  const VkResult result = api.vkCreateInstance(&create, nullptr, &instance);
  if (result == VK_ERROR_INCOMPATIBLE_DRIVER) {
    fail("Vulkan: no driver is installed (no ICD answered; Debian: mesa-vulkan-drivers for lavapipe, or the GPU vendor's driver)");
  }
  check(result, "vkCreateInstance");
  api.load_instance(instance);
  return instance;
}

std::vector<VkPhysicalDevice> physical_devices(const VulkanApi& api, VkInstance instance) {
  uint32_t count = 0;
  check(api.vkEnumeratePhysicalDevices(instance, &count, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devices(count);
  check(api.vkEnumeratePhysicalDevices(instance, &count, devices.data()), "vkEnumeratePhysicalDevices");
  return devices;
}

const char* type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

// Whether the device lists the one cooperative-matrix shape matmul_coopmat.comp uses.
bool has_f16_coopmat_shape(const VulkanApi& api, VkPhysicalDevice physical) {
  if (api.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV == nullptr) return false;
  uint32_t count = 0;
  if (api.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(physical, &count, nullptr) != VK_SUCCESS) return false;
  std::vector<VkCooperativeMatrixPropertiesNV> shapes(count, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  if (api.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(physical, &count, shapes.data()) != VK_SUCCESS) return false;
  return std::any_of(shapes.begin(), shapes.begin() + count, [](const VkCooperativeMatrixPropertiesNV& shape) {
    return shape.MSize == 16 && shape.NSize == 16 && shape.KSize == 16 && shape.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
           shape.BType == VK_COMPONENT_TYPE_FLOAT16_NV && shape.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
           shape.DType == VK_COMPONENT_TYPE_FLOAT32_NV && shape.scope == VK_SCOPE_SUBGROUP_NV;
  });
}

DeviceInfo describe(const VulkanApi& api, VkPhysicalDevice physical, int index) {
  DeviceInfo info;
  info.index = index;
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 properties{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  properties.pNext = &subgroup;
  api.vkGetPhysicalDeviceProperties2(physical, &properties);
  info.name = properties.properties.deviceName;
  info.type = type_name(properties.properties.deviceType);
  info.api_version = properties.properties.apiVersion;
  info.max_storage_buffer_range = properties.properties.limits.maxStorageBufferRange;
  info.subgroup_size = subgroup.subgroupSize;
  info.subgroup_arithmetic = (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0 &&
                             (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;

  uint32_t extension_count = 0;
  api.vkEnumerateDeviceExtensionProperties(physical, nullptr, &extension_count, nullptr);
  std::vector<VkExtensionProperties> extensions(extension_count);
  api.vkEnumerateDeviceExtensionProperties(physical, nullptr, &extension_count, extensions.data());
  for (const VkExtensionProperties& extension : extensions) {
    const std::string_view name = extension.extensionName;
    if (name == "VK_KHR_push_descriptor") info.push_descriptor = true;
    if (name == "VK_KHR_shader_integer_dot_product") info.integer_dot_product = true;
    if (name == "VK_KHR_cooperative_matrix") info.cooperative_matrix = true;
    if (name == "VK_NV_cooperative_matrix") info.cooperative_matrix_nv = true;
  }

  VkPhysicalDeviceCooperativeMatrixFeaturesNV cooperative{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceVulkan12Features features12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features features11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  features11.pNext = &features12;
  // Chained only where the extension exists: an unknown structure in the chain is invalid usage.
  if (info.cooperative_matrix_nv) features12.pNext = &cooperative;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &features11;
  if (info.api_version >= VK_API_VERSION_1_2) {
    api.vkGetPhysicalDeviceFeatures2(physical, &features);
    info.storage_16bit = features11.storageBuffer16BitAccess;
    info.storage_8bit = features12.storageBuffer8BitAccess;
    if (info.cooperative_matrix_nv && cooperative.cooperativeMatrix && features12.shaderFloat16 && features12.vulkanMemoryModel &&
        info.subgroup_size == 32) {
      info.cooperative_matrix_nv_f16 = has_f16_coopmat_shape(api, physical);
    }
  }

  VkPhysicalDeviceMemoryProperties memory{};
  api.vkGetPhysicalDeviceMemoryProperties(physical, &memory);
  for (uint32_t heap = 0; heap < memory.memoryHeapCount; ++heap) {
    if (memory.memoryHeaps[heap].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      info.device_local_bytes = std::max<uint64_t>(info.device_local_bytes, memory.memoryHeaps[heap].size);
    }
  }
  return info;
}

// Every device the instance sees, described; throws the one-line error when there is none.
std::vector<DeviceInfo> describe_devices(const VulkanApi& api, const std::vector<VkPhysicalDevice>& physical) {
  std::vector<DeviceInfo> devices;
  for (size_t index = 0; index < physical.size(); ++index) devices.push_back(describe(api, physical[index], static_cast<int>(index)));
  if (devices.empty()) fail("Vulkan: the loader found no device (is a driver installed? Debian: mesa-vulkan-drivers for lavapipe)");
  return devices;
}

}  // namespace

std::string version_string(uint32_t version) {
  return fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version), VK_API_VERSION_PATCH(version));
}

std::vector<DeviceInfo> list_devices() {
  VulkanApi api;
  VkInstance instance = create_instance(api);
  std::vector<DeviceInfo> devices;
  try {
    devices = describe_devices(api, physical_devices(api, instance));
  } catch (...) {
    api.vkDestroyInstance(instance, nullptr);
    throw;
  }
  api.vkDestroyInstance(instance, nullptr);
  return devices;
}

int choose_device(const std::vector<DeviceInfo>& devices, int requested) {
  if (requested < 0) {
    if (const char* environment = std::getenv("GEMMA4RT_VULKAN_DEVICE"); environment != nullptr && *environment != '\0') {
      char* end = nullptr;
      const long value = std::strtol(environment, &end, 10);
      if (*end != '\0' || value < 0) fail("GEMMA4RT_VULKAN_DEVICE must be a device index (gemma4rt devices lists them), got \"{}\"", environment);
      requested = static_cast<int>(value);
    }
  }
  if (requested >= 0) {
    if (requested >= static_cast<int>(devices.size())) {
      fail("Vulkan device {} does not exist: {} device{} found (gemma4rt devices lists them)", requested, devices.size(),
           devices.size() == 1 ? "" : "s");
    }
    return requested;
  }
  for (const char* type : {"discrete", "integrated"}) {
    for (const DeviceInfo& device : devices) {
      if (device.type == type) return device.index;
    }
  }
  std::vector<std::string> found;
  for (const DeviceInfo& device : devices) found.push_back(fmt::format("{}: {} ({})", device.index, device.name, device.type));
  fail("no Vulkan GPU found (devices: {}); a CPU device runs only when named with --device N or GEMMA4RT_VULKAN_DEVICE",
       fmt::join(found, ", "));
}

Device::Device(int requested_device) {
  instance_ = create_instance(api_);
  const std::vector<VkPhysicalDevice> physical = physical_devices(api_, instance_);
  const std::vector<DeviceInfo> devices = describe_devices(api_, physical);
  const int chosen = choose_device(devices, requested_device);
  physical_ = physical[static_cast<size_t>(chosen)];
  info_ = devices[static_cast<size_t>(chosen)];
  if (info_.api_version < VK_API_VERSION_1_2) fail("Vulkan device {} ({}) supports Vulkan {}; gemma4rt needs 1.2", chosen, info_.name, version_string(info_.api_version));
  if (!info_.push_descriptor) fail("Vulkan device {} ({}) lacks VK_KHR_push_descriptor, which the backend needs", chosen, info_.name);
  if (!info_.subgroup_arithmetic) fail("Vulkan device {} ({}) lacks subgroup arithmetic in compute shaders, which the products need", chosen, info_.name);

  uint32_t family_count = 0;
  api_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &family_count, nullptr);
  std::vector<VkQueueFamilyProperties> families(family_count);
  api_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &family_count, families.data());
  bool found = false;
  for (uint32_t family = 0; family < family_count && !found; ++family) {
    if (families[family].queueFlags & VK_QUEUE_COMPUTE_BIT) queue_family_ = family, found = true;
  }
  if (!found) fail("Vulkan device {} ({}) has no compute queue", chosen, info_.name);

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = queue_family_;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  std::vector<const char*> extensions = {"VK_KHR_push_descriptor"};
  VkDeviceCreateInfo create{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  // The cooperative-matrix product's features, only where describe() found all of them.
  VkPhysicalDeviceCooperativeMatrixFeaturesNV cooperative{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceVulkan12Features features12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  if (info_.cooperative_matrix_nv_f16) {
    extensions.push_back("VK_NV_cooperative_matrix");
    cooperative.cooperativeMatrix = VK_TRUE;
    features12.shaderFloat16 = VK_TRUE;
    features12.vulkanMemoryModel = VK_TRUE;
    features12.pNext = &cooperative;
    create.pNext = &features12;
  }
  create.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  create.ppEnabledExtensionNames = extensions.data();
  check(api_.vkCreateDevice(physical_, &create, nullptr, &device_), "vkCreateDevice");
  api_.load_device(device_);
  api_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  api_.vkGetPhysicalDeviceMemoryProperties(physical_, &memory_properties_);

  VkCommandPoolCreateInfo pool{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = queue_family_;
  check(api_.vkCreateCommandPool(device_, &pool, nullptr, &command_pool_), "vkCreateCommandPool");
  transfer_commands_ = allocate_command_buffer();
  VkFenceCreateInfo fence{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(api_.vkCreateFence(device_, &fence, nullptr, &fence_), "vkCreateFence");

  // The staging buffer: host-visible, for every transfer in both directions.
  VkBufferCreateInfo buffer{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  buffer.size = kStagingBytes;
  buffer.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  check(api_.vkCreateBuffer(device_, &buffer, nullptr, &staging_.buffer), "vkCreateBuffer (staging)");
  VkMemoryRequirements requirements;
  api_.vkGetBufferMemoryRequirements(device_, staging_.buffer, &requirements);
  VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = requirements.size;
  allocate.memoryTypeIndex = memory_type(requirements.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  check(api_.vkAllocateMemory(device_, &allocate, nullptr, &staging_.memory), "vkAllocateMemory (staging)");
  check(api_.vkBindBufferMemory(device_, staging_.buffer, staging_.memory, 0), "vkBindBufferMemory (staging)");
  check(api_.vkMapMemory(device_, staging_.memory, 0, kStagingBytes, 0, &staging_mapped_), "vkMapMemory (staging)");
  staging_.bytes = kStagingBytes;
}

Device::~Device() {
  if (device_ == VK_NULL_HANDLE) return;
  api_.vkQueueWaitIdle(queue_);
  for (Pipeline& pipeline : pipelines_) {
    api_.vkDestroyPipeline(device_, pipeline.pipeline, nullptr);
    api_.vkDestroyPipelineLayout(device_, pipeline.layout, nullptr);
    api_.vkDestroyDescriptorSetLayout(device_, pipeline.descriptors, nullptr);
  }
  api_.vkUnmapMemory(device_, staging_.memory);
  destroy_buffer(staging_);
  api_.vkDestroyFence(device_, fence_, nullptr);
  api_.vkDestroyCommandPool(device_, command_pool_, nullptr);
  api_.vkDestroyDevice(device_, nullptr);
  api_.vkDestroyInstance(instance_, nullptr);
}

uint32_t Device::memory_type(uint32_t allowed, VkMemoryPropertyFlags wanted) const {
  for (uint32_t type = 0; type < memory_properties_.memoryTypeCount; ++type) {
    if ((allowed & (1u << type)) && (memory_properties_.memoryTypes[type].propertyFlags & wanted) == wanted) return type;
  }
  fail("Vulkan device {} has no memory type with properties {:#x}", info_.name, static_cast<uint32_t>(wanted));
}

DeviceBuffer Device::create_buffer(size_t bytes) {
  DeviceBuffer result;
  result.bytes = std::max<size_t>(16, (bytes + 15) / 16 * 16);
  if (result.bytes > info_.max_storage_buffer_range) {
    fail("Vulkan: a buffer of {} bytes exceeds the device's maxStorageBufferRange ({} bytes)", result.bytes, info_.max_storage_buffer_range);
  }
  VkBufferCreateInfo create{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  create.size = result.bytes;
  create.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  check(api_.vkCreateBuffer(device_, &create, nullptr, &result.buffer), "vkCreateBuffer");
  VkMemoryRequirements requirements;
  api_.vkGetBufferMemoryRequirements(device_, result.buffer, &requirements);
  VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = requirements.size;
  allocate.memoryTypeIndex = memory_type(requirements.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  const VkResult allocated = api_.vkAllocateMemory(device_, &allocate, nullptr, &result.memory);
  if (allocated == VK_ERROR_OUT_OF_DEVICE_MEMORY || allocated == VK_ERROR_OUT_OF_HOST_MEMORY) {
    api_.vkDestroyBuffer(device_, result.buffer, nullptr);
    fail("Vulkan device {} is out of memory allocating {} bytes", info_.name, result.bytes);
  }
  check(allocated, "vkAllocateMemory");
  check(api_.vkBindBufferMemory(device_, result.buffer, result.memory, 0), "vkBindBufferMemory");
  // Zeroed, as the host backends' buffers are (an unwritten KV slot reads as zero), before any upload.
  open_transfers();
  api_.vkCmdFillBuffer(transfer_commands_, result.buffer, 0, VK_WHOLE_SIZE, 0);
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  api_.vkCmdPipelineBarrier(transfer_commands_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &barrier, 0, nullptr, 0,
                            nullptr);
  return result;
}

void Device::destroy_buffer(DeviceBuffer& buffer) {
  if (buffer.buffer != VK_NULL_HANDLE) api_.vkDestroyBuffer(device_, buffer.buffer, nullptr);
  if (buffer.memory != VK_NULL_HANDLE) api_.vkFreeMemory(device_, buffer.memory, nullptr);
  buffer = {};
}

void Device::open_transfers() {
  if (transfers_open_) return;
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(api_.vkBeginCommandBuffer(transfer_commands_, &begin), "vkBeginCommandBuffer");
  transfers_open_ = true;
}

// Ends the transfer recording with a barrier: what the copies wrote is visible to the work after them.
void Device::close_transfers() {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  api_.vkCmdPipelineBarrier(transfer_commands_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                            0, 1, &barrier, 0, nullptr, 0, nullptr);
  check(api_.vkEndCommandBuffer(transfer_commands_), "vkEndCommandBuffer");
  transfers_open_ = false;
}

void Device::flush() {
  if (transfers_open_) submit_and_wait(VK_NULL_HANDLE);
}

void Device::record_copy(VkBuffer from, size_t from_offset, VkBuffer to, size_t to_offset, size_t bytes) {
  open_transfers();
  const VkBufferCopy region{from_offset, to_offset, bytes};
  api_.vkCmdCopyBuffer(transfer_commands_, from, to, 1, &region);
}

void Device::upload(const DeviceBuffer& destination, size_t offset, const void* source, size_t bytes) {
  if (offset + bytes > destination.bytes) fail("Vulkan: an upload of {} bytes at {} overruns a buffer of {}", bytes, offset, destination.bytes);
  for (size_t done = 0; done < bytes;) {
    if (staged_bytes_ == kStagingBytes) flush();
    const size_t part = std::min(kStagingBytes - staged_bytes_, bytes - done);
    std::memcpy(static_cast<std::byte*>(staging_mapped_) + staged_bytes_, static_cast<const std::byte*>(source) + done, part);
    record_copy(staging_.buffer, staged_bytes_, destination.buffer, offset + done, part);
    staged_bytes_ = std::min(kStagingBytes, (staged_bytes_ + part + 15) / 16 * 16);
    done += part;
  }
}

void Device::download(const DeviceBuffer& source, size_t offset, void* destination, size_t bytes) {
  if (offset + bytes > source.bytes) fail("Vulkan: a download of {} bytes at {} overruns a buffer of {}", bytes, offset, source.bytes);
  flush();
  for (size_t done = 0; done < bytes; done += kStagingBytes) {
    const size_t part = std::min(kStagingBytes, bytes - done);
    record_copy(source.buffer, offset + done, staging_.buffer, 0, part);
    submit_and_wait(VK_NULL_HANDLE);
    std::memcpy(static_cast<std::byte*>(destination) + done, staging_mapped_, part);
  }
}

Pipeline Device::create_pipeline(std::span<const uint32_t> spirv, int bindings, uint32_t push_constant_bytes) {
  Pipeline pipeline;
  pipeline.bindings = bindings;
  pipeline.push_constant_bytes = push_constant_bytes;
  std::vector<VkDescriptorSetLayoutBinding> layout_bindings(static_cast<size_t>(bindings));
  for (int binding = 0; binding < bindings; ++binding) {
    layout_bindings[binding] = {static_cast<uint32_t>(binding), VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo descriptors{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  descriptors.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  descriptors.bindingCount = static_cast<uint32_t>(bindings);
  descriptors.pBindings = layout_bindings.data();
  check(api_.vkCreateDescriptorSetLayout(device_, &descriptors, nullptr, &pipeline.descriptors), "vkCreateDescriptorSetLayout");
  const VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_bytes};
  VkPipelineLayoutCreateInfo layout{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout.setLayoutCount = 1;
  layout.pSetLayouts = &pipeline.descriptors;
  layout.pushConstantRangeCount = push_constant_bytes > 0 ? 1 : 0;
  layout.pPushConstantRanges = &push;
  check(api_.vkCreatePipelineLayout(device_, &layout, nullptr, &pipeline.layout), "vkCreatePipelineLayout");
  VkShaderModuleCreateInfo module_info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  module_info.codeSize = spirv.size_bytes();
  module_info.pCode = spirv.data();
  VkShaderModule module = VK_NULL_HANDLE;
  check(api_.vkCreateShaderModule(device_, &module_info, nullptr, &module), "vkCreateShaderModule");
  VkComputePipelineCreateInfo create{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  create.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, nullptr, 0, VK_SHADER_STAGE_COMPUTE_BIT, module, "main", nullptr};
  create.layout = pipeline.layout;
  const VkResult result = api_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &create, nullptr, &pipeline.pipeline);
  api_.vkDestroyShaderModule(device_, module, nullptr);
  check(result, "vkCreateComputePipelines");
  pipelines_.push_back(pipeline);
  return pipeline;
}

VkCommandBuffer Device::allocate_command_buffer() {
  VkCommandBufferAllocateInfo allocate{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  allocate.commandPool = command_pool_;
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = 1;
  VkCommandBuffer command_buffer = VK_NULL_HANDLE;
  check(api_.vkAllocateCommandBuffers(device_, &allocate, &command_buffer), "vkAllocateCommandBuffers");
  return command_buffer;
}

void Device::free_command_buffer(VkCommandBuffer command_buffer) { api_.vkFreeCommandBuffers(device_, command_pool_, 1, &command_buffer); }

void Device::submit_and_wait(VkCommandBuffer command_buffer) {
  VkCommandBuffer buffers[2];
  uint32_t count = 0;
  if (transfers_open_) {
    close_transfers();
    buffers[count++] = transfer_commands_;
  }
  if (command_buffer != VK_NULL_HANDLE) buffers[count++] = command_buffer;
  if (count == 0) return;
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = count;
  submit.pCommandBuffers = buffers;
  check(api_.vkQueueSubmit(queue_, 1, &submit, fence_), "vkQueueSubmit");
  check(api_.vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  check(api_.vkResetFences(device_, 1, &fence_), "vkResetFences");
  staged_bytes_ = 0;
}

}  // namespace gemma4rt::backend::vulkan
