// A compiled output constraint: a graph of value nodes (from a JSON Schema, the json_object mode or a
// set of forced tool calls) that the automaton (automaton.h) walks byte by byte. Immutable once built,
// so one grammar serves any number of sequences at once.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace gemma4rt::constrain {

// How values are written. kJson is standard JSON; kGemma is the syntax of Gemma-4 tool-call arguments:
// bare object keys and strings between <|"|> tokens, no escapes.
enum class Syntax : uint8_t { kJson, kGemma };

// Special tokens that forced tool calls need, each fed to the automaton as one byte that valid UTF-8
// never holds, so they can never appear inside JSON text.
inline constexpr uint8_t kStringDelimiterSymbol = 0xF8;  // <|"|>
inline constexpr uint8_t kToolCallOpenSymbol = 0xF9;     // <|tool_call>
inline constexpr uint8_t kToolCallCloseSymbol = 0xFA;    // <tool_call|>

// A schema the engine cannot enforce, or that no value satisfies. `path` is a JSON pointer into the
// schema ("#/properties/a"), `keyword` the keyword at fault (empty when the whole schema is).
class SchemaError : public Error {
 public:
  SchemaError(std::string path, std::string keyword, const std::string& message)
      : Error(message), path(std::move(path)), keyword(std::move(keyword)) {}
  std::string path;
  std::string keyword;
};

enum class NodeKind : uint8_t {
  kObject,    // properties, required, additional
  kArray,     // items, min/max items
  kString,    // min/max length in code points
  kNumber,    // any JSON number
  kInteger,   // digits only (a subset of the integers JSON Schema accepts)
  kLiterals,  // one of a set of exact texts (enum, const, true/false/null)
  kUnion,     // any of the branches (anyOf, oneOf with disjoint branches, type lists)
};

struct Property {
  std::string name;
  std::string key_text;  // what the output spells after the opening quote: JSON `name"`, Gemma `name:`
  int node = -1;
  bool required = false;
};

struct Node {
  NodeKind kind = NodeKind::kUnion;
  std::vector<Property> properties;  // sorted by key_text
  int additional = -1;               // node of other keys' values; -1: no other keys
  uint32_t min_count = 0;            // array items or string code points
  uint32_t max_count = UINT32_MAX;
  int items = -1;
  std::vector<std::string> literals;  // sorted, distinct
  std::vector<int> branches;
  std::bitset<256> first_bytes;       // bytes a value of this node can start with
};

// One function a forced tool call may name: the automaton matches `prefix` ("call:NAME{") and then
// the arguments object `arguments` (a kObject node, entered just after its '{').
struct ToolEntry {
  std::string prefix;
  int arguments = -1;
};

struct Grammar {
  Syntax syntax = Syntax::kJson;
  std::vector<Node> nodes;
  int root = -1;                   // the value to produce (unused in tool-call mode)
  std::vector<ToolEntry> tools;    // non-empty: produce one or more tool calls; sorted by prefix
};

}  // namespace gemma4rt::constrain
