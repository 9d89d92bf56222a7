#include "serve/output_parser.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>

#include "core/error.h"
#include "core/utf8.h"

namespace gemma4rt::serve {
namespace {

using json = nlohmann::json;

constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kToolCallOpen = "<|tool_call>";
constexpr std::string_view kToolCallClose = "<tool_call|>";
constexpr std::string_view kStringDelimiter = "<|\"|>";
constexpr std::array<std::string_view, 3> kEndMarkers = {"<turn|>", "<|tool_response>", "<eos>"};

// Every marker recognized outside a tool call. None is a prefix of another, so at any '<' the text is
// either one whole marker, a possible start of one (wait for more text), or ordinary text.
constexpr std::array<std::string_view, 22> kMarkers = {
    kChannelOpen, kChannelClose, kToolCallOpen, kToolCallClose, "<turn|>", "<|tool_response>", "<eos>",
    // Control tokens that carry nothing for the client; dropped wherever they appear.
    kStringDelimiter, "<|turn>", "<bos>", "<pad>", "<|think|>", "<|tool>", "<tool|>", "<tool_response|>",
    "<|image>", "<image|>", "<|audio>", "<audio|>", "<|image|>", "<|audio|>", "<|video|>"};

// Inside a tool call span only its close and the end markers count: the body is parsed when whole.
constexpr std::array<std::string_view, 4> kCallTerminators = {kToolCallClose, "<turn|>", "<|tool_response>",
                                                               "<eos>"};
constexpr size_t kLongestCallTerminator = 16;  // "<|tool_response>"

constexpr std::string_view kThoughtChannel = "thought";
constexpr size_t kMaxChannelHeader = 256;  // longer headers are not "thought"; no need to keep them
constexpr int kMaxNestingDepth = 512;      // keeps garbage like "[[[[..." from exhausting the stack

constexpr std::string_view kWhitespace = " \t\r\n";

bool is_end_marker(std::string_view marker) {
  return std::find(kEndMarkers.begin(), kEndMarkers.end(), marker) != kEndMarkers.end();
}

std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return {};
  const size_t last = text.find_last_not_of(kWhitespace);
  return text.substr(first, last - first + 1);
}

enum class MarkerMatch { kNone, kPartial, kWhole };

// Whether `text` (starting with '<') begins with a marker, or could once more text arrives.
MarkerMatch match_marker(std::string_view text, std::string_view& marker) {
  for (std::string_view candidate : kMarkers) {
    if (text.starts_with(candidate)) {
      marker = candidate;
      return MarkerMatch::kWhole;
    }
  }
  for (std::string_view candidate : kMarkers) {
    if (text.size() < candidate.size() && candidate.starts_with(text)) return MarkerMatch::kPartial;
  }
  return MarkerMatch::kNone;
}

// Appends `text` behind the held `tail` and returns what is safe to release; an incomplete character
// at the end stays in `tail`.
std::string release_whole_characters(std::string& tail, std::string_view text) {
  std::string released = std::move(tail);
  released.append(text);
  const size_t keep = incomplete_utf8_tail(released);
  tail = released.substr(released.size() - keep);
  released.resize(released.size() - keep);
  return released;
}


void append_json_string(std::string_view text, std::string& out) {
  out.push_back('"');
  for (char c : text) {
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out.append(fmt::format("\\u{:04x}", static_cast<unsigned>(c)));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// Recursive descent over the <|"|> value syntax. Builds the JSON value and, when asked, its compact
// JSON text with numbers copied as written.
class GemmaValueParser {
 public:
  GemmaValueParser(std::string_view text, std::string* json_text) : text_(text), out_(json_text) {}

  json parse() {
    json value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) error("unexpected text after the value");
    return value;
  }

 private:
  [[noreturn]] void error(std::string_view what) const {
    fail("malformed Gemma-4 value at byte {} of {}: {}", pos_, text_.size(), what);
  }

  void write(std::string_view json_piece) {
    if (out_) out_->append(json_piece);
  }

  void skip_whitespace() {
    while (pos_ < text_.size() && kWhitespace.find(text_[pos_]) != std::string_view::npos) ++pos_;
  }

  bool at_string() const { return text_.substr(pos_).starts_with(kStringDelimiter); }

  bool consume_word(std::string_view word) {
    if (!text_.substr(pos_).starts_with(word)) return false;
    pos_ += word.size();
    return true;
  }

  json parse_value(int depth) {
    if (depth > kMaxNestingDepth) error("nested too deeply");
    skip_whitespace();
    if (pos_ == text_.size()) error("expected a value, found the end");
    if (at_string()) {
      std::string string = parse_string();
      if (out_) append_json_string(string, *out_);
      return json(std::move(string));
    }
    const char c = text_[pos_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (consume_word("true")) return write("true"), json(true);
    if (consume_word("false")) return write("false"), json(false);
    if (consume_word("null")) return write("null"), json(nullptr);
    error("expected a value");
  }

  std::string parse_string() {
    pos_ += kStringDelimiter.size();
    const size_t end = text_.find(kStringDelimiter, pos_);
    if (end == std::string_view::npos) error("unterminated <|\"|> string");
    std::string string = with_valid_utf8(text_.substr(pos_, end - pos_));
    pos_ = end + kStringDelimiter.size();
    return string;
  }

  // Keys are bare (the templates write them so) or, leniently, <|"|>-quoted.
  std::string parse_key() {
    skip_whitespace();
    if (at_string()) return parse_string();
    const size_t start = pos_;
    while (pos_ < text_.size() && std::string_view(" \t\r\n:{}[],").find(text_[pos_]) == std::string_view::npos &&
           !at_string()) {
      ++pos_;
    }
    if (pos_ == start) error("expected a key");
    return with_valid_utf8(text_.substr(start, pos_ - start));
  }

  json parse_object(int depth) {
    ++pos_;  // '{'
    write("{");
    json object = json::object();
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      write("}");
      return object;
    }
    while (true) {
      std::string key = parse_key();
      if (object.contains(key)) error(fmt::format("duplicate key \"{}\"", key));
      skip_whitespace();
      if (pos_ == text_.size() || text_[pos_] != ':') error("expected ':' after a key");
      ++pos_;
      if (object.size() > 0) write(",");
      if (out_) append_json_string(key, *out_);
      write(":");
      object[key] = parse_value(depth + 1);
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        write("}");
        return object;
      }
      error("expected ',' or '}' in an object");
    }
  }

  json parse_array(int depth) {
    ++pos_;  // '['
    write("[");
    json array = json::array();
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      write("]");
      return array;
    }
    while (true) {
      if (!array.empty()) write(",");
      array.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        write("]");
        return array;
      }
      error("expected ',' or ']' in an array");
    }
  }

  // JSON number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  json parse_number() {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      error("malformed number");
    }
    bool integer = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      integer = false;
      if (digits() == 0) error("malformed number: no digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      integer = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) error("malformed number: no digits in the exponent");
    }
    const std::string_view number = text_.substr(start, pos_ - start);
    write(number);
    const char* first = number.data();
    const char* last = number.data() + number.size();
    // As nlohmann::json::parse does: non-negative integers unsigned, negative ones signed, double only
    // past 64 bits.
    if (integer) {
      if (number[0] == '-') {
        int64_t value;
        if (std::from_chars(first, last, value).ec == std::errc()) return json(value);
      } else {
        uint64_t value;
        if (std::from_chars(first, last, value).ec == std::errc()) return json(value);
      }
    }
    double value;
    const auto [end, status] = std::from_chars(first, last, value);
    if (status != std::errc() || end != last) error(fmt::format("number {} is out of range", number));
    return json(value);
  }

  std::string_view text_;
  std::string* out_;
  size_t pos_ = 0;
};

}  // namespace

