// UTF-8, one implementation for the tokenizer, the chat format and the output parser. "Well-formed"
// follows Unicode Table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gemma4rt {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence at text[pos], or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view text, size_t pos);
bool is_valid_utf8(std::string_view text);
// Code point of the well-formed sequence of `length` bytes at text[pos].
char32_t decode_code_point(std::string_view text, size_t pos, size_t length);
// `text` with every byte that is not part of a well-formed sequence replaced by U+FFFD.
std::string with_valid_utf8(std::string_view text);
// Bytes at the end of `text` that start a character still missing continuation bytes.
size_t incomplete_utf8_tail(std::string_view text);

}  // namespace gemma4rt
