// gemma4rt bench: prompt processing and decode speed of a checkpoint, against the machine's own
// memory-bandwidth ceiling measured by a short probe between decode steps. Decode is memory-bound, so
// decode tok/s times the weight bytes a token reads, divided by the probe's bandwidth, says how close
// to the limit it runs.
#include <chrono>
#include <filesystem>
#include <optional>
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "constrain/json_schema.h"
#include "core/error.h"
#include "core/json_input.h"
#include "backend/backend.h"
#include "engine/transformer.h"
#include "model/weights.h"
#include "tools/alternating_blocks.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/structured_output_bench.h"

namespace gemma4rt::tools {
namespace {

struct BenchFlags {
  std::string model_dir;
  int prompt_tokens = 512;
  int decode_tokens = 128;
  int depth = 0;
  int repeats = 1;
  bool json = false;
  bool json_object = false;  // also time structured output: any JSON object
  std::string json_schema;   // ... or a JSON Schema file
  int sequences = 1;         // > 1: also decode steps of this many sequences at once
  EngineFlags engine;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Token ids that are ordinary text in every Gemma vocabulary (no special tokens), drawn reproducibly.
std::vector<int32_t> bench_tokens(int count, int vocab, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int32_t> pick(std::min(1000, vocab / 2), vocab - 1);
  std::vector<int32_t> tokens(count);
  for (int32_t& token : tokens) token = pick(random);
  return tokens;
}

struct DecodeFigures {
  double tokens_per_second = 0.0;
  double ms_per_token = 0.0;
  // The decode roofline from bandwidth probes taken around the timed steps (time_decode).
  double roofline_tokens_per_second = 0.0;
  double bandwidth = 0.0;                          // bytes/s the roofline used: the probes' mean over the steps
  double slowest_probe = 0.0, fastest_probe = 0.0;  // bytes/s
};

// Where the backend has no instruction probe (GPU backends, the scalar reference), the prompt figure
// is held to the backend's own product in the engine's weight format on a prefill-shaped problem (512
// tokens through a 1024 x 2048 weight): compute-bound, so memory never limits it.
double measure_matmul_peak(backend::Backend& device, WeightFormat format) {
  constexpr int kRows = 1024, kCols = 2048, kTokens = 512, kPasses = 5;
  std::vector<float> values(static_cast<size_t>(kRows) * kCols);
  std::mt19937 random(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& value : values) value = uniform(random);
  TensorView view;
  view.name = "bench.peak_probe";
  view.dtype = DType::kF32;
  view.shape = {kRows, kCols};
  view.data = reinterpret_cast<const std::byte*>(values.data());
  const backend::Weight weight = device.prepare_weight(view, format);
  const backend::Buffer x = device.allocate(static_cast<size_t>(kTokens) * kCols * sizeof(float));
  const backend::Buffer y = device.allocate(static_cast<size_t>(kTokens) * kRows * sizeof(float));
  std::vector<float> input(static_cast<size_t>(kTokens) * kCols);
  for (float& value : input) value = uniform(random);
  device.upload(x, 0, input.data(), input.size() * sizeof(float));
  float sink = 0.0f;
  double best = 1e30;
  for (int pass = 0; pass < kPasses; ++pass) {
    const auto start = Clock::now();
    device.matmul(x, kTokens, weight, y);
    device.download(y, 0, &sink, sizeof(sink));  // the result is complete once it can be read
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * kRows * kCols * kTokens / best;
}

// Decodes `count` tokens starting at `position` (the cache already holds everything before it), in
// pairs with the read-bandwidth probe (best of 5 passes over 1 GiB, ~0.1 s) before and after each.
// This VM's bandwidth moves between ~30 and ~50 GB/s within seconds, so a probe taken once before
// decoding held the tokens to whichever rate it happened to catch (48-101% of "roofline" for the same
// kernel in one sitting); here each pair is held to the mean of the probes around it, and the
// roofline is the time those allow for all the tokens. Pairs, not blocks of 8: a flip inside a block
// is missed by both of its probes.
DecodeFigures time_decode(Transformer& transformer, int position, int count, double bytes_per_token) {
  constexpr int kBlock = 2;
  std::vector<int32_t> tokens = bench_tokens(count, transformer.config().vocab_size, 7);
  transformer.forward_greedy(std::span<const int32_t>(&tokens[0], 1), position);  // warm-up, not timed
  backend::Backend& device = transformer.backend();
  DecodeFigures figures;
  double before = device.measure_read_bandwidth();
  figures.slowest_probe = figures.fastest_probe = before;
  double seconds = 0.0, roofline_seconds = 0.0;
  for (int block = 1; block < count; block += kBlock) {
    const int end = std::min(count, block + kBlock);
    const auto start = Clock::now();
    for (int i = block; i < end; ++i) transformer.forward_greedy(std::span<const int32_t>(&tokens[i], 1), position + i);
    seconds += seconds_since(start);
    const double after = device.measure_read_bandwidth();
    roofline_seconds += (end - block) * bytes_per_token / ((before + after) / 2.0);
    figures.slowest_probe = std::min(figures.slowest_probe, after);
    figures.fastest_probe = std::max(figures.fastest_probe, after);
    before = after;
  }
  const int timed = std::max(1, count - 1);
  figures.ms_per_token = seconds * 1000.0 / timed;
  figures.tokens_per_second = timed / seconds;
  figures.roofline_tokens_per_second = timed / roofline_seconds;
  figures.bandwidth = timed * bytes_per_token / roofline_seconds;
  return figures;
}

// Steps of `sequences` sequences (one row each, sequences 1..N, so every weight is read once for all)
// alternate with single-sequence steps (sequence 0) in blocks over the same stretch of time.
struct BatchedFigures {
  double tokens_per_second = 0.0;         // aggregate over the sequences
  double single_tokens_per_second = 0.0;  // the interleaved single-sequence steps
};

BatchedFigures time_batched_decode(Transformer& transformer, int sequences, int steps) {
  std::vector<int32_t> tokens = bench_tokens(steps * (sequences + 1), transformer.config().vocab_size, 11);
  std::vector<BatchRow> rows(sequences);
  std::vector<int> logit_rows(sequences);
  std::vector<int32_t> ids(sequences);
  for (int s = 0; s < sequences; ++s) logit_rows[s] = s;
  auto batched_step = [&](int position) {
    for (int s = 0; s < sequences; ++s) rows[s] = {s + 1, position, tokens[(position * (sequences + 1) + s + 1) % tokens.size()]};
    transformer.forward_greedy(rows, logit_rows, ids.data());
  };
  auto single_step = [&](int position) {
    transformer.forward_greedy(std::span<const int32_t>(&tokens[position * (sequences + 1) % tokens.size()], 1), position, 0);
  };
  batched_step(0);  // warm-up, not timed
  single_step(0);
  const AlternatingSeconds seconds = time_alternating_blocks(1, steps, batched_step, single_step);
  return {static_cast<double>(steps - 1) * sequences / seconds.first, (steps - 1) / seconds.second};
}

int bench(const BenchFlags& flags) {
  if (flags.prompt_tokens < 1 || flags.decode_tokens < 2) fail("-p must be at least 1 and -n at least 2");
  const auto load_start = Clock::now();
  auto model = Model::load(flags.model_dir);
  const ModelConfig& config = model->config();
  std::unique_ptr<parallel::Communicator> communicator;
  EngineOptions options = flags.engine.options(&communicator);
  const bool prints = !communicator || communicator->rank() == 0;
  options.context_tokens = std::max(flags.prompt_tokens, flags.depth) + flags.decode_tokens + 1;
  options.max_chunk_tokens = std::min(flags.prompt_tokens, 512);
  if (flags.sequences > 1) {
    options.sequences = flags.sequences + 1;  // sequence 0 for the single-sequence steps
    options.max_chunk_tokens = std::max(options.max_chunk_tokens, flags.sequences);
  }
  fmt::print(stderr, "bench: preparing {} ({} layers) ...\n", flags.model_dir, config.num_layers);
  Transformer transformer(*model, options);
  const double load_seconds = seconds_since(load_start);

  // The compute peak is probed before the prompts and after each repetition, the highest taken: a host
  // busy for the probe's 0.15 s once made one probe read half the peak (and the prompt 120% of it), and
  // with two probes a busy minute still made both read 53% (the prompt 104.6% of them).
  auto probe_compute_peak = [&] {
    fmt::print(stderr, "bench: probing the compute peak ...\n");
    backend::Backend::ComputePeak probed = transformer.backend().measure_compute_peak(transformer.weight_format());
    if (probed.ops_per_second <= 0.0) {
      probed.ops_per_second = measure_matmul_peak(transformer.backend(), transformer.weight_format());
      probed.instruction = "backend's own product";
    }
    return probed;
  };
  // Prompt processing: a fresh prompt of -p tokens, best of --repeats.
  const std::vector<int32_t> prompt = bench_tokens(flags.prompt_tokens, config.vocab_size, 1);
  // Weights and embedding tables used in place are read through the checkpoint's map, so a first
  // forward pass pays a page fault for every page it touches, a read from disk where the page cache
  // does not hold the file. After dropping the page cache, a first timed 512-token bf16 prompt of the
  // E2B shape read 17-34% of the peak; after an untimed 32-token prompt (every dense weight touched),
  // 57-60%, the rest being the embedding rows of the prompt's other tokens. So the prompt itself (up to
  // one chunk) runs once untimed.
  fmt::print(stderr, "bench: an untimed prompt to bring in the weights ...\n");
  const size_t warm_tokens = std::min(prompt.size(), static_cast<size_t>(options.max_chunk_tokens));
  transformer.forward_greedy(std::span<const int32_t>(prompt).first(warm_tokens), 0);
  backend::Backend::ComputePeak peak = probe_compute_peak();
  double prompt_seconds = 1e30;
  for (int repeat = 0; repeat < std::max(1, flags.repeats); ++repeat) {
    fmt::print(stderr, "bench: prompt of {} tokens ...\n", flags.prompt_tokens);
    const auto start = Clock::now();
    transformer.forward_greedy(prompt, 0);
    prompt_seconds = std::min(prompt_seconds, seconds_since(start));
    peak.ops_per_second = std::max(peak.ops_per_second, probe_compute_peak().ops_per_second);
  }
  const double peak_flops = peak.ops_per_second;
  // Work as executed: every prompt token runs the decoder layers, the LM head runs for the last only.
  double prompt_flops = transformer.head_flops_per_row();
  for (int position = 0; position < flags.prompt_tokens; ++position) {
    prompt_flops += transformer.layer_matmul_flops_per_token() + transformer.attention_flops_per_token(position);
  }

  fmt::print(stderr, "bench: decoding {} tokens at depth 0 ...\n", flags.decode_tokens);
  const double communication_before = transformer.communication_seconds();
  const double bytes_per_token = transformer.weight_bytes_per_token();
  const DecodeFigures at_zero = time_decode(transformer, 0, flags.decode_tokens, bytes_per_token);
  const double decode_communication_ms = (transformer.communication_seconds() - communication_before) * 1000.0 / flags.decode_tokens;
  DecodeFigures at_depth = at_zero;
  if (flags.depth > 0) {
    fmt::print(stderr, "bench: filling the context to depth {} ...\n", flags.depth);
    const std::vector<int32_t> fill = bench_tokens(flags.depth, config.vocab_size, 3);
    transformer.forward_greedy(fill, 0);
    fmt::print(stderr, "bench: decoding {} tokens at depth {} ...\n", flags.decode_tokens, flags.depth);
    at_depth = time_decode(transformer, flags.depth, flags.decode_tokens, bytes_per_token);
  }

  std::optional<BatchedFigures> batched;
  if (flags.sequences > 1) {
    fmt::print(stderr, "bench: decoding {} steps of {} sequences, alternating with single-sequence steps ...\n", flags.decode_tokens,
               flags.sequences);
    batched = time_batched_decode(transformer, flags.sequences, flags.decode_tokens);
  }

  std::optional<nlohmann::json> structured;
  if (flags.json_object || !flags.json_schema.empty()) {
    std::shared_ptr<const constrain::Grammar> grammar;
    try {
      grammar = flags.json_object ? constrain::json_object_grammar() : constrain::compile_json_schema(parse_json_file(flags.json_schema));
    } catch (const constrain::SchemaError& error) {
      fail("--json-schema {}: {}", flags.json_schema, error.what());
    }
    const auto tokenizer_path = std::filesystem::path(flags.model_dir) / "tokenizer.json";
    if (!std::filesystem::exists(tokenizer_path)) fail("{}: file not found (structured output needs the tokenizer)", tokenizer_path.string());
    fmt::print(stderr, "bench: decoding {} tokens with structured output ...\n", flags.decode_tokens);
    structured = bench_structured_output(transformer, Tokenizer::load(tokenizer_path), grammar, flags.decode_tokens);
  }

  nlohmann::json result = {
      {"model", flags.model_dir},
      {"backend", transformer.backend().name()},
      {"kernels", transformer.backend().kernels()},
      {"dtype", format_name(transformer.weight_format())},
      {"kv_cache", format_name(transformer.kv_cache().format())},
      {"threads", transformer.backend().threads()},
      {"load_seconds", load_seconds},
      {"prompt_tokens", flags.prompt_tokens},
      {"prompt_tokens_per_s", flags.prompt_tokens / prompt_seconds},
      {"prompt_gflops", prompt_flops / prompt_seconds / 1e9},
      {"compute_peak_gflops", peak_flops / 1e9},
      {"compute_peak_probe", peak.instruction},
      {"prompt_percent_of_peak", 100.0 * prompt_flops / prompt_seconds / peak_flops},
      {"decode_tokens", flags.decode_tokens},
      {"decode_tokens_per_s", at_zero.tokens_per_second},
      {"decode_ms_per_token", at_zero.ms_per_token},
      {"depth", flags.depth},
      {"decode_tokens_per_s_at_depth", at_depth.tokens_per_second},
      {"decode_depth_ratio", at_depth.tokens_per_second / at_zero.tokens_per_second},
      {"weight_bytes_per_token", bytes_per_token},
      {"read_bandwidth_gb_s", at_zero.bandwidth / 1e9},
      {"read_bandwidth_probes_gb_s", {at_zero.slowest_probe / 1e9, at_zero.fastest_probe / 1e9}},
      {"roofline_decode_tokens_per_s", at_zero.roofline_tokens_per_second},
      {"decode_percent_of_roofline", 100.0 * at_zero.tokens_per_second / at_zero.roofline_tokens_per_second},
      {"kv_cache_bytes", transformer.kv_cache().size_bytes()},
      {"kv_bytes_per_context_token", transformer.kv_cache().bytes_per_context_token()},
      {"owned_weight_bytes", transformer.owned_weight_bytes()},
      {"tensor_parallel", transformer.tensor_parallel_size()},
      {"mpi", communicator != nullptr},
      {"communication_ms_per_decode_token", decode_communication_ms},
  };
  if (structured) result["structured_output"] = *structured;
  if (batched) {
    result["batched"] = {{"sequences", flags.sequences},
                         {"tokens_per_s", batched->tokens_per_second},
                         {"single_tokens_per_s", batched->single_tokens_per_second},
                         {"speedup", batched->tokens_per_second / batched->single_tokens_per_second}};
  }
  if (!prints) return 0;
  if (flags.json) {
    fmt::print("{}\n", result.dump(2));
    return 0;
  }
  fmt::print("| model | kernels | dtype | threads | test | tok/s | figure |\n|---|---|---|---|---|---|---|\n");
  const std::string head = fmt::format("| {} | {} | {} | {} ", flags.model_dir, result["kernels"].get<std::string>(),
                                       result["dtype"].get<std::string>(), transformer.backend().threads());
  fmt::print("{}| pp{} | {:.2f} | {:.1f} GFLOP/s executed, {:.1f}% of the {:.1f} GFLOP/s peak measured on {} |\n", head,
             flags.prompt_tokens, result["prompt_tokens_per_s"].get<double>(), result["prompt_gflops"].get<double>(),
             result["prompt_percent_of_peak"].get<double>(), peak_flops / 1e9, peak.instruction);
  fmt::print("{}| tg{} | {:.2f} | {:.1f}% of the {:.2f} tok/s roofline ({:.2f} GB/token at {:.1f} GB/s, probed every 2 tokens: "
             "{:.1f}-{:.1f}) |\n",
             head, flags.decode_tokens, at_zero.tokens_per_second, result["decode_percent_of_roofline"].get<double>(),
             at_zero.roofline_tokens_per_second, bytes_per_token / 1e9, at_zero.bandwidth / 1e9, at_zero.slowest_probe / 1e9,
             at_zero.fastest_probe / 1e9);
  if (transformer.tensor_parallel_size() > 1) {
    fmt::print("{}| tp{} {} | | {:.2f} ms of communication per decode token (rank 0) |\n", head, transformer.tensor_parallel_size(),
               communicator ? "mpi" : "in-process", decode_communication_ms);
  }
  if (flags.depth > 0) {
    fmt::print("{}| tg{} @ d{} | {:.2f} | {:.2f}x of depth 0 |\n", head, flags.decode_tokens, flags.depth, at_depth.tokens_per_second,
               result["decode_depth_ratio"].get<double>());
  }
  if (batched) {
    fmt::print("{}| tg{} x{} | {:.2f} | {:.2f}x the {:.2f} tok/s of one sequence in steps alternating with these |\n", head,
               flags.decode_tokens, flags.sequences, batched->tokens_per_second,
               batched->tokens_per_second / batched->single_tokens_per_second, batched->single_tokens_per_second);
  }
  if (structured) {
    const nlohmann::json& s = *structured;
    fmt::print("{}| tg{} {} | {:.2f} | {:.1f}% of the free rate; mask per step over {} steps of the {}-token vocabulary: median {:.3f} ms "
               "({:.2f}% of a free step), p99 {:.3f} ms, worst {:.3f} ms (CPU time: worst {:.3f} ms); {} outputs completed |\n",
               head, flags.decode_tokens, flags.json_object ? "json_object" : "json_schema", 1000.0 / s["constrained_ms_per_token"].get<double>(),
               s["constrained_rate_percent"].get<double>(), s["steps"].get<int>(), s["vocabulary"].get<int>(), s["median_ms"].get<double>(),
               s["mask_median_percent_of_step"].get<double>(), s["p99_ms"].get<double>(), s["worst_ms"].get<double>(),
               s["cpu"]["worst_ms"].get<double>(), s["outputs_completed"].get<int>());
  }
  fmt::print("\nKV cache: {:.1f} MiB allocated, {} bytes per token of context (sliding rings and KV-shared layers excluded)\n",
             transformer.kv_cache().size_bytes() / 1048576.0, transformer.kv_cache().bytes_per_context_token());
  return 0;
}

}  // namespace

Action add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* command = app.add_subcommand("bench", "Measure prompt and decode speed against the machine's memory-bandwidth roofline");
  command->add_option("--model", flags->model_dir, "Checkpoint directory")->required();
  command->add_option("-p,--prompt-tokens", flags->prompt_tokens, "Prompt length for the prefill test")->check(at_least_one());
  command->add_option("-n,--decode-tokens", flags->decode_tokens, "Tokens to decode per decode test")->check(CLI::Range(2, 1 << 20));
  command->add_option("-d,--depth", flags->depth, "Also decode after filling the context to this many tokens")->check(zero_or_more());
  command->add_option("-r,--repeats", flags->repeats, "Prompt repetitions (the best is reported)")->check(at_least_one());
  command->add_flag("--json", flags->json, "Print the figures as JSON");
  auto* schema = command->add_option("--json-schema", flags->json_schema, "Also decode under this JSON Schema file and time the token masks")
                     ->check(CLI::ExistingFile);
  command->add_flag("--json-object", flags->json_object, "Also decode under json_object mode and time the token masks")->excludes(schema);
  command->add_option("--sequences", flags->sequences,
                      "Also decode steps of this many sequences at once (a server's batch), alternating with single-sequence steps")
      ->check(CLI::Range(1, 256));
  flags->engine.add_to(*command);
  return [flags] { return bench(*flags); };
}

}  // namespace gemma4rt::tools
