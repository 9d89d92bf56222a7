#include "constrain/automaton.h"

#include <algorithm>
#include <cstring>

namespace gemma4rt::constrain {
namespace {

// Object phases.
constexpr uint8_t kObjectOpen = 0;        // after '{': a key or '}'
constexpr uint8_t kObjectColon = 1;       // after a JSON key: ':'
constexpr uint8_t kObjectAfterValue = 2;  // ',' or '}'
constexpr uint8_t kObjectAfterComma = 3;  // a key
// Array phases.
constexpr uint8_t kArrayOpen = 0;
constexpr uint8_t kArrayAfterValue = 1;
constexpr uint8_t kArrayAfterComma = 2;
// Key flags.
constexpr uint8_t kKeyFree = 1;      // a key other than the declared ones is allowed
constexpr uint8_t kKeyDeviated = 2;  // the key so far matches no declared one
constexpr uint32_t kFreeProperty = UINT32_MAX;
// Tool-call phases.
constexpr uint8_t kCallsStart = 0, kCallsPrefix = 1, kCallsArguments = 2, kCallsDone = 3;

bool is_whitespace(uint8_t byte) { return byte == ' ' || byte == '\n' || byte == '\t' || byte == '\r'; }
bool is_digit(uint8_t byte) { return byte >= '0' && byte <= '9'; }
bool is_hex(uint8_t byte) { return is_digit(byte) || (byte >= 'a' && byte <= 'f') || (byte >= 'A' && byte <= 'F'); }

// UTF-8 well-formedness, one byte at a time. state: 0 between characters, else bytes still expected
// (bits 0-7) and the range of the next one (bits 8-15, 16-23). Sets starts_character for a byte that
// begins a character.
bool utf8_next(uint32_t& state, uint8_t byte, bool& starts_character) {
  starts_character = false;
  if (state != 0) {
    const uint8_t low = (state >> 8) & 0xFF, high = (state >> 16) & 0xFF;
    if (byte < low || byte > high) return false;
    const uint32_t left = (state & 0xFF) - 1;
    state = left == 0 ? 0 : (left | (0x80u << 8) | (0xBFu << 16));
    return true;
  }
  starts_character = true;
  if (byte < 0x80) return true;
  auto expect = [&](uint32_t count, uint32_t low, uint32_t high) {
    state = count | (low << 8) | (high << 16);
    return true;
  };
  if (byte >= 0xC2 && byte <= 0xDF) return expect(1, 0x80, 0xBF);
  if (byte == 0xE0) return expect(2, 0xA0, 0xBF);
  if (byte == 0xED) return expect(2, 0x80, 0x9F);
  if (byte >= 0xE1 && byte <= 0xEF) return expect(2, 0x80, 0xBF);
  if (byte == 0xF0) return expect(3, 0x90, 0xBF);
  if (byte >= 0xF1 && byte <= 0xF3) return expect(3, 0x80, 0xBF);
  if (byte == 0xF4) return expect(3, 0x80, 0x8F);
  return false;
}

// Counts saturate where more makes no difference to what may follow, so equal futures share a state.
uint32_t count_cap(const Node& node) { return node.max_count == UINT32_MAX ? node.min_count : node.max_count; }
uint32_t bump(uint32_t count, const Node& node) { return std::min(count + 1, count_cap(node)); }

// The sub-range of sorted texts [lo, hi), all sharing their first `pos` bytes, whose byte at `pos` is
// `byte` (shorter texts sort first, then by that byte). `text(i)` is the i-th text.
template <typename TextOf>
std::pair<uint32_t, uint32_t> narrow(TextOf text, uint32_t lo, uint32_t hi, size_t pos, uint8_t byte) {
  auto key = [&](uint32_t index) -> int {
    const std::string& candidate = text(index);
    return candidate.size() > pos ? static_cast<uint8_t>(candidate[pos]) : -1;
  };
  // The first index whose key is at least `bound`, by bisection.
  auto first_at_least = [&](int bound) {
    uint32_t first = lo;
    for (uint32_t count = hi - lo; count > 0;) {
      const uint32_t half = count / 2;
      if (key(first + half) < bound) {
        first += half + 1;
        count -= half + 1;
      } else {
        count = half;
      }
    }
    return first;
  };
  return {first_at_least(byte), first_at_least(byte + 1)};
}

uint64_t required_mask(const Node& node) {
  uint64_t mask = 0;
  for (size_t i = 0; i < node.properties.size(); ++i) {
    if (node.properties[i].required) mask |= uint64_t{1} << i;
  }
  return mask;
}

bool may_close_object(const Node& node, uint64_t seen) {
  const uint64_t required = required_mask(node);
  return (seen & required) == required;
}

bool may_add_key(const Grammar& grammar, const Node& node, uint64_t seen) {
  if (node.additional >= 0 && grammar.syntax == Syntax::kJson) return true;
  const uint64_t all = node.properties.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << node.properties.size()) - 1;
  return (seen & all) != all;
}

bool literal_complete(const Grammar& grammar, const Frame& frame) {
  const auto& texts = grammar.nodes[frame.node].literals;
  return frame.a < frame.b && texts[frame.a].size() == frame.c;
}

bool number_complete(const Frame& frame) { return frame.phase == 2 || frame.phase == 3 || frame.phase == 5 || frame.phase == 8; }

}  // namespace

