#include "tokenizer/chat_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/json_input.h"
#include "core/utf8.h"

namespace gemma4rt {
namespace {

using json = nlohmann::json;

// Gemma-4's string delimiter token: every string value in declarations, calls and results is wrapped in it.
constexpr std::string_view kQuote = "<|\"|>";

// ---------------------------------------------------------------------------------------------
// Values as @huggingface/jinja (the oracle) handles them.

// The code point at `pos` and its length; a malformed byte decodes as U+FFFD (a non-space) of length 1.
char32_t decode_utf8(std::string_view s, size_t pos, size_t* length) {
  *length = utf8_sequence_length(s, pos);
  if (*length == 0) {
    *length = 1;
    return 0xFFFD;
  }
  return decode_code_point(s, pos, *length);
}

// The characters JavaScript's String.prototype.trim removes (the template's `trim` filter).
bool is_js_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

std::string trim(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t length = 0;
    if (!is_js_space(decode_utf8(s, begin, &length))) break;
    begin += length;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t length = 0;
    if (!is_js_space(decode_utf8(s, start, &length)) || start + length != end) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

std::string upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// JavaScript's Number.prototype.toString: the shortest round-trip digits, written plainly for
// exponents in [-7, 21) and as 1.5e+21 / 1e-7 outside. A JSON number that is integral becomes a Jinja
// integer there, so 3.0 prints as 3.
std::string js_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  if (value == 0) return "0";  // -0 too: it is an integer in JavaScript
  std::string out = value < 0 ? "-" : "";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, std::fabs(value), std::chars_format::scientific);
  const std::string_view scientific(buffer, static_cast<size_t>(result.ptr - buffer));
  const size_t e = scientific.find('e');
  std::string digits;
  for (char c : scientific.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exponent = std::stoi(std::string(scientific.substr(e + 1)));
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // value = 0.digits * 10^n
  if (k <= n && n <= 21) {
    out += digits + std::string(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += n - 1 >= 0 ? "e+" : "e-";
    out += std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string number_text(const json& value) {
  if (value.is_number_integer()) return value.dump();
  return js_number(value.get<double>());
}

// JSON as the engine writes a list or mapping printed directly (Python json.dumps separators).
std::string json_text(const json& value) {
  if (value.is_number()) return number_text(value);
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + json_text(value[i]);
    return out + "]";
  }
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      out += (first ? "" : ", ") + json(key).dump() + ": " + json_text(item);
      first = false;
    }
    return out + "}";
  }
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// `{{ value }}`: strings as they are, null as nothing.
std::string display(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  return json_text(value);
}

// Jinja truthiness; a missing member (nullptr) is undefined, which is false.
bool truthy(const json* value) {
  if (value == nullptr || value->is_null()) return false;
  if (value->is_boolean()) return value->get<bool>();
  if (value->is_number_unsigned()) return value->get<uint64_t>() != 0;
  if (value->is_number_integer()) return value->get<int64_t>() != 0;
  if (value->is_number()) {
    const double number = value->get<double>();
    return number != 0 && !std::isnan(number);
  }
  if (value->is_string()) return !value->get_ref<const std::string&>().empty();
  if (value->is_array() || value->is_object()) return !value->empty();
  return true;
}

const json* member(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// `| dictsort`: by key, case-insensitively, stable for keys that differ only in case.
std::vector<std::pair<const std::string*, const json*>> dictsort(const json& object) {
  std::vector<std::pair<const std::string*, const json*>> items;
  for (auto it = object.begin(); it != object.end(); ++it) items.emplace_back(&it.key(), &it.value());
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return lower(*a.first) < lower(*b.first); });
  return items;
}

// The template's format_argument macro: Gemma's value syntax, `<|"|>` strings, bare numbers and
// booleans, sorted mappings whose keys are quoted only in declarations (escape_keys).
void format_argument(std::string& out, const json& value, bool escape_keys) {
  if (value.is_string()) {
    out.append(kQuote).append(value.get_ref<const std::string&>()).append(kQuote);
  } else if (value.is_boolean()) {
    out += value.get<bool>() ? "true" : "false";
  } else if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : dictsort(value)) {
      if (!first) out += ',';
      first = false;
      if (escape_keys) {
        out.append(kQuote).append(*key).append(kQuote);
      } else {
        out += *key;
      }
      out += ':';
      format_argument(out, *item, escape_keys);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i) out += ',';
      format_argument(out, value[i], escape_keys);
    }
    out += ']';
  } else {
    out += display(value);
  }
}

