#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_input.h"

namespace gemma4rt {

size_t stored_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : file_(std::make_unique<MappedFile>(path)) {
  const std::string name = path.string();
  const auto bytes = file_->bytes();
  if (bytes.size() < 8) fail("{}: truncated safetensors file ({} bytes; the 8-byte header length is missing)", name, bytes.size());
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);  // little-endian, as is the host
  if (header_size > bytes.size() - 8) {
    fail("{}: truncated safetensors file: header claims {} bytes but the file has {} after the length", name, header_size,
         bytes.size() - 8);
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const nlohmann::json header = parse_json(std::string_view(header_begin, header_size), name + " (safetensors header)");
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", name);

  metadata_ = std::make_unique<std::map<std::string, std::string>>();
  if (header.contains("__metadata__") && header["__metadata__"].is_object()) {
    for (const auto& [key, value] : header["__metadata__"].items()) {
      if (value.is_string()) (*metadata_)[key] = value.get<std::string>();
    }
  }
  const std::byte* data_begin = bytes.data() + 8 + header_size;
  const uint64_t data_size = bytes.size() - 8 - header_size;
  struct Range {
    uint64_t begin, end;
    std::string tensor;
  };
  std::vector<Range> ranges;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    auto bad = [&](const std::string& why) { fail("{}: tensor {}: {}", name, key, why); };
    if (!entry.is_object()) bad("header entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) bad("dtype is missing");
    if (!entry.contains("shape") || !entry["shape"].is_array()) bad("shape is missing");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      bad("data_offsets must be [begin, end]");
    }
    StoredTensor tensor;
    tensor.name = key;
    tensor.dtype_name = entry["dtype"].get<std::string>();
    uint64_t element_count = 1;
    for (const auto& dimension : entry["shape"]) {
      if (!dimension.is_number_unsigned()) bad("shape holds a non-integer or negative dimension");
      const uint64_t extent = dimension.get<uint64_t>();
      if (extent > static_cast<uint64_t>(INT64_MAX) || (extent != 0 && element_count > UINT64_MAX / extent)) {
        bad(fmt::format("shape {} has more elements than any file can hold", json_excerpt(entry["shape"])));
      }
      tensor.shape.push_back(static_cast<int64_t>(extent));
      element_count *= extent;
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) bad("data_offsets must be non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end) bad(fmt::format("data_offsets [{}, {}] are reversed", begin, end));
    if (end > data_size) {
      bad(fmt::format("data_offsets [{}, {}] run past the end of the data ({} bytes): the file is truncated or corrupt", begin,
                      end, data_size));
    }
    const size_t element_size = stored_dtype_size(tensor.dtype_name);
    if (element_size != 0 && element_count > UINT64_MAX / element_size) bad("shape has more bytes than any file can hold");
    if (element_size != 0 && end - begin != element_count * element_size) {
      bad(fmt::format("holds {} bytes but dtype {} and shape {} need {}", end - begin, tensor.dtype_name,
                      shape_to_string(tensor.shape), element_count * element_size));
    }
    tensor.data = data_begin + begin;
    // Elements are read in place from the memory map (page-aligned), so they must sit at multiples of
    // their size; safetensors writers pad the header and order tensors by element size to keep that.
    if (element_size > 1 && (8 + header_size + begin) % element_size != 0) {
      bad(fmt::format("its {}-byte elements start at byte {} of the file, not a multiple of {} (the header is not padded to 8 bytes, "
                      "or tensors are not ordered by element size)",
                      element_size, 8 + header_size + begin, element_size));
    }
    tensor.size_bytes = end - begin;
    tensor.file = &file_->path();
    tensor.metadata = metadata_.get();
    ranges.push_back({begin, end, key});
    tensors_.push_back(std::move(tensor));
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t index = 1; index < ranges.size(); ++index) {
    if (ranges[index].begin < ranges[index - 1].end) {
      fail("{}: tensors {} and {} overlap (bytes [{}, {}) and [{}, {}))", name, ranges[index - 1].tensor, ranges[index].tensor,
           ranges[index - 1].begin, ranges[index - 1].end, ranges[index].begin, ranges[index].end);
    }
  }
}

Checkpoint::Checkpoint(const std::filesystem::path& model_dir) {
  const auto index_path = model_dir / "model.safetensors.index.json";
  const auto single_path = model_dir / "model.safetensors";
  std::map<std::string, std::string> expected_file;  // tensor -> shard, from the index
  if (std::filesystem::exists(index_path)) {
    const nlohmann::json index = parse_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      fail("{}: field weight_map is missing", index_path.string());
    }
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string()) fail("{}: weight_map entry {} is not a file name", index_path.string(), tensor);
      expected_file[tensor] = file.get<std::string>();
      shard_names.insert(file.get<std::string>());
    }
    for (const auto& shard : shard_names) {
      const auto shard_path = model_dir / shard;
      if (!std::filesystem::exists(shard_path)) fail("{}: shard listed in {} is missing", shard_path.string(), index_path.string());
      files_.push_back(shard_path);
    }
  } else if (std::filesystem::exists(single_path)) {
    files_.push_back(single_path);
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", model_dir.string());
  }

  for (const auto& path : files_) {
    shards_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const StoredTensor& tensor : shards_.back()->tensors()) {
      auto [where, inserted] = tensors_.emplace(tensor.name, tensor);
      if (!inserted) fail("{}: tensor {} is stored twice (also in {})", path.string(), tensor.name, where->second.file->string());
    }
  }
  for (const auto& [tensor, file] : expected_file) {
    auto found = tensors_.find(tensor);
    if (found == tensors_.end()) fail("{}: tensor {} is listed in the index but missing from the shard", (model_dir / file).string(), tensor);
  }
}

const StoredTensor* Checkpoint::find(const std::string& name) const {
  auto found = tensors_.find(name);
  return found == tensors_.end() ? nullptr : &found->second;
}

TensorView Checkpoint::view(const StoredTensor& stored) {
  TensorView view;
  view.name = stored.name;
  view.shape = stored.shape;
  view.data = stored.data;
  if (stored.dtype_name == "F32") {
    view.dtype = DType::kF32;
  } else if (stored.dtype_name == "BF16") {
    view.dtype = DType::kBF16;
  } else if (stored.dtype_name == "F16") {
    view.dtype = DType::kF16;
  } else if (stored.dtype_name == "I8") {
    view.dtype = DType::kQ8;  // the caller attaches the block scales stored beside it
  } else if (stored.dtype_name == "U8") {
    view.dtype = DType::kQ4;  // packed nibbles: the caller sets the logical shape and attaches the scales
  } else {
    fail("{}: tensor {} has dtype {}; gemma4rt reads F32, BF16, F16, I8 (q8 with scales) and U8 (q4 with scales)", stored.file->string(),
         stored.name, stored.dtype_name);
  }
  return view;
}

}  // namespace gemma4rt
