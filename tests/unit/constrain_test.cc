// The constraint engine: the automaton against hand-written valid and invalid texts, the schema
// compiler's errors, and token masks against a brute-force check of every token of the real Gemma-4
// vocabulary. (Whole outputs are validated by ajv in tests/e2e/structured_output.test.mjs.)
#include <filesystem>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "constrain/automaton.h"
#include "constrain/json_schema.h"
#include "constrain/matcher.h"
#include "constrain/token_table.h"
#include "tokenizer/tokenizer.h"

namespace gemma4rt::constrain {
namespace {

using nlohmann::json;

const std::string kQuote = "\xF8";  // <|"|>
const std::string kOpen = "\xF9";   // <|tool_call>
const std::string kClose = "\xFA";  // <tool_call|>

std::shared_ptr<const Grammar> schema(const char* text) { return compile_json_schema(json::parse(text)); }

TEST(ConstrainAutomaton, JsonObjectAcceptsObjectsOnly) {
  const Automaton automaton(*json_object_grammar());
  for (const char* text : {"{}", " {\"a\": 1}\n", "{\"a\":[1,-2.5e+3,0,\"x\\u00e9\\n\",true,null,{\"b\":{}}],\"\":\"\xC3\xA9\xE2\x82\xAC\"}",
                           "{\"k\": \"\\\"quoted\\\" \\\\ \\/ \\b\\f\\r\\t\"}", "{\"n\": 0.5E-7}"}) {
    EXPECT_TRUE(automaton.accepts(text)) << text;
  }
  for (const char* text : {"[]", "\"s\"", "1", "{", "{\"a\":}", "{\"a\":01}", "{\"a\":\"<\"}", "{\"a\":\"\\ud800\"}", "{,}",
                           "{\"a\":1,}", "{\"a\" 1}", "{\"a\":\"\n\"}", "{\"a\":tru}", "{\"a\":1.}", "{\"a\":-}", "{\"a\":\"\xC3\"}",
                           "{\"a\":\"\xED\xA0\x80\"}", "{\"a\":1e5000}", "{\"a\":\"x\"}}", "{\"a\\u0041\":1}"}) {
    EXPECT_FALSE(automaton.accepts(text)) << text;
  }
  State state;
  ASSERT_TRUE(automaton.accepts_prefix("{\"a\":12", &state));
  EXPECT_FALSE(automaton.complete(state));
}

TEST(ConstrainAutomaton, WhitespaceRunsAreBounded) {
  const Automaton automaton(*json_object_grammar());
  EXPECT_TRUE(automaton.accepts(std::string(kMaxWhitespace, ' ') + "{}"));
  EXPECT_FALSE(automaton.accepts(std::string(kMaxWhitespace + 1, ' ') + "{}"));
  EXPECT_TRUE(automaton.accepts("{\n  \"a\": [\n    1\n  ]\n}\n"));
  EXPECT_FALSE(automaton.accepts("{\n\n\"a\": 1}"));
}

TEST(ConstrainAutomaton, ObjectsFollowPropertiesRequiredAndAdditional) {
  const auto grammar = schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["a","b"]},"minItems":1,"maxItems":2}},"required":["name","tags"],"additionalProperties":false})");
  const Automaton automaton(*grammar);
  EXPECT_TRUE(automaton.accepts(R"({"name":"x","tags":["a"]})"));
  EXPECT_TRUE(automaton.accepts(R"({"tags":["b","a"],"age":-3,"name":""})"));
  EXPECT_FALSE(automaton.accepts(R"({"name":"x"})"));                          // tags missing
  EXPECT_FALSE(automaton.accepts(R"({"name":"x","tags":[]})"));                // minItems
  EXPECT_FALSE(automaton.accepts(R"({"name":"x","tags":["a","b","a"]})"));     // maxItems
  EXPECT_FALSE(automaton.accepts(R"({"name":"x","tags":["c"]})"));             // enum
  EXPECT_FALSE(automaton.accepts(R"({"name":"x","tags":["a"],"other":1})"));   // additionalProperties
  EXPECT_FALSE(automaton.accepts(R"({"name":"x","name":"y","tags":["a"]})"));  // duplicate key
  EXPECT_FALSE(automaton.accepts(R"({"name":"x","tags":["a"],"age":1.5})"));   // integer

  const auto open_grammar = schema(R"({"properties":{"a":{"type":"boolean"}},"additionalProperties":{"type":"null"}})");
  const Automaton open(*open_grammar);
  EXPECT_TRUE(open.accepts(R"({"ab":null,"a":true,"b":null})"));
  EXPECT_FALSE(open.accepts(R"({"a":null})"));   // a declared key takes its own schema
  EXPECT_FALSE(open.accepts(R"({"ab":true})"));  // another key takes additionalProperties
}

