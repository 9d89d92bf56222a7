// The C++ Gemma-4 chat format against (1) the published large-model template rendered by
// tests/e2e/render_templates.mjs (a ctest fixture that writes rendered_templates.json) and (2) the prompt
// texts of the trained coherence fixtures in models/, which use the E-series generation prompt.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_format.h"

namespace gemma4rt {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json load_json(const fs::path& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  return json::parse(file);
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// Newlines and the like made visible, so two renderings compare line by line in the test log.
std::string escaped(const std::string& text) { return json(text).dump(); }

// Empty when equal; otherwise where the texts first differ, with context, and both in full.
std::string difference(const std::string& expected, const std::string& actual) {
  if (expected == actual) return "";
  size_t at = 0;
  while (at < expected.size() && at < actual.size() && expected[at] == actual[at]) ++at;
  const size_t from = at > 40 ? at - 40 : 0;
  std::ostringstream out;
  out << "first difference at byte " << at << "\n  expected ..." << escaped(expected.substr(from, 100))
      << "\n  actual   ..." << escaped(actual.substr(from, 100)) << "\n  expected: " << escaped(expected)
      << "\n  actual:   " << escaped(actual);
  return out.str();
}

json value_or(const json& object, const char* key, json fallback) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? fallback : *it;
}

ChatOptions large_model(bool enable_thinking = false) {
  ChatOptions options;
  options.style = GenerationPromptStyle::kLargeModel;
  options.enable_thinking = enable_thinking;
  return options;
}

const json kUser = json::array({{{"role", "user"}, {"content", "What is the capital of France?"}}});

// ---------------------------------------------------------------------------------------------
// (1) The published template, rendered by the oracle.

TEST(ChatFormatOracle, MatchesPublishedLargeModelTemplate) {
  const fs::path path = fs::path(GEMMA4RT_TEST_WORK) / "rendered_templates.json";
  ASSERT_TRUE(fs::exists(path)) << path << " is missing: the ctest fixture setup.render_chat_templates "
                                << "(node tests/e2e/render_templates.mjs) writes it";
  const json rendered = load_json(path);
  const json& cases = rendered.at("cases");
  ASSERT_GE(cases.size(), 40u) << "chat_cases.json lost cases";
  std::set<std::string> names;
  for (const json& c : cases) {
    const std::string name = c.at("name");
    names.insert(name);
    ChatOptions options = large_model(c.at("enable_thinking").get<bool>());
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    options.parse_json_strings = c.at("parse_json_strings").get<bool>();
    std::string actual;
    try {
      actual = render_chat(c.at("messages"), c.at("tools"), options);
    } catch (const Error& error) {
      ADD_FAILURE() << "case " << name << ": render_chat threw: " << error.what();
      continue;
    }
    const std::string diff = difference(c.at("rendered").get<std::string>(), actual);
    EXPECT_TRUE(diff.empty()) << "case " << name << " (" << c.at("template").get<std::string>() << "): " << diff;
  }
  // The areas the oracle must keep covering.
  for (const char* required :
       {"single_user", "system_user", "developer_user", "multi_turn_strip_thinking", "single_user_thinking",
        "tool_declaration_nested", "tool_call_pending_argument_types", "tool_result_object_string_then_answer",
        "tool_result_plain_string", "tool_result_native_tool_responses", "tool_rounds_with_reasoning_thinking_on",
        "add_generation_prompt_false", "consecutive_assistant_merged"}) {
    EXPECT_TRUE(names.count(required)) << "oracle case missing: " << required;
  }
}

// ---------------------------------------------------------------------------------------------
// (2) The trained fixtures: their prompts use the E-series generation prompt.

const char* const kFixtureModels[] = {"tiny-e2b", "tiny-e4b", "tiny-12b", "tiny-31b", "tiny-26b-a4b", "tiny-e2b-agent"};

TEST(ChatFormatFixtures, CoherencePromptsRenderWithESeriesStyle) {
  for (const char* model : kFixtureModels) {
    const json coherence = load_json(fs::path(GEMMA4RT_MODELS) / model / "coherence.json");
    size_t checked = 0;
    for (const json& prompt : coherence.at("prompts")) {
      if (prompt.at("messages").is_null()) continue;
      ChatOptions options;
      options.enable_thinking = value_or(prompt, "enable_thinking", false).get<bool>();
      const std::string actual = render_chat(prompt.at("messages"), value_or(prompt, "tools", nullptr), options);
      const std::string diff = difference(prompt.at("text").get<std::string>(), actual);
      EXPECT_TRUE(diff.empty()) << model << " prompt " << prompt.at("id") << ": " << diff;
      ++checked;
    }
    EXPECT_GT(checked, 0u) << model << " has no chat prompts";
  }
}

// models/README.md: the released large-model template gives the fixture texts plus the thinking-off
// pre-fill, which it does not add after a tool result.
TEST(ChatFormatFixtures, LargeModelStyleAddsOnlyTheEmptyThoughtChannel) {
  for (const char* model : kFixtureModels) {
    const json coherence = load_json(fs::path(GEMMA4RT_MODELS) / model / "coherence.json");
    for (const json& prompt : coherence.at("prompts")) {
      if (prompt.at("messages").is_null()) continue;
      const bool thinking = value_or(prompt, "enable_thinking", false).get<bool>();
      const bool after_tool_result = prompt.at("kind") == "chat_tool_result";
      std::string expected = prompt.at("text").get<std::string>();
      if (!thinking && !after_tool_result) expected += kEmptyThoughtChannel;
      const std::string actual =
          render_chat(prompt.at("messages"), value_or(prompt, "tools", nullptr), large_model(thinking));
      const std::string diff = difference(expected, actual);
      EXPECT_TRUE(diff.empty()) << model << " prompt " << prompt.at("id") << ": " << diff;
    }
  }
}

// The agent's tool results, sent the three ways a client may: object content (as recorded), OpenAI string
// content, and the native tool_responses form, all render the recorded text.
TEST(ChatFormatFixtures, ToolResultFormsRenderTheSameText) {
  const json coherence = load_json(fs::path(GEMMA4RT_MODELS) / "tiny-e2b-agent" / "coherence.json");
  size_t checked = 0;
  for (const json& prompt : coherence.at("prompts")) {
    if (prompt.at("kind") != "chat_tool_result") continue;
    const json& messages = prompt.at("messages");
    ASSERT_EQ(messages.size(), 3u);
    ASSERT_EQ(messages[2].at("role"), "tool");
    const std::string text = prompt.at("text");

    json as_string = messages;
    as_string[2]["content"] = messages[2].at("content").dump();
    EXPECT_EQ(render_chat(as_string, prompt.at("tools"), {}), text) << prompt.at("id");

    json as_string_args = as_string;
    json& arguments = as_string_args[1]["tool_calls"][0]["function"]["arguments"];
    arguments = arguments.dump();
    EXPECT_EQ(render_chat(as_string_args, prompt.at("tools"), {}), text) << prompt.at("id");

    json native = json::array({messages[0], messages[1]});
    native[1]["tool_responses"] =
        json::array({{{"name", messages[2].at("name")}, {"response", messages[2].at("content")}}});
    EXPECT_EQ(render_chat(native, prompt.at("tools"), {}), text) << prompt.at("id");

    // Unparsed, the string is a plain value, as the published template renders it.
    ChatOptions raw;
    raw.parse_json_strings = false;
    const std::string unparsed = render_chat(as_string, prompt.at("tools"), raw);
    EXPECT_NE(unparsed.find("response:get_weather{value:<|\"|>{"), std::string::npos) << unparsed;
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

// ---------------------------------------------------------------------------------------------
// Generation prompt, roles and option details.

TEST(ChatFormat, GenerationPromptPerStyle) {
  EXPECT_EQ(render_chat(kUser, nullptr, {}),
            "<bos><|turn>user\nWhat is the capital of France?<turn|>\n<|turn>model\n");
  EXPECT_EQ(render_chat(kUser, nullptr, large_model()),
            "<bos><|turn>user\nWhat is the capital of France?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  // Thinking on: both styles leave the channel to the model.
  ChatOptions e_series_thinking;
  e_series_thinking.enable_thinking = true;
  const std::string thinking = render_chat(kUser, nullptr, e_series_thinking);
  EXPECT_EQ(thinking, "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nWhat is the capital of France?<turn|>\n"
                      "<|turn>model\n");
  EXPECT_EQ(render_chat(kUser, nullptr, large_model(true)), thinking);

  ChatOptions no_prompt = large_model();
  no_prompt.add_generation_prompt = false;
  no_prompt.bos_token = "";
  EXPECT_EQ(render_chat(kUser, nullptr, no_prompt), "<|turn>user\nWhat is the capital of France?<turn|>\n");
}

TEST(ChatFormat, DeveloperFirstRendersLikeSystem) {
  const json system = json::array({{{"role", "system"}, {"content", " Be brief. "}}, kUser[0]});
  json developer = system;
  developer[0]["role"] = "developer";
  EXPECT_EQ(render_chat(developer, nullptr, large_model()), render_chat(system, nullptr, large_model()));
  EXPECT_EQ(render_chat(system, nullptr, {}),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWhat is the capital of France?<turn|>\n<|turn>model\n");
}

TEST(ChatFormat, EarlierThinkingIsStripped) {
  const json messages = json::array({
      {{"role", "user"}, {"content", "Hi"}},
      {{"role", "assistant"},
       {"content", "<|channel>thought\nsay hello<channel|>Hello!"},
       {"reasoning_content", "not replayed without tool calls"}},
      {{"role", "user"}, {"content", "Bye"}},
  });
  EXPECT_EQ(render_chat(messages, nullptr, {}),
            "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n");
}

TEST(ChatFormat, PendingToolCallEndsWithToolResponseToken) {
  const json messages = json::array({
      kUser[0],
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "1"}, {"type", "function"}, {"function", {{"name", "lookup"}, {"arguments", R"({"q": "Paris", "n": 2})"}}}}}}},
  });
  const std::string expected =
      "<bos><|turn>user\nWhat is the capital of France?<turn|>\n<|turn>model\n"
      "<|tool_call>call:lookup{n:2,q:<|\"|>Paris<|\"|>}<tool_call|><|tool_response>";
  EXPECT_EQ(render_chat(messages, nullptr, {}), expected);
  EXPECT_EQ(render_chat(messages, nullptr, large_model()), expected);  // no pre-fill after a call
}

