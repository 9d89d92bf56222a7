#include "constrain/token_table.h"

#include <algorithm>
#include <numeric>

#include "constrain/grammar.h"
#include "core/utf8.h"

namespace gemma4rt::constrain {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// What the decoder emits for a token (Replace "▁" -> " ", ByteFallback <0xNN>).
std::string token_bytes(const Tokenizer& tokenizer, int32_t id) {
  const std::string& text = tokenizer.token_text(id);
  if (tokenizer.is_special(id)) {
    if (text == "<|\"|>") return std::string(1, static_cast<char>(kStringDelimiterSymbol));
    if (text == "<|tool_call>") return std::string(1, static_cast<char>(kToolCallOpenSymbol));
    if (text == "<tool_call|>") return std::string(1, static_cast<char>(kToolCallCloseSymbol));
    return {};
  }
  if (text.size() == 6 && text.starts_with("<0x") && text.back() == '>' && hex_digit(text[3]) >= 0 && hex_digit(text[4]) >= 0) {
    const int byte = hex_digit(text[3]) * 16 + hex_digit(text[4]);
    // Bytes no UTF-8 text holds never help; 0xF8-0xFA would pose as the symbols above.
    if (byte == 0xC0 || byte == 0xC1 || byte >= 0xF5) return {};
    return std::string(1, static_cast<char>(byte));
  }
  std::string bytes;
  constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // ▁
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      bytes.push_back(' ');
      i += kSpaceMark.size();
    } else {
      bytes.push_back(text[i++]);
    }
  }
  return bytes;
}

// Code points of a plain token, or 0 when it is not plain.
uint32_t plain_characters(const std::string& bytes) {
  if (bytes.empty() || !is_valid_utf8(bytes)) return 0;
  uint32_t characters = 0;
  for (const char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte < 0x20 || c == '"' || c == '\\' || c == '<') return 0;
    if ((byte & 0xC0) != 0x80) ++characters;
  }
  return characters;
}

}  // namespace

ByteTrie::ByteTrie(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids) {
  std::vector<size_t> order;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!bytes[i].empty()) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] != bytes[b] ? bytes[a] < bytes[b] : ids[a] < ids[b]; });
  nodes_.push_back(Node{});
  std::vector<uint32_t> path = {0};  // path[d]: the node of the current string's first d bytes
  const std::string* previous = nullptr;
  for (const size_t i : order) {
    const std::string& text = bytes[i];
    size_t common = 0;
    if (previous) {
      while (common < text.size() && common < previous->size() && text[common] == (*previous)[common]) ++common;
    }
    // Close the nodes of the previous string below the shared prefix.
    while (path.size() > common + 1) {
      nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < text.size(); ++d) {
      Node node;
      node.byte = static_cast<uint8_t>(text[d]);
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(node);
    }
    Node& last = nodes_[path.back()];
    if (last.token_count == 0) last.first_token = static_cast<uint32_t>(tokens_.size());
    tokens_.push_back(ids[i]);
    ++last.token_count;
    longest_ = std::max(longest_, text.size());
    previous = &text;
  }
  while (!path.empty()) {
    nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
    path.pop_back();
  }
}

TokenTable::TokenTable(const Tokenizer& tokenizer, int32_t vocab_size) : vocab_size_(vocab_size) {
  bytes_.resize(static_cast<size_t>(vocab_size));
  const int32_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < known; ++id) bytes_[static_cast<size_t>(id)] = token_bytes(tokenizer, id);

  std::vector<int32_t> ids(static_cast<size_t>(vocab_size));
  std::iota(ids.begin(), ids.end(), 0);
  all_ = ByteTrie(bytes_, ids);

  std::vector<std::string> non_plain_bytes;
  std::vector<int32_t> non_plain_ids;
  std::vector<uint32_t> characters(static_cast<size_t>(vocab_size), 0);
  uint32_t longest = 1;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string& text = bytes_[static_cast<size_t>(id)];
    if (text.empty()) continue;
    characters[static_cast<size_t>(id)] = plain_characters(text);
    if (characters[static_cast<size_t>(id)] == 0) {
      non_plain_bytes.push_back(text);
      non_plain_ids.push_back(id);
    }
    longest = std::max(longest, characters[static_cast<size_t>(id)]);
  }
  non_plain_ = ByteTrie(non_plain_bytes, non_plain_ids);

  plain_up_to_.assign(longest + 1, TokenBits(words(), 0));
  for (int32_t id = 0; id < vocab_size; ++id) {
    const uint32_t count = characters[static_cast<size_t>(id)];
    if (count > 0) plain_up_to_[count][static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  }
  for (size_t k = 1; k < plain_up_to_.size(); ++k) {
    for (size_t w = 0; w < words(); ++w) plain_up_to_[k][w] |= plain_up_to_[k - 1][w];
  }
}

const TokenBits& TokenTable::plain_tokens_up_to(uint32_t characters) const {
  return plain_up_to_[std::min<size_t>(characters, plain_up_to_.size() - 1)];
}

}  // namespace gemma4rt::constrain