TEST(ConstrainAutomaton, StringsCountCodePoints) {
  const auto grammar = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  const Automaton automaton(*grammar);
  EXPECT_TRUE(automaton.accepts("\"ab\""));
  EXPECT_TRUE(automaton.accepts("\"\xC3\xA9\\n\xE2\x82\xAC\""));
  EXPECT_FALSE(automaton.accepts("\"a\""));
  EXPECT_FALSE(automaton.accepts("\"abcd\""));
  EXPECT_FALSE(automaton.accepts("\"\\u0041bcd\""));
}

TEST(ConstrainAutomaton, UnionsReferencesAndLiterals) {
  const auto grammar = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":["integer","null"]},
      "next":{"$ref":"#/$defs/node"}},"required":["v"],"additionalProperties":false}},
      "anyOf":[{"$ref":"#/$defs/node"},{"const":12},{"enum":[1,1.5,"s",[1,{"a":null}]]}]})");
  const Automaton automaton(*grammar);
  EXPECT_TRUE(automaton.accepts(R"({"v":1,"next":{"v":null,"next":{"v":2}}})"));
  EXPECT_TRUE(automaton.accepts("12"));
  EXPECT_TRUE(automaton.accepts("1"));
  EXPECT_TRUE(automaton.accepts("1.5"));
  EXPECT_TRUE(automaton.accepts("[1,{\"a\":null}]"));
  EXPECT_FALSE(automaton.accepts("13"));
  EXPECT_FALSE(automaton.accepts(R"({"v":1,"next":{}})"));
  EXPECT_FALSE(automaton.accepts("[1,{\"a\":0}]"));
}

TEST(ConstrainAutomaton, NumbersWithExponents) {
  const auto grammar = schema(R"({"type":"number"})");
  const Automaton automaton(*grammar);
  for (const char* text : {"0", "-0", "1e5", "1E+05", "-2.50e-3", "123456789012345"}) EXPECT_TRUE(automaton.accepts(text)) << text;
  for (const char* text : {"01", "1.", ".5", "1e", "+1", "1e123", "1234567890123456"}) EXPECT_FALSE(automaton.accepts(text)) << text;
}

