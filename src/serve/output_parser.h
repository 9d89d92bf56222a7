// Gemma-4 output parsing: turns what the model generates (decoded with its special tokens kept as their
// literal strings) into OpenAI chat-completion parts: reasoning, visible content and tool calls, either
// for a finished output or incrementally while streaming.
//
// The syntax (docs: models/README.md "Parsing the output", gemma4-architecture.md §8):
//   <|channel>thought\n REASONING <channel|>      the thought channel
//   <|tool_call>call:NAME{key:value,...}<tool_call|>  one tool call; values use the <|"|> syntax below
//   <turn|>, <|tool_response>, <eos>              end the output (stop tokens); later text is ignored
//   anything else                                 content
//
// Behaviour chosen where the model strays from that syntax:
//   * A channel whose header (the text up to its first "\n") is not "thought" is neither reasoning nor
//     content: its text is dropped. A thought channel without "\n" before <channel|> is empty reasoning.
//   * An unterminated thought channel (the output ends inside it) keeps its text as reasoning: streaming
//     has already sent it and cannot take it back.
//   * <|tool_call> inside a channel closes the channel first.
//   * A tool call span whose body does not parse (no "call:", no name, missing `}`, unterminated string,
//     text after the object, ...) becomes content verbatim, markers included, so no text is lost and
//     the client sees what the model wrote. An unterminated span (the output ends before <tool_call|>)
//     is still a tool call when its body is a complete call; otherwise it is verbatim content too.
//   * Other Gemma-4 control tokens (<|"|>, <|turn>, <bos>, <pad>, <|think|>, <|tool>, <tool|>,
//     <tool_response|>, a stray <channel|> or <tool_call|>, the image/audio/video tokens) are dropped
//     from content and reasoning. Working on text, the parser cannot tell them from the same characters
//     written as ordinary pieces.
//   * Content that is only whitespace is "" when the output has tool calls (a pure tool call has
//     content ""); otherwise content is kept exactly, whitespace included.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gemma4rt::serve {

struct ToolCall {
  std::string name;
  nlohmann::json arguments;  // always an object
  // Compact JSON text of the arguments for OpenAI's "arguments" string: keys in the model's order and
  // numbers exactly as the model wrote them (no float round trip: 0.1 stays 0.1, 1.50 stays 1.50).
  std::string arguments_json;

  bool operator==(const ToolCall& other) const = default;
};

struct ParsedOutput {
  std::optional<std::string> reasoning;  // null when the output has no thought channel
  std::string content;
  std::vector<ToolCall> tool_calls;

  bool operator==(const ParsedOutput& other) const = default;
};

// What a push() or finish() releases: text that is final and safe to send now. Content and reasoning
// never hold part of a marker and always end on a whole UTF-8 character (except at finish(), which
// flushes everything, broken sequences included).
struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> completed_tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && completed_tool_calls.empty(); }
};

struct OutputParserOptions {
  // The prompt itself opened the thought channel (some large-model templates end a prompt after a tool
  // response with `<|channel>thought\n`), so the output starts as reasoning.
  bool starts_in_thought_channel = false;
};

// Incremental parser. Chunks may end anywhere: inside a marker, inside a <|"|> delimiter or inside a
// multi-byte UTF-8 character. Text is held back only while it may still be (or complete) a marker, a
// UTF-8 character, leading whitespace of the content (which is dropped if a tool call follows), a
// channel header, or a tool call span (released whole when it closes). Whatever the chunking, the
// concatenated deltas and result() equal parse_output() of the concatenated text.
class StreamingOutputParser {
 public:
  explicit StreamingOutputParser(OutputParserOptions options = {});

  // Throws gemma4rt::Error when called after finish().
  OutputDelta push(std::string_view chunk);
  // End of generation: releases everything still held back (see the header comment for unterminated
  // channels and tool calls). Later calls return an empty delta.
  OutputDelta finish();

  // Everything released so far; after finish(), the parsed output.
  const ParsedOutput& result() const { return result_; }
  // An end marker (<turn|>, <|tool_response>, <eos>) was seen; text after it is ignored.
  bool ended() const { return state_ == State::kEnded; }

 private:
  enum class State { kContent, kChannelHeader, kChannel, kToolCall, kEnded };

  void process(OutputDelta& delta);
  void handle_marker(std::string_view marker, OutputDelta& delta);
  void close_channel_header();
  void finish_tool_call(std::string_view body, bool terminated, OutputDelta& delta);
  void emit(std::string_view text, OutputDelta& delta);  // text outside markers, for the current state
  void emit_content(std::string_view text, OutputDelta& delta);
  void emit_reasoning(std::string_view text, OutputDelta& delta);

  State state_ = State::kContent;
  bool finished_ = false;
  std::string pending_;    // unprocessed text: empty, or starting with a possible marker prefix
  std::string call_body_;  // text after <|tool_call> while its closing marker has not arrived
  size_t call_search_from_ = 0;
  std::string channel_header_;
  bool channel_is_thought_ = false;
  bool content_started_ = false;     // content so far has a non-whitespace character
  std::string held_whitespace_;      // leading whitespace of the content, until content starts
  std::string content_utf8_tail_;    // an incomplete UTF-8 character at the end of released content
  std::string reasoning_utf8_tail_;  // the same for reasoning
  ParsedOutput result_;
};

// Parses a whole output. The stop token may be included: it ends the output like any end marker.
ParsedOutput parse_output(std::string_view text_with_special_tokens, OutputParserOptions options = {});

// Parses the body of a tool call span, "call:NAME{...}" (surrounding whitespace allowed). Returns
// nullopt when it is malformed.
std::optional<ToolCall> parse_tool_call(std::string_view body);

// Parses one value in the Gemma-4 syntax of tool-call arguments and tool responses: {key:value,...}
// objects with bare (or <|"|>-quoted) keys, [...] arrays, <|"|>strings<|"|> holding any characters,
// JSON numbers, true/false/null; whitespace between tokens is allowed. Integers become JSON integers
// (double only beyond 64 bits), decimals become doubles. Strings with invalid UTF-8 get U+FFFD for
// each bad byte. When json_text is given it receives the compact JSON text with numbers as written.
// Throws gemma4rt::Error on malformed input (also duplicate keys, trailing text, nesting over 512).
nlohmann::json parse_gemma_value(std::string_view text, std::string* json_text = nullptr);

}  // namespace gemma4rt::serve