bool State::operator==(const State& other) const {
  return ends_ == other.ends_ && frames_.size() == other.frames_.size() &&
         std::memcmp(frames_.data(), other.frames_.data(), frames_.size() * sizeof(Frame)) == 0;
}

uint64_t State::hash() const {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  };
  mix(frames_.data(), frames_.size() * sizeof(Frame));
  mix(ends_.data(), ends_.size() * sizeof(uint32_t));
  return hash;
}

// Feeds one byte to the thread at the end of out.frames_ (from `base`), which it edits in place.
struct Automaton::Feeder {
  const Grammar& grammar;
  State& out;
  size_t base;

  std::vector<Frame>& frames() { return out.frames_; }
  Frame& top() { return out.frames_.back(); }
  size_t depth() const { return out.frames_.size() - base; }

  bool push(const Frame& frame) {
    if (depth() >= kMaxFrames) return false;
    out.frames_.push_back(frame);
    return true;
  }
  void pop() { out.frames_.pop_back(); }

  // A run of whitespace holds at most kMaxWhitespace bytes and one line break (bit 7 of the count),
  // so a model that likes newlines still has to write the value.
  static bool whitespace(uint8_t byte, Frame& frame) {
    constexpr uint8_t kLineBreak = 0x80;
    const bool line_break = byte == '\n' || byte == '\r';
    if ((frame.whitespace & 0x7F) >= kMaxWhitespace || (line_break && (frame.whitespace & kLineBreak))) return false;
    frame.whitespace = static_cast<uint8_t>(frame.whitespace + 1) | (line_break ? kLineBreak : 0);
    return true;
  }

  static Frame value_frame(int node) {
    Frame frame;
    frame.kind = FrameKind::kValue;
    frame.node = node;
    return frame;
  }

  // Feeds `byte` to the thread; true when it survives. Forks finish their extra threads themselves.
  bool feed(uint8_t byte) {
    Frame& frame = top();
    switch (frame.kind) {
      case FrameKind::kRoot: return is_whitespace(byte) && whitespace(byte, frame);
      case FrameKind::kToolCalls: return feed_tool_calls(byte);
      case FrameKind::kValue: return feed_value(byte);
      case FrameKind::kObject: return feed_object(byte);
      case FrameKind::kKey: return feed_key(byte);
      case FrameKind::kArray: return feed_array(byte);
      case FrameKind::kString: return feed_string(byte);
      case FrameKind::kNumber: return feed_number(byte);
      case FrameKind::kLiteral: return feed_literal(byte);
    }
    return false;
  }

  bool feed_tool_calls(uint8_t byte) {
    Frame& frame = top();
    switch (frame.phase) {
      case kCallsStart:
      case kCallsDone:
        if (byte != kToolCallOpenSymbol) return false;
        frame.phase = kCallsPrefix;
        frame.a = 0;
        frame.b = static_cast<uint32_t>(grammar.tools.size());
        frame.c = 0;
        return true;
      case kCallsPrefix: {
        const auto [lo, hi] = narrow([&](uint32_t i) -> const std::string& { return grammar.tools[i].prefix; }, frame.a, frame.b, frame.c, byte);
        if (lo == hi) return false;
        const ToolEntry& first = grammar.tools[lo];
        if (first.prefix.size() == frame.c + 1) {  // "call:NAME{" is whole: the arguments follow
          frame.phase = kCallsArguments;
          frame.a = frame.b = 0;
          frame.c = 0;
          Frame object;
          object.kind = FrameKind::kObject;
          object.phase = kObjectOpen;
          object.node = first.arguments;
          return push(object);
        }
        frame.a = lo;
        frame.b = hi;
        ++frame.c;
        return true;
      }
      case kCallsArguments:
        if (byte != kToolCallCloseSymbol) return false;
        frame.phase = kCallsDone;
        return true;
    }
    return false;
  }