// ---------------------------------------------------------------------------------------------
// Tool declarations (format_function_declaration / format_parameters).

// A schema's `type` upper-cased; the template fails on anything but a string.
std::string schema_type(const json& schema, const std::string& where) {
  const json* type = member(schema, "type");
  if (type == nullptr || !type->is_string()) {
    fail("tool declaration: {} needs a string 'type' (got {})", where, type ? type->dump() : "none");
  }
  return upper(type->get<std::string>());
}

void append_required(std::string& out, const json& required, const std::string& where) {
  if (!required.is_array()) fail("tool declaration: {}: 'required' must be an array", where);
  out += "required:[";
  for (size_t i = 0; i < required.size(); ++i) {
    if (i) out += ',';
    out.append(kQuote).append(display(required[i])).append(kQuote);
  }
  out += ']';
}

void format_parameters(std::string& out, const json& properties, const std::string& where);

// An array property's `items` schema: every non-null key in sorted order, known ones specially.
void format_items(std::string& out, const json& items, const std::string& where) {
  out += "items:{";
  bool first = true;
  for (const auto& [key, value] : dictsort(items)) {
    if (value->is_null()) continue;
    if (!first) out += ',';
    first = false;
    if (*key == "properties") {
      out += "properties:{";
      if (value->is_object()) format_parameters(out, *value, where + ".items");
      out += '}';
    } else if (*key == "required") {
      append_required(out, *value, where + ".items");
    } else if (*key == "type") {
      out += "type:";
      if (value->is_string()) {
        format_argument(out, upper(value->get<std::string>()), true);
      } else if (value->is_array()) {
        json names = json::array();
        for (const json& name : *value) {
          if (!name.is_string()) fail("tool declaration: {}.items: 'type' list must hold strings", where);
          names.push_back(upper(name.get<std::string>()));
        }
        format_argument(out, names, true);
      } else {
        fail("tool declaration: {}.items: 'type' must be a string or a list of strings", where);
      }
    } else {
      out += *key + ":";
      format_argument(out, *value, true);
    }
  }
  out += '}';
}

void format_parameters(std::string& out, const json& properties, const std::string& where) {
  // Keys that describe the schema itself; the template skips them even where they name a property.
  static constexpr std::string_view kStandardKeys[] = {"description", "type", "properties", "required", "nullable"};
  bool first_property = true;
  for (const auto& [key, value] : dictsort(properties)) {
    if (std::find(std::begin(kStandardKeys), std::end(kStandardKeys), *key) != std::end(kStandardKeys)) continue;
    const std::string path = where + "." + *key;
    if (!value->is_object()) {
      // Reached also through an object schema without `properties`, whose other keys the template
      // treats as properties (e.g. `additionalProperties: false`).
      fail("tool declaration: parameter {} must be a schema object (an object schema without 'properties' "
           "lists its other keys as properties)",
           path);
    }
    const std::string type = schema_type(*value, "parameter " + path);
    if (!first_property) out += ',';
    first_property = false;
    out += *key + ":{";
    bool need_comma = false;
    const auto separate = [&] {
      if (need_comma) out += ',';
      need_comma = true;
    };
    if (const json* description = member(*value, "description"); truthy(description)) {
      out.append("description:").append(kQuote).append(display(*description)).append(kQuote);
      need_comma = true;
    }
    if (type == "STRING") {
      if (const json* values = member(*value, "enum"); truthy(values)) {
        separate();
        out += "enum:";
        format_argument(out, *values, true);
      }
    } else if (type == "ARRAY") {
      if (const json* items = member(*value, "items"); items && items->is_object() && !items->empty()) {
        separate();
        format_items(out, *items, path);
      }
    }
    if (truthy(member(*value, "nullable"))) {
      separate();
      out += "nullable:true";
    }
    if (type == "OBJECT") {
      separate();
      out += "properties:{";
      // Without a `properties` mapping the template lists the schema's own other keys as properties.
      const json* nested = member(*value, "properties");
      format_parameters(out, nested && nested->is_object() ? *nested : *value, path);
      out += '}';
      if (const json* required = member(*value, "required"); truthy(required)) {
        separate();
        append_required(out, *required, path);
      }
    }
    separate();
    out.append("type:").append(kQuote).append(type).append(kQuote).append("}");
  }
}

