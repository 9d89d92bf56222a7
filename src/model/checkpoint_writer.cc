#include "model/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <span>

#include <fmt/format.h>

#include "core/bf16.h"
#include "core/error.h"

namespace gemma4rt {
namespace {

using nlohmann::json;

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "BF16";
    case DType::kF32: return "F32";
    default: break;
  }
  fail("checkpoint writer: dtype {} is not supported (use BF16 or F32)", dtype_name(dtype));
}

// ---- Random values ---------------------------------------------------------------------------------
// Counter-based: element i of a tensor is hash32(i * multiplier + offset) with a per-tensor odd
// multiplier and offset, so any chunk can be generated on its own, and the loop has no dependency
// between elements and only 32-bit integer work: the compiler vectorises it (the E2B alone is 4.6
// billion values). Distinct multipliers keep tensors from being shifted copies of one stream.

inline uint64_t mix64(uint64_t value) {  // the splitmix64 finaliser
  value ^= value >> 30;
  value *= 0xbf58476d1ce4e5b9ull;
  value ^= value >> 27;
  value *= 0x94d049bb133111ebull;
  value ^= value >> 31;
  return value;
}

inline uint32_t hash32(uint32_t value) {  // a low-bias 32-bit integer hash (xorshift-multiply rounds)
  value ^= value >> 16;
  value *= 0x7feb352du;
  value ^= value >> 15;
  value *= 0x846ca68bu;
  value ^= value >> 16;
  return value;
}

struct RandomStream {
  uint64_t key = 0;
  // The counter of elements [2^32 b, 2^32 (b + 1)): tensors past 4 billion elements get fresh offsets.
  uint32_t multiplier() const { return static_cast<uint32_t>(key) | 1u; }
  uint32_t offset(uint64_t block) const { return static_cast<uint32_t>(mix64(key + block) >> 32); }
};

RandomStream tensor_stream(uint64_t seed, const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a of the name
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return {mix64(mix64(seed) ^ hash)};
}

struct InitRule {
  bool normal = true;   // normal: mean `a`, deviation `b`; uniform: [a, b)
  float a = 0.0f;
  float b = 1.0f;
};

// Well-conditioned for deep random models, so `verify` can hold a backend to the reference on a
// full-size shape: Gemma-4 scales attention scores by 1, so q/k norm weights near 1 would give scores
// with a deviation of about sqrt(head_dim) (16-23 at full width) and a nearly hard softmax, where a
// summation-order change flips tokens. Weights near head_dim^-1/4 keep the scores' deviation near 1;
// layer_scalar near 0.06 is what released checkpoints carry (0.4-0.9 let deep stacks blow up).
InitRule init_rule(const TensorSpec& tensor, const ModelConfig& config) {
  if (tensor.kind == TensorKind::kQNorm || tensor.kind == TensorKind::kKNorm) {
    const float scale = std::pow(static_cast<float>(tensor.shape.at(0)), -0.25f);
    return {false, 0.8f * scale, 1.2f * scale};
  }
  switch (tensor.role) {
    case TensorRole::kTokenEmbedding:
      return {true, 0.0f, 1.0f / std::sqrt(static_cast<float>(config.hidden_size))};
    case TensorRole::kPerLayerEmbedding:
      return {true, 0.0f, 1.0f / std::sqrt(static_cast<float>(config.hidden_size_per_layer_input))};
    case TensorRole::kLinear:
      return {true, 0.0f, 1.0f / std::sqrt(static_cast<float>(tensor.shape.back()))};
    case TensorRole::kNorm:
      return {false, 0.5f, 1.5f};
    case TensorRole::kLayerScalar:
      return {false, 0.05f, 0.07f};
  }
  return {};
}

// Sum of the four bytes of a random word: an Irwin-Hall(4) draw with 1021 levels, close enough to a
// normal for weights (bounded at 3.45 deviations) and far cheaper than an exact sampler.
// Mean 4 * 255 / 2 = 510; variance 4 * (256^2 - 1) / 12 = 21845.
inline float approximately_normal(uint32_t bits) {
  const uint32_t pairs = (bits & 0x00ff00ffu) + ((bits >> 8) & 0x00ff00ffu);
  const int32_t sum = static_cast<int32_t>((pairs & 0xffffu) + (pairs >> 16));
  return (static_cast<float>(sum) - 510.0f) * (1.0f / 147.80054f);
}

inline float uniform01(uint32_t bits) { return static_cast<float>(static_cast<int32_t>(bits >> 8)) * (1.0f / 16777216.0f); }

