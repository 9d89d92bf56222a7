// Helpers shared by the tests: running the gemma4rt binary, reading JSON fixtures, scratch folders,
// small weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace gemma4rt::testing {

struct CommandResult {
  int exit_code = -1;       // the process's exit status; 128 + signal when it was killed by one
  std::string out;          // stdout
  std::string err;          // stderr
};

// Runs the gemma4rt binary with these arguments (no shell involved) and captures both streams.
CommandResult run_gemma4rt(const std::vector<std::string>& arguments);

nlohmann::json read_json_file(const std::filesystem::path& path);
std::string read_text_file(const std::filesystem::path& path);
void write_text_file(const std::filesystem::path& path, const std::string& text);

// A fresh, empty folder under the test work directory.
std::filesystem::path fresh_work_dir(const std::string& name);

// "2,17,300" for a list of ids.
std::string join_ids(const std::vector<int>& ids);

// The Vulkan device the tests run on: the backend's own choice when there is a GPU, else the first
// CPU device (lavapipe, which scripts/install-test-deps.sh installs). Fails the test when there is none.
int vulkan_test_device();

// A gtest parameter name from text such as a model name: "tiny-26b-a4b" -> "tiny_26b_a4b".
std::string test_identifier(std::string text);
// For suites parameterised by one string (model or shape names).
inline std::string string_param_name(const ::testing::TestParamInfo<std::string>& info) { return test_identifier(info.param); }

// A cheap reproducible value in [-0.5, 0.5): the next step of a linear congruential generator.
inline float next_centered(uint32_t& seed) {
  seed = seed * 1664525u + 1013904223u;
  return static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
}

// A [rows][cols] f32 weight viewed in place from `values` (which must outlive the view).
inline TensorView f32_view(const std::vector<float>& values, int64_t rows, int64_t cols, std::string name = "test.weight") {
  TensorView view;
  view.name = std::move(name);
  view.dtype = DType::kF32;
  view.shape = {rows, cols};
  view.data = reinterpret_cast<const std::byte*>(values.data());
  return view;
}

}  // namespace gemma4rt::testing

namespace gemma4rt::testing {

// A safetensors file held in memory so tests can build broken copies: edit the header, cut the data.
struct SafetensorsImage {
  nlohmann::json header;
  std::string data;   // everything after the header

  static SafetensorsImage load(const std::filesystem::path& path);
  void save(const std::filesystem::path& path) const;  // header padded to 8 bytes
  // Loads the file, lets `change` alter header or bytes, writes it back.
  static void edit(const std::filesystem::path& path, const std::function<void(SafetensorsImage&)>& change);
};

// Copies config.json, generation_config.json, tokenizer files and model.safetensors of a checkpoint.
void copy_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace gemma4rt::testing
