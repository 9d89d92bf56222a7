#include "core/json_input.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace gemma4rt {

namespace {

// Thrown from the parser callback: stops the parse at the first level too deep.
struct TooDeep {};

}  // namespace

nlohmann::json parse_json(std::string_view text, std::string_view source, int max_depth) {
  std::string last_key;
  const nlohmann::json::parser_callback_t bound = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && parsed.is_string()) last_key = parsed.get<std::string>();
    if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) && depth >= max_depth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), bound);
  } catch (const TooDeep&) {
    fail("{}: JSON nested more than {} levels deep{}", source, max_depth, last_key.empty() ? "" : fmt::format(" (inside field \"{}\")", last_key));
  } catch (const nlohmann::json::out_of_range& error) {
    // Numbers such as 1e400 that no double holds.
    fail("{}: a number out of range{}: {}", source, last_key.empty() ? "" : fmt::format(" in field \"{}\"", last_key), error.what());
  } catch (const nlohmann::json::exception& error) {
    fail("{}: invalid JSON: {}", source, error.what());
  }
}

nlohmann::json parse_json_file(const std::filesystem::path& path, int max_depth) {
  std::ifstream input(path, std::ios::binary);
  if (!input) fail("{}: cannot be read", path.string());
  std::ostringstream contents;
  contents << input.rdbuf();
  return parse_json(contents.str(), path.string(), max_depth);
}

std::string json_excerpt(const nlohmann::json& value, size_t limit) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > limit) text = text.substr(0, limit) + "...";
  return text;
}

}  // namespace gemma4rt
