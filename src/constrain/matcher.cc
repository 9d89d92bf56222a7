#include "constrain/matcher.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace gemma4rt::constrain {
namespace {

constexpr size_t kCachedMasks = 256;  // 32 KiB each on the 262,144-token vocabulary

void set_bit(TokenBits& bits, int32_t id) { bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64); }
bool has_bit(const TokenBits& bits, int32_t id) { return bits[static_cast<size_t>(id) / 64] >> (id % 64) & 1; }

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTable> table, std::vector<int32_t> end_tokens)
    : grammar_(std::move(grammar)), table_(std::move(table)), automaton_(*grammar_), end_tokens_(std::move(end_tokens)) {
  state_ = automaton_.start();
  walk_states_.resize(table_->all_tokens().longest() + 1);
  const TokenBits& first = allowed();
  if (std::all_of(first.begin(), first.end(), [](uint64_t word) { return word == 0; })) {
    fail("no token of this vocabulary can start the constrained output");
  }
}

void Matcher::walk(const ByteTrie& trie, TokenBits& mask) {
  const auto& nodes = trie.nodes();
  const auto& tokens = trie.tokens();
  struct Level {
    uint32_t next;
    uint32_t end;
  };
  std::vector<Level> levels(trie.longest() + 1);
  walk_states_[0] = state_;
  levels[0] = {1, nodes[0].end};
  size_t depth = 0;
  while (true) {
    Level& level = levels[depth];
    if (level.next >= level.end) {
      if (depth == 0) break;
      --depth;
      continue;
    }
    const uint32_t child = level.next;
    const ByteTrie::Node& node = nodes[child];
    level.next = node.end;  // its next sibling
    if (!automaton_.step(walk_states_[depth], node.byte, walk_states_[depth + 1])) continue;  // the whole subtree
    for (uint32_t t = 0; t < node.token_count; ++t) set_bit(mask, tokens[node.first_token + t]);
    if (node.end > child + 1) {
      ++depth;
      levels[depth] = {child + 1, node.end};
    }
  }
}

void Matcher::compute(TokenBits& mask) {
  mask.assign(table_->words(), 0);
  uint32_t room = 0;
  if (automaton_.in_plain_string(state_, room)) {
    // Inside a string: plain tokens that fit, by table; the others by walking their own trie.
    if (room > 0) mask = table_->plain_tokens_up_to(room);
    walk(table_->non_plain_tokens(), mask);
  } else {
    walk(table_->all_tokens(), mask);
  }
  if (automaton_.complete(state_)) {
    for (const int32_t id : end_tokens_) {
      if (id >= 0 && id < table_->vocab_size()) set_bit(mask, id);
    }
  }
}

const TokenBits& Matcher::allowed() {
  if (mask_ready_) return mask_;
  if (ended_) {
    mask_.assign(table_->words(), 0);
  } else {
    const uint64_t hash = state_.hash();
    const auto [first, last] = cache_.equal_range(hash);
    auto found = first;
    while (found != last && !(found->second.state == state_)) ++found;
    if (found != last) {
      mask_ = found->second.mask;
    } else {
      compute(mask_);
      if (cache_.size() >= kCachedMasks) cache_.clear();
      cache_.emplace(hash, CacheEntry{state_, mask_});
    }
  }
  mask_ready_ = true;
  return mask_;
}

void Matcher::mask_logits(std::span<float> logits) {
  const TokenBits& mask = allowed();
  constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
  for (size_t word = 0; word < mask.size(); ++word) {
    const uint64_t bits = mask[word];
    if (bits == ~uint64_t{0}) continue;
    const size_t first = word * 64;
    const size_t last = std::min(first + 64, logits.size());
    for (size_t id = first; id < last; ++id) {
      if (!(bits >> (id - first) & 1)) logits[id] = kNegativeInfinity;
    }
  }
}

bool Matcher::accept(int32_t token) {
  if (ended_ || token < 0 || token >= table_->vocab_size()) return false;
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) {
    if (!complete()) return false;
    ended_ = true;
    mask_ready_ = false;
    return true;
  }
  const std::string& bytes = table_->bytes(token);
  if (bytes.empty()) return false;
  if (mask_ready_ && !has_bit(mask_, token)) return false;
  State state = state_, next;
  for (const char c : bytes) {
    if (!automaton_.step(state, static_cast<uint8_t>(c), next)) return false;
    std::swap(state, next);
  }
  state_ = std::move(state);
  mask_ready_ = false;
  return true;
}

}  // namespace gemma4rt::constrain
