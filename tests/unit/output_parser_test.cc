// The Gemma-4 output parser: the recorded outputs of models/tiny-e2b-agent against their expected_parsed,
// hand-written outputs for everything the fixture does not show (argument types, escaping, several calls,
// malformed and unterminated spans), streaming at every chunking, and the <|"|> value syntax.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/output_parser.h"

namespace gemma4rt::serve {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Gemma-4 spells the string delimiter token <|"|>; written out here for readable test texts.
const std::string Q = "<|\"|>";

json load_agent_prompts() {
  const fs::path path = fs::path(GEMMA4RT_MODELS) / "tiny-e2b-agent" / "coherence.json";
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  return json::parse(file).at("prompts");
}

bool valid_utf8(std::string_view text) {
  try {
    (void)json(std::string(text)).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

ToolCall call(std::string name, const std::string& arguments_json) {
  return ToolCall{std::move(name), json::parse(arguments_json), arguments_json};
}

ParsedOutput parsed(std::optional<std::string> reasoning, std::string content, std::vector<ToolCall> calls = {}) {
  return ParsedOutput{std::move(reasoning), std::move(content), std::move(calls)};
}

std::string describe(const ParsedOutput& output) {
  json calls = json::array();
  for (const ToolCall& tool_call : output.tool_calls) {
    calls.push_back({{"name", tool_call.name},
                     {"arguments", tool_call.arguments},
                     {"arguments_json", tool_call.arguments_json}});
  }
  return json{{"reasoning", output.reasoning ? json(*output.reasoning) : json(nullptr)},
              {"content", output.content},
              {"tool_calls", calls}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

// Streams `text` in chunks of the given sizes (cycled) and checks the deltas against parse_output().
void expect_streaming_matches(std::string_view text, const std::vector<size_t>& chunk_sizes,
                              const OutputParserOptions& options = {}) {
  const ParsedOutput whole = parse_output(text, options);
  StreamingOutputParser parser(options);
  std::vector<OutputDelta> deltas;
  size_t at = 0;
  for (size_t i = 0; at < text.size(); ++i) {
    const size_t size = std::min(chunk_sizes[i % chunk_sizes.size()], text.size() - at);
    deltas.push_back(parser.push(text.substr(at, size)));
    at += size;
  }
  deltas.push_back(parser.finish());

  std::string reasoning, content;
  std::vector<ToolCall> calls;
  const bool text_is_valid_utf8 = valid_utf8(text);
  for (const OutputDelta& delta : deltas) {
    reasoning += delta.reasoning;
    content += delta.content;
    calls.insert(calls.end(), delta.completed_tool_calls.begin(), delta.completed_tool_calls.end());
    // Each delta is sendable on its own: whole characters, and no piece of a marker where the final
    // text has no '<' at all.
    if (text_is_valid_utf8) {
      EXPECT_TRUE(valid_utf8(delta.reasoning)) << json(text).dump();
      EXPECT_TRUE(valid_utf8(delta.content)) << json(text).dump();
    }
    if (whole.reasoning.value_or("").find('<') == std::string::npos) {
      EXPECT_EQ(delta.reasoning.find('<'), std::string::npos) << json(text).dump();
    }
    if (whole.content.find('<') == std::string::npos) {
      EXPECT_EQ(delta.content.find('<'), std::string::npos) << json(text).dump();
    }
  }
  EXPECT_EQ(reasoning, whole.reasoning.value_or("")) << json(text).dump();
  EXPECT_EQ(content, whole.content) << json(text).dump();
  EXPECT_EQ(calls, whole.tool_calls) << json(text).dump();
  EXPECT_EQ(parser.result(), whole) << describe(parser.result()) << " vs " << describe(whole);
}

// 1-byte chunks, a few fixed sizes, and random sizes.
void expect_streaming_matches_any_chunking(std::string_view text, const OutputParserOptions& options = {}) {
  expect_streaming_matches(text, {1}, options);
  expect_streaming_matches(text, {2}, options);
  expect_streaming_matches(text, {3, 5, 7}, options);
  expect_streaming_matches(text, {text.size() + 1}, options);
  std::mt19937 random(static_cast<uint32_t>(text.size()));
  for (int round = 0; round < 8; ++round) {
    std::vector<size_t> sizes;
    for (int i = 0; i < 16; ++i) sizes.push_back(std::uniform_int_distribution<size_t>(1, 12)(random));
    expect_streaming_matches(text, sizes, options);
  }
}

// The whole-output result, then the same through every chunking.
void expect_parse(std::string_view text, const ParsedOutput& expected, const OutputParserOptions& options = {}) {
  const ParsedOutput actual = parse_output(text, options);
  EXPECT_EQ(actual, expected) << "text " << json(text).dump(-1, ' ', false, json::error_handler_t::replace)
                              << "\n  actual   " << describe(actual) << "\n  expected " << describe(expected);
  expect_streaming_matches_any_chunking(text, options);
}

// ---- models/tiny-e2b-agent ---------------------------------------------------------------------------

void expect_matches_expected_parsed(const ParsedOutput& actual, const json& expected, const std::string& id) {
  SCOPED_TRACE(id);
  if (expected.at("reasoning").is_null()) {
    EXPECT_FALSE(actual.reasoning.has_value());
  } else {
    ASSERT_TRUE(actual.reasoning.has_value());
    EXPECT_EQ(*actual.reasoning, expected.at("reasoning").get<std::string>());
  }
  EXPECT_EQ(actual.content, expected.at("content").get<std::string>());
  const json& expected_calls = expected.at("tool_calls");
  ASSERT_EQ(actual.tool_calls.size(), expected_calls.size());
  for (size_t i = 0; i < expected_calls.size(); ++i) {
    EXPECT_EQ(actual.tool_calls[i].name, expected_calls[i].at("name").get<std::string>());
    EXPECT_EQ(actual.tool_calls[i].arguments, expected_calls[i].at("arguments"));
    EXPECT_EQ(json::parse(actual.tool_calls[i].arguments_json), expected_calls[i].at("arguments"));
  }
}

TEST(OutputParserAgentFixture, EveryPromptParsesToExpectedParsed) {
  const json prompts = load_agent_prompts();
  ASSERT_EQ(prompts.size(), 108u);
  for (const json& prompt : prompts) {
    const std::string id = prompt.at("id");
    const std::string with_stop = prompt.at("output_text_with_special_tokens");
    const std::string without_stop = prompt.at("expected_text");
    expect_matches_expected_parsed(parse_output(with_stop), prompt.at("expected_parsed"), id);
    expect_matches_expected_parsed(parse_output(without_stop), prompt.at("expected_parsed"), id + " without stop");
  }
}

TEST(OutputParserAgentFixture, StreamingMatchesAtEveryChunking) {
  for (const json& prompt : load_agent_prompts()) {
    SCOPED_TRACE(prompt.at("id").get<std::string>());
    expect_streaming_matches_any_chunking(prompt.at("output_text_with_special_tokens").get<std::string>());
  }
}

TEST(OutputParserAgentFixture, StreamingSendsReasoningAndContentBeforeTheEnd) {
  // 00-thinking: the reasoning is out before <channel|> arrives, the answer before <turn|>.
  StreamingOutputParser parser;
  EXPECT_TRUE(parser.push("<|channel>thought\n").empty());
  EXPECT_EQ(parser.push("The user asks").reasoning, "The user asks");
  EXPECT_EQ(parser.push(" about France.<chan").reasoning, " about France.");
  EXPECT_EQ(parser.push("nel|>The capital").content, "The capital");
  EXPECT_EQ(parser.push(" is Paris.<tu").content, " is Paris.");
  EXPECT_TRUE(parser.push("rn|>").empty());
  EXPECT_TRUE(parser.ended());
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.result(), parsed("The user asks about France.", "The capital is Paris."));
}

// ---- hand-written outputs ------------------------------------------------------------------------------

TEST(OutputParser, PlainAnswer) {
  expect_parse("The capital of France is Paris.<turn|>", parsed(std::nullopt, "The capital of France is Paris."));
  expect_parse("No stop token at all", parsed(std::nullopt, "No stop token at all"));
  expect_parse("", parsed(std::nullopt, ""));
  expect_parse("<turn|>", parsed(std::nullopt, ""));
  expect_parse("Ends with eos<eos>", parsed(std::nullopt, "Ends with eos"));
}

TEST(OutputParser, ScalarArguments) {
  const std::string text = "<|tool_call>call:set_values{a:" + Q + "x" + Q +
                           ",b:42,c:3.5,d:-7,e:true,f:false,g:null,h:-0.25,i:1e-07,j:0.1,k:2E+3}<tool_call|>"
                           "<|tool_response>";
  const ParsedOutput output = parse_output(text);
  ASSERT_EQ(output.tool_calls.size(), 1u);
  const ToolCall& tool_call = output.tool_calls[0];
  EXPECT_EQ(tool_call.name, "set_values");
  EXPECT_EQ(tool_call.arguments_json,
            R"({"a":"x","b":42,"c":3.5,"d":-7,"e":true,"f":false,"g":null,"h":-0.25,"i":1e-07,"j":0.1,"k":2E+3})");
  const json& arguments = tool_call.arguments;
  EXPECT_TRUE(arguments["b"].is_number_integer());
  EXPECT_EQ(arguments["b"].get<int64_t>(), 42);
  EXPECT_TRUE(arguments["c"].is_number_float());
  EXPECT_EQ(arguments["c"].get<double>(), 3.5);
  EXPECT_TRUE(arguments["d"].is_number_integer());
  EXPECT_EQ(arguments["d"].get<int64_t>(), -7);
  EXPECT_EQ(arguments["e"], true);
  EXPECT_EQ(arguments["f"], false);
  EXPECT_TRUE(arguments["g"].is_null());
  EXPECT_EQ(arguments["h"].get<double>(), -0.25);
  EXPECT_EQ(arguments["i"].get<double>(), 1e-07);
  EXPECT_EQ(arguments["j"].get<double>(), 0.1);
  EXPECT_EQ(arguments["k"].get<double>(), 2000.0);
  EXPECT_EQ(output.content, "");
  EXPECT_FALSE(output.reasoning.has_value());
  expect_streaming_matches_any_chunking(text);
}

TEST(OutputParser, NestedObjectAndArrayArguments) {
  const std::string text = "<|tool_call>call:book{flights:[{from:" + Q + "CDG" + Q + ",seats:2},{from:" + Q + "JFK" +
                           Q + ",seats:1}],options:{meal:" + Q + "veg" + Q +
                           ",window:true,legs:[[1,2],[]]},tags:[]}<tool_call|>";
  expect_parse(text, parsed(std::nullopt, "",
                            {call("book", R"({"flights":[{"from":"CDG","seats":2},{"from":"JFK","seats":1}],)"
                                          R"("options":{"meal":"veg","window":true,"legs":[[1,2],[]]},"tags":[]})")}));
}

TEST(OutputParser, StringsHoldAnyCharacter) {
  const std::string value = "a{b},c:d \"quoted\" back\\slash\nline 2\ttab é 漢字 😀 [x] <b>";
  const std::string text = "<|tool_call>call:note{text:" + Q + value + Q + ",empty:" + Q + Q + "}<tool_call|>";
  const ParsedOutput output = parse_output(text);
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].arguments["text"], value);
  EXPECT_EQ(output.tool_calls[0].arguments["empty"], "");
  EXPECT_EQ(output.tool_calls[0].arguments_json,
            R"({"text":"a{b},c:d \"quoted\" back\\slash\nline 2\ttab é 漢字 😀 [x] <b>","empty":""})");
  EXPECT_EQ(json::parse(output.tool_calls[0].arguments_json), output.tool_calls[0].arguments);
  expect_streaming_matches_any_chunking(text);
}

TEST(OutputParser, SeveralCallsInOneTurn) {
  const std::string weather = "<|tool_call>call:get_weather{city:" + Q + "Paris" + Q + "}<tool_call|>";
  const std::string time = "<|tool_call>call:get_time{zone:" + Q + "Europe/Paris" + Q + "}<tool_call|>";
  const std::vector<ToolCall> both = {call("get_weather", R"({"city":"Paris"})"),
                                      call("get_time", R"({"zone":"Europe/Paris"})")};
  expect_parse(weather + time + "<|tool_response>", parsed(std::nullopt, "", both));
  // Whitespace between or around the calls is not content.
  expect_parse("\n" + weather + "\n" + time + "\n<|tool_response>", parsed(std::nullopt, "", both));
}

TEST(OutputParser, ThinkingBeforeTheAnswer) {
  expect_parse("<|channel>thought\nStep 1: recall.\nStep 2: answer.<channel|>Paris.<turn|>",
               parsed("Step 1: recall.\nStep 2: answer.", "Paris."));
  // Whitespace after the channel is content, kept as written.
  expect_parse("<|channel>thought\nHmm.<channel|>\n\nParis.<turn|>", parsed("Hmm.", "\n\nParis."));
  // An empty thought channel (the large models' thinking-off form) is empty reasoning, not null.
  expect_parse("<|channel>thought\n<channel|>Paris.<turn|>", parsed("", "Paris."));
  expect_parse("<|channel>thought<channel|>Paris.", parsed("", "Paris."));
}

TEST(OutputParser, ThinkingBeforeAToolCall) {
  expect_parse("<|channel>thought\nI need the weather.<channel|><|tool_call>call:get_weather{city:" + Q + "Paris" + Q +
                   "}<tool_call|><|tool_response>",
               parsed("I need the weather.", "", {call("get_weather", R"({"city":"Paris"})")}));
  // A call inside an open channel closes the channel.
  expect_parse("<|channel>thought\nCalling.<|tool_call>call:f{}<tool_call|>Done.",
               parsed("Calling.", "Done.", {call("f", "{}")}));
}

TEST(OutputParser, TextBeforeAndAfterACall) {
  expect_parse("Let me check. <|tool_call>call:get_weather{city:" + Q + "Oslo" + Q + "}<tool_call|><|tool_response>",
               parsed(std::nullopt, "Let me check. ", {call("get_weather", R"({"city":"Oslo"})")}));
  expect_parse("Before<|tool_call>call:f{}<tool_call|>after<turn|>",
               parsed(std::nullopt, "Beforeafter", {call("f", "{}")}));
  expect_parse("  Sure.\n<|tool_call>call:f{}<tool_call|>", parsed(std::nullopt, "  Sure.\n", {call("f", "{}")}));
}

TEST(OutputParser, EmptyArgumentObject) {
  expect_parse("<|tool_call>call:list_files{}<tool_call|>", parsed(std::nullopt, "", {call("list_files", "{}")}));
  expect_parse("<|tool_call>call:list_files{ }<tool_call|>", parsed(std::nullopt, "", {call("list_files", "{}")}));
}

TEST(OutputParser, MalformedCallsBecomeVerbatimContent) {
  const std::vector<std::string> bodies = {
      "call:f{a:1",                      // missing }
      "call:f{a:" + Q + "x}",            // unterminated string
      "call:f{a:1}}",                    // text after the object
      "call:f{a:1,a:2}",                 // duplicate key
      "call:f{a:yes}",                   // bare word value
      "call:{a:1}",                      // no name
      "call:two words{}",                // name with a space
      "call:f",                          // no arguments
      "call:f[1]",                       // arguments not an object
      "get_weather{city:" + Q + "Paris" + Q + "}",  // no "call:"
      "",
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(body);
    EXPECT_FALSE(parse_tool_call(body).has_value());
    const std::string span = "<|tool_call>" + body + "<tool_call|>";
    expect_parse("Text " + span + " more<turn|>", parsed(std::nullopt, "Text " + span + " more"));
    // A good call next to a bad one still parses.
    expect_parse(span + "<|tool_call>call:g{}<tool_call|>", parsed(std::nullopt, span, {call("g", "{}")}));
  }
}

TEST(OutputParser, UnterminatedCalls) {
  // The body is a whole call: the model just ended without <tool_call|>.
  expect_parse("<|tool_call>call:f{a:1}", parsed(std::nullopt, "", {call("f", R"({"a":1})")}));
  expect_parse("<|tool_call>call:f{a:1}<|tool_response>", parsed(std::nullopt, "", {call("f", R"({"a":1})")}));
  // Cut short (e.g. by max_tokens): verbatim content, with no closing marker added.
  expect_parse("Hi <|tool_call>call:f{a:" + Q + "Par", parsed(std::nullopt, "Hi <|tool_call>call:f{a:" + Q + "Par"));
  expect_parse("<|tool_call>call:f{a:1<turn|>ignored", parsed(std::nullopt, "<|tool_call>call:f{a:1"));
  // <tool_call|> inside a string still closes the span (the first close wins, as in the reference regex);
  // the rest is content with its stray markers dropped.
  expect_parse("<|tool_call>call:f{a:" + Q + "x<tool_call|>y" + Q + "}<tool_call|>",
               parsed(std::nullopt, "<|tool_call>call:f{a:" + Q + "x<tool_call|>y}"));
}

TEST(OutputParser, UnterminatedAndOtherChannels) {
  expect_parse("<|channel>thought\nStill thinking", parsed("Still thinking", ""));
  expect_parse("<|channel>thought\nStill thinking<turn|>", parsed("Still thinking", ""));
  expect_parse("<|channel>thought", parsed("", ""));
  expect_parse("<|channel>", parsed(std::nullopt, ""));
  // A channel that is not "thought" is neither reasoning nor content.
  expect_parse("<|channel>analysis\nsecret<channel|>Answer.", parsed(std::nullopt, "Answer."));
  expect_parse("<|channel>thoughts\nsecret<channel|>Answer.", parsed(std::nullopt, "Answer."));
  expect_parse("<|channel>" + std::string(1000, 'x') + "\nsecret<channel|>Answer.", parsed(std::nullopt, "Answer."));
  // Two thought channels: their texts join.
  expect_parse("<|channel>thought\nOne.<channel|>A<|channel>thought\nTwo.<channel|>B", parsed("One.Two.", "AB"));
}

TEST(OutputParser, StartsInThoughtChannel) {
  OutputParserOptions options;
  options.starts_in_thought_channel = true;
  expect_parse("Reasoning here.<channel|>Answer.<turn|>", parsed("Reasoning here.", "Answer."), options);
  expect_parse("<channel|><|tool_call>call:f{}<tool_call|>", parsed("", "", {call("f", "{}")}), options);
}

TEST(OutputParser, TextAfterTheEndIsIgnored) {
  StreamingOutputParser parser;
  EXPECT_EQ(parser.push("Hi<turn|>junk").content, "Hi");
  EXPECT_TRUE(parser.ended());
  EXPECT_TRUE(parser.push("more<|tool_call>call:f{}<tool_call|>").empty());
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.result(), parsed(std::nullopt, "Hi"));
  expect_parse("Hi<|tool_response>response:f{a:1}<tool_response|>", parsed(std::nullopt, "Hi"));
}

