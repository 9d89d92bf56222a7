#include "diagnostics/checkpoint_checks.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_input.h"
#include "engine/transformer.h"
#include "model/model_shapes.h"
#include "model/quantized_tensors.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace gemma4rt {
namespace {

using nlohmann::json;

// checkpoint_tensors() names keys with the released prefix; other layouts are mapped onto it.
// A FAIL message lists at most this many tensor names, then a count of the rest.
constexpr size_t kNamesShown = 8;

// Error texts become one report line: newlines flattened, and a loader's long list of problems ("a; b;
// c; ...") cut after the first few hundred characters with a count of the rest.
std::string one_line(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  constexpr size_t kLongest = 800;
  if (message.size() <= kLongest) return message;
  const size_t cut = message.rfind("; ", kLongest);
  if (cut == std::string::npos) return message.substr(0, kLongest) + " ...";
  size_t rest = 0;
  for (size_t at = message.find("; ", cut); at != std::string::npos; at = message.find("; ", at + 2)) ++rest;
  return message.substr(0, cut) + fmt::format("; and {} more", rest);
}

std::string list_names(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kNamesShown));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kNamesShown) text += fmt::format(" and {} more", names.size() - kNamesShown);
  return text;
}

// "5-14" for a run of consecutive numbers, "3, 7, 9" otherwise.
std::string list_numbers(const std::vector<int>& numbers) {
  if (numbers.size() > 2 && numbers.back() - numbers.front() + 1 == static_cast<int>(numbers.size())) {
    return fmt::format("{}-{}", numbers.front(), numbers.back());
  }
  return fmt::format("{}", fmt::join(numbers, ", "));
}