// `type: [..]` in array items: the JS oracle cannot render map('upper'), so this is Python Jinja's output.
TEST(ChatFormat, ItemTypeListIsUpperCased) {
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "f"},
                                     {"description", "d"},
                                     {"parameters",
                                      {{"type", "object"},
                                       {"properties", {{"xs", {{"type", "array"}, {"items", {{"type", {"string", "null"}}}}}}}}}}}}}});
  const std::string text = render_chat(kUser, tools, {});
  EXPECT_NE(text.find("<|tool>declaration:f{description:<|\"|>d<|\"|>,parameters:{properties:{xs:{items:{type:[<|\"|>STRING<|\"|>,"
                      "<|\"|>NULL<|\"|>]},type:<|\"|>ARRAY<|\"|>}},type:<|\"|>OBJECT<|\"|>}}<tool|>"),
            std::string::npos)
      << text;
}

TEST(ChatFormat, NumbersPrintAsTheTemplateEngineDoes) {
  const json messages = json::array({
      kUser[0],
      {{"role", "assistant"},
       {"tool_calls",
        {{{"function",
           {{"name", "f"},
            {"arguments", {{"a", 0.1}, {"b", 1e21}, {"c", 1.5e-7}, {"d", 100.0}, {"e", -0.0}, {"f", 123456789.125}, {"g", -7}}}}}}}}},
  });
  const std::string text = render_chat(messages, nullptr, {});
  EXPECT_NE(text.find("call:f{a:0.1,b:1e+21,c:1.5e-7,d:100,e:0,f:123456789.125,g:-7}"), std::string::npos) << text;
}