// Round to nearest even; the values are finite, so float_to_bf16's NaN branch (which blocks
// vectorisation) is not needed.
inline uint16_t finite_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// One build of the fill loops per x86-64 level, picked at load time: AVX-512 and AVX2 make them
// several times faster than the SSE2 baseline the library is compiled for.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMMA4RT_GENERATOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GEMMA4RT_GENERATOR_CLONES
#endif

GEMMA4RT_GENERATOR_CLONES
void fill_bf16(uint16_t* out, uint32_t count, uint32_t multiplier, uint32_t start, InitRule rule) {
  if (rule.normal) {
    for (uint32_t i = 0; i < count; ++i) out[i] = finite_to_bf16(rule.a + rule.b * approximately_normal(hash32(i * multiplier + start)));
  } else {
    const float width = rule.b - rule.a;
    for (uint32_t i = 0; i < count; ++i) out[i] = finite_to_bf16(rule.a + width * uniform01(hash32(i * multiplier + start)));
  }
}

GEMMA4RT_GENERATOR_CLONES
void fill_f32(float* out, uint32_t count, uint32_t multiplier, uint32_t start, InitRule rule) {
  if (rule.normal) {
    for (uint32_t i = 0; i < count; ++i) out[i] = rule.a + rule.b * approximately_normal(hash32(i * multiplier + start));
  } else {
    const float width = rule.b - rule.a;
    for (uint32_t i = 0; i < count; ++i) out[i] = rule.a + width * uniform01(hash32(i * multiplier + start));
  }
}

// Elements [first, first + count) of a tensor, encoded into `out`.
void generate(const InitRule& rule, const RandomStream& stream, uint64_t first, size_t count, DType dtype, std::byte* out) {
  const size_t element_size = dtype_size_bytes(dtype);
  while (count > 0) {
    // Split at multiples of 2^32 elements, where the 32-bit counter starts a new block.
    const uint64_t block = first >> 32;
    const uint32_t low = static_cast<uint32_t>(first);
    const uint32_t part = static_cast<uint32_t>(std::min<uint64_t>(count, (1ull << 32) - low));
    const uint32_t multiplier = stream.multiplier();
    const uint32_t start = low * multiplier + stream.offset(block);
    if (dtype == DType::kBF16) {
      fill_bf16(reinterpret_cast<uint16_t*>(out), part, multiplier, start, rule);
    } else {
      fill_f32(reinterpret_cast<float*>(out), part, multiplier, start, rule);
    }
    out += static_cast<size_t>(part) * element_size;
    first += part;
    count -= part;
  }
}

// ---- Output ----------------------------------------------------------------------------------------

void write_all(int fd, const std::byte* data, size_t size, const std::filesystem::path& path) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("{}: write failed: {}", path.string(), std::strerror(errno));
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
}

// A file written through two buffers: while one is written on a helper thread, the caller fills the
// other, so generation and the kernel's copy overlap. Writes stay in order (one in flight at a time).
class PipelinedFile {
 public:
  PipelinedFile(std::filesystem::path path, size_t chunk_bytes) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot create: {}", path_.string(), std::strerror(errno));
    // A multiple of 8 bytes, so a buffer's free tail always holds whole elements.
    const size_t size = std::max<size_t>(chunk_bytes, 4096) / 8 * 8;
    for (auto& buffer : buffers_) buffer.resize(size);
  }
  ~PipelinedFile() {
    if (pending_.valid()) pending_.wait();
    if (fd_ >= 0) ::close(fd_);
  }

  // Free space in the current buffer, never empty.
  std::span<std::byte> space() {
    if (filled_ == buffers_[current_].size()) submit();
    return std::span<std::byte>(buffers_[current_]).subspan(filled_);
  }
  void commit(size_t bytes) { filled_ += bytes; }

  void append(std::string_view text) {
    while (!text.empty()) {
      const std::span<std::byte> free = space();
      const size_t take = std::min(free.size(), text.size());
      std::memcpy(free.data(), text.data(), take);
      commit(take);
      text.remove_prefix(take);
    }
  }

  void close() {
    submit();
    wait();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("{}: write failed on close: {}", path_.string(), std::strerror(errno));
  }

 private:
  void wait() {
    if (pending_.valid()) pending_.get();  // rethrows a write error
  }
  void submit() {
    if (filled_ == 0) return;
    wait();
    const std::byte* data = buffers_[current_].data();
    const size_t size = filled_;
    pending_ = std::async(std::launch::async, [this, data, size] { write_all(fd_, data, size, path_); });
    current_ ^= 1;
    filled_ = 0;
  }

  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<std::byte> buffers_[2];
  int current_ = 0;
  size_t filled_ = 0;
  std::future<void> pending_;
};