  bool feed_value(uint8_t byte) {
    Frame& frame = top();
    if (is_whitespace(byte)) return whitespace(byte, frame);
    const Node& node = grammar.nodes[frame.node];
    if (!node.first_bytes[byte]) return false;
    if (node.kind == NodeKind::kUnion) {
      // One thread per branch that can start with this byte; the last continues this one.
      int last = -1;
      for (int branch : node.branches) {
        if (grammar.nodes[branch].first_bytes[byte]) last = branch;
      }
      const std::vector<Frame> saved(frames().begin() + static_cast<std::ptrdiff_t>(base), frames().end());
      for (int branch : node.branches) {
        if (branch == last || !grammar.nodes[branch].first_bytes[byte]) continue;
        frames().back() = value_frame(branch);
        if (feed(byte)) {
          out.ends_.push_back(static_cast<uint32_t>(frames().size()));
          base = frames().size();
        } else {
          frames().resize(base);
        }
        frames().insert(frames().end(), saved.begin(), saved.end());
      }
      frames().back() = value_frame(last);
      return feed(byte);
    }
    Frame concrete;
    concrete.node = frame.node;
    switch (node.kind) {
      case NodeKind::kObject:
        concrete.kind = FrameKind::kObject;
        concrete.phase = kObjectOpen;
        frame = concrete;
        return true;  // the byte was '{'
      case NodeKind::kArray:
        concrete.kind = FrameKind::kArray;
        concrete.phase = kArrayOpen;
        frame = concrete;
        return true;
      case NodeKind::kString:
        concrete.kind = FrameKind::kString;
        frame = concrete;
        return true;  // the opening quote
      case NodeKind::kNumber:
      case NodeKind::kInteger:
        concrete.kind = FrameKind::kNumber;
        frame = concrete;
        return feed_number(byte);
      case NodeKind::kLiterals:
        concrete.kind = FrameKind::kLiteral;
        concrete.a = 0;
        concrete.b = static_cast<uint32_t>(node.literals.size());
        frame = concrete;
        return feed_literal(byte);
      case NodeKind::kUnion: break;
    }
    return false;
  }

  bool start_key(const Node& node, uint64_t seen) {
    Frame key;
    key.kind = FrameKind::kKey;
    key.node = top().node;
    key.a = 0;
    key.b = static_cast<uint32_t>(node.properties.size());
    key.c = 0;
    key.flags = node.additional >= 0 && grammar.syntax == Syntax::kJson ? kKeyFree : 0;
    return may_add_key(grammar, node, seen) && push(key);
  }

  bool feed_object(uint8_t byte) {
    Frame& frame = top();
    const Node& node = grammar.nodes[frame.node];
    const bool json = grammar.syntax == Syntax::kJson;
    if (is_whitespace(byte)) return whitespace(byte, frame);
    frame.whitespace = 0;
    switch (frame.phase) {
      case kObjectOpen:
      case kObjectAfterComma:
        if (frame.phase == kObjectOpen && byte == '}') {
          if (!may_close_object(node, frame.c)) return false;
          pop();
          return true;
        }
        if (json) {
          if (byte != '"') return false;
          frame.phase = kObjectColon;
          return start_key(node, frame.c);
        }
        frame.phase = kObjectAfterValue;  // a Gemma key ends with its ':' and becomes the value
        return start_key(node, frame.c) && feed_key(byte);
      case kObjectColon: {
        if (byte != ':') return false;
        const int value = frame.a == kFreeProperty ? node.additional : node.properties[frame.a].node;
        frame.phase = kObjectAfterValue;
        return push(value_frame(value));
      }
      case kObjectAfterValue:
        if (byte == ',') {
          if (!may_add_key(grammar, node, frame.c)) return false;
          frame.phase = kObjectAfterComma;
          return true;
        }
        if (byte == '}' && may_close_object(node, frame.c)) {
          pop();
          return true;
        }
        return false;
    }
    return false;
  }

