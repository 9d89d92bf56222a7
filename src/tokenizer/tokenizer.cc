#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/json_input.h"
#include "core/utf8.h"

namespace gemma4rt {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------
// UTF-8

// Unicode White_Space, which is what the Rust library's lstrip/rstrip of added tokens consume.
bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// "<0x41>" -> 0x41; anything else -> nullopt. This is how ByteFallback recognises byte tokens: by their
// text, not by their id.
std::optional<uint8_t> parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int high = hex(piece[3]);
  const int low = hex(piece[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<uint8_t>(high * 16 + low);
}

void replace_all(std::string& text, std::string_view pattern, std::string_view replacement) {
  if (pattern.empty() || text.find(pattern) == std::string::npos) return;
  std::string result;
  result.reserve(text.size());
  size_t pos = 0;
  for (size_t found; (found = text.find(pattern, pos)) != std::string::npos; pos = found + pattern.size()) {
    result.append(text, pos, found - pos);
    result.append(replacement);
  }
  result.append(text, pos);
  text = std::move(result);
}

// The Strip decoder: removes up to `start` leading and `stop` trailing copies of `content`.
void strip_repeated(std::string& text, std::string_view content, size_t start, size_t stop) {
  size_t begin = 0;
  for (size_t i = 0; i < start && text.compare(begin, content.size(), content) == 0; ++i) {
    begin += content.size();
  }
  size_t end = text.size();
  for (size_t i = 0;
       i < stop && end >= begin + content.size() && text.compare(end - content.size(), content.size(), content) == 0;
       ++i) {
    end -= content.size();
  }
  text = text.substr(begin, end - begin);
}

// ---------------------------------------------------------------------------------------------------
// Reading tokenizer.json

// nlohmann's SAX interface lets model.vocab and model.merges (262k and 515k entries for Gemma) go
// straight into flat vectors: building them as a JSON DOM first takes several times longer than
// parsing. Everything else in the file is small and is kept as a DOM.
class TokenizerJsonReader final : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;
  bool has_vocab = false;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_merges = false;
  std::string error;  // set when parsing stops

  bool null() override { return capture_mode_ == Capture::kNone ? add(json(nullptr)) : bad_entry(); }
  bool boolean(bool value) override { return capture_mode_ == Capture::kNone ? add(json(value)) : bad_entry(); }
  bool number_integer(number_integer_t value) override {
    if (capture_mode_ == Capture::kVocab) return add_vocab_entry(value);
    return capture_mode_ == Capture::kNone ? add(json(value)) : bad_entry();
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (capture_mode_ == Capture::kVocab) {
      return add_vocab_entry(value > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(value));
    }
    return capture_mode_ == Capture::kNone ? add(json(value)) : bad_entry();
  }
  bool number_float(number_float_t value, const string_t&) override {
    return capture_mode_ == Capture::kNone ? add(json(value)) : bad_entry();
  }
  bool string(string_t& value) override {
    if (capture_mode_ == Capture::kNone) return add(json(std::move(value)));
    if (capture_mode_ == Capture::kVocab) return bad_entry();
    if (merge_depth_ == 1) {
      if (merge_parts_.size() == 2) return bad_entry();
      merge_parts_.push_back(std::move(value));
      return true;
    }
    // Older files store a merge as one "left right" string.
    const size_t space = value.find(' ');
    if (space == std::string::npos || value.find(' ', space + 1) != std::string::npos) return bad_entry();
    merges.emplace_back(value.substr(0, space), value.substr(space + 1));
    return true;
  }
  bool binary(binary_t&) override { return bad_entry(); }

  bool start_object(std::size_t) override {
    if (capture_mode_ != Capture::kNone) return bad_entry();
    if (at_model_field("vocab")) {
      capture_mode_ = Capture::kVocab;
      has_vocab = true;
      return true;
    }
    json* object = add_container(json::object());
    if (object == nullptr) return false;
    if (stack_.size() == 2 && key_ == "model") model_ = object;
    return true;
  }
  bool end_object() override {
    if (capture_mode_ == Capture::kVocab) {
      capture_mode_ = Capture::kNone;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (capture_mode_ == Capture::kMerges) {
      if (merge_depth_ != 0) return bad_entry();
      merge_depth_ = 1;
      merge_parts_.clear();
      return true;
    }
    if (capture_mode_ != Capture::kNone) return bad_entry();
    if (at_model_field("merges")) {
      capture_mode_ = Capture::kMerges;
      has_merges = true;
      merge_depth_ = 0;
      return true;
    }
    return add_container(json::array()) != nullptr;
  }
  bool end_array() override {
    if (capture_mode_ == Capture::kMerges) {
      if (merge_depth_ == 0) {
        capture_mode_ = Capture::kNone;
        return true;
      }
      if (merge_parts_.size() != 2) return bad_entry();
      merges.emplace_back(std::move(merge_parts_[0]), std::move(merge_parts_[1]));
      merge_depth_ = 0;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool key(string_t& value) override {
    key_ = std::move(value);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (error.empty()) error = e.what();
    return false;
  }

 private:
  enum class Capture { kNone, kVocab, kMerges };

  // True when the value about to start is root.model.<name>.
  bool at_model_field(std::string_view name) const {
    return model_ != nullptr && !stack_.empty() && stack_.back() == model_ && key_ == name;
  }

  // Inserts a value into the container being built (or makes it the root) and returns where it lives.
  // Pointers stay valid: an array only grows after the element we point into has been closed.
  json* place(json value) {
    if (stack_.empty()) {
      root = std::move(value);
      return &root;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }
  bool add(json value) {
    place(std::move(value));
    return true;
  }
  json* add_container(json value) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      // Deeper than any tokenizer.json: stop before later walks over the DOM recurse that deep.
      if (error.empty()) error = fmt::format("JSON nested more than {} levels deep (inside field \"{}\")", kMaxJsonDepth, key_);
      return nullptr;
    }
    json* container = place(std::move(value));
    stack_.push_back(container);
    return container;
  }

  bool add_vocab_entry(int64_t id) {
    vocab.emplace_back(std::move(key_), id);
    key_.clear();
    return true;
  }
  bool bad_entry() {
    error = capture_mode_ == Capture::kVocab
                ? "model.vocab must map each token string to an integer id"
                : "model.merges entries must be [\"left\", \"right\"] pairs or \"left right\" strings";
    return false;
  }

  std::vector<json*> stack_;
  std::string key_;
  json* model_ = nullptr;
  Capture capture_mode_ = Capture::kNone;
  int merge_depth_ = 0;
  std::vector<std::string> merge_parts_;
};

// Typed access to the small DOM part of the file, with errors that name the file and the field.
class ConfigReader {
 public:
  explicit ConfigReader(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  const json& require(const json& object, std::string_view key, const std::string& path) const {
    if (!object.is_object()) fail("{}: field \"{}\" must be an object", file_, parent_of(path));
    auto it = object.find(std::string(key));
    if (it == object.end()) fail("{}: field \"{}\" is missing", file_, path);
    return *it;
  }
  const json* optional(const json& object, std::string_view key) const {
    if (!object.is_object()) return nullptr;
    auto it = object.find(std::string(key));
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }
  std::string string(const json& object, std::string_view key, const std::string& path) const {
    const json& value = require(object, key, path);
    if (!value.is_string()) fail("{}: field \"{}\" must be a string", file_, path);
    return value.get<std::string>();
  }
  bool boolean(const json& object, std::string_view key, const std::string& path, bool fallback) const {
    const json* value = optional(object, key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail("{}: field \"{}\" must be true or false", file_, path);
    return value->get<bool>();
  }
  int64_t integer(const json& object, std::string_view key, const std::string& path) const {
    const json& value = require(object, key, path);
    if (!value.is_number_integer()) fail("{}: field \"{}\" must be an integer", file_, path);
    return value.get<int64_t>();
  }
  const json& array(const json& object, std::string_view key, const std::string& path) const {
    const json& value = require(object, key, path);
    if (!value.is_array()) fail("{}: field \"{}\" must be an array", file_, path);
    return value;
  }
  // The "type" of a component, e.g. normalizer.type.
  std::string type(const json& object, const std::string& path) const {
    if (!object.is_object()) fail("{}: field \"{}\" must be an object", file_, path);
    return string(object, "type", path + ".type");
  }
  [[noreturn]] void unsupported_type(const std::string& path, const std::string& type) const {
    fail("{}: {}.type \"{}\" is not supported", file_, path, type);
  }
  // {"String": "x"} -> "x". Regex patterns would need a regex engine compatible with Rust's (Oniguruma
  // syntax in the Python/Rust library), so they are rejected.
  std::string string_pattern(const json& object, const std::string& path) const {
    const json& pattern = require(object, "pattern", path + ".pattern");
    if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      std::string text = pattern["String"].get<std::string>();
      if (text.empty()) fail("{}: field \"{}.pattern.String\" must not be empty", file_, path);
      return text;
    }
    if (pattern.is_object() && pattern.contains("Regex")) {
      fail("{}: {}.pattern: Regex patterns are not supported (only String)", file_, path);
    }
    fail("{}: field \"{}.pattern\" must be {{\"String\": \"...\"}}", file_, path);
  }

 private:
  static std::string parent_of(const std::string& path) {
    const size_t dot = path.rfind('.');
    return dot == std::string::npos ? std::string("(top level)") : path.substr(0, dot);
  }
  std::string file_;
};

std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) fail("{}: cannot open tokenizer file", path.string());
  std::string contents;
  stream.seekg(0, std::ios::end);
  const auto size = stream.tellg();
  if (size > 0) {
    contents.resize(static_cast<size_t>(size));
    stream.seekg(0, std::ios::beg);
    stream.read(contents.data(), size);
  }
  if (!stream) fail("{}: cannot read tokenizer file", path.string());
  return contents;
}

// ---------------------------------------------------------------------------------------------------
// Lookup structures

// (left id, right id) -> (rank, merged id), open addressing. Half a million merges are looked up for
// every pair of neighbouring symbols, so this is the hottest table in encode().
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  void reserve(size_t count) {
    size_t capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    slots_.assign(capacity, Slot{kEmpty, {0, 0}});
    mask_ = capacity - 1;
  }
  // A pair listed twice keeps its last rank, as the Rust library's HashMap construction does.
  void insert_or_assign(int32_t left, int32_t right, Merge merge) {
    const uint64_t key = pack(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, merge};
        return;
      }
    }
  }
  void prefetch(int32_t left, int32_t right) const { __builtin_prefetch(&slots_[hash(pack(left, right)) & mask_]); }
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  // Ids are non-negative int32, so a packed key never has its top bit set.
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static uint64_t pack(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  static size_t hash(uint64_t key) {  // murmur3 finalizer: consecutive ids spread over the table
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ULL;
    key ^= key >> 33;
    return static_cast<size_t>(key);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Token string -> id, open addressing. Slots hold a hash tag and the id; the string itself is compared
// through `pieces` (id -> string), so the table adds 8 bytes per slot and no copies of the strings.
// Loading resolves ~1.5 million strings through it (three per merge), which is why it is not a
// std::unordered_map: that spent half the load time chasing nodes.
class PieceTable {
 public:
  explicit PieceTable(const std::vector<std::string>& pieces) : pieces_(&pieces) {}

  void reserve(size_t count) {
    size_t capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    slots_.assign(capacity, Slot{0, -1});
    mask_ = capacity - 1;
  }
  // Adds pieces[id]; false (and no change) when an equal string is already present.
  bool insert(int32_t id) {
    const std::string_view piece = (*pieces_)[id];
    const size_t hash = hash_of(piece);
    const auto tag = static_cast<uint32_t>(hash >> 32);
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) {
        slots_[i] = Slot{tag, id};
        return true;
      }
      if (slots_[i].tag == tag && (*pieces_)[slots_[i].id] == piece) return false;
    }
  }
  static size_t hash_of(std::string_view piece) { return std::hash<std::string_view>{}(piece); }
  // Lets a caller that has many lookups to do start loading their slots before it needs them.
  void prefetch(size_t hash) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[hash & mask_]);
  }
  std::optional<int32_t> find(std::string_view piece) const { return find(piece, hash_of(piece)); }
  std::optional<int32_t> find(std::string_view piece, size_t hash) const {
    if (slots_.empty()) return std::nullopt;
    const auto tag = static_cast<uint32_t>(hash >> 32);
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) return std::nullopt;
      if (slots_[i].tag == tag && (*pieces_)[slots_[i].id] == piece) return slots_[i].id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;
    int32_t id;  // -1: empty
  };
  const std::vector<std::string>* pieces_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Byte trie over added-token strings answering "which is the longest token starting here?". Scanning