json parse_gemma_value(std::string_view text, std::string* json_text) {
  std::string compact;
  json value = GemmaValueParser(text, json_text ? &compact : nullptr).parse();
  if (json_text) *json_text = std::move(compact);
  return value;
}

std::optional<ToolCall> parse_tool_call(std::string_view body) {
  constexpr std::string_view kCallPrefix = "call:";
  body = trim(body);
  if (!body.starts_with(kCallPrefix)) return std::nullopt;
  body.remove_prefix(kCallPrefix.size());
  const size_t brace = body.find('{');
  if (brace == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(body.substr(0, brace));
  const bool name_ok = !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
    return static_cast<unsigned char>(c) <= 0x20 || std::string_view("<>{}[],\"").find(c) != std::string_view::npos;
  });
  if (!name_ok) return std::nullopt;
  ToolCall call;
  call.name = with_valid_utf8(name);
  try {
    call.arguments = parse_gemma_value(body.substr(brace), &call.arguments_json);
  } catch (const Error&) {
    return std::nullopt;
  }
  return call;  // the text starts with '{', so a successful parse is an object
}

StreamingOutputParser::StreamingOutputParser(OutputParserOptions options) {
  if (options.starts_in_thought_channel) {
    state_ = State::kChannel;
    channel_is_thought_ = true;
    result_.reasoning = "";
  }
}

