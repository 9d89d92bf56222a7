// Reading Hugging Face safetensors checkpoints: one model.safetensors, or shards listed in
// model.safetensors.index.json. Files are memory-mapped; headers are validated completely before
// any tensor is used (offsets inside the file, no overlaps, sizes that match dtype and shape).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace gemma4rt {

// One tensor entry as stored. dtype_name is kept as written so unsupported dtypes (e.g. of vision
// tensors we never read) only fail when something asks for them.
// Bytes per element of every dtype the format defines ("BF16" -> 2); 0 = unknown to us.
size_t stored_dtype_size(const std::string& dtype);

struct StoredTensor {
  std::string name;
  std::string dtype_name;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t size_bytes = 0;
  const std::filesystem::path* file = nullptr;
  const std::map<std::string, std::string>* metadata = nullptr;  // the file's __metadata__ (string values)
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);  // throws Error naming the file and tensor
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  const std::filesystem::path& path() const { return file_->path(); }

 private:
  std::unique_ptr<MappedFile> file_;
  std::unique_ptr<std::map<std::string, std::string>> metadata_;  // tensors point here: kept where it is on a move
  std::vector<StoredTensor> tensors_;
};

// All tensors of a checkpoint directory, by their full key.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& model_dir);
  const StoredTensor* find(const std::string& name) const;
  const std::map<std::string, StoredTensor>& tensors() const { return tensors_; }
  const std::vector<std::filesystem::path>& files() const { return files_; }

  // A typed view of a stored tensor; throws if its dtype is not F32, BF16 or F16.
  static TensorView view(const StoredTensor& stored);

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::filesystem::path> files_;
  std::map<std::string, StoredTensor> tensors_;
};

}  // namespace gemma4rt