  // The object frame under the key.
  Frame& parent() { return frames()[frames().size() - 2]; }

  bool feed_key(uint8_t byte) {
    Frame& key = top();
    const Node& node = grammar.nodes[key.node];
    const auto& properties = node.properties;
    const uint64_t seen = parent().c;
    if (!(key.flags & kKeyDeviated)) {
      const auto [lo, hi] = narrow([&](uint32_t i) -> const std::string& { return properties[i].key_text; }, key.a, key.b, key.c, byte);
      bool open = false;  // some unseen property still fits
      for (uint32_t i = lo; i < hi && !open; ++i) open = !(seen >> i & 1);
      if (open) {
        if (properties[lo].key_text.size() == key.c + 1) {  // the key is whole
          if (seen >> lo & 1) return false;
          Frame& object = parent();
          object.c |= uint64_t{1} << lo;
          if (grammar.syntax == Syntax::kJson) {
            object.a = lo;
            pop();
            return true;
          }
          key = value_frame(properties[lo].node);  // Gemma: the ':' was part of the key
          return true;
        }
        key.a = lo;
        key.b = hi;
        ++key.c;
        return true;
      }
      if (!(key.flags & kKeyFree)) return false;
      // Another key: it may not spell a declared one (whose schema would apply instead).
      if (byte == '"') {
        if (hi > lo && properties[lo].key_text.size() == key.c + 1) return false;  // a seen property again
        if (key.c > 0) {
          const std::string& prefix = properties[key.a].key_text;
          uint32_t state = 0;
          bool starts = false;
          for (size_t i = 0; i < key.c; ++i) utf8_next(state, static_cast<uint8_t>(prefix[i]), starts);
          if (state != 0 || prefix.find('\\') < key.c) return false;  // free keys never escape
        }
        parent().a = kFreeProperty;
        pop();
        return true;
      }
      uint32_t state = 0;
      bool starts = false;
      if (key.c > 0) {
        const std::string& prefix = properties[key.a].key_text;
        if (prefix.find('\\') < key.c) return false;
        for (size_t i = 0; i < key.c; ++i) utf8_next(state, static_cast<uint8_t>(prefix[i]), starts);
      }
      if (byte < 0x20 || byte == '\\' || byte == '<' || !utf8_next(state, byte, starts)) return false;
      key.flags |= kKeyDeviated;
      key.a = state;
      key.b = 0;
      key.c = 0;
      return true;
    }
    if (byte == '"') {
      if (key.a != 0) return false;
      parent().a = kFreeProperty;
      pop();
      return true;
    }
    bool starts = false;
    return byte >= 0x20 && byte != '\\' && byte != '<' && utf8_next(key.a, byte, starts);
  }

  bool feed_array(uint8_t byte) {
    Frame& frame = top();
    const Node& node = grammar.nodes[frame.node];
    if (is_whitespace(byte)) return whitespace(byte, frame);
    frame.whitespace = 0;
    switch (frame.phase) {
      case kArrayOpen:
        if (byte == ']') {
          if (node.min_count > 0) return false;
          pop();
          return true;
        }
        [[fallthrough]];
      case kArrayAfterComma:
        if (node.items < 0 || node.max_count == 0) return false;
        frame.a = bump(frame.a, node);
        frame.phase = kArrayAfterValue;
        return push(value_frame(node.items)) && feed_value(byte);
      case kArrayAfterValue:
        if (byte == ',' && frame.a < node.max_count) {
          frame.phase = kArrayAfterComma;
          return true;
        }
        if (byte == ']' && frame.a >= node.min_count) {
          pop();
          return true;
        }
        return false;
    }
    return false;
  }

