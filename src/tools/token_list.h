// Parsing "2,17,300" token id lists given on the command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gemma4rt::tools {

// Throws Error naming `flag` when the list is empty or holds something that is not a non-negative integer.
std::vector<int32_t> parse_token_list(const std::string& text, const std::string& flag);

}  // namespace gemma4rt::tools
