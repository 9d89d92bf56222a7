// gemma4rt run: one generation from a checkpoint directory, from raw text (--prompt), one chat turn
// (--chat) or token ids (--prompt-ids). Text streams to stdout; --json prints one JSON object instead.
#include <cstdio>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "constrain/json_schema.h"
#include "constrain/token_table.h"
#include "core/error.h"
#include "core/json_input.h"
#include "engine/generator.h"
#include "model/weights.h"
#include "serve/output_parser.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/token_list.h"

namespace gemma4rt::tools {
namespace {

struct RunFlags {
  std::string model_dir;
  std::string prompt, chat, prompt_ids, system;
  bool thinking = false;
  int max_tokens = 256;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int64_t seed = 0;  // -1: a random seed
  bool ignore_eos = false;
  int context_tokens = 4096;
  bool json = false;
  int logprobs = -1;
  std::string json_schema;  // structured output: a JSON Schema file
  bool json_object = false;  // structured output: any JSON object
  EngineFlags engine;
};

// --json-schema FILE or --json-object: the grammar the output must follow, or null.
std::shared_ptr<const constrain::Grammar> output_grammar(const RunFlags& flags) {
  if (flags.json_object) return constrain::json_object_grammar();
  if (flags.json_schema.empty()) return nullptr;
  const nlohmann::json schema = parse_json_file(flags.json_schema);
  try {
    return constrain::compile_json_schema(schema);
  } catch (const constrain::SchemaError& error) {
    fail("--json-schema {}: {}", flags.json_schema, error.what());
  }
}

// --seed -1 draws a seed, as llama.cpp does, and says which so the run can be repeated. Under mpirun every
// rank samples the same token, so rank 0's draw is the one they all use.
uint64_t sampling_seed(int64_t flag, parallel::Communicator* communicator, bool prints) {
  if (flag >= 0) return static_cast<uint64_t>(flag);
  std::random_device entropy;
  uint64_t seed = (static_cast<uint64_t>(entropy()) << 32 | entropy()) & static_cast<uint64_t>(INT64_MAX);
  if (communicator) communicator->broadcast(&seed, sizeof(seed), 0);
  if (prints) fmt::print(stderr, "seed: {}\n", seed);
  return seed;
}

Tokenizer load_tokenizer_for(const std::filesystem::path& model_dir, const char* why) {
  const auto path = model_dir / "tokenizer.json";
  if (!std::filesystem::exists(path)) fail("{}: file not found ({})", path.string(), why);
  return Tokenizer::load(path);
}

int run(const RunFlags& flags) {
  const std::shared_ptr<const constrain::Grammar> grammar = output_grammar(flags);
  if (grammar && flags.ignore_eos) fail("--ignore-eos cannot be combined with --json-schema or --json-object: the output ends where it is complete");
  if (grammar && !flags.prompt_ids.empty() && !std::filesystem::exists(std::filesystem::path(flags.model_dir) / "tokenizer.json")) {
    fail("--json-schema and --json-object need the checkpoint's tokenizer.json (the constraint works on the tokens' text)");
  }
  auto model = Model::load(flags.model_dir);
  const ModelConfig& config = model->config();

  std::optional<Tokenizer> tokenizer;
  std::vector<int32_t> prompt_tokens;
  if (!flags.prompt_ids.empty()) {
    prompt_tokens = parse_token_list(flags.prompt_ids, "--prompt-ids");
    // Ids need no tokenizer; one is used for the output text when the checkpoint has it.
    if (std::filesystem::exists(std::filesystem::path(flags.model_dir) / "tokenizer.json")) {
      tokenizer = load_tokenizer_for(flags.model_dir, "");
    }
  } else {
    tokenizer = load_tokenizer_for(flags.model_dir, "needed to tokenize --prompt or --chat; --prompt-ids needs none");
    std::string text;
    if (!flags.chat.empty()) {
      nlohmann::json messages = nlohmann::json::array();
      if (!flags.system.empty()) messages.push_back({{"role", "system"}, {"content", flags.system}});
      messages.push_back({{"role", "user"}, {"content", flags.chat}});
      ChatOptions options;
      options.enable_thinking = flags.thinking;
      // Without a template in the checkpoint, PLE models are the E-series and use its generation prompt.
      options.style = detect_generation_prompt_style(
          flags.model_dir, config.has_per_layer_inputs() ? GenerationPromptStyle::kESeries : GenerationPromptStyle::kLargeModel);
      text = render_chat(messages, nullptr, options);
    } else {
      text = flags.prompt;
    }
    prompt_tokens = tokenizer->encode(text);
    // Raw completions start with exactly one <bos>, written in the text or added here.
    if (prompt_tokens.empty() || prompt_tokens.front() != config.bos_token_id) {
      prompt_tokens.insert(prompt_tokens.begin(), config.bos_token_id);
    }
  }
  for (int32_t id : prompt_tokens) {
    if (id >= config.vocab_size) fail("--prompt-ids: token id {} is outside the vocabulary (0..{})", id, config.vocab_size - 1);
  }

  if (static_cast<int64_t>(prompt_tokens.size()) > flags.context_tokens) {
    fail("the prompt has {} tokens but --ctx is {}: raise --ctx or shorten the prompt", prompt_tokens.size(), flags.context_tokens);
  }
  std::unique_ptr<parallel::Communicator> communicator;
  EngineOptions engine_options = flags.engine.options(&communicator);
  // Under mpirun every rank runs the same generation; only rank 0 writes the answer.
  const bool prints = !communicator || communicator->rank() == 0;
  engine_options.context_tokens = flags.context_tokens;
  Transformer transformer(*model, engine_options);

  GenerationOptions options;
  options.max_tokens = flags.max_tokens;
  options.sampling = {flags.temperature, flags.top_k, flags.top_p, flags.min_p, sampling_seed(flags.seed, communicator.get(), prints)};
  options.ignore_eos = flags.ignore_eos;
  options.stop_token_ids.assign(config.eos_token_ids.begin(), config.eos_token_ids.end());
  options.top_logprobs = flags.logprobs;
  if (grammar) {
    auto table = std::make_shared<constrain::TokenTable>(*tokenizer, config.vocab_size);
    options.constraint = std::make_shared<constrain::Matcher>(grammar, std::move(table), options.stop_token_ids);
  }

  // With --thinking the output is parsed as the server parses it: the thought channel is reasoning,
  // streamed to stderr (its own stream), and the answer alone goes to stdout; --json gets "reasoning".
  const bool separate_reasoning = flags.thinking && !flags.chat.empty() && tokenizer.has_value();
  std::optional<StreamingDecoder> stream;
  std::optional<serve::StreamingOutputParser> parser;
  if (tokenizer && !flags.json && prints) stream.emplace(*tokenizer, /*skip_special_tokens=*/!separate_reasoning);
  if (separate_reasoning) parser.emplace();
  auto show = [&](const std::string& text, bool last) {
    if (!parser) {
      fmt::print("{}", text);
      return;
    }
    serve::OutputDelta delta = parser->push(text);
    if (last) {
      const serve::OutputDelta rest = parser->finish();
      delta.reasoning += rest.reasoning;
      delta.content += rest.content;
    }
    if (!delta.reasoning.empty()) {
      fmt::print(stderr, "{}", delta.reasoning);
      std::fflush(stderr);
    }
    fmt::print("{}", delta.content);
  };
  auto on_token = [&](int32_t token) {
    if (stream) {
      const bool stops = !flags.ignore_eos && std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
                                                  options.stop_token_ids.end();
      if (!stops) {
        show(stream->push(token), false);
        std::fflush(stdout);
      }
    }
    return true;
  };
  GenerationResult result = generate(transformer, prompt_tokens, options, on_token);

  // The text leaves out the stop token that ended generation.
  std::vector<int32_t> text_tokens = result.tokens;
  if (result.finish_reason == "stop" && !text_tokens.empty()) text_tokens.pop_back();
  if (!prints) return 0;
  if (flags.json) {
    nlohmann::json output;
    output["prompt_tokens"] = prompt_tokens;
    output["tokens"] = result.tokens;
    if (separate_reasoning) {
      const serve::ParsedOutput parsed = serve::parse_output(tokenizer->decode(text_tokens, /*skip_special_tokens=*/false));
      output["text"] = parsed.content;
      output["reasoning"] = parsed.reasoning ? nlohmann::json(*parsed.reasoning) : nlohmann::json(nullptr);
    } else {
      output["text"] = tokenizer ? tokenizer->decode(text_tokens, /*skip_special_tokens=*/true) : std::string();
    }
    if (flags.logprobs >= 0) {
      // Per generated token: its log-probability and the top alternatives, as the server's logprobs.
      auto entry = [&](int32_t token, float logprob) {
        nlohmann::json item = {{"id", token}, {"logprob", logprob}};
        if (tokenizer) item["token"] = tokenizer->token_text(token);
        return item;
      };
      nlohmann::json logprobs = nlohmann::json::array();
      for (size_t index = 0; index < result.logprobs.size(); ++index) {
        nlohmann::json item = entry(result.tokens[index], result.logprobs[index].logprob);
        item["top_logprobs"] = nlohmann::json::array();
        for (const TokenLogprob& alternative : result.logprobs[index].top) item["top_logprobs"].push_back(entry(alternative.token, alternative.logprob));
        logprobs.push_back(std::move(item));
      }
      output["logprobs"] = std::move(logprobs);
    }
    output["finish_reason"] = result.finish_reason;
    output["timings"] = {{"prefill_ms", result.prefill_ms},
                         {"decode_ms", result.decode_ms},
                         {"decode_tokens_per_s", result.decode_tokens_per_second()}};
    // Invalid UTF-8 in generated text is replaced rather than aborting the dump.
    fmt::print("{}\n", output.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    if (stream) show(stream->finish(), true);
    if (!tokenizer) fmt::print("{}", fmt::join(result.tokens, ","));
    fmt::print("\n");
  }
  return 0;
}

}  // namespace

Action add_run_command(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* command = app.add_subcommand("run", "Generate text from a Hugging Face Gemma-4 checkpoint directory");
  command->add_option("--model", flags->model_dir, "Checkpoint directory (config.json, *.safetensors, tokenizer.json)")->required();
  auto* prompt = command->add_option("--prompt", flags->prompt, "Raw completion: the text is not wrapped in the chat format");
  auto* chat = command->add_option("--chat", flags->chat, "One user turn, rendered through the Gemma-4 chat format");
  auto* ids = command->add_option("--prompt-ids", flags->prompt_ids, "Prompt as comma-separated token ids (no tokenizer needed)");
  prompt->excludes(chat)->excludes(ids);
  chat->excludes(ids);
  command->add_option("--system", flags->system, "System prompt for --chat");
  command->add_flag("--thinking", flags->thinking, "Enable thinking in the chat format (--chat)");
  command->add_option("--max-tokens,-n", flags->max_tokens, "Most tokens to generate")->check(zero_or_more());
  command->add_option("--temperature", flags->temperature, "Sampling temperature; 0 = greedy")->check(zero_or_more());
  command->add_option("--top-k", flags->top_k, "Keep the k most likely tokens; 0 = all")->check(zero_or_more());
  command->add_option("--top-p", flags->top_p, "Nucleus sampling mass")->check(zero_to_one());
  command->add_option("--min-p", flags->min_p, "Drop tokens below min-p times the best token's probability")->check(zero_to_one());
  command->add_option("--seed", flags->seed, "Random seed for sampling; -1 picks one at random and prints it (default 0)")
      ->check(seed_value());
  command->add_flag("--ignore-eos", flags->ignore_eos, "Do not stop on the checkpoint's end-of-sequence tokens");
  command->add_option("--ctx", flags->context_tokens, "Context length: KV cache positions allocated at load")->check(at_least_one());
  flags->engine.add_to(*command);
  command->add_flag("--json", flags->json, "Print one JSON object with tokens, text, finish reason and timings");
  auto* schema = command->add_option("--json-schema", flags->json_schema, "Structured output: the text is a JSON value valid under this JSON Schema file")
                     ->check(CLI::ExistingFile);
  command->add_flag("--json-object", flags->json_object, "Structured output: the text is a JSON object")->excludes(schema);
  command->add_option("--logprobs", flags->logprobs,
                      "With --json: each generated token's log-probability and the N most likely alternatives (0-20)")
      ->check(CLI::Range(0, 20));
  command->callback([command] {
    if (command->count("--prompt") + command->count("--chat") + command->count("--prompt-ids") != 1) {
      throw CLI::ValidationError("run", "give exactly one of --prompt, --chat or --prompt-ids");
    }
    // An empty prompt would run from <bos> alone and make up text nobody asked for.
    for (const char* name : {"--prompt", "--chat", "--prompt-ids"}) {
      if (command->count(name) > 0 && command->get_option(name)->as<std::string>().empty()) {
        throw CLI::ValidationError(name, "is empty: give the text (or ids) to start from");
      }
    }
  });
  return [flags] { return run(*flags); };
}

}  // namespace gemma4rt::tools