std::string format_declaration(const json& tool, size_t index) {
  const json* function = member(tool, "function");
  if (function == nullptr || !function->is_object()) fail("tool {}: needs a 'function' object", index);
  const json* name = member(*function, "name");
  if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    fail("tool {}: 'function.name' must be a non-empty string", index);
  }
  const std::string where = name->get<std::string>();
  std::string out = "declaration:" + where + "{description:";
  const json* description = member(*function, "description");
  out.append(kQuote).append(description ? display(*description) : "").append(kQuote);

  if (const json* parameters = member(*function, "parameters"); truthy(parameters)) {
    if (!parameters->is_object()) fail("tool {}: 'parameters' must be an object", where);
    out += ",parameters:{";
    if (const json* properties = member(*parameters, "properties"); truthy(properties)) {
      if (!properties->is_object()) fail("tool {}: 'parameters.properties' must be an object", where);
      out += "properties:{";
      format_parameters(out, *properties, where);
      out += "},";
    }
    if (const json* required = member(*parameters, "required"); truthy(required)) {
      append_required(out, *required, where);
      out += ',';
    }
    // Without a type the template also leaves out the brace that closes `parameters:{`.
    if (const json* type = member(*parameters, "type"); truthy(type)) {
      out.append("type:").append(kQuote).append(schema_type(*parameters, where + " parameters")).append(kQuote) += '}';
    }
  }
  if (const json* response = member(*function, "response")) {
    if (!response->is_object()) fail("tool {}: 'response' must be an object", where);
    out += ",response:{";
    if (const json* text = member(*response, "description"); truthy(text)) {
      out.append("description:").append(kQuote).append(display(*text)).append(kQuote) += ',';
    }
    if (schema_type(*response, where + " response") == "OBJECT") {
      out.append("type:").append(kQuote).append("OBJECT").append(kQuote) += '}';
    }
  }
  out += '}';
  return trim(out);
}

// ---------------------------------------------------------------------------------------------
// Messages.

// What the last rendered part was; it decides how a turn ends and whether a generation prompt follows.
enum class Last { kOther, kToolCall, kToolResponse };

const std::string& role_of(const json& message) { return message.at("role").get_ref<const std::string&>(); }

// `<|channel>...<channel|>` spans (and an unclosed span at the end) are dropped from earlier model text.
std::string strip_thinking(std::string_view text) {
  constexpr std::string_view kOpen = "<|channel>";
  constexpr std::string_view kClose = "<channel|>";
  std::string kept;
  size_t start = 0;
  while (true) {
    const size_t close = text.find(kClose, start);
    const std::string_view part = text.substr(start, close == std::string_view::npos ? std::string_view::npos : close - start);
    kept += part.substr(0, part.find(kOpen));
    if (close == std::string_view::npos) break;
    start = close + kClose.size();
  }
  return trim(kept);
}

// A message's content: strings trimmed (thinking stripped for the model), parts in order.
void render_content(std::string& out, const json* content, bool model, Last& last) {
  if (content == nullptr || content->is_null()) return;
  if (content->is_string()) {
    const auto& text = content->get_ref<const std::string&>();
    out += model ? strip_thinking(text) : trim(text);
    return;
  }
  for (const json& part : *content) {
    const std::string& type = part.at("type").get_ref<const std::string&>();
    if (type == "text") {
      const auto& text = part.at("text").get_ref<const std::string&>();
      out += model ? strip_thinking(text) : trim(text);
    } else if (type == "image" || type == "audio" || type == "video") {
      out += "<|" + type + "|>";
      last = Last::kOther;
    }
  }
}