// ---------------------------------------------------------------------------------------------
// Malformed input.

void expect_error(const json& messages, const json& tools, const std::string& fragment) {
  try {
    render_chat(messages, tools, {});
    ADD_FAILURE() << "no error for " << messages.dump() << " tools " << tools.dump();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(ChatFormat, RejectsMalformedInput) {
  expect_error(json::array(), nullptr, "non-empty");
  expect_error(json::object(), nullptr, "non-empty");
  expect_error(json::array({{{"role", "wizard"}, {"content", "hi"}}}), nullptr, "unknown role 'wizard'");
  expect_error(json::array({{{"content", "hi"}}}), nullptr, "role");
  expect_error(json::array({{{"role", "user"}}}), nullptr, "missing content");
  expect_error(json::array({{{"role", "user"}, {"content", nullptr}}}), nullptr, "missing content");
  expect_error(json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}}), nullptr, "'text'");
  expect_error(json::array({kUser[0], {{"role", "assistant"}}}), nullptr, "no tool calls");
  expect_error(json::array({kUser[0], {{"role", "assistant"}, {"tool_calls", {{{"function", {{"arguments", "{}"}}}}}}}}),
               nullptr, "function.name");
  // A result whose tool cannot be identified.
  expect_error(json::array({kUser[0],
                            {{"role", "assistant"}, {"tool_calls", {{{"id", "a"}, {"function", {{"name", "f"}}}}}}},
                            {{"role", "tool"}, {"tool_call_id", "b"}, {"content", "x"}}}),
               nullptr, "which tool");
  expect_error(json::array({kUser[0], {{"role", "assistant"}, {"tool_calls", {{{"function", {{"name", "f"}}}}}}},
                            {{"role", "tool"}}}),
               nullptr, "missing 'content'");
  // Tool schemas.
  expect_error(kUser, json::object(), "'tools'");
  expect_error(kUser, json::array({{{"type", "function"}}}), "'function'");
  expect_error(kUser, json::array({{{"function", {{"description", "no name"}}}}}), "name");
  expect_error(kUser,
               json::array({{{"function",
                              {{"name", "f"}, {"parameters", {{"type", "object"}, {"properties", {{"x", {{"description", "untyped"}}}}}}}}}}}),
               "f.x");
  expect_error(kUser,
               json::array({{{"function",
                              {{"name", "f"},
                               {"parameters", {{"type", "object"}, {"properties", {{"x", {{"type", {"string", "null"}}}}}}}}}}}}),
               "'type'");
  expect_error(kUser, json::array({{{"function", {{"name", "f"}, {"response", {{"description", "untyped"}}}}}}}), "response");
}

