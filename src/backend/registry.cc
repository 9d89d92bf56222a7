#include "backend/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/reference/reference_backend.h"
#include "core/error.h"
#ifdef GEMMA4RT_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif

namespace gemma4rt::backend {

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names = {
    "cpu", "reference",
#ifdef GEMMA4RT_HAVE_VULKAN
    "vulkan",
#endif
  };
  return names;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.name == "cpu") return std::make_unique<CpuBackend>(options.threads);
  if (options.name == "reference") return std::make_unique<ReferenceBackend>(options.threads);
#ifdef GEMMA4RT_HAVE_VULKAN
  if (options.name == "vulkan") return std::make_unique<vulkan::VulkanBackend>(options.device);
#endif
  fail("unknown backend \"{}\" (this build has: {})", options.name, fmt::join(backend_names(), ", "));
}

}  // namespace gemma4rt::backend
