#include "test_support.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "backend/vulkan/vulkan_device.h"

extern char** environ;

namespace gemma4rt::testing {
namespace {

std::string slurp(const std::filesystem::path& path) {
  std::ifstream input(path, std::ios::binary);
  std::ostringstream contents;
  contents << input.rdbuf();
  return contents.str();
}

}  // namespace

int vulkan_test_device() {
  const std::vector<backend::vulkan::DeviceInfo> devices = backend::vulkan::list_devices();
  try {
    return backend::vulkan::choose_device(devices, -1);
  } catch (const std::exception&) {
    return devices.front().index;  // no GPU: the first device, lavapipe on a CI machine
  }
}

CommandResult run_gemma4rt(const std::vector<std::string>& arguments) {
  // Output goes through files rather than pipes so a large stdout can never dead-lock the child.
  static int counter = 0;
  const auto base = std::filesystem::path(GEMMA4RT_TEST_WORK) / "command_output";
  std::filesystem::create_directories(base);
  const std::string stem = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const auto out_path = base / (stem + ".out");
  const auto err_path = base / (stem + ".err");

  std::vector<std::string> argv_storage = {GEMMA4RT_BINARY};
  argv_storage.insert(argv_storage.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (auto& argument : argv_storage) argv.push_back(argument.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw std::runtime_error("cannot start " + argv_storage[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);

  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  return result;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream input(path);
  if (!input) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(input);
}

std::string read_text_file(const std::filesystem::path& path) { return slurp(path); }

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream output(path, std::ios::binary);
  output << text;
}

std::filesystem::path fresh_work_dir(const std::string& name) {
  const auto path = std::filesystem::path(GEMMA4RT_TEST_WORK) / name;
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

std::string test_identifier(std::string text) {
  std::replace(text.begin(), text.end(), '-', '_');
  return text;
}

std::string join_ids(const std::vector<int>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) text += ",";
    text += std::to_string(ids[i]);
  }
  return text;
}

}  // namespace gemma4rt::testing

namespace gemma4rt::testing {

SafetensorsImage SafetensorsImage::load(const std::filesystem::path& path) {
  const std::string bytes = slurp(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  SafetensorsImage image;
  image.header = nlohmann::json::parse(bytes.substr(8, header_size));
  image.data = bytes.substr(8 + header_size);
  return image;
}

void SafetensorsImage::save(const std::filesystem::path& path) const {
  // Padded with spaces to 8 bytes, as safetensors writers do, so the data stays aligned.
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_size, 8);
  write_text_file(path, bytes + text + data);
}

void SafetensorsImage::edit(const std::filesystem::path& path, const std::function<void(SafetensorsImage&)>& change) {
  SafetensorsImage image = load(path);
  change(image);
  image.save(path);
}

void copy_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::create_directories(to);
  for (const auto& entry : std::filesystem::directory_iterator(from)) {
    std::filesystem::copy_file(entry.path(), to / entry.path().filename(), std::filesystem::copy_options::overwrite_existing);
  }
}

}  // namespace gemma4rt::testing
