#include "core/utf8.h"

#include <algorithm>
#include <cstdint>

namespace gemma4rt {

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const size_t left = text.size() - pos;
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return 1;
  auto continuation = [&](size_t i, uint8_t low = 0x80, uint8_t high = 0xBF) {
    return byte(pos + i) >= low && byte(pos + i) <= high;
  };
  if (b0 >= 0xC2 && b0 <= 0xDF) return left >= 2 && continuation(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3) return 0;
    const uint8_t low = b0 == 0xE0 ? 0xA0 : 0x80;   // E0: no overlong forms
    const uint8_t high = b0 == 0xED ? 0x9F : 0xBF;  // ED: no surrogates
    return continuation(1, low, high) && continuation(2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4) return 0;
    const uint8_t low = b0 == 0xF0 ? 0x90 : 0x80;   // F0: no overlong forms
    const uint8_t high = b0 == 0xF4 ? 0x8F : 0xBF;  // F4: nothing above U+10FFFF
    return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_sequence_length(text, pos);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

char32_t decode_code_point(std::string_view text, size_t pos, size_t length) {
  const auto b = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(text[pos + i])); };
  switch (length) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

std::string with_valid_utf8(std::string_view text) {
  std::string valid;
  valid.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      valid.append(kReplacementCharacter);
      ++at;
    } else {
      valid.append(text.substr(at, length));
      at += length;
    }
  }
  return valid;
}

size_t incomplete_utf8_tail(std::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: look further back for the lead
    if (byte < 0xC0 || byte >= 0xF8) return 0;
    const size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : 2;
    return length > back ? back : 0;
  }
  return 0;
}

}  // namespace gemma4rt