OutputDelta StreamingOutputParser::push(std::string_view chunk) {
  if (finished_) fail("StreamingOutputParser::push called after finish()");
  OutputDelta delta;
  if (state_ == State::kEnded) return delta;
  pending_.append(chunk);
  process(delta);
  return delta;
}

void StreamingOutputParser::process(OutputDelta& delta) {
  std::string_view text = pending_;
  // text[0, at) is consumed; what is left when the loop stops stays pending.
  size_t at = 0;
  while (at < text.size()) {
    if (state_ == State::kEnded) {
      at = text.size();
      break;
    }
    if (state_ == State::kToolCall) {
      call_body_.append(text.substr(at));
      at = text.size();
      size_t close_at = std::string::npos;
      std::string_view terminator;
      for (std::string_view candidate : kCallTerminators) {
        const size_t found = call_body_.find(candidate, call_search_from_);
        if (found < close_at) close_at = found, terminator = candidate;
      }
      if (close_at == std::string::npos) {
        // A terminator split across chunks starts within its length of the end.
        call_search_from_ = call_body_.size() > kLongestCallTerminator ? call_body_.size() - kLongestCallTerminator : 0;
        break;
      }
      std::string rest = call_body_.substr(close_at + terminator.size());
      call_body_.resize(close_at);
      const bool closed = terminator == kToolCallClose;
      finish_tool_call(call_body_, closed, delta);
      call_body_.clear();
      call_search_from_ = 0;
      if (!closed) state_ = State::kEnded;
      pending_ = std::move(rest);  // `text` viewed the old buffer, which is no longer used
      text = pending_;
      at = 0;
      continue;
    }
    const size_t open = text.find('<', at);
    if (open == std::string_view::npos) {
      emit(text.substr(at), delta);
      at = text.size();
      break;
    }
    emit(text.substr(at, open - at), delta);
    std::string_view marker;
    const MarkerMatch match = match_marker(text.substr(open), marker);
    if (match == MarkerMatch::kPartial) {
      at = open;  // hold back the possible marker start
      break;
    }
    if (match == MarkerMatch::kWhole) {
      at = open + marker.size();
      handle_marker(marker, delta);
    } else {
      emit("<", delta);
      at = open + 1;
    }
  }
  pending_.erase(0, at);
}

void StreamingOutputParser::handle_marker(std::string_view marker, OutputDelta& delta) {
  const bool in_channel = state_ == State::kChannelHeader || state_ == State::kChannel;
  if (marker == kChannelOpen) {
    if (state_ == State::kContent) {
      state_ = State::kChannelHeader;
      channel_header_.clear();
      channel_is_thought_ = false;
    }
  } else if (marker == kChannelClose) {
    if (state_ == State::kChannelHeader) close_channel_header();
    if (in_channel) state_ = State::kContent;
  } else if (marker == kToolCallOpen) {
    if (state_ == State::kChannelHeader) close_channel_header();
    state_ = State::kToolCall;
    call_body_.clear();
    call_search_from_ = 0;
  } else if (is_end_marker(marker)) {
    if (state_ == State::kChannelHeader) close_channel_header();
    state_ = State::kEnded;
  }
  // Anything else is a control token with nothing to show: dropped.
}

