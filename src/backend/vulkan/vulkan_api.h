// The Vulkan entry points the backend uses, loaded at run time from the system loader
// (libvulkan.so.1) rather than linked: the gemma4rt binary starts on a machine without Vulkan, and only
// `--backend vulkan` (or `gemma4rt devices`) says, in one line, that the loader or a driver is missing.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

namespace gemma4rt::backend::vulkan {

#define GEMMA4RT_VULKAN_INSTANCE_FUNCTIONS(X)  \
  X(vkDestroyInstance)                         \
  X(vkEnumeratePhysicalDevices)                \
  X(vkGetPhysicalDeviceProperties)             \
  X(vkGetPhysicalDeviceProperties2)            \
  X(vkGetPhysicalDeviceFeatures2)              \
  X(vkGetPhysicalDeviceMemoryProperties)       \
  X(vkGetPhysicalDeviceQueueFamilyProperties)  \
  X(vkEnumerateDeviceExtensionProperties)      \
  X(vkCreateDevice)                            \
  X(vkGetDeviceProcAddr)

#define GEMMA4RT_VULKAN_DEVICE_FUNCTIONS(X) \
  X(vkDestroyDevice)                        \
  X(vkGetDeviceQueue)                       \
  X(vkCreateBuffer)                         \
  X(vkDestroyBuffer)                        \
  X(vkGetBufferMemoryRequirements)          \
  X(vkAllocateMemory)                       \
  X(vkFreeMemory)                           \
  X(vkBindBufferMemory)                     \
  X(vkMapMemory)                            \
  X(vkUnmapMemory)                          \
  X(vkCreateShaderModule)                   \
  X(vkDestroyShaderModule)                  \
  X(vkCreateDescriptorSetLayout)            \
  X(vkDestroyDescriptorSetLayout)           \
  X(vkCreatePipelineLayout)                 \
  X(vkDestroyPipelineLayout)                \
  X(vkCreateComputePipelines)               \
  X(vkDestroyPipeline)                      \
  X(vkCreateCommandPool)                    \
  X(vkDestroyCommandPool)                   \
  X(vkAllocateCommandBuffers)               \
  X(vkFreeCommandBuffers)                   \
  X(vkBeginCommandBuffer)                   \
  X(vkEndCommandBuffer)                     \
  X(vkCmdBindPipeline)                      \
  X(vkCmdPushConstants)                     \
  X(vkCmdDispatch)                          \
  X(vkCmdPipelineBarrier)                   \
  X(vkCmdCopyBuffer)                        \
  X(vkCmdFillBuffer)                        \
  X(vkQueueSubmit)                          \
  X(vkQueueWaitIdle)                        \
  X(vkCreateFence)                          \
  X(vkDestroyFence)                         \
  X(vkWaitForFences)                        \
  X(vkResetFences)

struct VulkanApi {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
  PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion = nullptr;
#define GEMMA4RT_DECLARE(name) PFN_##name name = nullptr;
  GEMMA4RT_VULKAN_INSTANCE_FUNCTIONS(GEMMA4RT_DECLARE)
  GEMMA4RT_VULKAN_DEVICE_FUNCTIONS(GEMMA4RT_DECLARE)
  PFN_vkCmdPushDescriptorSetKHR vkCmdPushDescriptorSetKHR = nullptr;
  // Optional (VK_NV_cooperative_matrix): null where the loader or no driver offers it.
  PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV vkGetPhysicalDeviceCooperativeMatrixPropertiesNV = nullptr;
#undef GEMMA4RT_DECLARE

  // Opens the system loader and its global entry points; throws Error naming the library when absent.
  void load_loader();
  void load_instance(VkInstance instance);
  void load_device(VkDevice device);
};

// Throws Error naming `what` when a Vulkan call did not succeed.
void check(VkResult result, const char* what);

}  // namespace gemma4rt::backend::vulkan