TEST(OutputParser, LiteralAngleBracketsAreContent) {
  const std::string text = "a < b, x<y, <b>bold</b>, <|not a marker|>, <tool_call, <|channel, <eo";
  expect_parse(text, parsed(std::nullopt, text));
  expect_parse("<|channel>thought\n1 < 2 <|x<channel|>ok", parsed("1 < 2 <|x", "ok"));
}

TEST(OutputParser, ControlTokensAreDropped) {
  expect_parse("Hi" + Q + " there<bos><|turn><|think|><tool_call|><channel|><|image|>!",
               parsed(std::nullopt, "Hi there!"));
  expect_parse("<|channel>thought\nA" + Q + "B<|channel>C<channel|>D", parsed("ABC", "D"));
}

TEST(OutputParser, WhitespaceOnlyContent) {
  expect_parse("\n<|tool_call>call:f{}<tool_call|>\n", parsed(std::nullopt, "", {call("f", "{}")}));
  // Without a tool call, whitespace is the answer as written.
  expect_parse("  \n", parsed(std::nullopt, "  \n"));
  expect_parse("\n\nHello", parsed(std::nullopt, "\n\nHello"));
  // Blank content before a call and real content after it keeps the blank part.
  expect_parse(" <|tool_call>call:f{}<tool_call|> Done.", parsed(std::nullopt, "  Done.", {call("f", "{}")}));
}