TEST(ConstrainAutomaton, ToolCallsInGemmaSyntax) {
  const auto grammar = compile_tool_calls({{"get_weather", json::parse(R"({"type":"object","properties":{"city":{"type":"string"},
      "days":{"type":"integer"}},"required":["city"]})")}, {"get", json()}});
  const Automaton automaton(*grammar);
  EXPECT_TRUE(automaton.accepts(kOpen + "call:get_weather{city:" + kQuote + "Paris, \"FR\"" + kQuote + "}" + kClose));
  EXPECT_TRUE(automaton.accepts(kOpen + "call:get_weather{days:3,city:" + kQuote + kQuote + "}" + kClose + kOpen + "call:get{}" + kClose));
  EXPECT_FALSE(automaton.accepts(kOpen + "call:get_weather{days:3}" + kClose));             // city is required
  EXPECT_FALSE(automaton.accepts(kOpen + "call:set{}" + kClose));                          // no such tool
  EXPECT_FALSE(automaton.accepts(kOpen + "call:get{x:1}" + kClose));                       // no other keys
  EXPECT_FALSE(automaton.accepts(kOpen + "call:get_weather{city:\"Paris\"}" + kClose));   // strings use <|"|>
  EXPECT_FALSE(automaton.accepts(kOpen + "call:get{}"));                                   // unterminated
}

TEST(ConstrainAutomaton, DeepNestingAndRandomBytesStayBounded) {
  const Automaton automaton(*json_object_grammar());
  // Nesting stops at kMaxFrames: the byte that would go deeper is refused, nothing recurses.
  std::string deep = "{\"a\":";
  for (int i = 0; i < 1000; ++i) deep += "[";
  State state;
  EXPECT_FALSE(automaton.accepts_prefix(deep, &state));
  std::string shallow = "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_TRUE(automaton.accepts(shallow));
  // Random bytes from a valid prefix: every surviving state is bounded.
  const auto grammar = schema(R"({"anyOf":[{"type":"object","additionalProperties":{"anyOf":[{"type":"string"},{"type":"array"}]}},
      {"type":"object","properties":{"a":{"enum":[1,12,123]}}}]})");
  const Automaton branching(*grammar);
  std::mt19937 random(3);
  const std::string alphabet = "{}[]\",:0123456789.eE-+tfnrul \n\\abc\xC3\xA9";
  for (int run = 0; run < 2000; ++run) {
    State current = branching.start(), next;
    for (int i = 0; i < 64; ++i) {
      const char c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(random)];
      if (!branching.step(current, static_cast<uint8_t>(c), next)) break;
      std::swap(current, next);
      ASSERT_LE(current.threads(), kMaxThreads);
      ASSERT_LE(current.frames().size(), kMaxThreads * kMaxFrames);
    }
  }
}

SchemaError schema_error(const std::string& text) {
  try {
    compile_json_schema(json::parse(text));
  } catch (const SchemaError& error) {
    return error;
  }
  ADD_FAILURE() << "no error for " << text;
  return SchemaError("", "", "");
}

TEST(ConstrainSchema, UnsupportedKeywordsAreNamed) {
  for (const char* keyword : {"pattern", "minimum", "format", "patternProperties", "not", "allOf", "uniqueItems"}) {
    const SchemaError error = schema_error(fmt::format(R"({{"type":"object","properties":{{"a":{{"type":"string","{}":1}}}}}})", keyword));
    EXPECT_EQ(error.keyword, keyword);
    EXPECT_EQ(error.path, "#/properties/a");
    EXPECT_NE(std::string(error.what()).find(keyword), std::string::npos) << error.what();
  }
}

