// The pushdown automaton over bytes that a Grammar defines. A state is a small set of threads (one per
// way the bytes so far can still be read: anyOf branches that both fit, a key that may be a declared
// property or another one), each a stack of frames. Feeding a byte advances every thread, drops those
// that reject it and merges duplicates; the state is dead when none is left.
//
// Bounds that keep every state small and every output finishable: at most kMaxFrames frames per
// thread (nesting), kMaxThreads threads, kMaxWhitespace bytes of whitespace in a row (one line break at
// most), 15 digits in the
// integer and fraction parts of a number and 2 in its exponent (so every number is a finite double).
// Strings never hold '<' (JSON can write it \u003c), so no text can spell a Gemma control token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "constrain/grammar.h"

namespace gemma4rt::constrain {

inline constexpr size_t kMaxFrames = 160;
inline constexpr size_t kMaxThreads = 64;
inline constexpr uint8_t kMaxWhitespace = 24;

enum class FrameKind : uint8_t { kRoot, kToolCalls, kValue, kObject, kKey, kArray, kString, kNumber, kLiteral };

// Plain data, compared and hashed as bytes (every field is always initialised).
struct Frame {
  FrameKind kind = FrameKind::kValue;
  uint8_t phase = 0;
  uint8_t whitespace = 0;  // whitespace bytes in a row in this frame
  uint8_t flags = 0;
  int32_t node = -1;
  uint32_t a = 0;  // object: current property; array: items so far; string: code points; literal/key: range start
  uint32_t b = 0;  // string: UTF-8 state; literal/key: range end; number: digits in the current part
  uint64_t c = 0;  // object: properties seen (bit per property); literal/key: bytes matched
};
static_assert(sizeof(Frame) == 24);

class State {
 public:
  bool dead() const { return ends_.empty(); }
  size_t threads() const { return ends_.size(); }
  // The frames of every thread, one after another, and where each thread ends: the state's identity.
  const std::vector<Frame>& frames() const { return frames_; }
  const std::vector<uint32_t>& ends() const { return ends_; }
  bool operator==(const State& other) const;
  uint64_t hash() const;

 private:
  friend class Automaton;
  std::vector<Frame> frames_;
  std::vector<uint32_t> ends_;
};

class Automaton {
 public:
  explicit Automaton(const Grammar& grammar) : grammar_(grammar) {}

  State start() const;
  // out = the state after `byte`; false (and out dead) when no thread accepts it. `out` may not be `in`.
  bool step(const State& in, uint8_t byte, State& out) const;
  // A whole output may end here (some thread has produced a complete value or tool call).
  bool complete(const State& state) const;
  // Every thread's top frame is inside a string (or a key that may be any string) that accepts any
  // run of plain characters (see TokenTable) without leaving it. Sets `room` to the most code points
  // one of them may still take (UINT32_MAX: unbounded).
  bool in_plain_string(const State& state, uint32_t& room) const;

  // Convenience for tests: feeds all bytes from the start state; false if any is rejected.
  bool accepts_prefix(std::string_view text, State* end = nullptr) const;
  bool accepts(std::string_view text) const;

 private:
  struct Feeder;
  const Grammar& grammar_;
};

}  // namespace gemma4rt::constrain
