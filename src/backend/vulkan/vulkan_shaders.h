// The compute shaders of src/backend/vulkan/shaders, compiled to SPIR-V by glslc at build time and
// embedded in the binary (the generated vulkan_shaders.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace gemma4rt::backend::vulkan {

// The SPIR-V words of a shader variant ("matmul_bf16", "rms_norm", ...); throws Error for an unknown name.
std::span<const uint32_t> shader_spirv(std::string_view name);

}  // namespace gemma4rt::backend::vulkan
