// parse_json: the bound on nesting and the errors it gives for outside JSON.
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json_input.h"

namespace gemma4rt {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_json(text, "test.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(JsonInput, NestingUpToTheBoundParses) {
  const std::string deepest = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(parse_json(deepest, "test.json").is_array());
  const std::string deeper = "{\"outer\": " + std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']') + "}";
  const std::string error = error_of(deeper);
  EXPECT_NE(error.find("test.json: JSON nested more than 128 levels deep (inside field \"outer\")"), std::string::npos) << error;
}

TEST(JsonInput, HundredThousandLevelsFailCleanly) {
  const std::string error = error_of(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_NE(error.find("nested more than"), std::string::npos) << error;
  std::string objects;
  for (int i = 0; i < 50000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(50000, '}');
  const std::string object_error = error_of(objects);
  EXPECT_NE(object_error.find("nested more than 128 levels deep (inside field \"a\")"), std::string::npos) << object_error;
}

TEST(JsonInput, NumbersOutOfRangeNameTheirField) {
  const std::string error = error_of("{\"a\": 1, \"rms_norm_eps\": 1e400}");
  EXPECT_NE(error.find("test.json: a number out of range in field \"rms_norm_eps\""), std::string::npos) << error;
}

TEST(JsonInput, InvalidJsonNamesTheSource) {
  const std::string error = error_of("{\"a\": ");
  EXPECT_TRUE(error.starts_with("test.json: invalid JSON")) << error;
}

TEST(JsonInput, ExcerptsAreShort) {
  const nlohmann::json long_value = std::string(1000, 'x');
  EXPECT_EQ(json_excerpt(long_value, 10), "\"xxxxxxxxx...");
  EXPECT_EQ(json_excerpt(nlohmann::json(5)), "5");
}

}  // namespace
}  // namespace gemma4rt