std::string human_count(int64_t count) {
  if (count >= 1'000'000'000) return fmt::format("{:.2f}B", count / 1e9);
  if (count >= 1'000'000) return fmt::format("{:.2f}M", count / 1e6);
  if (count >= 1'000) return fmt::format("{:.1f}K", count / 1e3);
  return std::to_string(count);
}

// The tensors of the Per-Layer Embeddings, which a stripped checkpoint lacks.
bool is_per_layer_input(TensorKind kind) {
  switch (kind) {
    case TensorKind::kPerLayerEmbedding: case TensorKind::kPerLayerModelProjection: case TensorKind::kPerLayerProjectionNorm:
    case TensorKind::kPerLayerInputGate: case TensorKind::kPerLayerProjection: case TensorKind::kPostPerLayerInputNorm:
      return true;
    default:
      return false;
  }
}

// A view whose values can be read, q8 block scales attached (q4 is refused: see below).
TensorView readable_view(const Checkpoint& checkpoint, const StoredTensor& stored) {
  TensorView view = Checkpoint::view(stored);
  if (view.dtype == DType::kQ8) {
    const StoredTensor* scales = checkpoint.find(stored.name + "_scale");
    if (scales == nullptr || scales->dtype_name != "F32") fail("q8 tensor {} has no F32 block scales {}_scale", stored.name, stored.name);
    view.q8_scales = reinterpret_cast<const float*>(scales->data);
  }
  // The tables and scalars read here are never quantised; packed nibbles there are a broken file.
  if (view.dtype == DType::kQ4) fail("tensor {} is stored as q4 (U8); only linear weights can be q4", stored.name);
  return view;
}

// NaN and infinity are the float values whose exponent bits are all ones: counted on the stored bits,
// so the scan runs at the speed of reading the file. -1 for a dtype that holds no float values.
template <typename Bits>
int64_t count_non_finite(const std::byte* data, size_t size_bytes, Bits exponent_mask, int64_t* first) {
  const size_t count = size_bytes / sizeof(Bits);
  const auto* values = reinterpret_cast<const Bits*>(data);
  int64_t found = 0;
  constexpr size_t kChunk = 1 << 16;  // counted branch-free a chunk at a time, the first index looked up after
  for (size_t begin = 0; begin < count; begin += kChunk) {
    const size_t end = std::min(count, begin + kChunk);
    int64_t in_chunk = 0;
    for (size_t i = begin; i < end; ++i) in_chunk += (values[i] & exponent_mask) == exponent_mask;
    if (in_chunk > 0 && found == 0) {
      for (size_t i = begin; i < end; ++i) {
        if ((values[i] & exponent_mask) == exponent_mask) {
          *first = static_cast<int64_t>(i);
          break;
        }
      }
    }
    found += in_chunk;
  }
  return found;
}

int64_t count_non_finite(const StoredTensor& stored, int64_t* first) {
  if (stored.dtype_name == "BF16") return count_non_finite<uint16_t>(stored.data, stored.size_bytes, 0x7f80, first);
  if (stored.dtype_name == "F16") return count_non_finite<uint16_t>(stored.data, stored.size_bytes, 0x7c00, first);
  if (stored.dtype_name == "F32") return count_non_finite<uint32_t>(stored.data, stored.size_bytes, 0x7f800000u, first);
  return -1;
}

json read_json_object(const std::filesystem::path& path) {
  const json value = parse_json_file(path);
  if (!value.is_object()) fail("{}: expected a JSON object", path.string());
  return value;
}

bool has_value(const json& object, const char* key) { return object.is_object() && object.contains(key) && !object.at(key).is_null(); }

// Everything the checks share; each check fills in what later ones need.
class Doctor {
 public:
  Doctor(std::filesystem::path model_dir, const DoctorOptions& options) : dir_(std::move(model_dir)), options_(options) {}

  DoctorReport run() {
    check("config", [&] { check_config(); });
    check("safetensors", [&] { check_safetensors(); });
    check("tensors", [&] { check_tensors(); });
    check("per-layer embeddings", [&] { check_per_layer_embeddings(); });
    check("layer_scalar", [&] { check_layer_scalars(); });
    check("kv sharing", [&] { check_kv_sharing(); });
    check("unused tensors", [&] { check_unused_tensors(); });
    check("values", [&] { check_values(); });
    check("tokenizer.json", [&] { check_tokenizer_file(); });
    check("vocabulary", [&] { check_vocabulary(); });
    check("round trip", [&] { check_round_trip(); });
    check("special tokens", [&] { check_special_tokens(); });
    check("chat format", [&] { check_chat_format(); });
    check("eos ids", [&] { check_eos_ids(); });
    check("weights", [&] { check_weights_load(); });
    check("forward", [&] { check_forward(); });
    check("parameters", [&] { check_parameters(); });
    return std::move(report_);
  }

 private:
  // A check ends by calling result() once, or by throwing: the exception text becomes its FAIL line.
  void check(const std::string& name, const std::function<void()>& body) {
    current_ = name;
    recorded_ = false;
    try {
      body();
    } catch (const std::exception& error) {
      if (!recorded_) result(CheckStatus::kFail, error.what());
    }
    if (!recorded_) result(CheckStatus::kFail, "the check ended without a result");
  }
  void result(CheckStatus status, std::string message) {
    report_.checks.push_back({current_, status, one_line(std::move(message))});
    recorded_ = true;
  }
  // Checks whose input failed earlier report a skip: the cause is already a FAIL of its own.
  bool skip_without_config() {
    if (config_) return false;
    result(CheckStatus::kWarn, "skipped (config.json did not parse)");
    return true;
  }
  bool skip_without_checkpoint() {
    if (skip_without_config()) return true;
    if (checkpoint_) return false;
    result(CheckStatus::kWarn, "skipped (the safetensors files did not open)");
    return true;
  }
  bool skip_without_tokenizer() {
    if (tokenizer_) return false;
    result(CheckStatus::kWarn, "skipped (no usable tokenizer.json)");
    return true;
  }
  // The name a tensor has in this checkpoint (its key prefix may differ from the released one).
  std::string stored_name(const TensorSpec& spec) const { return tensor_key_is_prefixed(spec.kind) ? prefix_ + spec.key : spec.key; }
  std::string stored_name(TensorKind kind, int layer = -1) const {
    return tensor_key_is_prefixed(kind) ? prefix_ + tensor_key(kind, layer) : tensor_key(kind, layer);
  }

  void check_config() {
    if (!std::filesystem::is_directory(dir_)) fail("{}: not a directory (expected a Hugging Face checkpoint directory)", dir_.string());
    config_ = load_model_config(dir_);
    const ModelConfig& config = *config_;
    const int full = static_cast<int>(std::count(config.layer_types.begin(), config.layer_types.end(), AttentionType::kFull));
    std::string message =
        fmt::format("{}: {} layers ({} sliding, {} full), hidden {}, vocab {}, sliding window {}", config.model_type, config.num_layers,
                    config.num_layers - full, full, config.hidden_size, config.vocab_size, config.sliding_window);
    if (config.has_per_layer_inputs()) message += fmt::format(", PLE width {}", config.hidden_size_per_layer_input);
    if (config.num_kv_shared_layers > 0) message += fmt::format(", {} KV-shared layers", config.num_kv_shared_layers);
    if (config.enable_moe_block) message += fmt::format(", MoE {} experts top-{}", config.num_experts, config.top_k_experts);
    result(CheckStatus::kPass, message);
  }

  void check_safetensors() {
    if (!std::filesystem::is_directory(dir_)) fail("{}: not a directory", dir_.string());
    checkpoint_ = std::make_unique<Checkpoint>(dir_);
    prefix_ = detect_key_prefix(*checkpoint_);
    result(CheckStatus::kPass, fmt::format("{} tensors in {} file{}, headers valid, key prefix \"{}\"", checkpoint_->tensors().size(),
                                           checkpoint_->files().size(), checkpoint_->files().size() == 1 ? "" : "s", prefix_));
  }

  // Presence and shape of every tensor the forward pass reads. Runs on the checkpoint directly, so a
  // stripped file is described tensor by tensor even though the loader would stop at the first Error.
  void check_tensors() {
    if (skip_without_checkpoint()) return;
    const ModelConfig& config = *config_;
    std::vector<std::string> missing, misshaped, bad_dtype;
    std::set<int> layers_with_wrong_attention;
    const std::vector<TensorSpec> specs = checkpoint_tensors(config);
    for (const TensorSpec& spec : specs) {
      const std::string name = stored_name(spec);
      needed_.insert(name);
      const StoredTensor* stored = checkpoint_->find(name);
      if (stored == nullptr) {
        missing.push_back(name);
        continue;
      }
      ++dtype_counts_[stored->dtype_name];
      const std::vector<int64_t> stored_shape = stored_shape_of(stored->dtype_name, spec.shape);
      if (stored->shape != stored_shape) {
        misshaped.push_back(fmt::format("{} is {} (config: {}{})", name, shape_to_string(stored->shape), shape_to_string(spec.shape),
                                        stored_shape != spec.shape ? fmt::format(", stored as {}: {}", stored->dtype_name, shape_to_string(stored_shape)) : ""));
        if (spec.is_attention()) layers_with_wrong_attention.insert(spec.layer);
      }
      if (is_quantized_dtype(stored->dtype_name)) {
        needed_.insert(name + "_scale");
        if (const std::string problem = block_scales_problem(*checkpoint_, *stored, spec.shape); !problem.empty()) bad_dtype.push_back(problem);
        if (stored->dtype_name == "U8") {
          const std::string problem = q4_layout_problem(*stored);
          const std::string file = stored->file != nullptr ? stored->file->string() : "";
          if (!problem.empty() && stale_q4_files_.insert(file).second) bad_dtype.push_back(problem);
        }
      } else if (stored->dtype_name != "F32" && stored->dtype_name != "BF16" && stored->dtype_name != "F16") {
        bad_dtype.push_back(fmt::format("{} has dtype {}", name, stored->dtype_name));
      }
    }
    // A stored head is used even when the config ties it (the loader prefers what is stored).
    if (config.tie_word_embeddings && checkpoint_->find(stored_name(TensorKind::kLmHead)) != nullptr) needed_.insert(stored_name(TensorKind::kLmHead));

    std::vector<std::string> problems;
    // Attention shapes follow the layer type, so a mis-shaped attention block usually means layer_types
    // (or num_kv_shared_layers) disagrees with the checkpoint rather than a damaged tensor: said first.
    for (int layer : layers_with_wrong_attention) problems.push_back(describe_layer_disagreement(layer));
    const size_t total = specs.size();
    if (!missing.empty()) {
      problems.push_back(
          fmt::format("{} of {} tensors the forward pass reads are missing: {}", missing.size(), total, list_names(missing)));
    }
    if (!misshaped.empty()) {
      problems.push_back(
          fmt::format("{} of {} tensors have a shape the config does not give: {}", misshaped.size(), total, list_names(misshaped)));
    }
    if (!bad_dtype.empty()) {
      problems.push_back(fmt::format("{} of {} tensors are unreadable: {}", bad_dtype.size(), total, list_names(bad_dtype)));
    }
    if (!problems.empty()) {
      result(CheckStatus::kFail, fmt::format("{}", fmt::join(problems, "; ")));
      return;
    }
    result(CheckStatus::kPass, fmt::format("all {} tensors the forward pass reads are stored with the config's shapes", specs.size()));
  }

  std::string describe_layer_disagreement(int layer) const {
    const ModelConfig& config = *config_;
    const LayerConfig& geometry = config.layers.at(layer);
    const StoredTensor* q_proj = checkpoint_->find(stored_name(TensorKind::kQProj, layer));
    const std::string said = geometry.is_sliding() ? "sliding_attention" : "full_attention";
    if (q_proj != nullptr && q_proj->shape.size() == 2) {
      const int other_head_dim =
          geometry.is_sliding() ? (config.global_head_dim > 0 ? config.global_head_dim : config.head_dim) : config.head_dim;
      if (other_head_dim != geometry.head_dim && q_proj->shape[0] == static_cast<int64_t>(geometry.num_query_heads) * other_head_dim) {
        return fmt::format("layer {}: layer_types says {} but its attention tensors have the shapes of the other layer type", layer, said);
      }
    }
    return fmt::format("layer {} ({}{}): attention tensors disagree with the config's geometry", layer, said,
                       geometry.owns_kv(layer) ? "" : fmt::format(", K/V shared from layer {}", geometry.kv_source_layer));
  }

  void check_per_layer_embeddings() {
    if (skip_without_checkpoint()) return;
    const ModelConfig& config = *config_;
    const std::string table_name = stored_name(TensorKind::kPerLayerEmbedding);
    const StoredTensor* table = checkpoint_->find(table_name);
    if (!config.has_per_layer_inputs()) {
      if (table != nullptr) {
        fail("the checkpoint stores {} but config.json has hidden_size_per_layer_input 0: the per-layer inputs would be skipped",
             table_name);
      }
      result(CheckStatus::kPass, "not a PLE model (hidden_size_per_layer_input 0) and no PLE tensors stored");
      return;
    }
    std::vector<std::string> missing;
    for (const TensorSpec& spec : checkpoint_tensors(config)) {
      if (is_per_layer_input(spec.kind) && checkpoint_->find(stored_name(spec)) == nullptr) missing.push_back(stored_name(spec));
    }
    if (!missing.empty()) {
      fail("hidden_size_per_layer_input is {} but {} PLE tensors are missing (the checkpoint was stripped of its per-layer embeddings): {}",
           config.hidden_size_per_layer_input, missing.size(), list_names(missing));
    }
    // A zeroed table loads fine and computes the same wrong thing on every path: sample a few rows.
    const TensorView view = readable_view(*checkpoint_, *table);
    if (view.shape.size() == 2 && view.shape[0] > 0) {
      const int64_t rows = view.shape[0];
      const int64_t width = view.shape[1];
      std::vector<float> row(static_cast<size_t>(width));
      bool any_nonzero = false;
      for (int64_t id : {int64_t{config.bos_token_id}, int64_t{kTurnOpenId}, rows / 2, rows - 1}) {
        if (id < 0 || id >= rows) continue;
        view.read_floats(id * width, width, row.data());
        any_nonzero = any_nonzero || std::any_of(row.begin(), row.end(), [](float value) { return value != 0.0f; });
      }
      if (!any_nonzero) fail("{}: every sampled row is zero (the PLE table was zeroed upstream)", table_name);
    }
    result(CheckStatus::kPass, fmt::format("PLE width {}: {} {} and every layer's per-layer input tensors are present",
                                           config.hidden_size_per_layer_input, table_name, shape_to_string(table->shape)));
  }

  void check_layer_scalars() {
    if (skip_without_checkpoint()) return;
    const ModelConfig& config = *config_;
    std::vector<std::string> missing, broken;
    std::vector<float> values;
    for (int layer = 0; layer < config.num_layers; ++layer) {
      const std::string name = stored_name(TensorKind::kLayerScalar, layer);
      const StoredTensor* stored = checkpoint_->find(name);
      if (stored == nullptr) {
        missing.push_back(name);
        continue;
      }
      if (stored->shape != std::vector<int64_t>{1}) {
        broken.push_back(fmt::format("{} has shape {} (expected [1])", name, shape_to_string(stored->shape)));
        continue;
      }
      const float value = readable_view(*checkpoint_, *stored).at(0);
      if (!std::isfinite(value)) broken.push_back(fmt::format("{} is {}", name, value));
      values.push_back(value);
    }
    if (!missing.empty()) {
      fail("{} of {} layers have no layer_scalar (the buffer was dropped upstream; the whole residual stream is scaled by it): {}",
           missing.size(), config.num_layers, list_names(missing));
    }
    if (!broken.empty()) fail("{}", list_names(broken));
    if (!values.empty() && std::all_of(values.begin(), values.end(), [](float value) { return value == 1.0f; })) {
      fail(
          "all {} layer_scalar values are exactly 1.0: the buffer was left at its default somewhere upstream (trained "
          "checkpoints store values far from 1)",
          values.size());
    }
    const auto [low, high] = std::minmax_element(values.begin(), values.end());
    result(CheckStatus::kPass, fmt::format("present in all {} layers, values {:.4g} to {:.4g}", values.size(), *low, *high));
  }

  void check_kv_sharing() {
    if (skip_without_config()) return;
    const ModelConfig& config = *config_;
    if (config.num_kv_shared_layers == 0) {
      result(CheckStatus::kPass, "no KV-shared layers");
      return;
    }
    std::vector<int> shared;
    std::map<std::string, int> sources;  // "sliding"/"full" -> source layer
    for (int layer = 0; layer < config.num_layers; ++layer) {
      const LayerConfig& geometry = config.layers[layer];
      if (geometry.owns_kv(layer)) continue;
      shared.push_back(layer);
      sources[geometry.is_sliding() ? "sliding" : "full"] = geometry.kv_source_layer;
    }
    std::vector<std::string> source_text;
    for (const auto& [type, layer] : sources) source_text.push_back(fmt::format("layer {} for {}", layer, type));
    std::string message = fmt::format("layers {} reuse the K/V of {}", list_numbers(shared), fmt::join(source_text, " and "));
    if (!checkpoint_) {
      result(CheckStatus::kPass, message);
      return;
    }
    // Released E-model checkpoints still carry K/V projections for shared layers; the model never reads them.
    for (int layer : shared) {
      for (const TensorKind kind : {TensorKind::kKProj, TensorKind::kVProj, TensorKind::kKNorm}) {
        for (const std::string& name : {stored_name(kind, layer), stored_name(kind, layer) + "_scale"}) {
          if (checkpoint_->find(name) != nullptr) stale_kv_.insert(name);
        }
      }
    }
    if (stale_kv_.empty()) {
      result(CheckStatus::kPass, message);
      return;
    }
    result(CheckStatus::kInfo,
           message + fmt::format("; {} stale k_proj/v_proj/k_norm tensors of the shared layers are stored and ignored", stale_kv_.size()));
  }

  // Language-model tensors nobody reads hint at a naming mismatch between the checkpoint and the loader.
  void check_unused_tensors() {
    if (skip_without_checkpoint()) return;
    if (needed_.empty()) {
      result(CheckStatus::kWarn, "skipped (the tensor check did not run)");
      return;
    }
    std::vector<std::string> unused;
    for (const auto& [name, stored] : checkpoint_->tensors()) {
      const bool other_tower = name.find("vision") != std::string::npos || name.find("audio") != std::string::npos;
      const bool language_model = prefix_.empty() || name.starts_with(prefix_);
      if (!language_model || other_tower || needed_.contains(name) || stale_kv_.contains(name)) continue;
      unused.push_back(name);
    }
    if (unused.empty()) {
      result(CheckStatus::kPass, "every stored language-model tensor is read (stale KV-shared tensors aside)");
      return;
    }
    result(CheckStatus::kWarn, fmt::format("{} stored tensors are never read (renamed keys or a config that disagrees?): {}", unused.size(),
                                           list_names(unused)));
  }

  // One NaN or inf anywhere in a weight spreads through the residual stream to every logit, and the
  // forward check alone cannot say where it came from: every stored value the forward pass reads is
  // scanned, float weights and quantised weights' block scales alike.
  void check_values() {
    if (!options_.scan_values) {
      result(CheckStatus::kInfo, "skipped (not requested)");
      return;
    }
    if (skip_without_checkpoint()) return;
    if (needed_.empty()) {
      result(CheckStatus::kWarn, "skipped (the tensor check did not run)");
      return;
    }
    std::vector<std::string> broken;
    int64_t scanned_tensors = 0, scanned_values = 0;
    for (const std::string& name : needed_) {
      const StoredTensor* stored = checkpoint_->find(name);
      if (stored == nullptr) continue;
      int64_t first = 0;
      const int64_t found = count_non_finite(*stored, &first);
      if (found < 0) continue;  // integer codes: their scales are scanned as tensors of their own
      const auto values = static_cast<int64_t>(stored->size_bytes / stored_dtype_size(stored->dtype_name));
      ++scanned_tensors;
      scanned_values += values;
      if (found > 0) broken.push_back(fmt::format("{} ({} of {} values, the first at flat index {})", name, found, values, first));
    }
    if (!broken.empty()) {
      fail("{} NaN or inf values, which spread to the logits: {}", broken.size() == 1 ? "1 tensor holds" : fmt::format("{} tensors hold", broken.size()),
           list_names(broken));
    }
    result(CheckStatus::kPass, fmt::format("no NaN or inf among the {} values of the {} float tensors the forward pass reads",
                                           human_count(scanned_values), scanned_tensors));
  }

  void check_tokenizer_file() {
    const std::filesystem::path path = dir_ / "tokenizer.json";
    if (!std::filesystem::exists(path)) {
      fail(
          "{}: file not found: text prompts and the chat format cannot be tokenized (copy tokenizer.json from the original "
          "checkpoint)",
          path.string());
    }
    tokenizer_.emplace(Tokenizer::load(path));
    result(CheckStatus::kPass, fmt::format("{} loads: {} ids", path.string(), tokenizer_->vocab_size()));
  }

  void check_vocabulary() {
    if (skip_without_tokenizer() || skip_without_config()) return;
    const int32_t tokenizer_ids = tokenizer_->vocab_size();
    const int config_ids = config_->vocab_size;
    if (tokenizer_ids > config_ids) {
      fail(
          "tokenizer.json has {} ids but config.json vocab_size is {}: ids {}..{} have no embedding row (wrong tokenizer for this "
          "checkpoint?)",
          tokenizer_ids, config_ids, config_ids, tokenizer_ids - 1);
    }
    if (tokenizer_ids < config_ids) {
      result(CheckStatus::kPass,
             fmt::format("tokenizer ids 0..{} fit the {}-row embedding (rows beyond are padding)", tokenizer_ids - 1, config_ids));
      return;
    }
    result(CheckStatus::kPass, fmt::format("tokenizer and config.json agree: {} ids", config_ids));
  }

  void check_round_trip() {
    if (skip_without_tokenizer()) return;
    const std::string text = "hello world";
    const std::vector<int32_t> ids = tokenizer_->encode(text);
    const std::string decoded = tokenizer_->decode(ids);
    if (decoded != text) fail("\"{}\" encodes to [{}] and decodes to \"{}\"", text, fmt::join(ids, ", "), decoded);
    result(CheckStatus::kPass, fmt::format("\"{}\" -> [{}] -> \"{}\"", text, fmt::join(ids, ", "), decoded));
  }

  void check_special_tokens() {
    if (skip_without_tokenizer()) return;
    const int32_t bos = config_ ? config_->bos_token_id : 2;
    const std::vector<std::pair<std::string, int32_t>> expected = {{"<bos>", bos},
                                                                   {"<eos>", kEosId},
                                                                   {"<|turn>", kTurnOpenId},
                                                                   {"<turn|>", kTurnCloseId},
                                                                   {"<|channel>", kChannelOpenId},
                                                                   {"<channel|>", kChannelCloseId}};
    std::vector<std::string> problems, not_special;
    for (const auto& [text, id] : expected) {
      const std::vector<int32_t> ids = tokenizer_->encode(text);
      if (ids.size() != 1) {
        problems.push_back(
            fmt::format("{} encodes to {} ids [{}] instead of the single id {}", text, ids.size(), fmt::join(ids, ", "), id));
      } else if (ids[0] != id) {
        problems.push_back(fmt::format("{} encodes to id {} instead of {}", text, ids[0], id));
      } else if (!tokenizer_->is_special(id)) {
        not_special.push_back(text);
      }
    }
    if (!problems.empty()) {
      fail("{}: the chat format's markers would reach the model as ordinary text", fmt::join(problems, "; "));
    }
    if (!not_special.empty()) {
      result(CheckStatus::kWarn, fmt::format("single ids at the expected places, but {} not marked special: decoded output would show them",
                                             fmt::join(not_special, ", ")));
      return;
    }
    result(CheckStatus::kPass, fmt::format("<bos> {}, <eos> {}, <|turn> {}, <turn|> {}, <|channel> {}, <channel|> {}: one special id each",
                                           bos, kEosId, kTurnOpenId, kTurnCloseId, kChannelOpenId, kChannelCloseId));
  }

  // The chat format writes <bos> itself; anything that adds another one doubles it.
  void check_chat_format() {
    if (skip_without_tokenizer()) return;
    const int32_t bos = config_ ? config_->bos_token_id : 2;
    const bool ple = config_ && config_->has_per_layer_inputs();
    ChatOptions options;
    options.style = detect_generation_prompt_style(dir_, ple ? GenerationPromptStyle::kESeries : GenerationPromptStyle::kLargeModel);
    const json messages = json::array({{{"role", "user"}, {"content", "hello world"}}});
    const std::vector<int32_t> ids = tokenizer_->encode(render_chat(messages, nullptr, options));
    std::vector<std::string> problems;
    if (ids.empty() || ids[0] != bos) {
      problems.push_back(fmt::format("the rendered chat does not start with <bos> (id {}): it starts [{}]", bos,
                                     fmt::join(std::vector<int32_t>(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 4)), ", ")));
    } else if (ids.size() > 1 && ids[1] == bos) {
      problems.push_back("the rendered chat starts with two <bos>");
    }
    const std::vector<int32_t> added = tokenizer_->post_processor_added_prefix();
    if (std::find(added.begin(), added.end(), bos) != added.end()) {
      problems.push_back(
          fmt::format("tokenizer.json's post_processor adds <bos> (id {}) before every sequence: a runtime that encodes "
                      "the rendered chat with special tokens starts it with two <bos>",
                      bos));
    }
    const std::filesystem::path tokenizer_config = dir_ / "tokenizer_config.json";
    if (std::filesystem::exists(tokenizer_config)) {
      const json settings = read_json_object(tokenizer_config);
      if (has_value(settings, "add_bos_token") && settings.at("add_bos_token") == true) {
        problems.push_back(fmt::format("{} sets add_bos_token true: transformers would add a second <bos> to the rendered chat",
                                       tokenizer_config.string()));
      }
    }
    if (!problems.empty()) fail("{}", fmt::join(problems, "; "));
    result(CheckStatus::kPass,
           fmt::format("a one-turn chat ({}) is {} tokens starting with exactly one <bos>; the post-processor adds none",
                       options.style == GenerationPromptStyle::kESeries ? "E-series generation prompt" : "large-model generation prompt",
                       ids.size()));
  }

  void check_eos_ids() {
    if (skip_without_config()) return;
    // load_model_config falls back to <eos> when no file names one; a deployment should not rely on that.
    bool configured = false;
    const json config = read_json_object(dir_ / "config.json");
    configured =
        has_value(config, "eos_token_id") || (has_value(config, "text_config") && has_value(config["text_config"], "eos_token_id"));
    const std::filesystem::path generation = dir_ / "generation_config.json";
    if (std::filesystem::exists(generation)) configured = configured || has_value(read_json_object(generation), "eos_token_id");
    if (!configured) {
      fail("no eos_token_id in config.json or generation_config.json: generation would only stop at the token limit");
    }
    std::vector<std::string> described;
    for (int id : config_->eos_token_ids) {
      std::string piece;
      if (tokenizer_ && id < tokenizer_->vocab_size()) piece = " " + tokenizer_->token_text(id);
      described.push_back(fmt::format("{}{}", id, piece));
    }
    const auto& ids = config_->eos_token_ids;
    if (tokenizer_ && tokenizer_->token_id("<turn|>") == kTurnCloseId && std::find(ids.begin(), ids.end(), kTurnCloseId) == ids.end()) {
      result(CheckStatus::kWarn, fmt::format("eos ids {} do not include <turn|> ({}): chat answers end with it, so generation would run on "
                                             "past the answer",
                                             fmt::join(described, ", "), kTurnCloseId));
      return;
    }
    result(CheckStatus::kPass, fmt::format("generation stops on {}", fmt::join(described, ", ")));
  }

  void check_weights_load() {
    if (skip_without_checkpoint()) return;
    model_ = Model::load(dir_);
    result(CheckStatus::kPass, fmt::format("the loader resolves all {} layers' weights", config_->num_layers));
  }

  void check_forward() {
    if (!options_.run_forward) {
      result(CheckStatus::kInfo, "skipped (not requested)");
      return;
    }
    if (!model_) {
      result(CheckStatus::kWarn, "skipped (weights did not load)");
      return;
    }
    EngineOptions engine;
    engine.context_tokens = 8;
    engine.threads = options_.threads;
    engine.backend = options_.backend;
    engine.device = options_.device;
    Transformer transformer(*model_, engine);
    const int32_t token = config_->bos_token_id;
    const std::span<const float> logits = transformer.forward(std::span<const int32_t>(&token, 1), 0);
    const auto bad = std::find_if(logits.begin(), logits.end(), [](float value) { return !std::isfinite(value); });
    if (bad != logits.end()) {
      fail("a one-token forward (<bos>) on the {} backend gives logit {} for id {}", transformer.backend().name(), *bad, bad - logits.begin());
    }
    const auto [low, high] = std::minmax_element(logits.begin(), logits.end());
    if (*low == *high) fail("a one-token forward gives the same logit {} for every id: the weights carry no signal", *low);
    const int64_t best = high - logits.begin();
    result(CheckStatus::kPass, fmt::format("one <bos> on the {} backend ({} weights): {} finite logits in [{:.3g}, {:.3g}], argmax id {}",
                                           transformer.backend().name(), format_name(transformer.weight_format()), logits.size(), *low, *high, best));
  }

  void check_parameters() {
    if (skip_without_config()) return;
    const ParameterCounts counts = count_parameters(*config_);
    std::string dtype = "unknown (tensors not checked)";
    if (!dtype_counts_.empty()) {
      std::vector<std::string> parts;
      for (const auto& [name, count] : dtype_counts_) {
        parts.push_back(dtype_counts_.size() == 1 ? name : fmt::format("{} ({} tensors)", name, count));
      }
      dtype = fmt::format("{}", fmt::join(parts, ", "));
    }
    std::string excluded;
    if (counts.per_layer_embedding > 0) excluded += fmt::format(", without the {} PLE table", human_count(counts.per_layer_embedding));
    if (counts.inactive_experts > 0) excluded += fmt::format(", without {} of inactive experts", human_count(counts.inactive_experts));
    result(CheckStatus::kInfo, fmt::format("dtype {}; {} parameters in total ({}), {} effective ({}{})", dtype, human_count(counts.total),
                                           counts.total, human_count(counts.effective), counts.effective, excluded));
  }

  std::filesystem::path dir_;
  DoctorOptions options_;
  DoctorReport report_;
  std::string current_;
  bool recorded_ = false;

  std::optional<ModelConfig> config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::string prefix_ = kReleasedKeyPrefix;
  std::set<std::string> needed_;    // stored names the forward pass reads
  std::set<std::string> stale_kv_;  // K/V tensors of KV-shared layers
  std::set<std::string> stale_q4_files_;  // files of an older q4 layout, reported once each
  std::map<std::string, int> dtype_counts_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<Model> model_;
};

}  // namespace