  bool feed_string(uint8_t byte) {
    Frame& frame = top();
    const Node& node = grammar.nodes[frame.node];
    const bool counted = node.min_count > 0 || node.max_count != UINT32_MAX;
    auto count_character = [&] {
      if (frame.a >= node.max_count) return false;
      if (counted) frame.a = bump(frame.a, node);
      return true;
    };
    if (grammar.syntax == Syntax::kGemma) {
      if (frame.b == 0) {
        if (byte == kStringDelimiterSymbol) {
          if (frame.a < node.min_count) return false;
          pop();
          return true;
        }
        if (byte == '<' || (byte < 0x20 && byte != '\n' && byte != '\t' && byte != '\r')) return false;
      }
      bool starts = false;
      if (!utf8_next(frame.b, byte, starts)) return false;
      return !starts || count_character();
    }
    switch (frame.phase) {
      case 0: {
        if (frame.b == 0) {
          if (byte == '"') {
            if (frame.a < node.min_count) return false;
            pop();
            return true;
          }
          if (byte == '\\') {
            if (!count_character()) return false;
            frame.phase = 1;
            return true;
          }
          if (byte < 0x20 || byte == '<') return false;
        }
        bool starts = false;
        if (!utf8_next(frame.b, byte, starts)) return false;
        return !starts || count_character();
      }
      case 1:
        if (byte == 'u') {
          frame.phase = 2;
          return true;
        }
        if (std::strchr("\"\\/bfnrt", byte) == nullptr || byte == 0) return false;
        frame.phase = 0;
        return true;
      default:  // \uXXXX: phases 2..5 are its hex digits; no surrogates (D800-DFFF)
        if (!is_hex(byte)) return false;
        if (frame.phase == 2 && (byte == 'd' || byte == 'D')) frame.flags = 1;
        if (frame.phase == 3 && frame.flags == 1 && !(byte >= '0' && byte <= '7')) return false;
        if (frame.phase == 5) {
          frame.phase = 0;
          frame.flags = 0;
        } else {
          ++frame.phase;
        }
        return true;
    }
  }

  bool feed_number(uint8_t byte) {
    Frame& frame = top();
    const bool integer = grammar.nodes[frame.node].kind == NodeKind::kInteger;
    auto go = [&](uint8_t phase, uint32_t digits) {
      frame.phase = phase;
      frame.b = digits;
      return true;
    };
    switch (frame.phase) {
      case 0:
        if (byte == '-') return go(1, 0);
        [[fallthrough]];
      case 1:
        if (byte == '0') return go(2, 0);
        if (is_digit(byte)) return go(3, 1);
        return false;
      case 2:
      case 3:
        if (frame.phase == 3 && is_digit(byte) && frame.b < 15) return go(3, frame.b + 1);
        if (!integer && byte == '.') return go(4, 0);
        if (!integer && (byte == 'e' || byte == 'E')) return go(6, 0);
        break;
      case 4:
        if (is_digit(byte)) return go(5, 1);
        return false;
      case 5:
        if (is_digit(byte) && frame.b < 15) return go(5, frame.b + 1);
        if (byte == 'e' || byte == 'E') return go(6, 0);
        break;
      case 6:
        if (byte == '+' || byte == '-') return go(7, 0);
        [[fallthrough]];
      case 7:
        if (is_digit(byte)) return go(8, 1);
        return false;
      case 8:
        if (is_digit(byte) && frame.b < 2) return go(8, frame.b + 1);
        break;
    }
    if (!number_complete(frame)) return false;
    pop();  // the number ended before this byte, which belongs to the enclosing value
    return feed(byte);
  }

  bool feed_literal(uint8_t byte) {
    Frame& frame = top();
    const auto& texts = grammar.nodes[frame.node].literals;
    const auto [lo, hi] = narrow([&](uint32_t i) -> const std::string& { return texts[i]; }, frame.a, frame.b, frame.c, byte);
    if (lo < hi) {
      if (hi - lo == 1 && texts[lo].size() == frame.c + 1) {
        pop();  // the only candidate is whole
        return true;
      }
      frame.a = lo;
      frame.b = hi;
      ++frame.c;
      return true;
    }
    if (!literal_complete(grammar, frame)) return false;
    pop();  // a whole literal (a number) that a longer one extends: this byte is not part of it
    return feed(byte);
  }
};

State Automaton::start() const {
  State state;
  Frame root;
  if (!grammar_.tools.empty()) {
    root.kind = FrameKind::kToolCalls;
    root.phase = kCallsStart;
    state.frames_.push_back(root);
  } else {
    root.kind = FrameKind::kRoot;
    state.frames_.push_back(root);
    state.frames_.push_back(Feeder::value_frame(grammar_.root));
  }
  state.ends_.push_back(static_cast<uint32_t>(state.frames_.size()));
  return state;
}