// left to right and taking the first position that has a match gives leftmost-longest matching, the
// rule of the Rust library's Aho-Corasick automaton.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() : node_token_(1, -1) {}

  bool empty() const { return node_token_.size() == 1; }

  void add(std::string_view pattern, int32_t token_index) {
    if (pattern.empty()) return;
    first_bytes_.set(static_cast<uint8_t>(pattern[0]));
    int32_t node = 0;
    for (char c : pattern) {
      const uint64_t edge = edge_key(node, c);
      auto it = children_.find(edge);
      if (it == children_.end()) {
        const auto child = static_cast<int32_t>(node_token_.size());
        node_token_.push_back(-1);
        it = children_.emplace(edge, child).first;
      }
      node = it->second;
    }
    if (node_token_[node] < 0) node_token_[node] = token_index;  // the first of duplicate strings wins
  }

  struct Match {
    int32_t token_index;
    size_t length;
  };
  std::optional<Match> longest_at(std::string_view text, size_t pos) const {
    if (!first_bytes_.test(static_cast<uint8_t>(text[pos]))) return std::nullopt;
    std::optional<Match> best;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      auto it = children_.find(edge_key(node, text[i]));
      if (it == children_.end()) break;
      node = it->second;
      if (node_token_[node] >= 0) best = Match{node_token_[node], i + 1 - pos};
    }
    return best;
  }

 private:
  static uint64_t edge_key(int32_t node, char c) {
    return (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
  }
  std::vector<int32_t> node_token_;  // per node: index of the token that ends there, or -1
  std::unordered_map<uint64_t, int32_t> children_;
  std::bitset<256> first_bytes_;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

struct NormalizerStep {
  enum class Kind { kReplace, kPrepend } kind;
  std::string pattern;  // kReplace
  std::string content;  // replacement (kReplace) or prefix (kPrepend)
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::string pattern;
  SplitBehavior behavior;
};

struct DecodeStep {
  enum class Kind { kReplace, kByteFallback, kStrip } kind;
  std::string pattern;  // kReplace
  std::string content;  // replacement (kReplace) or the character to strip (kStrip)
  size_t start = 0;     // kStrip
  size_t stop = 0;      // kStrip
};

struct PostProcessorTokens {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Tokenizer::Impl

struct Tokenizer::Impl {
  Impl() = default;
  Impl(const Impl&) = delete;  // model_vocab points at this object's `pieces`
  Impl& operator=(const Impl&) = delete;

  std::string file;

  // Ids. `pieces` holds the raw text of every id, model vocabulary and added tokens alike.
  std::vector<std::string> pieces;
  enum : uint8_t { kHasToken = 1, kSpecial = 2 };
  std::vector<uint8_t> id_flags;
  PieceTable model_vocab{pieces};                       // model.vocab only
  std::unordered_map<std::string, int32_t> added_only;  // added tokens missing from model.vocab
  // Added tokens with `normalized: true` decode as their normalized form (so that the decoder can undo
  // the normalizer), as in the Rust library. Only those whose form differs are listed.
  std::unordered_map<int32_t, std::string> normalized_pieces;

  // BPE model.
  MergeTable merges;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;
  std::array<int32_t, 256> byte_ids{};  // id of "<0xNN>", -1 when the vocabulary lacks it

  // Added tokens, matched in the raw text (normalized: false) or in the normalized text (normalized: true).
  std::vector<AddedToken> added_tokens;
  AddedTokenMatcher raw_matcher;
  AddedTokenMatcher normalized_matcher;

  std::vector<NormalizerStep> normalizer;
  std::vector<SplitStep> pre_tokenizer;

  // Decoder. Steps up to Fuse act on each token; a Strip after Fuse acts on the whole text.
  bool join_with_spaces = false;  // no decoder at all: the Rust library joins tokens with " "
  std::vector<DecodeStep> token_steps;
  std::optional<DecodeStep> final_strip;
  int byte_fallback_step = -1;  // index into token_steps

  PostProcessorTokens post_processor;

  bool has_token(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < id_flags.size() && (id_flags[id] & kHasToken) != 0;
  }
  bool is_special(int32_t id) const { return has_token(id) && (id_flags[id] & kSpecial) != 0; }

  std::optional<int32_t> lookup_model(std::string_view piece) const { return model_vocab.find(piece); }

  // The string an id stands for when decoding (and what token_text() shows).
  const std::string& piece_of(int32_t id) const {
    if (!normalized_pieces.empty()) {
      auto it = normalized_pieces.find(id);
      if (it != normalized_pieces.end()) return it->second;
    }
    return pieces[id];
  }

  // --- encode -------------------------------------------------------------------------------------

  struct Segment {
    std::string_view text;
    int32_t token_id = -1;  // >= 0 when the segment is an added token
  };

  // Cuts added tokens out of `text`; the segments cover the whole text in order.
  std::vector<Segment> split_on_added_tokens(std::string_view text, const AddedTokenMatcher& matcher) const {
    std::vector<Segment> segments;
    if (matcher.empty()) {
      segments.push_back({text});
      return segments;
    }
    size_t segment_start = 0;
    for (size_t pos = 0; pos < text.size();) {
      const auto match = matcher.longest_at(text, pos);
      if (!match) {
        ++pos;
        continue;
      }
      const AddedToken& token = added_tokens[match->token_index];
      size_t start = pos;
      size_t end = pos + match->length;
      if (token.lstrip) start = std::max(whitespace_run_before(text, start), segment_start);
      if (token.rstrip) end = whitespace_run_after(text, end);
      if (start > segment_start) segments.push_back({text.substr(segment_start, start - segment_start)});
      segments.push_back({text.substr(start, end - start), token.id});
      segment_start = pos = end;
    }
    if (segment_start < text.size()) segments.push_back({text.substr(segment_start)});
    return segments;
  }

  static size_t whitespace_run_before(std::string_view text, size_t end) {
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      const size_t length = utf8_sequence_length(text, start);
      if (length != end - start || !is_unicode_whitespace(decode_code_point(text, start, length))) break;
      end = start;
    }
    return end;
  }
  static size_t whitespace_run_after(std::string_view text, size_t start) {
    while (start < text.size()) {
      const size_t length = utf8_sequence_length(text, start);
      if (length == 0 || !is_unicode_whitespace(decode_code_point(text, start, length))) break;
      start += length;
    }
    return start;
  }

  std::string normalize(std::string_view text) const {
    std::string normalized(text);
    for (const NormalizerStep& step : normalizer) {
      if (step.kind == NormalizerStep::Kind::kReplace) {
        replace_all(normalized, step.pattern, step.content);
      } else if (!normalized.empty()) {
        normalized.insert(0, step.content);
      }
    }
    return normalized;
  }

  std::vector<std::string_view> pre_tokenize(std::string_view text) const {
    std::vector<std::string_view> words{text};
    for (const SplitStep& step : pre_tokenizer) {
      std::vector<std::string_view> next;
      for (std::string_view word : words) split_word(word, step, next);
      words = std::move(next);
    }
    return words;
  }

  // The Split pre-tokenizer with a String pattern, following the Rust library's handling of each
  // delimiter behavior (e.g. MergedWithPrevious attaches only the first of two adjacent delimiters).
  static void split_word(std::string_view word, const SplitStep& step, std::vector<std::string_view>& out) {
    struct Piece {
      size_t begin, end;
      bool is_delimiter;
    };
    std::vector<Piece> pieces;
    size_t pos = 0;
    for (size_t found; (found = word.find(step.pattern, pos)) != std::string_view::npos;
         pos = found + step.pattern.size()) {
      if (found > pos) pieces.push_back({pos, found, false});
      pieces.push_back({found, found + step.pattern.size(), true});
    }
    if (pos < word.size()) pieces.push_back({pos, word.size(), false});

    std::vector<Piece> merged;
    bool previous_is_delimiter = false;
    switch (step.behavior) {
      case SplitBehavior::kRemoved:
        for (const Piece& piece : pieces) {
          if (!piece.is_delimiter) merged.push_back(piece);
        }
        break;
      case SplitBehavior::kIsolated:
        merged = pieces;
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const Piece& piece : pieces) {
          if (piece.is_delimiter && !previous_is_delimiter && !merged.empty()) {
            merged.back().end = piece.end;
          } else {
            merged.push_back(piece);
          }
          previous_is_delimiter = piece.is_delimiter;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
          if (it->is_delimiter && !previous_is_delimiter && !merged.empty()) {
            merged.back().begin = it->begin;
          } else {
            merged.push_back(*it);
          }
          previous_is_delimiter = it->is_delimiter;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case SplitBehavior::kContiguous:
        for (const Piece& piece : pieces) {
          if (piece.is_delimiter && previous_is_delimiter) {
            merged.back().end = piece.end;
          } else {
            merged.push_back(piece);
          }
          previous_is_delimiter = piece.is_delimiter;
        }
        break;
    }
    for (const Piece& piece : merged) {
      if (piece.end > piece.begin) out.push_back(word.substr(piece.begin, piece.end - piece.begin));
    }
  }

  // Byte-fallback BPE on one pre-tokenized word, appending ids to `out`.
  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      if (auto id = lookup_model(word)) {
        out.push_back(*id);
        return;
      }
    }

    // Symbols form a doubly linked list over a vector; merging keeps the left symbol and unlinks the right.
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;
      bool merged_away;
    };
    std::vector<Symbol> symbols;
    symbols.reserve(word.size());
    auto add_symbol = [&](int32_t id) {
      const auto index = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, index - 1, -1, false});
      if (index > 0) symbols[index - 1].next = index;
    };
    bool unk_pending = false;  // an <unk> waiting in case the next character is unknown too (fuse_unk)
    auto flush_unk = [&] {
      if (unk_pending) add_symbol(*unk_id);
      unk_pending = false;
    };

    for (size_t pos = 0; pos < word.size();) {
      size_t length = utf8_sequence_length(word, pos);
      if (length > 0) {
        if (auto id = lookup_model(word.substr(pos, length))) {
          flush_unk();
          add_symbol(*id);
          pos += length;
          continue;
        }
      } else {
        // Invalid UTF-8: the byte stands alone and takes the byte-fallback path like any unknown
        // character, so encode() never fails and decode() gives U+FFFD for it.
        length = 1;
      }
      if (byte_fallback && std::all_of(word.begin() + pos, word.begin() + pos + length,
                                       [&](char c) { return byte_ids[static_cast<uint8_t>(c)] >= 0; })) {
        // A pending <unk> is deliberately not flushed here: the Rust library keeps it pending across
        // byte tokens, so it comes out after them (and later unknown characters still fuse into it).
        // Only reachable when the vocabulary lacks some <0xNN> tokens.
        for (size_t i = pos; i < pos + length; ++i) add_symbol(byte_ids[static_cast<uint8_t>(word[i])]);
      } else if (unk_id) {
        if (!unk_pending || !fuse_unk) {
          flush_unk();
          unk_pending = true;
        }
      }
      // With neither byte fallback nor an unk token the character is dropped, as in the Rust library.
      pos += length;
    }
    flush_unk();
    if (symbols.empty()) return;

    // Apply merges lowest rank first, leftmost first on equal rank. Candidates go stale when one of
    // their symbols takes part in another merge; they are recognised on pop by re-checking the pair.
    struct Candidate {
      int32_t rank;
      int32_t left;  // index of the left symbol
    };
    auto comes_later = [](const Candidate& a, const Candidate& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(comes_later)> candidates(comes_later);
    auto consider_pair = [&](int32_t left) {
      const int32_t right = symbols[left].next;
      if (right < 0) return;
      if (const auto* merge = merges.find(symbols[left].id, symbols[right].id)) {
        candidates.push({merge->rank, left});
      }
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider_pair(i);

    while (!candidates.empty()) {
      const Candidate candidate = candidates.top();
      candidates.pop();
      Symbol& left = symbols[candidate.left];
      if (left.merged_away || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      const auto* merge = merges.find(left.id, right.id);
      if (merge == nullptr || merge->rank != candidate.rank) continue;  // stale
      left.id = merge->merged_id;
      right.merged_away = true;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = candidate.left;
      if (left.prev >= 0) consider_pair(left.prev);
      consider_pair(candidate.left);
    }
    for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
  }

  void encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
    for (std::string_view word : pre_tokenize(text)) bpe(word, out);
  }

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    for (const Segment& segment : split_on_added_tokens(text, raw_matcher)) {
      if (segment.token_id >= 0) {
        ids.push_back(segment.token_id);
        continue;
      }
      const std::string normalized = normalize(segment.text);
      for (const Segment& piece : split_on_added_tokens(normalized, normalized_matcher)) {
        if (piece.token_id >= 0) {
          ids.push_back(piece.token_id);
        } else {
          encode_normalized(piece.text, ids);
        }
      }
    }
    return ids;
  }

  // --- decode -------------------------------------------------------------------------------------

  static void apply_token_step(const DecodeStep& step, std::vector<std::string>& tokens) {
    switch (step.kind) {
      case DecodeStep::Kind::kReplace:
        for (std::string& token : tokens) replace_all(token, step.pattern, step.content);
        break;
      case DecodeStep::Kind::kStrip:
        for (std::string& token : tokens) strip_repeated(token, step.content, step.start, step.stop);
        break;
      case DecodeStep::Kind::kByteFallback: {
        // Each run of byte tokens is joined; a run that is not valid UTF-8 becomes one U+FFFD per byte of
        // the whole run (the Rust library's behaviour, not "one per invalid subsequence").
        std::vector<std::string> result;
        result.reserve(tokens.size());
        std::string run;
        auto flush_run = [&] {
          if (run.empty()) return;
          if (is_valid_utf8(run)) {
            result.push_back(std::move(run));
          } else {
            for (size_t i = 0; i < run.size(); ++i) result.emplace_back(kReplacementCharacter);
          }
          run.clear();
        };
        for (std::string& token : tokens) {
          if (auto byte = parse_byte_piece(token)) {
            run.push_back(static_cast<char>(*byte));
          } else {
            flush_run();
            result.push_back(std::move(token));
          }
        }
        flush_run();
        tokens = std::move(result);
        break;
      }
    }
  }

  // Decodes ids up to, not including, a Strip that follows Fuse. Callers that split a sequence into
  // chunks must cut only after a token that is not a byte-fallback token.
  std::string decode_chunk(std::span<const int32_t> ids, bool skip_special_tokens) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (!has_token(id) || (skip_special_tokens && is_special(id))) continue;
      tokens.push_back(piece_of(id));
    }
    for (const DecodeStep& step : token_steps) apply_token_step(step, tokens);
    std::string text;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (join_with_spaces && i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }

  // The byte a token stands for when ByteFallback reaches it, if any.
  std::optional<uint8_t> fallback_byte(int32_t id) const {
    if (byte_fallback_step < 0 || !has_token(id)) return std::nullopt;
    if (byte_fallback_step == 0) return parse_byte_piece(piece_of(id));
    std::vector<std::string> token{piece_of(id)};
    for (int i = 0; i < byte_fallback_step; ++i) apply_token_step(token_steps[i], token);
    return parse_byte_piece(token[0]);
  }

  // Applies a Strip that follows Fuse to text that arrives in chunks. `start_left` counts the leading
  // characters it may still remove; `tail` keeps trailing strip characters back until it is known
  // whether more text follows them. With fresh state and at_end, this is Strip on the whole text.
  std::string apply_final_strip(std::string text, bool at_end, size_t& start_left, std::string& tail) const {
    if (!final_strip) return text;
    const std::string& c = final_strip->content;
    size_t cut = 0;
    while (start_left > 0 && text.compare(cut, c.size(), c) == 0) {
      cut += c.size();
      --start_left;
    }
    text.erase(0, cut);
    if (!text.empty()) start_left = 0;
    if (final_strip->stop == 0) return text;

    std::string out = std::move(tail) + text;
    tail.clear();
    size_t end = out.size();
    size_t trailing = 0;
    while (end >= c.size() && out.compare(end - c.size(), c.size(), c) == 0) {
      end -= c.size();
      ++trailing;
    }
    if (at_end) {
      out.resize(out.size() - std::min(trailing, final_strip->stop) * c.size());
    } else {
      tail = out.substr(end);
      out.resize(end);
    }
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    size_t start_left = final_strip ? final_strip->start : 0;
    std::string tail;
    return apply_final_strip(decode_chunk(ids, skip_special_tokens), true, start_left, tail);
  }
};