// ---------------------------------------------------------------------------------------------
// Style detection.

class ScratchDir {
 public:
  ScratchDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("gemma4rt_chat_format_" + std::string(test->name()) + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  fs::path dir(const std::string& name) const {
    fs::create_directories(path_ / name);
    return path_ / name;
  }

 private:
  fs::path path_;
};

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
}

TEST(ChatFormatStyle, FixturesAreESeries) {
  for (const char* model : kFixtureModels) {
    EXPECT_EQ(detect_generation_prompt_style(fs::path(GEMMA4RT_MODELS) / model, GenerationPromptStyle::kLargeModel),
              GenerationPromptStyle::kESeries)
        << model;
  }
}

TEST(ChatFormatStyle, PublishedLargeModelTemplatesAreLargeModel) {
  ScratchDir scratch;
  for (const char* name : {"google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"}) {
    const std::string source = read_file(fs::path(GEMMA4RT_TEST_DATA) / "templates" / name);
    ASSERT_FALSE(source.empty()) << name;

    const fs::path jinja_dir = scratch.dir(std::string("jinja_") + name);
    write_file(jinja_dir / "chat_template.jinja", source);
    EXPECT_EQ(detect_generation_prompt_style(jinja_dir, GenerationPromptStyle::kESeries),
              GenerationPromptStyle::kLargeModel)
        << name;

    const fs::path config_dir = scratch.dir(std::string("config_") + name);
    write_file(config_dir / "tokenizer_config.json", json{{"chat_template", source}}.dump());
    EXPECT_EQ(detect_generation_prompt_style(config_dir, GenerationPromptStyle::kESeries),
              GenerationPromptStyle::kLargeModel)
        << name;

    // chat_template.jinja wins over tokenizer_config.json.
    const fs::path both_dir = scratch.dir(std::string("both_") + name);
    write_file(both_dir / "chat_template.jinja", "{{ bos_token }}{{ '<|turn>model\\n' }}");
    write_file(both_dir / "tokenizer_config.json", json{{"chat_template", source}}.dump());
    EXPECT_EQ(detect_generation_prompt_style(both_dir, GenerationPromptStyle::kLargeModel),
              GenerationPromptStyle::kESeries)
        << name;
  }
}

TEST(ChatFormatStyle, NoTemplateFallsBack) {
  ScratchDir scratch;
  const fs::path empty = scratch.dir("empty");
  EXPECT_EQ(detect_generation_prompt_style(empty, GenerationPromptStyle::kLargeModel), GenerationPromptStyle::kLargeModel);
  EXPECT_EQ(detect_generation_prompt_style(empty, GenerationPromptStyle::kESeries), GenerationPromptStyle::kESeries);
  const fs::path no_template = scratch.dir("no_template");
  write_file(no_template / "tokenizer_config.json", R"({"bos_token": "<bos>"})");
  EXPECT_EQ(detect_generation_prompt_style(no_template, GenerationPromptStyle::kLargeModel),
            GenerationPromptStyle::kLargeModel);
  const fs::path broken = scratch.dir("broken");
  write_file(broken / "tokenizer_config.json", "{not json");
  EXPECT_THROW(detect_generation_prompt_style(broken, GenerationPromptStyle::kESeries), Error);
}

}  // namespace
}  // namespace gemma4rt
