// Gemma-4 chat format: renders an OpenAI / Hugging Face style conversation into the prompt text the
// model was trained on, without a Jinja engine.
//
// The authority is the published large-model template (tests/data/templates/google-gemma-4-31B-it.jinja)
// as rendered by @huggingface/jinja; tests/e2e/render_templates.mjs renders it and chat_format_test.cc
// compares. Its quirks are reproduced on purpose, for example:
//   * consecutive assistant messages share one model turn only in that the second opens no new
//     `<|turn>model\n`; the first still closes with `<turn|>\n`;
//   * an assistant message's text comes after its tool calls and tool results;
//   * after tool results the generation prompt adds nothing, even when the message also had text;
//   * a tool message that does not follow an assistant message with tool calls is dropped;
//   * reasoning (`reasoning` or `reasoning_content`) is rendered only on assistant messages with tool
//     calls after the last user message; earlier thinking spans are stripped from assistant text;
//   * tool schemas: a property literally named description/type/properties/required/nullable is
//     dropped, parameters without a `type` leave the declaration's brace unclosed, an object schema
//     without `properties` lists its other keys as properties.
// Values print as @huggingface/jinja prints them: null as nothing, booleans as true/false, numbers as
// JavaScript does (1e-7, 1e+21, 3.0 as 3). Mapping keys are sorted case-insensitively (dictsort).
//
// Where the template has no behaviour or only a failing one, gemma4rt chooses:
//   * a role:"tool" message whose content is a JSON object renders like the native `tool_responses`
//     form, `response:NAME{key:value,...}` (the template fails on it in both Jinja engines);
//   * with ChatOptions::parse_json_strings (the default), tool-call arguments and tool-message
//     contents that are JSON text holding an object are parsed first, as OpenAI clients send them;
//   * `type: [..]` inside array `items` upper-cases each entry, as Python Jinja does (the JS engine
//     cannot render `map('upper')`);
//   * a first system/developer message given as content parts joins its trimmed text parts;
//   * malformed input (see render_chat) throws gemma4rt::Error instead of rendering garbage.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace gemma4rt {

// E2B/E4B end the generation prompt at `<|turn>model\n`; the large models (12B/26B/31B) pre-fill an
// empty thought channel `<|channel>thought\n<channel|>` after it when thinking is off.
enum class GenerationPromptStyle { kESeries, kLargeModel };

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;
  GenerationPromptStyle style = GenerationPromptStyle::kESeries;
  std::string bos_token = "<bos>";
  // Parse tool-call `arguments` and role:"tool" `content` strings that hold a JSON object, so the model
  // sees its trained `{key:value}` syntax. False renders such strings as the template does: arguments
  // verbatim inside the call's braces, results as `{value:<|"|>...<|"|>}`.
  bool parse_json_strings = true;
};

// The text that starts and ends the thinking-off pre-fill, also used to detect large-model templates.
inline constexpr const char* kEmptyThoughtChannel = "<|channel>thought\n<channel|>";

// Renders `messages` (and the `tools` declarations, null or an array) in the OpenAI / Hugging Face
// shape:
//   {"role": "system"|"developer"|"user"|"assistant"|"tool", "content": string|null|[{"type":"text","text":..},
//    {"type":"image"|"audio"|"video"}], "reasoning_content"?/"reasoning"?: string,
//    "tool_calls"?: [{"id", "type":"function", "function": {"name", "arguments": object or JSON string}}],
//    "tool_call_id"?, "name"?, "tool_responses"?: [{"name", "response"}]}
// Returns the prompt text, starting with options.bos_token. Throws gemma4rt::Error for malformed input:
// no messages, an unknown role, missing content, a tool call without a function name, a tool result whose
// tool cannot be identified, or a tool schema the template cannot render (e.g. a property without a
// string `type`).
std::string render_chat(const nlohmann::json& messages, const nlohmann::json& tools, const ChatOptions& options);

// Which generation-prompt style a checkpoint uses: reads <model_dir>/chat_template.jinja, else
// tokenizer_config.json["chat_template"] (a string, or a list of {name, template} where "default" or the
// first entry counts). A template that writes the empty thought channel is kLargeModel, any other
// template kESeries; with no template at all, `fallback`. Throws gemma4rt::Error if a file exists but
// cannot be read or parsed.
GenerationPromptStyle detect_generation_prompt_style(const std::filesystem::path& model_dir,
                                                     GenerationPromptStyle fallback);

}  // namespace gemma4rt
