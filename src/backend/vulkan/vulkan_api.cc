#include "backend/vulkan/vulkan_api.h"

#include <dlfcn.h>

#include "core/error.h"

namespace gemma4rt::backend::vulkan {

void check(VkResult result, const char* what) {
  if (result != VK_SUCCESS) fail("Vulkan: {} failed (VkResult {})", what, static_cast<int>(result));
}

void VulkanApi::load_loader() {
  if (vkGetInstanceProcAddr != nullptr) return;
  void* library = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) fail("Vulkan: the loader libvulkan.so.1 is not installed (Debian: apt-get install libvulkan1)");
  vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(library, "vkGetInstanceProcAddr"));
  if (vkGetInstanceProcAddr == nullptr) fail("Vulkan: libvulkan.so.1 has no vkGetInstanceProcAddr");
  vkCreateInstance = reinterpret_cast<PFN_vkCreateInstance>(vkGetInstanceProcAddr(nullptr, "vkCreateInstance"));
  vkEnumerateInstanceVersion = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceVersion"));
  if (vkCreateInstance == nullptr) fail("Vulkan: the loader exports no vkCreateInstance");
}

void VulkanApi::load_instance(VkInstance instance) {
#define GEMMA4RT_LOAD(name)                                                                  \
  name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(instance, #name));             \
  if (name == nullptr) fail("Vulkan: the instance has no {}", #name);
  GEMMA4RT_VULKAN_INSTANCE_FUNCTIONS(GEMMA4RT_LOAD)
#undef GEMMA4RT_LOAD
  vkGetPhysicalDeviceCooperativeMatrixPropertiesNV = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
}

void VulkanApi::load_device(VkDevice device) {
#define GEMMA4RT_LOAD(name)                                                      \
  name = reinterpret_cast<PFN_##name>(vkGetDeviceProcAddr(device, #name));     \
  if (name == nullptr) fail("Vulkan: the device has no {}", #name);
  GEMMA4RT_VULKAN_DEVICE_FUNCTIONS(GEMMA4RT_LOAD)
  GEMMA4RT_LOAD(vkCmdPushDescriptorSetKHR)
#undef GEMMA4RT_LOAD
}

}  // namespace gemma4rt::backend::vulkan