TEST(OutputParser, StreamingHoldsBackOnlyPossibleMarkers) {
  StreamingOutputParser parser;
  EXPECT_EQ(parser.push("Hello").content, "Hello");
  EXPECT_EQ(parser.push(" <").content, " ");
  EXPECT_EQ(parser.push("b").content, "");  // "<b" may still become <bos>
  EXPECT_EQ(parser.push("r>").content, "<br>");
  EXPECT_EQ(parser.push("x <").content, "x ");
  EXPECT_EQ(parser.push(" y").content, "< y");
  EXPECT_EQ(parser.push("<|tool_c").content, "");
  OutputDelta delta = parser.push("all>call:f{a:" + Q.substr(0, 2));
  EXPECT_TRUE(delta.empty());
  delta = parser.push(Q.substr(2) + "v" + Q + "}<tool_call");
  EXPECT_TRUE(delta.empty());
  delta = parser.push("|>Bye");
  ASSERT_EQ(delta.completed_tool_calls.size(), 1u);
  EXPECT_EQ(delta.completed_tool_calls[0], call("f", R"({"a":"v"})"));
  EXPECT_EQ(delta.content, "Bye");
  EXPECT_EQ(parser.push("<").content, "");
  EXPECT_EQ(parser.finish().content, "<");  // a marker start that never completed is text
  EXPECT_THROW(parser.push("late"), Error);
}