std::optional<json> parse_object(const json& value) {
  if (!value.is_string()) return std::nullopt;
  try {
    json parsed = parse_json(value.get_ref<const std::string&>(), "a JSON string");
    if (!parsed.is_object()) return std::nullopt;
    return parsed;
  } catch (const Error&) {
    return std::nullopt;  // not JSON (or too deep to be): rendered as the text it is
  }
}

void render_tool_response(std::string& out, const std::string& name, const json& response) {
  out += "<|tool_response>response:" + name + "{";
  if (response.is_object()) {
    bool first = true;
    for (const auto& [key, value] : dictsort(response)) {
      if (!first) out += ',';
      first = false;
      out += *key + ":";
      format_argument(out, *value, false);
    }
  } else {
    out += "value:";
    format_argument(out, response, false);
  }
  out += "}<tool_response|>";
}

void check_content_parts(const json& parts, size_t index) {
  for (const json& part : parts) {
    const json* type = member(part, "type");
    if (type == nullptr || !type->is_string()) fail("chat message {}: every content part needs a string 'type'", index);
    if (*type == "text") {
      const json* text = member(part, "text");
      if (text == nullptr || !text->is_string()) fail("chat message {}: a text content part needs a string 'text'", index);
    }
  }
}

// Rejects what the template would fail on or silently garble, so render_* below can trust the shape.
void check_message(const json& message, size_t index) {
  if (!message.is_object()) fail("chat message {} must be an object", index);
  const json* role_value = member(message, "role");
  if (role_value == nullptr || !role_value->is_string()) fail("chat message {}: needs a string 'role'", index);
  const std::string& role = role_value->get_ref<const std::string&>();
  if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool") {
    fail("chat message {}: unknown role '{}' (expected system, developer, user, assistant or tool)", index, role);
  }
  const json* content = member(message, "content");
  const bool has_content = content != nullptr && !content->is_null();
  if (has_content && content->is_array()) check_content_parts(*content, index);

  const json* calls = member(message, "tool_calls");
  if (calls && !calls->is_null()) {
    if (!calls->is_array()) fail("chat message {}: 'tool_calls' must be an array", index);
    for (const json& call : *calls) {
      const json* function = member(call, "function");
      const json* name = function ? member(*function, "name") : nullptr;
      if (name == nullptr || !name->is_string()) fail("chat message {}: every tool call needs 'function.name'", index);
    }
  }
  const json* responses = member(message, "tool_responses");
  if (responses && !responses->is_null()) {
    if (!responses->is_array()) fail("chat message {}: 'tool_responses' must be an array", index);
    for (const json& response : *responses) {
      const json* name = member(response, "name");
      if (!response.is_object() || member(response, "response") == nullptr || (name && !name->is_string())) {
        fail("chat message {}: every entry of 'tool_responses' needs 'response' and a string 'name' if any", index);
      }
    }
  }

  if (role == "tool") {
    if (content == nullptr) fail("chat message {} (tool): missing 'content'", index);
    const json* name = member(message, "name");
    if (name && !name->is_null() && !name->is_string()) fail("chat message {} (tool): 'name' must be a string", index);
  } else if (role == "assistant") {
    if (has_content && !content->is_string() && !content->is_array()) {
      fail("chat message {} (assistant): 'content' must be a string, an array of parts or null", index);
    }
    if (!has_content && !truthy(calls) && !truthy(responses)) {
      fail("chat message {} (assistant): missing content and no tool calls", index);
    }
  } else if (!has_content || (!content->is_string() && !content->is_array())) {
    fail("chat message {} ({}): missing content (need a string or an array of parts)", index, role);
  }
}

class ChatRenderer {
 public:
  ChatRenderer(const json& messages, const ChatOptions& options) : options_(options) {
    // Work on a copy: parsing JSON strings rewrites arguments and tool contents.
    messages_ = messages;
    if (options.parse_json_strings) parse_json_strings();
  }