void write_json_file(const std::filesystem::path& path, const json& document) {
  std::ofstream output(path, std::ios::binary | std::ios::trunc);
  if (!output) fail("{}: cannot create: {}", path.string(), std::strerror(errno));
  output << document.dump(2) << '\n';
  output.close();
  if (!output) fail("{}: write failed", path.string());
}

bool is_shard_name(const std::string& name) {
  // model-00001-of-00004.safetensors
  return name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos;
}

// Files a write replaces: stale shards of another layout would otherwise be picked up by the reader.
std::vector<std::filesystem::path> replaced_checkpoint_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" || name == "config.json" ||
        name == "generation_config.json" || is_shard_name(name)) {
      files.push_back(entry.path());
    }
  }
  return files;
}

}  // namespace

void remove_stale_shards(const std::filesystem::path& dir) {
  for (const auto& file : replaced_checkpoint_files(dir)) {
    const std::string name = file.filename().string();
    if (name == "model.safetensors.index.json" || is_shard_name(name)) std::filesystem::remove(file);
  }
}

namespace {

json generation_config(const ModelConfig& config) {
  // The released generation_config.json: stop on <eos>, <turn|> and <|tool_response>; sampling defaults.
  json eos = json::array();
  for (int id : {1, 106, 50}) {
    if (id < config.vocab_size) eos.push_back(id);
  }
  return {{"bos_token_id", config.bos_token_id}, {"pad_token_id", config.pad_token_id}, {"eos_token_id", eos},
          {"do_sample", true}, {"temperature", 1.0}, {"top_k", 64}, {"top_p", 0.95}};
}

}  // namespace

CheckpointPlan plan_checkpoint(const ModelConfig& config, const CheckpointWriterOptions& options) {
  const char* dtype = safetensors_dtype(options.dtype);
  const uint64_t element_size = dtype_size_bytes(options.dtype);
  if (options.max_shard_bytes == 0) fail("checkpoint writer: the shard size must be positive");

  CheckpointPlan plan;
  for (TensorSpec& spec : checkpoint_tensors(config)) {
    const uint64_t bytes = static_cast<uint64_t>(spec.element_count()) * element_size;
    if (plan.shards.empty() || (plan.shards.back().data_bytes > 0 && plan.shards.back().data_bytes + bytes > options.max_shard_bytes)) {
      plan.shards.emplace_back();
    }
    PlannedShard& shard = plan.shards.back();
    PlannedTensor tensor;
    tensor.spec = std::move(spec);
    tensor.shard = plan.shards.size() - 1;
    tensor.data_begin = shard.data_bytes;
    tensor.data_end = shard.data_bytes + bytes;
    shard.data_bytes = tensor.data_end;
    shard.tensors.push_back(plan.tensors.size());
    plan.tensor_bytes += bytes;
    plan.parameters += tensor.spec.element_count();
    plan.tensors.push_back(std::move(tensor));
  }

  const size_t count = plan.shards.size();
  for (size_t index = 0; index < count; ++index) {
    PlannedShard& shard = plan.shards[index];
    shard.file_name = count == 1 ? "model.safetensors" : fmt::format("model-{:05}-of-{:05}.safetensors", index + 1, count);
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}};
    for (size_t tensor_index : shard.tensors) {
      const PlannedTensor& tensor = plan.tensors[tensor_index];
      header[tensor.spec.name] = {{"dtype", dtype}, {"shape", tensor.spec.shape}, {"data_offsets", {tensor.data_begin, tensor.data_end}}};
    }
    shard.header = header.dump();
    // Padding keeps the data section 8-byte aligned, so memory-mapped tensors are aligned too.
    shard.header.append((8 - shard.header.size() % 8) % 8, ' ');
    plan.file_bytes += shard.file_bytes();
  }
  return plan;
}

uint64_t checkpoint_disk_bytes(const CheckpointPlan& plan) {
  // The index and JSON configs are small; a generous allowance covers them and filesystem overhead.
  const uint64_t json_allowance = (1u << 20) + plan.tensors.size() * 128;
  return plan.file_bytes + json_allowance;
}