TEST(OutputParser, StreamingHoldsBackIncompleteCharactersAndLeadingWhitespace) {
  StreamingOutputParser parser;
  EXPECT_EQ(parser.push("\n").content, "");  // leading whitespace waits for a non-blank character
  EXPECT_EQ(parser.push("\xC3").content, "\n");
  EXPECT_EQ(parser.push("\xA9t\xE6\xBC").content, "\xC3\xA9t");  // "ét", then half of 漢
  EXPECT_EQ(parser.push("\xA2").content, "\xE6\xBC\xA2");
  EXPECT_EQ(parser.push("\xF0\x9F\x98").content, "");
  EXPECT_EQ(parser.finish().content, "\xF0\x9F\x98");  // a broken character is released at the end
}

TEST(OutputParser, InvalidUtf8InStringsBecomesReplacementCharacters) {
  const std::string text = "<|tool_call>call:f{a:" + Q + "x\xC3(y\xFF" + Q + "}<tool_call|>";
  const ParsedOutput output = parse_output(text);
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].arguments["a"], "x\xEF\xBF\xBD(y\xEF\xBF\xBD");
  EXPECT_NO_THROW((void)output.tool_calls[0].arguments.dump());
  expect_streaming_matches_any_chunking(text);
}

// Random mixes of markers, marker pieces and call syntax: whatever the text, streaming at any chunking
// gives what the whole-output parse gives, and nothing throws.
TEST(OutputParser, RandomMarkerSoupStreamsLikeTheWholeOutput) {
  const std::vector<std::string> pieces = {
      "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", Q, "<|tool_response>", "<turn|>", "<eos>",
      "<|tool", "<|", "<", "thought", "\n", " ", "call:f", "{", "}", "[", "]", ":", ",", "a", "1", "-2.5", "true",
      "é", "\xE6\xBC", "\xA2", "x<y", "<bo"};
  std::mt19937 random(7);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int length = std::uniform_int_distribution<int>(0, 30)(random);
    for (int i = 0; i < length; ++i) {
      text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(random)];
    }
    SCOPED_TRACE(json(text).dump(-1, ' ', false, json::error_handler_t::replace));
    EXPECT_NO_THROW(expect_streaming_matches_any_chunking(text));
  }
}