  std::string render(const json& tools) {
    std::string out = options_.bos_token;
    const std::string& first_role = role_of(messages_[0]);
    const bool system_first = first_role == "system" || first_role == "developer";
    if (options_.enable_thinking || truthy(&tools) || system_first) {
      out += "<|turn>system\n";
      if (options_.enable_thinking) out += "<|think|>\n";
      if (system_first) {
        const json& content = messages_[0]["content"];
        if (content.is_string()) {
          out += trim(content.get_ref<const std::string&>());
        } else {
          Last ignored = Last::kOther;
          render_content(out, &content, false, ignored);
        }
      }
      if (truthy(&tools)) {
        for (size_t i = 0; i < tools.size(); ++i) out += "<|tool>" + format_declaration(tools[i], i) + "<tool|>";
      }
      out += "<turn|>\n";
    }

    first_index_ = system_first ? 1 : 0;
    last_user_ = -1;
    for (size_t i = first_index_; i < messages_.size(); ++i) {
      if (role_of(messages_[i]) == "user") last_user_ = static_cast<long>(i);
    }
    Last last = Last::kOther;
    for (size_t i = first_index_; i < messages_.size(); ++i) {
      if (role_of(messages_[i]) != "tool") render_message(out, i, last);
    }

    if (options_.add_generation_prompt && last != Last::kToolCall && last != Last::kToolResponse) {
      out += "<|turn>model\n";
      if (!options_.enable_thinking && options_.style == GenerationPromptStyle::kLargeModel) {
        out += kEmptyThoughtChannel;
      }
    }
    return out;
  }

 private:
  void parse_json_strings() {
    for (json& message : messages_) {
      if (role_of(message) == "tool") {
        if (auto parsed = parse_object(message["content"])) message["content"] = std::move(*parsed);
      }
      json* calls = message.contains("tool_calls") ? &message["tool_calls"] : nullptr;
      if (calls == nullptr || !calls->is_array()) continue;
      for (json& call : *calls) {
        json& function = call["function"];
        if (!function.contains("arguments")) continue;
        if (auto parsed = parse_object(function["arguments"])) function["arguments"] = std::move(*parsed);
      }
    }
  }

  void render_message(std::string& out, size_t index, Last& last) {
    const json& message = messages_[index];
    const std::string& role = role_of(message);
    const bool model = role == "assistant";
    last = Last::kOther;

    // An assistant message right after another (tool results in between) continues the same model turn.
    std::string_view previous_role;
    for (size_t j = index; j-- > first_index_;) {
      if (role_of(messages_[j]) != "tool") {
        previous_role = role_of(messages_[j]);
        break;
      }
    }
    if (!(model && previous_role == "assistant")) out += "<|turn>" + (model ? std::string("model") : role) + "\n";

    const json* calls = member(message, "tool_calls");
    const bool has_calls = truthy(calls);
    // Reasoning is replayed only between tool calls of the current exchange (after the last user turn).
    const json* reasoning = member(message, "reasoning");
    if (!truthy(reasoning)) reasoning = member(message, "reasoning_content");
    if (truthy(reasoning) && static_cast<long>(index) > last_user_ && has_calls) {
      if (!reasoning->is_string()) fail("chat message {}: reasoning must be a string", index);
      out += "<|channel>thought\n" + reasoning->get<std::string>() + "\n<channel|>";
    }

    if (has_calls) {
      for (const json& call : *calls) render_tool_call(out, call);
      last = Last::kToolCall;
    }

    bool answered = false;
    if (const json* responses = member(message, "tool_responses"); truthy(responses)) {
      for (const json& response : *responses) {
        const json* name = member(response, "name");
        render_tool_response(out, name ? name->get<std::string>() : "unknown", response.at("response"));
      }
      answered = true;
      last = Last::kToolResponse;
    } else if (has_calls) {
      // OpenAI form: the results are the role:"tool" messages that follow.
      for (size_t k = index + 1; k < messages_.size() && role_of(messages_[k]) == "tool"; ++k) {
        render_tool_message(out, *calls, k);
        answered = true;
        last = Last::kToolResponse;
      }
    }

    const json* content = member(message, "content");
    render_content(out, content, model, last);

    if (last == Last::kToolCall && !answered) {
      out += "<|tool_response>";  // the model's stop token for "run the tool"; the turn stays open
    } else if (!(answered && !truthy(content))) {
      out += "<turn|>\n";
    }
  }

