// The OpenAI request schema: validation of /v1/chat/completions and /v1/completions bodies into one
// ParsedRequest, and the error objects every failure is answered with. Nothing here knows about HTTP
// connections or the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "constrain/grammar.h"
#include "engine/sampler.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace gemma4rt::serve {

// An OpenAI-style error: HTTP status, error type, message and the offending parameter.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type;
  std::string param;
  std::string code;
};

ApiError invalid_request(const std::string& message, const std::string& param = {});
nlohmann::json error_body(const ApiError& error);

// What validating a request needs to know about the served model.
struct ServedModel {
  std::string id;                        // the name /v1/models lists
  std::string checkpoint_name;           // the checkpoint directory's name, also accepted as "model"
  const Tokenizer* tokenizer = nullptr;
  GenerationPromptStyle prompt_style = GenerationPromptStyle::kESeries;
  int context_tokens = 0;
  int vocab_size = 0;
  int bos_token_id = 2;
  std::vector<int> eos_token_ids;
  std::string backend;                   // where the forward pass runs, for /props ("cpu (avx512bf16)")
  int slots = 0;                         // KV slots (--parallel)
};

struct ParsedRequest {
  bool chat = true;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  std::vector<int32_t> prompt_tokens;
  int max_tokens = 0;
  SamplingOptions sampling;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::map<int32_t, float> logit_bias;   // token id -> added to its logit
  std::vector<std::string> stop;
  int logprobs = -1;                     // -1: none; else the number of alternatives per token
  bool has_tools = false;
  // Structured output (response_format json_object / json_schema, or a forced tool call); null: free text.
  std::shared_ptr<const constrain::Grammar> grammar;
  bool ignore_eos = false;
  bool cache_prompt = true;              // llama-server's field: false computes the whole prompt
  std::optional<double> timeout_seconds;
};

ParsedRequest parse_chat_request(const nlohmann::json& body, const ServedModel& model);
ParsedRequest parse_completion_request(const nlohmann::json& body, const ServedModel& model);

}  // namespace gemma4rt::serve