TEST(OutputParser, ParseToolCall) {
  const std::optional<ToolCall> tool_call = parse_tool_call(" call:ns.get-weather_v2{city:" + Q + "Paris" + Q + "} ");
  ASSERT_TRUE(tool_call.has_value());
  EXPECT_EQ(tool_call->name, "ns.get-weather_v2");
  EXPECT_EQ(tool_call->arguments_json, R"({"city":"Paris"})");
}

// ---- parse_gemma_value -----------------------------------------------------------------------------------

// Writes a JSON value in the Gemma-4 syntax: bare keys, <|"|> strings, numbers as JSON writes them.
std::string to_gemma(const json& value) {
  if (value.is_string()) return Q + value.get<std::string>() + Q;
  if (value.is_object()) {
    std::string out = "{";
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it != value.begin()) out += ",";
      out += it.key() + ":" + to_gemma(it.value());
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? "," : "") + to_gemma(value[i]);
    return out + "]";
  }
  return value.dump();
}

json random_value(std::mt19937& random, int depth) {
  const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(random); };
  const std::vector<std::string> strings = {"", "Paris", "a{b},c:d", "\"quoted\"", "back\\slash", "line\nbreak",
                                            "é 漢字 😀", "[1,2]", "<b>", "tab\tand\x01"};
  const std::vector<std::string> keys = {"a", "city", "max_results", "user.name", "x-y", "$ref", "n2", "ü"};
  switch (depth >= 3 ? pick(6) : pick(8)) {
    case 0: return strings[pick(static_cast<int>(strings.size()))];
    case 1: return std::uniform_int_distribution<int64_t>(-1000000, 1000000)(random);
    case 2: return std::uniform_real_distribution<double>(-1e6, 1e6)(random);
    case 3: return pick(2) == 0;
    case 4: return nullptr;
    case 5: return std::uniform_int_distribution<uint64_t>(0, UINT64_MAX)(random);
    case 6: {
      json object = json::object();
      for (int i = pick(4); i > 0; --i) {
        object[keys[pick(static_cast<int>(keys.size()))]] = random_value(random, depth + 1);
      }
      return object;
    }
    default: {
      json array = json::array();
      for (int i = pick(4); i > 0; --i) array.push_back(random_value(random, depth + 1));
      return array;
    }
  }
}