void StreamingOutputParser::close_channel_header() {
  channel_is_thought_ = channel_header_.size() <= kMaxChannelHeader && trim(channel_header_) == kThoughtChannel;
  if (channel_is_thought_ && !result_.reasoning) result_.reasoning = "";
  channel_header_.clear();
}

void StreamingOutputParser::finish_tool_call(std::string_view body, bool terminated, OutputDelta& delta) {
  state_ = State::kContent;
  if (std::optional<ToolCall> call = parse_tool_call(body)) {
    delta.completed_tool_calls.push_back(*call);
    result_.tool_calls.push_back(std::move(*call));
    return;
  }
  std::string verbatim(kToolCallOpen);
  verbatim.append(body);
  if (terminated) verbatim.append(kToolCallClose);
  emit_content(verbatim, delta);
}

void StreamingOutputParser::emit(std::string_view text, OutputDelta& delta) {
  if (text.empty()) return;
  switch (state_) {
    case State::kContent:
      emit_content(text, delta);
      break;
    case State::kChannelHeader: {
      const size_t newline = text.find('\n');
      const std::string_view header_part = text.substr(0, newline);
      if (channel_header_.size() <= kMaxChannelHeader) {
        channel_header_.append(header_part.substr(0, kMaxChannelHeader + 1 - channel_header_.size()));
      }
      if (newline != std::string_view::npos) {
        close_channel_header();
        state_ = State::kChannel;
        emit(text.substr(newline + 1), delta);
      }
      break;
    }
    case State::kChannel:
      if (channel_is_thought_) emit_reasoning(text, delta);
      break;
    case State::kToolCall:
    case State::kEnded:
      break;  // process() never emits in these states
  }
}

void StreamingOutputParser::emit_content(std::string_view text, OutputDelta& delta) {
  if (text.empty()) return;
  std::string with_whitespace;
  if (!content_started_) {
    // Leading whitespace waits: it is dropped if the content stays blank and a tool call comes.
    if (text.find_first_not_of(kWhitespace) == std::string_view::npos) {
      held_whitespace_.append(text);
      return;
    }
    content_started_ = true;
    with_whitespace = std::move(held_whitespace_);
    held_whitespace_.clear();
    with_whitespace.append(text);
    text = with_whitespace;
  }
  const std::string released = release_whole_characters(content_utf8_tail_, text);
  delta.content.append(released);
  result_.content.append(released);
}

void StreamingOutputParser::emit_reasoning(std::string_view text, OutputDelta& delta) {
  const std::string released = release_whole_characters(reasoning_utf8_tail_, text);
  delta.reasoning.append(released);
  result_.reasoning->append(released);
}

OutputDelta StreamingOutputParser::finish() {
  OutputDelta delta;
  if (finished_) return delta;
  finished_ = true;
  switch (state_) {
    case State::kContent:
    case State::kChannelHeader:
    case State::kChannel:
      // What is pending starts a marker that can no longer complete: it is ordinary text.
      emit(pending_, delta);
      if (state_ == State::kChannelHeader) close_channel_header();
      break;
    case State::kToolCall:
      finish_tool_call(call_body_, /*terminated=*/false, delta);
      break;
    case State::kEnded:
      break;
  }
  pending_.clear();
  call_body_.clear();
  if (!held_whitespace_.empty() && result_.tool_calls.empty()) {
    delta.content.append(held_whitespace_);
    result_.content.append(held_whitespace_);
  }
  held_whitespace_.clear();
  // A character cut short for good is released as it is, broken.
  delta.content.append(content_utf8_tail_);
  result_.content.append(content_utf8_tail_);
  content_utf8_tail_.clear();
  if (!reasoning_utf8_tail_.empty()) {
    delta.reasoning.append(reasoning_utf8_tail_);
    result_.reasoning->append(reasoning_utf8_tail_);
    reasoning_utf8_tail_.clear();
  }
  return delta;
}

ParsedOutput parse_output(std::string_view text_with_special_tokens, OutputParserOptions options) {
  StreamingOutputParser parser(options);
  parser.push(text_with_special_tokens);
  parser.finish();
  return parser.result();
}

}  // namespace gemma4rt::serve