  static void render_tool_call(std::string& out, const json& call) {
    const json& function = call.at("function");
    out += "<|tool_call>call:" + function.at("name").get<std::string>() + "{";
    if (const json* arguments = member(function, "arguments")) {
      if (arguments->is_object()) {
        bool first = true;
        for (const auto& [key, value] : dictsort(*arguments)) {
          if (!first) out += ',';
          first = false;
          out += *key + ":";
          format_argument(out, *value, false);
        }
      } else if (arguments->is_string()) {
        out += arguments->get_ref<const std::string&>();  // the template writes unparsed text verbatim
      }
    }
    out += "}<tool_call|>";
  }

  void render_tool_message(std::string& out, const json& calls, size_t index) const {
    const json& message = messages_[index];
    // The tool's name: the call whose id matches tool_call_id (the last one wins, and a missing id
    // matches a missing tool_call_id, as in the template), else the message's own name.
    const json* own_name = member(message, "name");
    std::optional<std::string> name;
    if (own_name && own_name->is_string()) name = own_name->get<std::string>();
    const json* wanted = member(message, "tool_call_id");
    for (const json& call : calls) {
      const json* id = member(call, "id");
      const bool both_missing = (id == nullptr || id->is_null()) && (wanted == nullptr || wanted->is_null());
      if (both_missing || (id && wanted && *id == *wanted)) name = call["function"]["name"].get<std::string>();
    }
    if (!name) {
      fail("chat message {} (tool): cannot tell which tool answered: no 'name' and no tool call with id {}", index,
           wanted ? wanted->dump() : "null");
    }
    const json& content = message.at("content");
    if (content.is_array()) {
      std::string text;
      for (const json& part : content) {
        if (part["type"] == "text") text += part["text"].get<std::string>();
      }
      render_tool_response(out, *name, text);
    } else {
      render_tool_response(out, *name, content);
    }
  }

  const ChatOptions& options_;
  json messages_;
  size_t first_index_ = 0;
  long last_user_ = -1;
};

std::optional<std::string> read_text_file(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return std::nullopt;
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot read {}", path.string());
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::optional<std::string> read_chat_template(const std::filesystem::path& model_dir) {
  if (auto text = read_text_file(model_dir / "chat_template.jinja")) return text;
  const auto config_path = model_dir / "tokenizer_config.json";
  const auto config_text = read_text_file(config_path);
  if (!config_text) return std::nullopt;
  const json config = parse_json(*config_text, config_path.string());
  const json* chat_template = member(config, "chat_template");
  if (chat_template == nullptr || chat_template->is_null()) return std::nullopt;
  if (chat_template->is_string()) return chat_template->get<std::string>();
  // Hugging Face also allows a list of named templates; "default" is the one apply_chat_template uses.
  if (chat_template->is_array() && !chat_template->empty()) {
    const json* chosen = &(*chat_template)[0];
    for (const json& entry : *chat_template) {
      if (const json* name = member(entry, "name"); name && *name == "default") chosen = &entry;
    }
    if (const json* text = member(*chosen, "template"); text && text->is_string()) return text->get<std::string>();
  }
  fail("{}: 'chat_template' must be a string or a list of {{name, template}}", config_path.string());
}

}  // namespace

std::string render_chat(const json& messages, const json& tools, const ChatOptions& options) {
  if (!messages.is_array() || messages.empty()) fail("render_chat: 'messages' must be a non-empty array");
  if (!tools.is_null() && !tools.is_array()) fail("render_chat: 'tools' must be null or an array");
  for (size_t i = 0; i < messages.size(); ++i) check_message(messages[i], i);
  return ChatRenderer(messages, options).render(tools);
}

GenerationPromptStyle detect_generation_prompt_style(const std::filesystem::path& model_dir,
                                                     GenerationPromptStyle fallback) {
  const auto chat_template = read_chat_template(model_dir);
  if (!chat_template) return fallback;
  // The template source writes the pre-fill as a Jinja string literal, so `\n` is usually escaped.
  const bool prefills = chat_template->find("<|channel>thought\\n<channel|>") != std::string::npos ||
                        chat_template->find(kEmptyThoughtChannel) != std::string::npos;
  return prefills ? GenerationPromptStyle::kLargeModel : GenerationPromptStyle::kESeries;
}

}  // namespace gemma4rt