TEST(ConstrainSchema, UnsatisfiableAndMalformedSchemasAreErrors) {
  EXPECT_NE(std::string(schema_error(R"({"$ref":"#"})").what()).find("no finite value"), std::string::npos);
  schema_error(R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})");
  schema_error(R"({"type":"array","minItems":3,"maxItems":2})");
  schema_error(R"({"type":"string","minLength":3,"maxLength":2})");
  schema_error(R"({"enum":[]})");
  schema_error(R"({"type":"string","enum":[1,2]})");
  schema_error(R"({"type":"object","required":["x"],"additionalProperties":false})");
  schema_error(R"({"$ref":"other.json#/a"})");
  schema_error(R"({"$ref":"#/$defs/missing"})");
  schema_error(R"({"type":"strin"})");
  schema_error(R"({"items":[{"type":"string"}]})");
  EXPECT_EQ(schema_error(R"({"oneOf":[{"type":"number"},{"type":"integer"}]})").keyword, "oneOf");
  EXPECT_EQ(schema_error(R"({"type":"object","anyOf":[{"required":["a"]}]})").keyword, "type");
  EXPECT_NO_THROW(compile_json_schema(json::parse(R"({"oneOf":[{"type":"string"},{"type":"integer"},{"enum":[true]},{"enum":[false]}]})")));
  // Optional recursion is fine, and a chain of references longer than the depth limit is refused.
  EXPECT_NO_THROW(compile_json_schema(json::parse(R"({"type":"object","properties":{"a":{"$ref":"#"}}})")));
  json chain = {{"$ref", "#/$defs/d0"}, {"$defs", json::object()}};
  for (int i = 0; i < 400; ++i) chain["$defs"][fmt::format("d{}", i)] = {{"$ref", fmt::format("#/$defs/d{}", i + 1)}};
  chain["$defs"]["d400"] = {{"type", "null"}};
  EXPECT_THROW(compile_json_schema(chain), SchemaError);
}

class ConstrainMask : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static const Tokenizer tokenizer = Tokenizer::load(std::filesystem::path(GEMMA4RT_TEST_WORK) / "gemma4-tokenizer.json");
    tokenizer_ = &tokenizer;
    table_ = std::make_shared<TokenTable>(tokenizer, tokenizer.vocab_size());
  }
  static const Tokenizer* tokenizer_;
  static std::shared_ptr<const TokenTable> table_;
};
const Tokenizer* ConstrainMask::tokenizer_ = nullptr;
std::shared_ptr<const TokenTable> ConstrainMask::table_;

// The mask after `prefix` equals stepping every token's bytes through the automaton by itself.
void expect_mask_matches_brute_force(const std::shared_ptr<const Grammar>& grammar, const std::shared_ptr<const TokenTable>& table,
                                     const std::vector<int32_t>& prefix, const std::vector<int32_t>& end_tokens) {
  Matcher matcher(grammar, table, end_tokens);
  const Automaton automaton(*grammar);
  State state = automaton.start();
  for (const int32_t token : prefix) {
    ASSERT_TRUE(matcher.accept(token)) << token;
    for (const char c : table->bytes(token)) {
      State next;
      ASSERT_TRUE(automaton.step(state, static_cast<uint8_t>(c), next));
      state = next;
    }
  }
  const TokenBits& mask = matcher.allowed();
  int allowed = 0;
  for (int32_t id = 0; id < table->vocab_size(); ++id) {
    bool expected = false;
    if (std::find(end_tokens.begin(), end_tokens.end(), id) != end_tokens.end()) {
      expected = automaton.complete(state);
    } else if (!table->bytes(id).empty()) {
      State current = state, next;
      expected = true;
      for (const char c : table->bytes(id)) {
        if (!automaton.step(current, static_cast<uint8_t>(c), next)) {
          expected = false;
          break;
        }
        current = next;
      }
    }
    const bool got = mask[static_cast<size_t>(id) / 64] >> (id % 64) & 1;
    ASSERT_EQ(got, expected) << "token " << id << " '" << table->bytes(id) << "'";
    allowed += got;
  }
  EXPECT_GT(allowed, 0);
}

TEST_F(ConstrainMask, TokenBytesFollowTheDecoder) {
  const int32_t space_the = tokenizer_->encode(" the").front();
  EXPECT_EQ(table_->bytes(space_the), " the");
  EXPECT_EQ(table_->bytes(*tokenizer_->token_id("<0x41>")), "A");
  EXPECT_EQ(table_->bytes(52), kQuote);  // <|"|>
  EXPECT_EQ(table_->bytes(*tokenizer_->token_id("<0xF8>")), "");  // not UTF-8, and not the symbol of <|"|>
  EXPECT_EQ(table_->bytes(106), "");     // <turn|> is never text
  EXPECT_EQ(table_->bytes(2), "");       // <bos>
}

TEST_F(ConstrainMask, AVocabularyThatCannotStartTheOutputIsAnError) {
  // The first 64 ids are control tokens: none writes '{'.
  const auto small = std::make_shared<TokenTable>(*tokenizer_, 64);
  EXPECT_THROW(Matcher(json_object_grammar(), small, {1}), Error);
  EXPECT_NO_THROW(Matcher(json_object_grammar(), table_, {1}));
}

TEST_F(ConstrainMask, MasksEqualBruteForceOnTheRealVocabulary) {
  const std::vector<int32_t> ends = {1, 106};
  const auto object = json_object_grammar();
  const auto nested = schema(R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string","maxLength":5},
      "kind":{"enum":["alpha","beta"]},"items":{"type":"array","items":{"type":"number"}}},"required":["id","kind"]})");
  auto ids = [&](const std::string& text) { return tokenizer_->encode(text); };
  expect_mask_matches_brute_force(object, table_, {}, ends);
  expect_mask_matches_brute_force(object, table_, ids("{\"a"), ends);               // in a free key
  expect_mask_matches_brute_force(object, table_, ids("{\"a\": \"hello wor"), ends);  // in a string
  expect_mask_matches_brute_force(object, table_, ids("{\"a\": [1"), ends);          // in a number
  expect_mask_matches_brute_force(object, table_, ids("{\"a\": {}}"), ends);         // complete
  expect_mask_matches_brute_force(nested, table_, ids("{\"na"), ends);               // a declared key
  expect_mask_matches_brute_force(nested, table_, ids("{\"name\": \"ab"), ends);     // a bounded string
  expect_mask_matches_brute_force(nested, table_, ids("{\"kind\": \"al"), ends);     // an enum
  expect_mask_matches_brute_force(nested, table_, ids("{\"id\": 3, \"items\": [1.5e"), ends);
  // Several threads in strings at once, and keys that may be declared or other ones.
  const auto strings = schema(R"({"anyOf":[{"type":"string","maxLength":3},{"type":"string","minLength":2,"maxLength":6}]})");
  expect_mask_matches_brute_force(strings, table_, ids("\"ab"), ends);
  const auto keys = schema(R"({"type":"object","properties":{"name":{"type":"integer"},"a\"b":{"type":"null"},"é":{"type":"null"}}})");
  expect_mask_matches_brute_force(keys, table_, ids("{\""), ends);
  expect_mask_matches_brute_force(keys, table_, ids("{\"na"), ends);
  expect_mask_matches_brute_force(keys, table_, ids("{\"a\\"), ends);
  expect_mask_matches_brute_force(keys, table_, {ids("{\"")[0], *tokenizer_->token_id("<0xC3>")}, ends);
  const auto tools = compile_tool_calls({{"search", json::parse(R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})")}});
  expect_mask_matches_brute_force(tools, table_, {}, {50});
  expect_mask_matches_brute_force(tools, table_, {48}, {50});
  expect_mask_matches_brute_force(tools, table_, {48, ids("call:search{q:")[0]}, {50});
}

TEST_F(ConstrainMask, RandomWalksStayValidAndCanAlwaysContinue) {
  // Picking random allowed tokens never reaches a state without a way on, and a completed walk's
  // text is accepted as a whole.
  const auto grammar = schema(R"({"type":"object","properties":{"a":{"type":"array","items":{"anyOf":[{"type":"string","maxLength":4},
      {"type":"boolean"}]},"maxItems":3},"b":{"enum":["x","y"]}},"required":["a","b"],"additionalProperties":false})");
  std::mt19937 random(7);
  int completed = 0;
  for (int walk = 0; walk < 20; ++walk) {
    Matcher matcher(grammar, table_, {106});
    std::string text;
    for (int step = 0; step < 200 && !matcher.ended(); ++step) {
      const TokenBits& mask = matcher.allowed();
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < table_->vocab_size(); ++id) {
        if (mask[static_cast<size_t>(id) / 64] >> (id % 64) & 1) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << text;
      // Prefer the end token and short tokens so walks finish.
      int32_t token = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(random)];
      if (std::find(allowed.begin(), allowed.end(), 106) != allowed.end()) token = 106;
      ASSERT_TRUE(matcher.accept(token));
      if (token != 106) text += table_->bytes(token);
    }
    if (matcher.ended()) {
      ++completed;
      EXPECT_TRUE(Automaton(*grammar).accepts(text)) << text;
      const json value = json::parse(text);
      EXPECT_TRUE(value.contains("a") && value.contains("b")) << text;
    }
  }
  EXPECT_GT(completed, 0);
}

}  // namespace
}  // namespace gemma4rt::constrain
