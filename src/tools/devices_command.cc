// gemma4rt devices: every Vulkan device the loader finds, with what the Vulkan backend uses of it, and
// which one `--backend vulkan` would pick.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/vulkan/vulkan_device.h"
#include "core/error.h"
#include "tools/commands.h"

namespace gemma4rt::tools {
namespace {

int devices(bool json) {
  using backend::vulkan::DeviceInfo;
  const std::vector<DeviceInfo> found = backend::vulkan::list_devices();
  int chosen = -1;
  try {
    chosen = backend::vulkan::choose_device(found, -1);
  } catch (const Error&) {
    // No GPU: listed below all the same, and the default choice says so.
  }
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const DeviceInfo& device : found) {
      list.push_back({{"index", device.index}, {"name", device.name}, {"type", device.type},
                      {"vulkan", backend::vulkan::version_string(device.api_version)}, {"memory_bytes", device.device_local_bytes},
                      {"subgroup_size", device.subgroup_size}, {"max_storage_buffer_range", device.max_storage_buffer_range},
                      {"storage_16bit", device.storage_16bit}, {"storage_8bit", device.storage_8bit},
                      {"subgroup_arithmetic", device.subgroup_arithmetic}, {"integer_dot_product", device.integer_dot_product},
                      {"cooperative_matrix", device.cooperative_matrix}, {"cooperative_matrix_nv", device.cooperative_matrix_nv},
                      {"push_descriptor", device.push_descriptor},
                      {"default", device.index == chosen}});
    }
    fmt::print("{}\n", nlohmann::json{{"devices", list}}.dump(2));
    return 0;
  }
  auto yes = [](bool value) { return value ? "yes" : "no"; };
  // Which cooperative-matrix extensions: the products use NV's (what the build's glslc compiles).
  auto cooperative = [](const DeviceInfo& device) -> std::string {
    if (device.cooperative_matrix && device.cooperative_matrix_nv) return "yes (KHR, NV)";
    if (device.cooperative_matrix) return "yes (KHR)";
    return device.cooperative_matrix_nv ? "yes (NV)" : "no";
  };
  fmt::print("| # | device | type | Vulkan | memory | subgroup | 16-bit / 8-bit storage | subgroup arithmetic | int dot | cooperative matrix |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const DeviceInfo& device : found) {
    fmt::print("| {}{} | {} | {} | {} | {:.1f} GiB | {} | {} / {} | {} | {} | {} |\n", device.index, device.index == chosen ? " (default)" : "",
               device.name, device.type, backend::vulkan::version_string(device.api_version), device.device_local_bytes / 1073741824.0,
               device.subgroup_size, yes(device.storage_16bit), yes(device.storage_8bit), yes(device.subgroup_arithmetic),
               yes(device.integer_dot_product), cooperative(device));
  }
  if (chosen < 0) fmt::print("\nNo GPU: --backend vulkan needs --device N (or GEMMA4RT_VULKAN_DEVICE) to run on a CPU device.\n");
  return 0;
}

}  // namespace

Action add_devices_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand("devices", "List the Vulkan devices --backend vulkan can run on");
  command->add_flag("--json", *json, "Print the devices as JSON");
  return [json] { return devices(*json); };
}

}  // namespace gemma4rt::tools
