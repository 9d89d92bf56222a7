// One sequence's constraint: the automaton state after the tokens generated so far, and the mask of
// the tokens that may come next. Masks are cached by state (the whole state, so a hit is always
// right): inside a long string or between the items of an array the same state comes back, and its
// mask is a copy away. Not thread-safe; each sequence owns its matcher.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "constrain/automaton.h"
#include "constrain/grammar.h"
#include "constrain/token_table.h"

namespace gemma4rt::constrain {

class Matcher {
 public:
  // `end_tokens`: ids that end the output (the checkpoint's stop tokens); allowed only where the
  // output is complete. Throws Error when no token of the vocabulary can start the output (a
  // vocabulary without the tool-call tokens, say), so a request fails before it runs.
  Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTable> table, std::vector<int32_t> end_tokens);

  // The tokens that may come next; empty when an end token was accepted.
  const TokenBits& allowed();
  // Sets the logits of every token not allowed to -infinity (logits.size() == the table's vocabulary).
  void mask_logits(std::span<float> logits);
  // Advances by one generated token. False, with the state unchanged, when it is not allowed.
  bool accept(int32_t token);
  // The text so far is a whole value (or tool call): an end token may follow.
  bool complete() const { return automaton_.complete(state_); }
  bool ended() const { return ended_; }

 private:
  void compute(TokenBits& mask);
  void walk(const ByteTrie& trie, TokenBits& mask);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTable> table_;
  Automaton automaton_;
  std::vector<int32_t> end_tokens_;
  State state_;
  bool ended_ = false;
  bool mask_ready_ = false;
  TokenBits mask_;
  std::vector<State> walk_states_;  // one per trie depth, reused
  struct CacheEntry {
    State state;
    TokenBits mask;
  };
  std::unordered_multimap<uint64_t, CacheEntry> cache_;
};

}  // namespace gemma4rt::constrain
