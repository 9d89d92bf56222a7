// JSON from outside the process (checkpoint files, HTTP bodies, strings inside requests) is parsed
// here: nesting is bounded while parsing, so no later walk over the value (rendering, dump, the
// destructor) recurses without bound, and every failure is one Error naming the source and the field.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gemma4rt {

// Deep enough for any real config, tokenizer, tool schema or tool-call argument; far below what
// would exhaust a thread's stack in a recursive walk.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text` or throws Error "<source>: ..." for invalid JSON (with the byte offset), nesting
// deeper than max_depth, or a number out of range (naming the field it belongs to).
nlohmann::json parse_json(std::string_view text, std::string_view source, int max_depth = kMaxJsonDepth);
// The same for a file; the source named is its path. Throws Error when it cannot be read.
nlohmann::json parse_json_file(const std::filesystem::path& path, int max_depth = kMaxJsonDepth);

// A value for an error message: its JSON, cut to `limit` characters.
std::string json_excerpt(const nlohmann::json& value, size_t limit = 80);

}  // namespace gemma4rt
