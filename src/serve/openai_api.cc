#include "serve/openai_api.h"

#include <charconv>
#include <cmath>
#include <random>

#include "constrain/json_schema.h"
#include "core/error.h"

namespace gemma4rt::serve {
namespace {

using nlohmann::json;

// Typed access to optional request fields; a present field of the wrong type or range is a 400.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  bool has(const char* key) const { return body_.contains(key) && !body_.at(key).is_null(); }
  const json& at(const char* key) const { return body_.at(key); }

  std::optional<double> number(const char* key, double minimum, double maximum) const {
    if (!has(key)) return std::nullopt;
    const json& value = body_.at(key);
    if (!value.is_number()) throw invalid_request(fmt::format("'{}' must be a number", key), key);
    const double number = value.get<double>();
    if (!(number >= minimum && number <= maximum)) {
      throw invalid_request(fmt::format("'{}' must be between {} and {}, got {}", key, minimum, maximum, number), key);
    }
    return number;
  }
  std::optional<int64_t> integer(const char* key, int64_t minimum, int64_t maximum) const {
    if (!has(key)) return std::nullopt;
    const json& value = body_.at(key);
    if (!value.is_number_integer()) throw invalid_request(fmt::format("'{}' must be an integer", key), key);
    const int64_t number = value.get<int64_t>();
    if (number < minimum || number > maximum) {
      throw invalid_request(fmt::format("'{}' must be between {} and {}, got {}", key, minimum, maximum, number), key);
    }
    return number;
  }
  std::optional<bool> boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& value = body_.at(key);
    if (!value.is_boolean()) throw invalid_request(fmt::format("'{}' must be true or false", key), key);
    return value.get<bool>();
  }
  std::optional<std::string> string(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& value = body_.at(key);
    if (!value.is_string()) throw invalid_request(fmt::format("'{}' must be a string", key), key);
    return value.get<std::string>();
  }

 private:
  const json& body_;
};

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, the ids as decimal strings.
std::map<int32_t, float> parse_logit_bias(const json& biases, int vocab_size) {
  if (!biases.is_object()) throw invalid_request("'logit_bias' must be an object mapping token ids to numbers", "logit_bias");
  std::map<int32_t, float> parsed;
  for (const auto& [key, value] : biases.items()) {
    int64_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || key[0] == '-' || error != std::errc() || end != key.data() + key.size() || id >= vocab_size) {
      throw invalid_request(fmt::format("'logit_bias' key {} is not a token id below {}", json(key).dump(), vocab_size), "logit_bias");
    }
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0)) {
      throw invalid_request(fmt::format("'logit_bias' value for token {} must be a number from -100 to 100", id), "logit_bias");
    }
    parsed[static_cast<int32_t>(id)] = value.get<float>();
  }
  return parsed;
}