bool Automaton::step(const State& in, uint8_t byte, State& out) const {
  out.frames_.clear();
  out.ends_.clear();
  uint32_t begin = 0;
  for (const uint32_t end : in.ends_) {
    Feeder feeder{grammar_, out, out.frames_.size()};
    out.frames_.insert(out.frames_.end(), in.frames_.begin() + begin, in.frames_.begin() + end);
    if (feeder.feed(byte)) {
      out.ends_.push_back(static_cast<uint32_t>(out.frames_.size()));
    } else {
      out.frames_.resize(feeder.base);
    }
    begin = end;
  }
  if (out.ends_.size() > 1) {
    // Merge equal threads (keeping the first of each) and keep at most kMaxThreads: every thread left
    // can still finish, so dropping some only narrows what may follow.
    std::vector<Frame> frames;
    std::vector<uint32_t> ends;
    uint32_t start = 0;
    for (const uint32_t end : out.ends_) {
      bool duplicate = false;
      uint32_t other = 0;
      for (const uint32_t other_end : ends) {
        if (other_end - other == end - start &&
            std::memcmp(frames.data() + other, out.frames_.data() + start, (end - start) * sizeof(Frame)) == 0) {
          duplicate = true;
          break;
        }
        other = other_end;
      }
      if (!duplicate && ends.size() < kMaxThreads) {
        frames.insert(frames.end(), out.frames_.begin() + start, out.frames_.begin() + end);
        ends.push_back(static_cast<uint32_t>(frames.size()));
      }
      start = end;
    }
    out.frames_ = std::move(frames);
    out.ends_ = std::move(ends);
  }
  return !out.ends_.empty();
}

bool Automaton::complete(const State& state) const {
  uint32_t begin = 0;
  for (const uint32_t end : state.ends_) {
    uint32_t top = end;
    // A number or a literal on top ends where the output ends.
    while (top > begin + 1) {
      const Frame& frame = state.frames_[top - 1];
      const bool ends_here = (frame.kind == FrameKind::kNumber && number_complete(frame)) ||
                             (frame.kind == FrameKind::kLiteral && literal_complete(grammar_, frame));
      if (!ends_here) break;
      --top;
    }
    if (top == begin + 1) {
      const Frame& bottom = state.frames_[begin];
      if (bottom.kind == FrameKind::kRoot || (bottom.kind == FrameKind::kToolCalls && bottom.phase == kCallsDone)) return true;
    }
    begin = end;
  }
  return false;
}

bool Automaton::in_plain_string(const State& state, uint32_t& room) const {
  // A plain token leaves every such thread in its string (only counters move), so it is allowed when
  // it fits the thread with the most room.
  room = 0;
  for (const uint32_t end : state.ends_) {
    const Frame& top = state.frames_[end - 1];
    uint32_t thread_room = 0;
    if (top.kind == FrameKind::kKey) {
      // Another key is allowed and the key so far can turn into one at any plain byte: it has no
      // escape and ends on a character boundary.
      if (!(top.flags & kKeyFree)) return false;
      if (top.flags & kKeyDeviated) {
        if (top.a != 0) return false;
      } else if (top.c > 0) {
        const std::string& prefix = grammar_.nodes[top.node].properties[top.a].key_text;
        uint32_t utf8 = 0;
        bool starts = false;
        for (size_t i = 0; i < top.c; ++i) utf8_next(utf8, static_cast<uint8_t>(prefix[i]), starts);
        if (utf8 != 0 || prefix.find('\\') < top.c) return false;
      }
      thread_room = UINT32_MAX;
    } else if (top.kind == FrameKind::kString && top.phase == 0 && top.b == 0) {
      const Node& node = grammar_.nodes[top.node];
      thread_room = node.max_count == UINT32_MAX ? UINT32_MAX : node.max_count - top.a;
    } else {
      return false;
    }
    room = std::max(room, thread_room);
  }
  return !state.ends_.empty();
}

bool Automaton::accepts_prefix(std::string_view text, State* end) const {
  State state = start(), next;
  for (const char c : text) {
    if (!step(state, static_cast<uint8_t>(c), next)) return false;
    std::swap(state, next);
  }
  if (end) *end = std::move(state);
  return true;
}

bool Automaton::accepts(std::string_view text) const {
  State end;
  return accepts_prefix(text, &end) && complete(end);
}

}  // namespace gemma4rt::constrain
