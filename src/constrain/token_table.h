// The vocabulary as the automaton sees it: each token's bytes as the decoder emits them ("▁" is a
// space, <0xNN> is that byte; the special tokens <|"|>, <|tool_call>, <tool_call|> are the one-byte
// symbols of grammar.h; other special tokens have no bytes and are never allowed inside constrained
// text), and byte tries over them so a mask is one depth-first walk that drops whole subtrees at the
// first byte the automaton rejects.
//
// Most tokens are "plain": printable text without '"', '\', '<' or control characters, whole UTF-8
// characters. Inside a string every plain token of at most the remaining length is allowed and leaves
// the state as it was, so string states take them from precomputed bitsets (by length in code points)
// and walk only the trie of the other tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace gemma4rt::constrain {

// A bit per token id.
using TokenBits = std::vector<uint64_t>;

class ByteTrie {
 public:
  // Nodes in preorder: a node's children follow it, each child's subtree ends where its next sibling
  // starts, and the node's own subtree ends at `end`.
  struct Node {
    uint8_t byte = 0;
    uint32_t end = 0;
    uint32_t first_token = 0;  // tokens whose bytes end here: tokens()[first_token, first_token + token_count)
    uint32_t token_count = 0;
  };

  ByteTrie() = default;
  // `strings[i]` is token ids[i]'s bytes; empty strings are skipped.
  ByteTrie(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids);

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  size_t longest() const { return longest_; }

 private:
  std::vector<Node> nodes_;  // nodes_[0] is the root (the empty prefix)
  std::vector<int32_t> tokens_;
  size_t longest_ = 0;
};

class TokenTable {
 public:
  // `vocab_size` is the model's (the logits' length); ids the tokenizer lacks have no bytes.
  TokenTable(const Tokenizer& tokenizer, int32_t vocab_size);

  int32_t vocab_size() const { return vocab_size_; }
  size_t words() const { return (static_cast<size_t>(vocab_size_) + 63) / 64; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }

  const ByteTrie& all_tokens() const { return all_; }
  const ByteTrie& non_plain_tokens() const { return non_plain_; }
  // Plain tokens of at most `characters` code points.
  const TokenBits& plain_tokens_up_to(uint32_t characters) const;

 private:
  int32_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  ByteTrie all_;
  ByteTrie non_plain_;
  std::vector<TokenBits> plain_up_to_;  // [k]: plain tokens of at most k code points; the last has all
};

}  // namespace gemma4rt::constrain