TEST(ParseGemmaValue, RoundTripsRandomValues) {
  std::mt19937 random(4);
  for (int i = 0; i < 500; ++i) {
    const json value = random_value(random, 0);
    const std::string gemma = to_gemma(value);
    std::string json_text;
    const json parsed_value = parse_gemma_value(gemma, &json_text);
    EXPECT_EQ(parsed_value, value) << gemma;
    EXPECT_EQ(json_text, value.dump()) << gemma;  // same key order (sorted) and number forms here
    // As tool-call arguments, through the whole parser and every chunking.
    if (value.is_object()) {
      expect_parse("<|tool_call>call:f" + gemma + "<tool_call|>",
                   parsed(std::nullopt, "", {ToolCall{"f", value, json_text}}));
    }
  }
}

TEST(ParseGemmaValue, NumbersKeepTheirText) {
  std::string text;
  EXPECT_EQ(parse_gemma_value("0.1", &text), json(0.1));
  EXPECT_EQ(text, "0.1");
  EXPECT_EQ(parse_gemma_value("1.50", &text), json(1.5));
  EXPECT_EQ(text, "1.50");
  EXPECT_EQ(parse_gemma_value("1e5", &text), json(100000.0));
  EXPECT_EQ(text, "1e5");
  const json largest = parse_gemma_value("18446744073709551615", &text);
  EXPECT_TRUE(largest.is_number_unsigned());
  EXPECT_EQ(largest.get<uint64_t>(), UINT64_MAX);
  const json smallest = parse_gemma_value("-9223372036854775808", &text);
  EXPECT_TRUE(smallest.is_number_integer());
  EXPECT_EQ(smallest.get<int64_t>(), INT64_MIN);
  const json huge = parse_gemma_value("123456789012345678901234567890", &text);
  EXPECT_TRUE(huge.is_number_float());
  EXPECT_EQ(text, "123456789012345678901234567890");
  EXPECT_EQ(parse_gemma_value("-0", &text), json(0));
}

