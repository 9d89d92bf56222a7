// gemma4rt quantize: writes a copy of a checkpoint whose linear weights are q8 (int8 with one float
// scale per 32 values of a row), so loading it needs no quantisation pass. Embedding and per-layer
// embedding tables stay as stored (they are only gathered), norms and the router stay as stored, and a
// tied LM head gets its own q8 copy as lm_head.weight. A q8 tensor NAME is stored as I8 with its block
// scales in the F32 tensor NAME_scale, which the loader reads back (model/weights.cc).
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/progress.h"
#include "backend/cpu/kernels/matmul.h"
#include "model/weights.h"
#include "tools/commands.h"

namespace gemma4rt::tools {
namespace {

struct QuantizeFlags {
  std::string model_dir, out_dir, dtype = "q8";
  bool force = false;
};

struct OutputTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  const StoredTensor* source = nullptr;  // copied as stored
  TensorView quantize;                   // or quantised from this view (values, or scales when is_scale)
  bool is_scale = false;
};

int quantize(const QuantizeFlags& flags) {
  if (flags.dtype != "q8") fail("--dtype {}: only q8 is supported", flags.dtype);
  const std::filesystem::path out(flags.out_dir);
  if (std::filesystem::exists(out) && !std::filesystem::is_empty(out) && !flags.force) {
    fail("{}: exists and is not empty (use --force to replace)", out.string());
  }
  auto model = Model::load(flags.model_dir);
  const ModelWeights& weights = model->weights();

  // The matrices the engine multiplies: these become q8.
  std::vector<TensorView> matrices;
  for (const LayerWeights& layer : weights.layers) {
    for (const TensorView* view : {&layer.attention.q_proj, &layer.attention.k_proj, &layer.attention.v_proj, &layer.attention.o_proj,
                                   &layer.mlp.gate_proj, &layer.mlp.up_proj, &layer.mlp.down_proj}) {
      if (!view->empty()) matrices.push_back(*view);
    }
    if (layer.moe) {
      matrices.push_back(layer.moe->gate_up_proj);
      matrices.push_back(layer.moe->down_proj);
    }
    if (layer.per_layer_input) {
      matrices.push_back(layer.per_layer_input->input_gate);
      matrices.push_back(layer.per_layer_input->projection);
    }
  }
  if (!weights.per_layer_model_projection.empty()) matrices.push_back(weights.per_layer_model_projection);
  std::map<std::string, TensorView> quantized;
  for (const TensorView& view : matrices) {
    if (view.dtype == DType::kQ8) fail("{}: tensor {} is already q8", flags.model_dir, view.name);
    quantized[view.name] = view;
  }

  std::vector<OutputTensor> tensors;
  auto add_q8 = [&](const std::string& name, const TensorView& view) {
    const int64_t columns = view.shape.back();
    const int64_t elements = view.element_count();
    std::vector<int64_t> scale_shape = view.shape;
    scale_shape.back() = q8_blocks_per_row(columns);
    tensors.push_back({name, "I8", view.shape, static_cast<uint64_t>(elements), nullptr, view, false});
    tensors.push_back({name + "_scale", "F32", scale_shape, static_cast<uint64_t>(elements / columns * scale_shape.back() * 4), nullptr, view, true});
  };
  for (const auto& [name, stored] : model->checkpoint().tensors()) {
    if (auto found = quantized.find(name); found != quantized.end()) {
      add_q8(name, found->second);
    } else {
      tensors.push_back({name, stored.dtype_name, stored.shape, stored.size_bytes, &stored, {}, false});
    }
  }
  if (weights.lm_head_tied) add_q8("lm_head.weight", weights.embed_tokens);  // the head reads its own q8 copy

  // Larger elements first (f32 scales, then bf16, then int8): every tensor then starts at a multiple
  // of its element size without gaps, which safetensors readers reject.
  std::stable_sort(tensors.begin(), tensors.end(), [](const OutputTensor& a, const OutputTensor& b) {
    return stored_dtype_size(a.dtype) > stored_dtype_size(b.dtype);
  });
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"quantized_by", "gemma4rt quantize"}};
  uint64_t offset = 0;
  for (const OutputTensor& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::filesystem::create_directories(out);
  const auto file_path = out / "model.safetensors";
  std::ofstream file(file_path, std::ios::binary | std::ios::trunc);
  if (!file) fail("{}: cannot create", file_path.string());
  const uint64_t header_size = header_text.size();
  file.write(reinterpret_cast<const char*>(&header_size), 8);
  file.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));

  ProgressBar progress("quantize", offset);
  uint64_t written = 0;
  std::vector<float> row;
  std::vector<int8_t> values;
  std::vector<float> scales;
  for (const OutputTensor& tensor : tensors) {
    if (tensor.source != nullptr) {
      file.write(reinterpret_cast<const char*>(tensor.source->data), static_cast<std::streamsize>(tensor.bytes));
    } else {
      // Row by row: the same quantisation the engine applies at load, so results are identical.
      const int64_t columns = tensor.quantize.shape.back();
      const int64_t rows = tensor.quantize.element_count() / columns;
      const int64_t blocks = q8_blocks_per_row(columns);
      row.resize(columns);
      values.resize(columns);
      scales.resize(blocks);
      for (int64_t r = 0; r < rows; ++r) {
        tensor.quantize.read_floats(r * columns, columns, row.data());
        kernels::quantize_q8(row.data(), 1, columns, values.data(), scales.data());
        if (tensor.is_scale) {
          file.write(reinterpret_cast<const char*>(scales.data()), static_cast<std::streamsize>(blocks * sizeof(float)));
        } else {
          file.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(columns));
        }
      }
    }
    written += tensor.bytes;
    progress.update(written);
  }
  progress.finish();
  if (!file) fail("{}: write failed (disk full?)", file_path.string());
  file.close();

  // The small files travel along; config.json records how the weights are stored.
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}) {
    const auto source = std::filesystem::path(flags.model_dir) / name;
    if (std::filesystem::exists(source)) std::filesystem::copy_file(source, out / name, std::filesystem::copy_options::overwrite_existing);
  }
  std::ifstream config_input(std::filesystem::path(flags.model_dir) / "config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(config_input);
  config["quantization_config"] = {{"quant_method", "gemma4rt_q8"}, {"block_size", kQ8BlockValues}};
  std::ofstream(out / "config.json") << config.dump(2) << "\n";
  std::filesystem::remove(out / "model.safetensors.index.json");
  fmt::print(stderr, "quantize: wrote {} ({:.2f} GB, {} q8 matrices)\n", file_path.string(), offset / 1e9, quantized.size() + (weights.lm_head_tied ? 1 : 0));
  return 0;
}

}  // namespace

Action add_quantize_command(CLI::App& app) {
  auto flags = std::make_shared<QuantizeFlags>();
  CLI::App* command = app.add_subcommand("quantize", "Write a copy of a checkpoint with q8 linear weights");
  command->add_option("--model", flags->model_dir, "Checkpoint directory to read")->required();
  command->add_option("--out", flags->out_dir, "Directory to write")->required();
  command->add_option("--dtype", flags->dtype, "Target format (q8)")->check(CLI::IsMember({"q8"}));
  command->add_flag("--force", flags->force, "Replace the files of a non-empty --out");
  return [flags] { return quantize(*flags); };
}

}  // namespace gemma4rt::tools
