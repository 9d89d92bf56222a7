// Writes a Hugging Face checkpoint directory with random weights for any Gemma-4 config: config.json,
// generation_config.json and the tensors as safetensors, sharded with model.safetensors.index.json
// once they exceed one shard. Writing streams: every header is computed from the plan up front, then
// tensor data is generated and written in small chunks, so memory use stays a few MB however large
// the tensors (the E2B per-layer embedding table alone is 4.7 GB).
//
// The weights are a deterministic function of (seed, tensor name, element index), so the bytes do not
// depend on chunking or sharding, and they are scaled to keep a forward pass numerically sane:
// linear weights ~N(0, 1/fan_in), embeddings ~N(0, 1/width) (the lookup rescales rows to unit size),
// norm weights and other scales ~U(0.5, 1.5), layer scalars ~U(0.4, 0.9).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/config.h"
#include "model/model_shapes.h"

namespace gemma4rt {

struct CheckpointWriterOptions {
  DType dtype = DType::kBF16;                 // kBF16 or kF32
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 4ull << 30;      // tensor bytes per shard; a larger tensor gets a shard of its own
  size_t chunk_bytes = 4u << 20;              // generation/write buffer (two are alive while writing)
  // Called from the writing thread with tensor bytes generated so far and the total.
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

struct PlannedTensor {
  TensorSpec spec;
  size_t shard = 0;
  uint64_t data_begin = 0;                    // byte offsets within the shard's data section
  uint64_t data_end = 0;
};

struct PlannedShard {
  std::string file_name;                      // model.safetensors or model-0000i-of-0000N.safetensors
  std::string header;                         // JSON header, space-padded to a multiple of 8 bytes
  uint64_t data_bytes = 0;
  std::vector<size_t> tensors;                // indices into CheckpointPlan::tensors, in file order
  uint64_t file_bytes() const { return 8 + header.size() + data_bytes; }
};

struct CheckpointPlan {
  std::vector<PlannedTensor> tensors;
  std::vector<PlannedShard> shards;
  uint64_t tensor_bytes = 0;                  // the index's metadata.total_size
  uint64_t file_bytes = 0;                    // all shard files, headers included
  int64_t parameters = 0;
  bool indexed() const { return shards.size() > 1; }
};

// Lays out every tensor of the config into shards (no I/O). Throws Error for an unsupported dtype.
CheckpointPlan plan_checkpoint(const ModelConfig& config, const CheckpointWriterOptions& options);

struct CheckpointSummary {
  int64_t parameters = 0;
  uint64_t bytes_written = 0;                 // every file written
  std::vector<std::filesystem::path> files;
  double seconds = 0;
};

// Writes the checkpoint for `config_json` (a config.json document; parsed and checked with
// parse_model_config) into `dir`, creating it. Checkpoint files already there (config, shards, index)
// are replaced; other files are left alone. The config's dtype fields are set to match options.dtype.
CheckpointSummary write_random_checkpoint(const nlohmann::json& config_json, const std::filesystem::path& dir,
                                          const CheckpointWriterOptions& options);

// Removes the shards (model-*-of-*.safetensors) and the index of another layout from `dir`, once a
// single model.safetensors has been written there: readers would otherwise take the stale shards.
void remove_stale_shards(const std::filesystem::path& dir);

// Bytes the files of a plan (plus the small JSON files) will take on disk.
uint64_t checkpoint_disk_bytes(const CheckpointPlan& plan);

// Throws Error when the filesystem holding `dir` (or its nearest existing parent) cannot take
// `bytes_needed` more bytes, counting checkpoint files in `dir` that a write would replace as free
// unless the writer keeps them until it is done (`replaced_files_count` false).
void check_free_space(const std::filesystem::path& dir, uint64_t bytes_needed, bool replaced_files_count = true);

}  // namespace gemma4rt