const char* check_status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass: return "PASS";
    case CheckStatus::kInfo: return "INFO";
    case CheckStatus::kWarn: return "WARN";
    case CheckStatus::kFail: return "FAIL";
  }
  return "?";
}

bool DoctorReport::ok() const { return count(CheckStatus::kFail) == 0; }

int DoctorReport::count(CheckStatus status) const {
  return static_cast<int>(std::count_if(checks.begin(), checks.end(), [&](const CheckResult& check) { return check.status == status; }));
}

const CheckResult* DoctorReport::find(const std::string& name) const {
  for (const CheckResult& check : checks) {
    if (check.name == name) return &check;
  }
  return nullptr;
}

DoctorReport run_checkpoint_checks(const std::filesystem::path& model_dir, const DoctorOptions& options) {
  return Doctor(model_dir, options).run();
}

ParameterCounts count_parameters(const ModelConfig& config) {
  ParameterCounts counts;
  int64_t experts = 0;
  for (const TensorSpec& spec : checkpoint_tensors(config)) {
    counts.total += spec.element_count();
    if (spec.role == TensorRole::kPerLayerEmbedding) counts.per_layer_embedding += spec.element_count();
    if (spec.is_expert()) experts += spec.element_count();
  }
  if (config.enable_moe_block && config.num_experts > 0) {
    counts.inactive_experts = experts / config.num_experts * (config.num_experts - config.top_k_experts);
  }
  counts.effective = counts.total - counts.per_layer_embedding - counts.inactive_experts;
  return counts;
}

}  // namespace gemma4rt
