// gemma4rt quantize: writes a copy of a checkpoint whose linear weights are q8 (int8 with one float
// scale per 32 values of a row) or q4 (core/formats.h), so loading it needs no quantisation pass.
// Embedding and per-layer embedding tables stay as stored (they are only gathered), norms and the
// router stay as stored, and a tied LM head gets its own copy as lm_head.weight. A q8 tensor NAME is
// stored as I8 with its block scales in the F32 tensor NAME_scale; a q4 one as U8 [..., packed row
// bytes] with F16 scales NAME_scale. The loader reads both back (model/weights.cc).
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/progress.h"
#include "backend/cpu/kernels/matmul.h"
#include "model/checkpoint_writer.h"
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
  const std::optional<WeightFormat> parsed = parse_weight_format(flags.dtype);
  if (parsed != WeightFormat::kQ8 && parsed != WeightFormat::kQ4) fail("--dtype {}: quantize writes q8 or q4", flags.dtype);
  const WeightFormat format = *parsed;
  const bool q4 = format == WeightFormat::kQ4;
  const std::filesystem::path out(flags.out_dir);
  if (std::filesystem::exists(out) && !std::filesystem::is_directory(out)) fail("{}: exists and is not a directory", out.string());
  if (std::filesystem::exists(out) && !std::filesystem::is_empty(out) && !flags.force) {
    fail("{}: exists and is not empty (use --force to replace)", out.string());
  }
  // The copy is written beside the checkpoint being read, never over it: its files are mapped while
  // the copy is written, and the copy must not replace the weights it came from.
  std::error_code same_error;
  if (std::filesystem::exists(out) && std::filesystem::equivalent(out, flags.model_dir, same_error)) {
    fail("--out {} is the checkpoint being read ({}): write the quantised copy to another directory", flags.out_dir, flags.model_dir);
  }
  auto model = Model::load(flags.model_dir);
  const ModelWeights& weights = model->weights();

  // The matrices the engine multiplies: these are quantised.
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
    if (view.dtype == DType::kQ8 || view.dtype == DType::kQ4) fail("{}: tensor {} is already {}", flags.model_dir, view.name, dtype_name(view.dtype));
    quantized[view.name] = view;
  }

  std::vector<OutputTensor> tensors;
  auto add_quantized = [&](const std::string& name, const TensorView& view) {
    const int64_t columns = view.shape.back();
    const int64_t rows = view.element_count() / columns;
    std::vector<int64_t> value_shape = view.shape, scale_shape = view.shape;
    if (q4) value_shape.back() = q4_row_bytes(columns);
    scale_shape.back() = q4 ? q4_blocks_per_row(columns) : q8_blocks_per_row(columns);
    tensors.push_back({name, q4 ? "U8" : "I8", value_shape, static_cast<uint64_t>(rows * value_shape.back()), nullptr, view, false});
    tensors.push_back({name + "_scale", q4 ? "F16" : "F32", scale_shape, static_cast<uint64_t>(rows * scale_shape.back() * (q4 ? 2 : 4)), nullptr,
                       view, true});
  };
  for (const auto& [name, stored] : model->checkpoint().tensors()) {
    if (auto found = quantized.find(name); found != quantized.end()) {
      add_quantized(name, found->second);
    } else {
      tensors.push_back({name, stored.dtype_name, stored.shape, stored.size_bytes, &stored, {}, false});
    }
  }
  if (weights.lm_head_tied) add_quantized("lm_head.weight", weights.embed_tokens);  // the head reads its own quantised copy

  // Larger elements first (f32 scales, then bf16 and f16, then bytes): every tensor then starts at a multiple
  // of its element size without gaps, which safetensors readers reject.
  std::stable_sort(tensors.begin(), tensors.end(), [](const OutputTensor& a, const OutputTensor& b) {
    return stored_dtype_size(a.dtype) > stored_dtype_size(b.dtype);
  });
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"quantized_by", "gemma4rt quantize"}};
  if (q4) header["__metadata__"][kQ4LayoutKey] = kQ4Layout;
  uint64_t offset = 0;
  for (const OutputTensor& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  // Written to a temporary name and renamed when complete: a failure (a value q4 cannot hold, a full
  // disk) leaves what --out held before, and no half-written checkpoint. Both files exist until then.
  check_free_space(out, 8 + header_text.size() + offset, false);
  std::filesystem::create_directories(out);
  const auto file_path = out / "model.safetensors";
  const auto partial_path = out / "model.safetensors.partial";
  struct RemoveUnlessKept {
    std::filesystem::path path;
    bool kept = false;
    ~RemoveUnlessKept() {
      std::error_code ignored;
      if (!kept) std::filesystem::remove(path, ignored);
    }
  } partial{partial_path};
  std::ofstream file(partial_path, std::ios::binary | std::ios::trunc);
  if (!file) fail("{}: cannot create", partial_path.string());
  const uint64_t header_size = header_text.size();
  file.write(reinterpret_cast<const char*>(&header_size), 8);
  file.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));

  ProgressBar progress("quantize", offset);
  uint64_t written = 0;
  std::vector<float> row;
  std::vector<int8_t> values;
  std::vector<float> scales;
  std::vector<uint8_t> nibbles;
  std::vector<uint16_t> half_scales;
  for (const OutputTensor& tensor : tensors) {
    if (tensor.source != nullptr) {
      file.write(reinterpret_cast<const char*>(tensor.source->data), static_cast<std::streamsize>(tensor.bytes));
    } else {
      // Row by row: the same quantisation the engine applies at load, so results are identical.
      const int64_t columns = tensor.quantize.shape.back();
      const int64_t rows = tensor.quantize.element_count() / columns;
      row.resize(columns);
      values.resize(columns);
      scales.resize(q8_blocks_per_row(columns));
      nibbles.resize(q4_row_bytes(columns));
      half_scales.resize(q4_blocks_per_row(columns));
      auto write = [&](const auto& data) {
        file.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(data[0])));
      };
      for (int64_t r = 0; r < rows; ++r) {
        tensor.quantize.read_floats(r * columns, columns, row.data());
        if (q4) {
          try {
            kernels::quantize_q4(row.data(), 1, columns, nibbles.data(), half_scales.data());
          } catch (const Error& error) {
            fail("{} row {}: {}", tensor.quantize.name, r, error.what());
          }
          tensor.is_scale ? write(half_scales) : write(nibbles);
        } else {
          kernels::quantize_q8(row.data(), 1, columns, values.data(), scales.data());
          tensor.is_scale ? write(scales) : write(values);
        }
      }
    }
    written += tensor.bytes;
    progress.update(written);
  }
  progress.finish();
  file.close();
  if (!file) fail("{}: write failed (disk full?)", partial_path.string());
  std::error_code rename_error;
  std::filesystem::rename(partial_path, file_path, rename_error);
  if (rename_error) fail("{}: cannot replace it with {}: {}", file_path.string(), partial_path.string(), rename_error.message());
  partial.kept = true;

  // The small files travel along; config.json records how the weights are stored.
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}) {
    const auto source = std::filesystem::path(flags.model_dir) / name;
    if (std::filesystem::exists(source)) std::filesystem::copy_file(source, out / name, std::filesystem::copy_options::overwrite_existing);
  }
  std::ifstream config_input(std::filesystem::path(flags.model_dir) / "config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(config_input);
  config["quantization_config"] = {{"quant_method", q4 ? "gemma4rt_q4" : "gemma4rt_q8"}, {"block_size", q4 ? kQ4BlockValues : kQ8BlockValues}};
  std::ofstream(out / "config.json") << config.dump(2) << "\n";
  remove_stale_shards(out);
  fmt::print(stderr, "quantize: wrote {} ({:.2f} GB, {} {} matrices)\n", file_path.string(), offset / 1e9, quantized.size() + (weights.lm_head_tied ? 1 : 0),
             format_name(format));
  return 0;
}

}  // namespace

Action add_quantize_command(CLI::App& app) {
  auto flags = std::make_shared<QuantizeFlags>();
  CLI::App* command = app.add_subcommand("quantize", "Write a copy of a checkpoint with q8 or q4 linear weights");
  command->add_option("--model", flags->model_dir, "Checkpoint directory to read")->required();
  command->add_option("--out", flags->out_dir, "Directory to write")->required();
  command->add_option("--dtype", flags->dtype, "Target format: q8 (int8, f32 scale per 32) or q4 (4.5 bits per weight)")->check(CLI::IsMember({"q8", "q4"}));
  command->add_flag("--force", flags->force, "Replace the files of a non-empty --out");
  return [flags] { return quantize(*flags); };
}

}  // namespace gemma4rt::tools