void check_free_space(const std::filesystem::path& dir, uint64_t bytes_needed, bool replaced_files_count) {
  std::filesystem::path probe = std::filesystem::absolute(dir);
  std::error_code error;
  while (!std::filesystem::exists(probe, error) && probe.has_parent_path() && probe != probe.parent_path()) {
    probe = probe.parent_path();
  }
  const std::filesystem::space_info space = std::filesystem::space(probe, error);
  if (error) fail("{}: cannot query free disk space: {}", probe.string(), error.message());
  uint64_t reclaimable = 0;
  for (const auto& file : replaced_files_count ? replaced_checkpoint_files(dir) : std::vector<std::filesystem::path>{}) {
    const auto size = std::filesystem::file_size(file, error);
    if (!error) reclaimable += size;
  }
  const uint64_t available = static_cast<uint64_t>(space.available) + reclaimable;
  if (available < bytes_needed) {
    fail("{}: not enough free disk space: the checkpoint needs {:.2f} GB but only {:.2f} GB is available", dir.string(),
         static_cast<double>(bytes_needed) / 1e9, static_cast<double>(available) / 1e9);
  }
}

CheckpointSummary write_random_checkpoint(const json& config_json, const std::filesystem::path& dir,
                                          const CheckpointWriterOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  json config_document = config_json;
  const char* torch_dtype = options.dtype == DType::kF32 ? "float32" : "bfloat16";
  config_document["dtype"] = torch_dtype;
  if (config_document.contains("text_config") && config_document["text_config"].is_object()) {
    config_document["text_config"]["dtype"] = torch_dtype;
  }
  const ModelConfig config = parse_model_config(config_document, (dir / "config.json").string());
  const CheckpointPlan plan = plan_checkpoint(config, options);

  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) fail("{}: cannot create the directory: {}", dir.string(), error.message());
  for (const auto& stale : replaced_checkpoint_files(dir)) std::filesystem::remove(stale);

  CheckpointSummary summary;
  summary.parameters = plan.parameters;
  uint64_t generated = 0;
  for (const PlannedShard& shard : plan.shards) {
    const std::filesystem::path path = dir / shard.file_name;
    PipelinedFile file(path, options.chunk_bytes);
    uint64_t header_size = shard.header.size();
    std::string length(8, '\0');
    for (int byte = 0; byte < 8; ++byte) length[byte] = static_cast<char>((header_size >> (8 * byte)) & 0xff);  // little-endian
    file.append(length);
    file.append(shard.header);
    const size_t element_size = dtype_size_bytes(options.dtype);
    for (size_t tensor_index : shard.tensors) {
      const PlannedTensor& tensor = plan.tensors[tensor_index];
      const InitRule rule = init_rule(tensor.spec, config);
      const RandomStream stream = tensor_stream(options.seed, tensor.spec.name);
      const uint64_t elements = static_cast<uint64_t>(tensor.spec.element_count());
      uint64_t done = 0;
      while (done < elements) {
        // Never shorter than one element: buffers are a multiple of 8 bytes and so is the header.
        std::span<std::byte> free = file.space();
        const size_t count = static_cast<size_t>(std::min<uint64_t>(elements - done, free.size() / element_size));
        generate(rule, stream, done, count, options.dtype, free.data());
        file.commit(count * element_size);
        done += count;
        generated += count * element_size;
        if (options.on_progress) options.on_progress(generated, plan.tensor_bytes);
      }
    }
    file.close();
    summary.files.push_back(path);
    summary.bytes_written += shard.file_bytes();
  }

  if (plan.indexed()) {
    json index;
    index["metadata"] = {{"total_size", plan.tensor_bytes}, {"total_parameters", plan.parameters}};
    json weight_map = json::object();
    for (const PlannedTensor& tensor : plan.tensors) weight_map[tensor.spec.name] = plan.shards[tensor.shard].file_name;
    index["weight_map"] = std::move(weight_map);
    const auto path = dir / "model.safetensors.index.json";
    write_json_file(path, index);
    summary.files.push_back(path);
  }
  // The configs go last: an interrupted write leaves a directory that does not look like a checkpoint.
  write_json_file(dir / "generation_config.json", generation_config(config));
  write_json_file(dir / "config.json", config_document);
  summary.files.push_back(dir / "generation_config.json");
  summary.files.push_back(dir / "config.json");
  for (const auto& path : summary.files) {
    if (path.extension() == ".json") summary.bytes_written += std::filesystem::file_size(path);
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace gemma4rt