// The fields both endpoints share: sampling, penalties, stop, budget, streaming.
void parse_common(const json& body, const ServedModel& model, ParsedRequest& request) {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  const Fields fields(body);
  // As vLLM does: a request for another model is not answered by this one.
  if (auto name = fields.string("model"); name && *name != model.id && *name != model.checkpoint_name) {
    throw ApiError(404, "invalid_request_error", fmt::format("the model '{}' does not exist; this server serves '{}'", *name, model.id), "model",
                   "model_not_found");
  }
  if (auto n = fields.integer("n", 1, 128); n && *n != 1) throw invalid_request("only n = 1 is supported", "n");
  if (fields.boolean("echo").value_or(false)) throw invalid_request("'echo' is not supported", "echo");
  if (fields.has("best_of")) {
    if (auto best_of = fields.integer("best_of", 1, 128); best_of && *best_of != 1) throw invalid_request("only best_of = 1 is supported", "best_of");
  }

  request.stream = fields.boolean("stream").value_or(false);
  if (fields.has("stream_options")) {
    const json& options = fields.at("stream_options");
    if (!options.is_object()) throw invalid_request("'stream_options' must be an object", "stream_options");
    if (options.contains("include_usage") && !options["include_usage"].is_null()) {
      if (!options["include_usage"].is_boolean()) throw invalid_request("'stream_options.include_usage' must be true or false", "stream_options");
      request.include_usage = options["include_usage"].get<bool>();
    }
  }

  request.sampling.temperature = static_cast<float>(fields.number("temperature", 0.0, 2.0).value_or(1.0));
  request.sampling.top_p = static_cast<float>(fields.number("top_p", 0.0, 1.0).value_or(1.0));
  if (request.sampling.top_p <= 0.0f) request.sampling.top_p = 1e-6f;  // top_p 0 keeps only the best token
  request.sampling.top_k = static_cast<int>(fields.integer("top_k", -1, 1 << 20).value_or(0));
  if (request.sampling.top_k < 0) request.sampling.top_k = 0;
  request.sampling.min_p = static_cast<float>(fields.number("min_p", 0.0, 1.0).value_or(0.0));
  if (auto seed = fields.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    request.sampling.seed = static_cast<uint64_t>(*seed);
  } else {
    request.sampling.seed = std::random_device{}();
  }
  request.presence_penalty = static_cast<float>(fields.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  request.frequency_penalty = static_cast<float>(fields.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  if (fields.has("logit_bias")) request.logit_bias = parse_logit_bias(fields.at("logit_bias"), model.vocab_size);
  request.ignore_eos = fields.boolean("ignore_eos").value_or(false);
  request.cache_prompt = fields.boolean("cache_prompt").value_or(true);
  if (auto timeout = fields.number("timeout", 0.0, 86400.0)) request.timeout_seconds = *timeout;

  if (fields.has("stop")) {
    const json& stop = fields.at("stop");
    if (stop.is_string()) {
      request.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (stop.size() > 16) throw invalid_request("'stop' holds at most 16 strings", "stop");
      for (const json& item : stop) {
        if (!item.is_string()) throw invalid_request("'stop' must be a string or a list of strings", "stop");
        request.stop.push_back(item.get<std::string>());
      }
    } else {
      throw invalid_request("'stop' must be a string or a list of strings", "stop");
    }
    for (const std::string& text : request.stop) {
      if (text.empty()) throw invalid_request("'stop' strings must not be empty", "stop");
    }
  }

  // The budget: max_completion_tokens (current) or max_tokens (legacy); at least 1, and room in the context.
  std::optional<int64_t> budget = fields.integer("max_completion_tokens", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  const char* budget_name = "max_completion_tokens";
  if (!budget) {
    budget = fields.integer("max_tokens", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    budget_name = "max_tokens";
  }
  const int64_t room = static_cast<int64_t>(model.context_tokens) - static_cast<int64_t>(request.prompt_tokens.size());
  if (room <= 0) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the prompt has {} tokens but the context holds {}", request.prompt_tokens.size(), model.context_tokens),
                   "messages", "context_length_exceeded");
  }
  if (budget) {
    if (*budget < 1) throw invalid_request(fmt::format("'{}' must be at least 1", budget_name), budget_name);
    if (*budget > room) {
      throw ApiError(400, "invalid_request_error",
                     fmt::format("'{}' is {} but only {} tokens of context are left after the {}-token prompt", budget_name, *budget, room,
                                 request.prompt_tokens.size()),
                     budget_name, "context_length_exceeded");
    }
    request.max_tokens = static_cast<int>(*budget);
  } else {
    request.max_tokens = static_cast<int>(room);
  }
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}.
std::shared_ptr<const constrain::Grammar> parse_response_format(const json& body) {
  const Fields fields(body);
  if (!fields.has("response_format")) return nullptr;
  const json& format = fields.at("response_format");
  const char* field = "response_format";
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string()) {
    throw invalid_request("'response_format' must be an object with a 'type' (text, json_object or json_schema)", field);
  }
  const std::string type = format["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return constrain::json_object_grammar();
  if (type != "json_schema") throw invalid_request(fmt::format("'response_format.type' must be text, json_object or json_schema, got '{}'", type), field);
  if (!format.contains("json_schema") || !format["json_schema"].is_object()) {
    throw invalid_request("'response_format.json_schema' must be an object with a 'schema'", field);
  }
  const json& spec = format["json_schema"];
  if (spec.contains("name") && !spec["name"].is_string()) throw invalid_request("'response_format.json_schema.name' must be a string", field);
  if (spec.contains("strict") && !spec["strict"].is_null() && !spec["strict"].is_boolean()) {
    throw invalid_request("'response_format.json_schema.strict' must be true or false", field);
  }
  if (!spec.contains("schema")) throw invalid_request("'response_format.json_schema.schema' is required", field);
  try {
    return constrain::compile_json_schema(spec["schema"]);
  } catch (const constrain::SchemaError& error) {
    throw invalid_request(fmt::format("response_format.json_schema.schema: {}", error.what()), field);
  }
}

// A forced tool call (tool_choice "required" or a named function): the grammar of the allowed calls.
std::shared_ptr<const constrain::Grammar> forced_tool_calls(const json& tools, const json& choice) {
  if (!tools.is_array() || tools.empty()) throw invalid_request("'tool_choice' forces a tool call but 'tools' is empty", "tool_choice");
  std::string wanted;
  if (choice.is_object()) {
    const json* function = choice.contains("function") ? &choice["function"] : nullptr;
    if ((choice.contains("type") && choice["type"] != "function") || function == nullptr || !function->is_object() ||
        !function->contains("name") || !(*function)["name"].is_string()) {
      throw invalid_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
    }
    wanted = (*function)["name"].get<std::string>();
  }
  std::vector<constrain::ToolSchema> schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    const json* function = tool.is_object() && tool.contains("function") ? &tool["function"] : nullptr;
    if (function == nullptr || !function->is_object() || !function->contains("name") || !(*function)["name"].is_string()) {
      throw invalid_request(fmt::format("tools[{}] needs a 'function' with a 'name'", i), "tools");
    }
    const std::string name = (*function)["name"].get<std::string>();
    if (!wanted.empty() && name != wanted) continue;
    schemas.push_back({name, function->contains("parameters") ? (*function)["parameters"] : json()});
  }
  if (schemas.empty()) throw invalid_request(fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", wanted), "tool_choice");
  try {
    return constrain::compile_tool_calls(schemas);
  } catch (const constrain::SchemaError& error) {
    throw invalid_request(error.what(), "tools");
  }
}

// What structured output cannot be combined with.
void check_structured_output(const ParsedRequest& request, const char* by) {
  if (!request.grammar) return;
  if (!request.stop.empty()) throw invalid_request(fmt::format("'stop' cannot be combined with {}: a stop string would cut the output short", by), "stop");
  if (request.ignore_eos) throw invalid_request(fmt::format("'ignore_eos' cannot be combined with {}: the output ends where it is complete", by), "ignore_eos");
}

}  // namespace

ApiError invalid_request(const std::string& message, const std::string& param) {
  return ApiError(400, "invalid_request_error", message, param);
}

nlohmann::json error_body(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

ParsedRequest parse_chat_request(const json& body, const ServedModel& model) {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  ParsedRequest request;
  request.chat = true;
  const Fields fields(body);
  if (!fields.has("messages")) throw invalid_request("'messages' is required", "messages");
  const json& messages = fields.at("messages");
  if (!messages.is_array() || messages.empty()) throw invalid_request("'messages' must be a non-empty list", "messages");
  // The engine runs the text decoder only: an image or audio part silently dropped (or sent as a bare
  // placeholder token) would get an answer about something the model never saw.
  for (size_t index = 0; index < messages.size(); ++index) {
    const json& message = messages[index];
    if (!message.is_object() || !message.contains("content") || !message["content"].is_array()) continue;
    for (const json& part : message["content"]) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) continue;  // the chat format names these
      const std::string& type = part["type"].get_ref<const std::string&>();
      if (type != "text") {
        throw invalid_request(fmt::format("messages[{}]: content parts of type '{}' are not supported: this server runs Gemma-4's text decoder only",
                                          index, type),
                              "messages");
      }
    }
  }

  ChatOptions options;
  options.style = model.prompt_style;
  if (fields.has("chat_template_kwargs")) {
    const json& kwargs = fields.at("chat_template_kwargs");
    if (!kwargs.is_object()) throw invalid_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (kwargs.contains("enable_thinking") && !kwargs["enable_thinking"].is_null()) {
      if (!kwargs["enable_thinking"].is_boolean()) throw invalid_request("'enable_thinking' must be true or false", "chat_template_kwargs");
      options.enable_thinking = kwargs["enable_thinking"].get<bool>();
    }
  }
  if (auto effort = fields.string("reasoning_effort")) {
    if (*effort != "none" && *effort != "minimal" && *effort != "low" && *effort != "medium" && *effort != "high") {
      throw invalid_request("'reasoning_effort' must be one of none, minimal, low, medium, high", "reasoning_effort");
    }
    options.enable_thinking = *effort != "none";
  }

  json tools = nullptr;
  if (fields.has("tools")) {
    tools = fields.at("tools");
    if (!tools.is_array()) throw invalid_request("'tools' must be a list", "tools");
  }
  bool forced = false;
  if (fields.has("tool_choice")) {
    const json& choice = fields.at("tool_choice");
    if (choice.is_string()) {
      const std::string value = choice.get<std::string>();
      if (value != "none" && value != "auto" && value != "required") throw invalid_request("'tool_choice' must be none, auto, required or an object", "tool_choice");
      if (value == "none") tools = nullptr;  // the model is not told about tools it may not call
      forced = value == "required";
    } else if (!choice.is_object()) {
      throw invalid_request("'tool_choice' must be none, auto, required or an object", "tool_choice");
    } else {
      forced = true;
    }
    if (forced) request.grammar = forced_tool_calls(tools, choice);
  }
  request.has_tools = tools.is_array() && !tools.empty();
  if (auto format = parse_response_format(body)) {
    if (forced) throw invalid_request("'response_format' cannot be combined with a forced tool call ('tool_choice')", "response_format");
    request.grammar = std::move(format);
  }

  std::string prompt;
  try {
    prompt = render_chat(messages, tools, options);
  } catch (const Error& error) {
    throw invalid_request(error.what(), "messages");
  }
  request.prompt_tokens = model.tokenizer->encode(prompt);

  // logprobs: true plus top_logprobs (0..20).
  const bool logprobs = fields.boolean("logprobs").value_or(false);
  const auto top = fields.integer("top_logprobs", 0, 20);
  if (top && !logprobs) throw invalid_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  request.logprobs = logprobs ? static_cast<int>(top.value_or(0)) : -1;

  parse_common(body, model, request);
  check_structured_output(request, forced ? "a forced tool call" : "response_format");
  return request;
}

