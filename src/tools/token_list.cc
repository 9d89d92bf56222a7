#include "tools/token_list.h"

#include <charconv>

#include "core/error.h"

namespace gemma4rt::tools {

std::vector<int32_t> parse_token_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    size_t first = start, last = end;
    while (first < last && text[first] == ' ') ++first;
    while (last > first && text[last - 1] == ' ') --last;
    int32_t id = 0;
    const auto [pointer, error] = std::from_chars(text.data() + first, text.data() + last, id);
    if (first == last || error != std::errc() || pointer != text.data() + last || id < 0) {
      fail("{}: \"{}\" is not a token id (expected a comma-separated list such as 2,17,300)", flag,
           text.substr(start, end - start));
    }
    ids.push_back(id);
    start = end + 1;
  }
  return ids;
}

}  // namespace gemma4rt::tools