TEST(ParseGemmaValue, Forms) {
  std::string text;
  EXPECT_EQ(parse_gemma_value(" { a : 1 , b : [ 1 , 2 ] }\n", &text), json::parse(R"({"a":1,"b":[1,2]})"));
  EXPECT_EQ(text, R"({"a":1,"b":[1,2]})");
  EXPECT_EQ(parse_gemma_value("{b:1,a:2}", &text), json::parse(R"({"a":2,"b":1})"));
  EXPECT_EQ(text, R"({"b":1,"a":2})");  // the model's key order
  EXPECT_EQ(parse_gemma_value("{" + Q + "my key: {x}" + Q + ":1}"), json::parse(R"({"my key: {x}":1})"));
  EXPECT_EQ(parse_gemma_value(Q + "top-level string" + Q), json("top-level string"));
  EXPECT_EQ(parse_gemma_value("[true,false,null]"), json::parse("[true,false,null]"));
  // A tool response body, as the chat template renders it.
  EXPECT_EQ(parse_gemma_value("{condition:" + Q + "rainy" + Q + ",temperature:11}"),
            json::parse(R"({"condition":"rainy","temperature":11})"));
}

TEST(ParseGemmaValue, MalformedInputThrows) {
  const std::vector<std::string> bad = {
      "", "   ", "{", "}", "{a:1", "{a:}", "{:1}", "{a 1}", "{a:1,}", "{,}", "[1,]", "[1 2]", "[", Q + "abc",
      Q, "tru", "truex", "nul", "01", "1.", ".5", "-", "+1", "1e", "1e+", "{a:1}x", "{a:1,a:2}", "1e999",
      "NaN", "Infinity", "bare", "{a:bare}", "{a:" + Q + "x" + Q + Q + "}",
      std::string(1000, '[') + std::string(1000, ']'),
  };
  for (const std::string& text : bad) {
    EXPECT_THROW(parse_gemma_value(text), Error) << json(text).dump();
  }
  try {
    parse_gemma_value("{a:1,b:}");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("byte 7"), std::string::npos) << error.what();
  }
  // Deep but within the limit is fine.
  EXPECT_NO_THROW(parse_gemma_value(std::string(200, '[') + std::string(200, ']')));
}

}  // namespace
}  // namespace gemma4rt::serve
