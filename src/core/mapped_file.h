// A read-only memory map of a whole file. Checkpoints are read through this, so tensors that are only
// gathered (embedding tables) are never copied and pages are loaded on demand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace gemma4rt {

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);  // throws Error naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace gemma4rt