// ---------------------------------------------------------------------------------------------------
// Loading

namespace {

using Impl = Tokenizer::Impl;

void read_normalizer(const ConfigReader& config, const json& node, const std::string& path,
                     std::vector<NormalizerStep>& steps) {
  if (node.is_null()) return;
  const std::string type = config.type(node, path);
  if (type == "Sequence") {
    const json& children = config.array(node, "normalizers", path + ".normalizers");
    for (size_t i = 0; i < children.size(); ++i) {
      read_normalizer(config, children[i], fmt::format("{}.normalizers[{}]", path, i), steps);
    }
  } else if (type == "Replace") {
    steps.push_back({NormalizerStep::Kind::kReplace, config.string_pattern(node, path),
                     config.string(node, "content", path + ".content")});
  } else if (type == "Prepend") {
    steps.push_back({NormalizerStep::Kind::kPrepend, "", config.string(node, "prepend", path + ".prepend")});
  } else {
    config.unsupported_type(path, type);
  }
}

void read_pre_tokenizer(const ConfigReader& config, const json& node, const std::string& path,
                        std::vector<SplitStep>& steps) {
  if (node.is_null()) return;
  const std::string type = config.type(node, path);
  if (type == "Sequence") {
    const json& children = config.array(node, "pretokenizers", path + ".pretokenizers");
    for (size_t i = 0; i < children.size(); ++i) {
      read_pre_tokenizer(config, children[i], fmt::format("{}.pretokenizers[{}]", path, i), steps);
    }
  } else if (type == "Split") {
    SplitStep step;
    step.pattern = config.string_pattern(node, path);
    const std::string behavior = config.string(node, "behavior", path + ".behavior");
    static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    auto it = kBehaviors.find(behavior);
    if (it == kBehaviors.end()) fail("{}: {}.behavior \"{}\" is not supported", config.file(), path, behavior);
    step.behavior = it->second;
    if (config.boolean(node, "invert", path + ".invert", false)) {
      fail("{}: {}.invert true is not supported", config.file(), path);
    }
    steps.push_back(std::move(step));
  } else {
    config.unsupported_type(path, type);
  }
}

// Flattens the decoder into `impl.token_steps` and an optional Strip after Fuse.
void read_decoder(const ConfigReader& config, const json& node, const std::string& path, bool& fused, Impl& impl) {
  if (node.is_null()) return;
  const std::string type = config.type(node, path);
  if (type == "Sequence") {
    const json& children = config.array(node, "decoders", path + ".decoders");
    for (size_t i = 0; i < children.size(); ++i) {
      read_decoder(config, children[i], fmt::format("{}.decoders[{}]", path, i), fused, impl);
    }
    return;
  }
  if (type == "Fuse") {
    fused = true;
    return;
  }
  DecodeStep step;
  if (type == "Replace") {
    step.kind = DecodeStep::Kind::kReplace;
    step.pattern = config.string_pattern(node, path);
    step.content = config.string(node, "content", path + ".content");
  } else if (type == "ByteFallback") {
    step.kind = DecodeStep::Kind::kByteFallback;
  } else if (type == "Strip") {
    step.kind = DecodeStep::Kind::kStrip;
    step.content = config.string(node, "content", path + ".content");
    if (step.content.empty() || utf8_sequence_length(step.content, 0) != step.content.size()) {
      fail("{}: {}.content must be a single character", config.file(), path);
    }
    const int64_t start = config.integer(node, "start", path + ".start");
    const int64_t stop = config.integer(node, "stop", path + ".stop");
    if (start < 0 || stop < 0) fail("{}: {}.start and .stop must not be negative", config.file(), path);
    step.start = static_cast<size_t>(start);
    step.stop = static_cast<size_t>(stop);
  } else {
    config.unsupported_type(path, type);
  }
  if (fused) {
    // After Fuse the steps see the whole text. Only a Strip is supported there: it is the one step
    // whose effect on chunked (streamed) text can be reproduced exactly.
    if (step.kind != DecodeStep::Kind::kStrip || impl.final_strip) {
      fail("{}: {}: \"{}\" after Fuse is not supported (only one Strip may follow Fuse)", config.file(), path, type);
    }
    impl.final_strip = std::move(step);
    return;
  }
  if (step.kind == DecodeStep::Kind::kByteFallback && impl.byte_fallback_step < 0) {
    impl.byte_fallback_step = static_cast<int>(impl.token_steps.size());
  }
  impl.token_steps.push_back(std::move(step));
}

void special_token_id_list(const ConfigReader& config, const json& special_tokens, const std::string& name,
                           const std::string& path, std::vector<int32_t>& out) {
  const json& entry = config.require(special_tokens, name, path + ".special_tokens." + name);
  const json& ids = config.array(entry, "ids", path + ".special_tokens." + name + ".ids");
  for (const json& id : ids) {
    if (!id.is_number_integer()) fail("{}: {}.special_tokens.{}.ids must hold integers", config.file(), path, name);
    out.push_back(id.get<int32_t>());
  }
}

PostProcessorTokens read_post_processor(const ConfigReader& config, const json& node, const std::string& path) {
  PostProcessorTokens tokens;
  if (node.is_null()) return tokens;
  const std::string type = config.type(node, path);
  if (type == "TemplateProcessing") {
    const json& single = config.require(node, "single", path + ".single");
    const json* special_tokens = config.optional(node, "special_tokens");
    const json empty = json::object();
    bool after_sequence = false;
    auto add_special = [&](const std::string& name) {
      special_token_id_list(config, special_tokens ? *special_tokens : empty, name, path,
                            after_sequence ? tokens.suffix : tokens.prefix);
    };
    if (single.is_string()) {
      // The short form, e.g. "<bos> $A" or "[CLS]:0 $A:0 [SEP]:0".
      const std::string text = single.get<std::string>();
      for (size_t pos = 0; pos < text.size();) {
        const size_t end = std::min(text.find(' ', pos), text.size());
        std::string piece = text.substr(pos, end - pos);
        pos = end + 1;
        if (piece.empty()) continue;
        if (piece[0] == '$') {
          after_sequence = true;
          continue;
        }
        const size_t colon = piece.rfind(':');
        if (colon != std::string::npos && colon > 0 &&
            piece.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
          piece.resize(colon);
        }
        add_special(piece);
      }
    } else if (single.is_array()) {
      for (size_t i = 0; i < single.size(); ++i) {
        const json& piece = single[i];
        if (piece.is_object() && piece.contains("Sequence")) {
          after_sequence = true;
        } else if (piece.is_object() && piece.contains("SpecialToken")) {
          add_special(
              config.string(piece["SpecialToken"], "id", fmt::format("{}.single[{}].SpecialToken.id", path, i)));
        } else {
          fail("{}: {}.single[{}] must be a Sequence or a SpecialToken", config.file(), path, i);
        }
      }
    } else {
      fail("{}: field \"{}.single\" must be an array or a string", config.file(), path);
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto token_id = [&](const char* key) {
      const json& pair = config.array(node, key, path + "." + key);
      if (pair.size() != 2 || !pair[1].is_number_integer()) {
        fail("{}: field \"{}.{}\" must be [\"token\", id]", config.file(), path, key);
      }
      return pair[1].get<int32_t>();
    };
    tokens.prefix.push_back(token_id("cls"));
    tokens.suffix.push_back(token_id("sep"));
  } else if (type == "ByteLevel") {
    // Adjusts offsets only.
  } else if (type == "Sequence") {
    // Each processor wraps the output of the ones before it.
    const json& children = config.array(node, "processors", path + ".processors");
    for (size_t i = 0; i < children.size(); ++i) {
      PostProcessorTokens inner = read_post_processor(config, children[i], fmt::format("{}.processors[{}]", path, i));
      tokens.prefix.insert(tokens.prefix.begin(), inner.prefix.begin(), inner.prefix.end());
      tokens.suffix.insert(tokens.suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
  } else {
    config.unsupported_type(path, type);
  }
  return tokens;
}

void read_bpe_model(const ConfigReader& config, const json& model, TokenizerJsonReader& reader, Impl& impl) {
  const std::string& file = config.file();
  if (const json* type = config.optional(model, "type")) {
    if (!type->is_string()) fail("{}: field \"model.type\" must be a string", file);
    if (type->get<std::string>() != "BPE") config.unsupported_type("model", type->get<std::string>());
  } else if (!reader.has_merges) {
    fail("{}: field \"model.type\" is missing", file);
  }
  if (!reader.has_vocab) {
    if (model.contains("vocab")) fail("{}: field \"model.vocab\" must be an object mapping tokens to ids", file);
    fail("{}: field \"model.vocab\" is missing", file);
  }
  if (!reader.has_merges) {
    if (model.contains("merges")) fail("{}: field \"model.merges\" must be an array", file);
    fail("{}: field \"model.merges\" is missing", file);
  }
  if (const json* dropout = config.optional(model, "dropout")) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      fail("{}: model.dropout is not supported (encoding must be deterministic)", file);
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* value = config.optional(model, key);
        value && !(value->is_string() && value->get<std::string>().empty())) {
      fail("{}: model.{} is not supported", file, key);
    }
  }
  impl.byte_fallback = config.boolean(model, "byte_fallback", "model.byte_fallback", false);
  impl.fuse_unk = config.boolean(model, "fuse_unk", "model.fuse_unk", false);
  impl.ignore_merges = config.boolean(model, "ignore_merges", "model.ignore_merges", false);
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  const std::string file = tokenizer_json.string();
  const std::string contents = read_whole_file(tokenizer_json);
  TokenizerJsonReader reader;
  if (!json::sax_parse(contents, &reader)) {
    fail("{}: not a valid tokenizer.json: {}", file, reader.error.empty() ? "parse error" : reader.error);
  }
  const json& root = reader.root;
  if (!root.is_object()) fail("{}: the top level must be a JSON object", file);

  ConfigReader config(file);
  auto impl = std::make_shared<Impl>();
  impl->file = file;

  const json& model = config.require(root, "model", "model");
  if (!model.is_object()) fail("{}: field \"model\" must be an object", file);
  read_bpe_model(config, model, reader, *impl);

  // Normalizer and pre-tokenizer come first: normalized added tokens are matched in normalized form.
  if (const json* node = config.optional(root, "normalizer"))
    read_normalizer(config, *node, "normalizer", impl->normalizer);
  if (const json* node = config.optional(root, "pre_tokenizer")) {
    read_pre_tokenizer(config, *node, "pre_tokenizer", impl->pre_tokenizer);
  }
  if (const json* node = config.optional(root, "decoder")) {
    bool fused = false;
    read_decoder(config, *node, "decoder", fused, *impl);
  } else {
    impl->join_with_spaces = true;
  }
  if (const json* node = config.optional(root, "post_processor")) {
    impl->post_processor = read_post_processor(config, *node, "post_processor");
  }

  // Added tokens: validate and find the largest id before sizing the id tables.
  const json* added_json = config.optional(root, "added_tokens");
  if (added_json && !added_json->is_array()) fail("{}: field \"added_tokens\" must be an array", file);
  struct AddedSpec {
    AddedToken token;
    bool normalized;
  };
  std::vector<AddedSpec> added_specs;
  int64_t max_id = -1;
  for (const auto& [piece, id] : reader.vocab) {
    if (id < 0 || id >= INT32_MAX) fail("{}: model.vocab: id {} of \"{}\" is out of range", file, id, piece);
    max_id = std::max(max_id, id);
  }
  if (added_json) {
    for (size_t i = 0; i < added_json->size(); ++i) {
      const json& entry = (*added_json)[i];
      const std::string path = fmt::format("added_tokens[{}]", i);
      AddedSpec spec;
      spec.token.content = config.string(entry, "content", path + ".content");
      const int64_t id = config.integer(entry, "id", path + ".id");
      if (id < 0 || id >= INT32_MAX) fail("{}: {}.id {} is out of range", file, path, id);
      spec.token.id = static_cast<int32_t>(id);
      spec.token.special = config.boolean(entry, "special", path + ".special", false);
      spec.token.lstrip = config.boolean(entry, "lstrip", path + ".lstrip", false);
      spec.token.rstrip = config.boolean(entry, "rstrip", path + ".rstrip", false);
      spec.normalized = config.boolean(entry, "normalized", path + ".normalized", !spec.token.special);
      if (config.boolean(entry, "single_word", path + ".single_word", false)) {
        fail("{}: {}.single_word true is not supported", file, path);
      }
      if (spec.token.content.empty()) continue;  // the Rust library ignores empty added tokens
      max_id = std::max(max_id, id);
      added_specs.push_back(std::move(spec));
    }
  }

  // Vocabulary.
  impl->pieces.resize(static_cast<size_t>(max_id + 1));
  impl->id_flags.assign(impl->pieces.size(), 0);
  for (auto& [piece, id] : reader.vocab) {
    if (impl->id_flags[id] & Impl::kHasToken) {
      fail("{}: model.vocab: id {} is used by both \"{}\" and \"{}\"", file, id, impl->pieces[id], piece);
    }
    impl->pieces[id] = std::move(piece);
    impl->id_flags[id] = Impl::kHasToken;
  }
  impl->model_vocab.reserve(reader.vocab.size());
  for (const auto& entry : reader.vocab) {
    // A string listed twice keeps its first id (JSON objects should not repeat keys anyway).
    impl->model_vocab.insert(static_cast<int32_t>(entry.second));
  }
  reader.vocab = {};

  for (int byte = 0; byte < 256; ++byte) {
    impl->byte_ids[byte] = impl->lookup_model(fmt::format("<0x{:02X}>", byte)).value_or(-1);
  }
  if (const json* unk = config.optional(model, "unk_token")) {
    if (!unk->is_string()) fail("{}: field \"model.unk_token\" must be a string", file);
    impl->unk_id = impl->lookup_model(unk->get<std::string>());
    if (!impl->unk_id) fail("{}: model.unk_token \"{}\" is not in model.vocab", file, unk->get<std::string>());
  }

  // Merges: a merge's rank is its index in the list.
  // Three lookups per merge in tables far larger than the caches: work in batches and prefetch every
  // slot of a batch first, so that the memory accesses overlap (this halves the time).
  impl->merges.reserve(reader.merges.size());
  constexpr size_t kBatch = 32;
  std::array<std::string, kBatch> merged;
  std::array<size_t, kBatch * 3> hashes;
  std::array<std::array<int32_t, 3>, kBatch> resolved;  // left, right and merged ids
  const PieceTable& vocab = impl->model_vocab;
  for (size_t base = 0; base < reader.merges.size(); base += kBatch) {
    const size_t count = std::min(kBatch, reader.merges.size() - base);
    for (size_t k = 0; k < count; ++k) {
      const auto& [left, right] = reader.merges[base + k];
      merged[k].assign(left).append(right);
      hashes[3 * k] = PieceTable::hash_of(left);
      hashes[3 * k + 1] = PieceTable::hash_of(right);
      hashes[3 * k + 2] = PieceTable::hash_of(merged[k]);
      for (size_t h = 3 * k; h < 3 * k + 3; ++h) vocab.prefetch(hashes[h]);
    }
    for (size_t k = 0; k < count; ++k) {
      const auto& [left, right] = reader.merges[base + k];
      const auto left_id = vocab.find(left, hashes[3 * k]);
      const auto right_id = vocab.find(right, hashes[3 * k + 1]);
      const auto merged_id = vocab.find(merged[k], hashes[3 * k + 2]);
      if (!left_id || !right_id || !merged_id) {
        const std::string& missing = !left_id ? left : !right_id ? right : merged[k];
        fail("{}: model.merges[{}]: \"{}\" is not in model.vocab", file, base + k, missing);
      }
      resolved[k] = {*left_id, *right_id, *merged_id};
      impl->merges.prefetch(*left_id, *right_id);
    }
    for (size_t k = 0; k < count; ++k) {
      const auto [left_id, right_id, merged_id] = resolved[k];
      impl->merges.insert_or_assign(left_id, right_id, {static_cast<int32_t>(base + k), merged_id});
    }
  }
  reader.merges = {};

  // Added tokens share the id space with the vocabulary and must agree with it.
  for (AddedSpec& spec : added_specs) {
    AddedToken& token = spec.token;
    const auto vocab_id = impl->lookup_model(token.content);
    if (vocab_id && *vocab_id != token.id) {
      fail("{}: added token \"{}\" has id {} but model.vocab gives it id {}", file, token.content, token.id,
           *vocab_id);
    }
    uint8_t& flags = impl->id_flags[token.id];
    if ((flags & Impl::kHasToken) && impl->pieces[token.id] != token.content) {
      fail("{}: added token \"{}\" has id {}, which already belongs to \"{}\"", file, token.content, token.id,
           impl->pieces[token.id]);
    }
    if (!vocab_id) {
      impl->pieces[token.id] = token.content;
      impl->added_only.emplace(token.content, token.id);
    }
    flags |= Impl::kHasToken | (token.special ? Impl::kSpecial : 0);
    const auto index = static_cast<int32_t>(impl->added_tokens.size());
    if (spec.normalized) {
      std::string normalized = impl->normalize(token.content);
      impl->normalized_matcher.add(normalized, index);
      if (normalized != token.content) impl->normalized_pieces.emplace(token.id, std::move(normalized));
    } else {
      impl->raw_matcher.add(token.content, index);
    }
    impl->added_tokens.push_back(std::move(token));
  }

  return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------------------------------
// Tokenizer

std::vector<int32_t> Tokenizer::encode(std::string_view utf8_text) const { return impl_->encode(utf8_text); }

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->pieces.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto id = impl_->lookup_model(token)) return id;
  auto it = impl_->added_only.find(std::string(token));
  return it == impl_->added_only.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("{}: token id {} is out of range (vocabulary size {})", impl_->file, id, vocab_size());
  return impl_->piece_of(id);
}

bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }

std::vector<int32_t> Tokenizer::post_processor_added_prefix() const { return impl_->post_processor.prefix; }

std::vector<int32_t> Tokenizer::post_processor_added_suffix() const { return impl_->post_processor.suffix; }

// ---------------------------------------------------------------------------------------------------
// StreamingDecoder

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  const auto& strip = tokenizer_.impl_->final_strip;
  strip_start_left_ = strip ? strip->start : 0;
}

std::string StreamingDecoder::push(int32_t id) {
  const Tokenizer::Impl& impl = *tokenizer_.impl_;
  // decode() drops these before byte runs are joined, so they must not end a pending run either.
  if (!impl.has_token(id) || (skip_special_tokens_ && impl.is_special(id))) return {};
  pending_.push_back(id);
  if (impl.fallback_byte(id)) return {};
  // A non-byte token closes the run before it: everything pending now decodes exactly as it will in
  // the whole sequence, and ends on a character boundary.
  std::string text = emit(impl.decode_chunk(pending_, false), false);
  pending_.clear();
  return text;
}

std::string StreamingDecoder::finish() {
  const Tokenizer::Impl& impl = *tokenizer_.impl_;
  std::string text = emit(pending_.empty() ? std::string() : impl.decode_chunk(pending_, false), true);
  pending_.clear();
  strip_start_left_ = impl.final_strip ? impl.final_strip->start : 0;
  held_back_tail_.clear();
  emitted_tokens_ = false;
  return text;
}

std::string StreamingDecoder::emit(std::string text, bool at_end) {
  const Tokenizer::Impl& impl = *tokenizer_.impl_;
  if (impl.join_with_spaces && !pending_.empty()) {
    // Without a decoder the tokens are joined with spaces (there is no ByteFallback either, so every
    // chunk is a single token): each chunk after the first starts with one.
    if (emitted_tokens_) text.insert(0, " ");
    emitted_tokens_ = true;
  }
  return impl.apply_final_strip(std::move(text), at_end, strip_start_left_, held_back_tail_);
}

}  // namespace gemma4rt