ParsedRequest parse_completion_request(const json& body, const ServedModel& model) {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  ParsedRequest request;
  request.chat = false;
  const Fields fields(body);
  if (!fields.has("prompt")) throw invalid_request("'prompt' is required", "prompt");
  // Fill-in-the-middle: Gemma-4 has no suffix tokens, and dropping the suffix would answer another question.
  if (fields.has("suffix")) throw invalid_request("'suffix' is not supported (Gemma-4 has no fill-in-the-middle format)", "suffix");
  const json& prompt = fields.at("prompt");
  // A raw completion: the text is not wrapped in the chat format; it starts with exactly one <bos>.
  if (prompt.is_string()) {
    request.prompt_tokens = model.tokenizer->encode(prompt.get<std::string>());
  } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
    request.prompt_tokens = model.tokenizer->encode(prompt[0].get<std::string>());
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    for (const json& id : prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= model.vocab_size) {
        throw invalid_request(fmt::format("'prompt' token ids must be integers in [0, {})", model.vocab_size), "prompt");
      }
      request.prompt_tokens.push_back(id.get<int32_t>());
    }
  } else {
    throw invalid_request("'prompt' must be a string, a list holding one string, or a list of token ids", "prompt");
  }
  if (request.prompt_tokens.empty() || request.prompt_tokens.front() != model.bos_token_id) {
    request.prompt_tokens.insert(request.prompt_tokens.begin(), model.bos_token_id);
  }
  if (auto logprobs = fields.integer("logprobs", 0, 20)) request.logprobs = static_cast<int>(*logprobs);
  request.grammar = parse_response_format(body);
  parse_common(body, model, request);
  check_structured_output(request, "response_format");
  return request;
}

}  // namespace gemma4rt::serve
