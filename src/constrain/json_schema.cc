#include "constrain/json_schema.h"

#include <algorithm>
#include <map>
#include <set>

namespace gemma4rt::constrain {
namespace {

using nlohmann::json;

constexpr int kMaxCompileDepth = 256;  // schema nesting plus $ref hops
constexpr size_t kMaxNodes = 100000;
constexpr size_t kMaxProperties = 64;  // one bit each in a frame

const std::set<std::string>& annotations() {
  static const std::set<std::string> names = {"title", "description", "default", "examples", "$schema", "$id",
                                              "$comment", "deprecated", "readOnly", "writeOnly"};
  return names;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> names = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                              "items", "minItems", "maxItems", "minLength", "maxLength", "anyOf",
                                              "oneOf", "$ref", "$defs", "definitions"};
  return names;
}

void append_json_string(const std::string& text, std::string& out) {
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '<': out += "\\u003c"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void render(const json& value, Syntax syntax, std::string& out) {
  switch (value.type()) {
    case json::value_t::string:
      if (syntax == Syntax::kJson) {
        append_json_string(value.get_ref<const std::string&>(), out);
      } else {
        out.push_back(static_cast<char>(kStringDelimiterSymbol));
        out += value.get_ref<const std::string&>();
        out.push_back(static_cast<char>(kStringDelimiterSymbol));
      }
      return;
    case json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out.push_back(',');
        first = false;
        if (syntax == Syntax::kJson) {
          append_json_string(key, out);
        } else {
          out += key;
        }
        out.push_back(':');
        render(item, syntax, out);
      }
      out.push_back('}');
      return;
    }
    case json::value_t::array: {
      out.push_back('[');
      for (size_t i = 0; i < value.size(); ++i) {
        if (i > 0) out.push_back(',');
        render(value[i], syntax, out);
      }
      out.push_back(']');
      return;
    }
    default: out += value.dump(); return;
  }
}

// JSON types as bits, for type lists and oneOf overlap checks.
enum TypeBit : unsigned { kObjectBit = 1, kArrayBit = 2, kStringBit = 4, kNumberBit = 8, kIntegerBit = 16, kBooleanBit = 32, kNullBit = 64 };
constexpr unsigned kAllTypes = 127;

unsigned type_bit(const std::string& name) {
  if (name == "object") return kObjectBit;
  if (name == "array") return kArrayBit;
  if (name == "string") return kStringBit;
  if (name == "number") return kNumberBit;
  if (name == "integer") return kIntegerBit;
  if (name == "boolean") return kBooleanBit;
  if (name == "null") return kNullBit;
  return 0;
}

unsigned value_type(const json& value) {
  switch (value.type()) {
    case json::value_t::object: return kObjectBit;
    case json::value_t::array: return kArrayBit;
    case json::value_t::string: return kStringBit;
    case json::value_t::boolean: return kBooleanBit;
    case json::value_t::null: return kNullBit;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return kNumberBit | kIntegerBit;
    case json::value_t::number_float: {
      const double number = value.get<double>();
      return number == static_cast<double>(static_cast<int64_t>(number)) ? (kNumberBit | kIntegerBit) : kNumberBit;
    }
    default: return 0;
  }
}

class Compiler {
 public:
  Compiler(const json& document, Syntax syntax, std::string root_path) : document_(document), root_path_(std::move(root_path)) {
    grammar_ = std::make_shared<Grammar>();
    grammar_->syntax = syntax;
  }

  int compile(const json& schema, const std::string& path, int depth) {
    if (depth > kMaxCompileDepth) throw SchemaError(path, "", fmt::format("{}: the schema nests (or follows $ref) deeper than {} levels", path, kMaxCompileDepth));
    if (schema.is_boolean()) return schema.get<bool>() ? any() : unsatisfiable();
    if (!schema.is_object()) throw SchemaError(path, "", fmt::format("{}: a schema must be an object or a boolean", path));
    std::vector<std::string> assertions;
    for (const auto& [key, value] : schema.items()) {
      if (annotations().count(key) || key == "$defs" || key == "definitions") continue;
      if (!supported().count(key)) {
        throw SchemaError(path, key, fmt::format("{}: the keyword '{}' is not supported by structured output", path, key));
      }
      assertions.push_back(key);
    }
    auto alone = [&](const char* keyword) {
      for (const std::string& other : assertions) {
        if (other != keyword) {
          throw SchemaError(path, other, fmt::format("{}: '{}' beside '{}' is not supported (put it inside the branches or the definition)", path, other, keyword));
        }
      }
    };
    if (schema.contains("$ref")) {
      alone("$ref");
      return reference(schema["$ref"], path + "/$ref", depth);
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!schema.contains(keyword)) continue;
      alone(keyword);
      const json& branches = schema[keyword];
      const std::string here = path + "/" + keyword;
      if (!branches.is_array() || branches.empty()) throw SchemaError(here, keyword, fmt::format("{}: must be a non-empty list of schemas", here));
      const int node = add(NodeKind::kUnion);
      for (size_t i = 0; i < branches.size(); ++i) {
        const int branch = compile(branches[i], fmt::format("{}/{}", here, i), depth + 1);
        nodes()[node].branches.push_back(branch);
      }
      if (std::string(keyword) == "oneOf") one_ofs_.emplace_back(node, here);
      return node;
    }

    unsigned types = 0;
    if (schema.contains("type")) {
      const json& type = schema["type"];
      const std::string here = path + "/type";
      auto add_type = [&](const json& name) {
        const unsigned bit = name.is_string() ? type_bit(name.get<std::string>()) : 0;
        if (bit == 0) throw SchemaError(here, "type", fmt::format("{}: {} is not a JSON Schema type", here, name.dump()));
        types |= bit;
      };
      if (type.is_array()) {
        if (type.empty()) throw SchemaError(here, "type", fmt::format("{}: an empty list of types allows nothing", here));
        for (const json& name : type) add_type(name);
      } else {
        add_type(type);
      }
    }

    if (schema.contains("enum") || schema.contains("const")) {
      if (schema.contains("enum") && schema.contains("const")) {
        throw SchemaError(path, "const", fmt::format("{}: 'enum' beside 'const' is not supported", path));
      }
      const char* keyword = schema.contains("enum") ? "enum" : "const";
      for (const std::string& other : assertions) {
        if (other != keyword && other != "type") {
          throw SchemaError(path, other, fmt::format("{}: '{}' beside '{}' is not supported", path, other, keyword));
        }
      }
      json values = json::array();
      if (std::string(keyword) == "enum") {
        if (!schema["enum"].is_array() || schema["enum"].empty()) {
          throw SchemaError(path + "/enum", "enum", fmt::format("{}/enum: must be a non-empty list", path));
        }
        values = schema["enum"];
      } else {
        values.push_back(schema["const"]);
      }
      std::vector<std::string> texts;
      for (const json& value : values) {
        const unsigned type = value_type(value);
        if (types != 0 && (type & types) == 0) continue;  // excluded by `type`
        std::string text;
        render(value, grammar_->syntax, text);
        texts.push_back(std::move(text));
      }
      return literals(std::move(texts));
    }

    if (types == 0) {
      // No type: the keywords present decide it; none means any value.
      auto has = [&](std::initializer_list<const char*> keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const char* key) { return schema.contains(key); });
      };
      if (has({"properties", "required", "additionalProperties"})) types |= kObjectBit;
      if (has({"items", "minItems", "maxItems"})) types |= kArrayBit;
      if (has({"minLength", "maxLength"})) types |= kStringBit;
      if (types == 0) types = kAllTypes;
    }
    if ((types & kNumberBit) && (types & kIntegerBit)) types &= ~kIntegerBit;
    std::vector<int> typed;
    if (types & kObjectBit) typed.push_back(object(schema, path, depth));
    if (types & kArrayBit) typed.push_back(array(schema, path, depth));
    if (types & kStringBit) typed.push_back(string(schema, path));
    if (types & kNumberBit) typed.push_back(number(NodeKind::kNumber));
    if (types & kIntegerBit) typed.push_back(number(NodeKind::kInteger));
    if (types & kBooleanBit) typed.push_back(literals({"false", "true"}));
    if (types & kNullBit) typed.push_back(literals({"null"}));
    if (typed.size() == 1) return typed.front();
    const int node = add(NodeKind::kUnion);
    nodes()[node].branches = typed;
    return node;
  }

  // Removes what cannot finish, flattens unions and works out first bytes. Throws when the root has
  // no finite value.
  std::shared_ptr<Grammar> finish(const std::vector<std::pair<int, std::string>>& roots) {
    check_one_ofs();
    flatten_unions();
    const std::vector<bool> finite = finite_nodes();
    for (const auto& [root, path] : roots) {
      if (!finite[root]) {
        throw SchemaError(path, "", fmt::format("{}: no finite value satisfies the schema (a required property or item that recurses "
                                                "forever, a contradiction, or nothing left after `type`)", path));
      }
    }
    for (Node& node : nodes()) {
      std::erase_if(node.properties, [&](const Property& property) { return !property.required && !finite[property.node]; });
      if (node.additional >= 0 && !finite[node.additional]) node.additional = -1;
      if (node.items >= 0 && !finite[node.items]) {
        node.items = -1;
        node.max_count = 0;
      }
      std::erase_if(node.branches, [&](int branch) { return !finite[branch]; });
    }
    compute_first_bytes();
    return grammar_;
  }

  Grammar& grammar() { return *grammar_; }

  void check_one_ofs() {
    for (const auto& [node, path] : one_ofs_) {
      const std::vector<int> branches = nodes()[node].branches;
      for (size_t i = 0; i < branches.size(); ++i) {
        for (size_t j = i + 1; j < branches.size(); ++j) {
          const auto* left = literal_texts(branches[i]);
          const auto* right = literal_texts(branches[j]);
          bool overlap = false;
          if (left && right) {
            overlap = std::any_of(left->begin(), left->end(), [&](const std::string& text) {
              return std::binary_search(right->begin(), right->end(), text);
            });
          } else {
            std::set<int> visiting;
            overlap = (types_of(branches[i], visiting) & types_of(branches[j], visiting)) != 0;
          }
          if (overlap) {
            throw SchemaError(path, "oneOf", fmt::format("{}: branches {} and {} can match the same value; oneOf is supported when its branches "
                                                         "have different types or disjoint enums (use anyOf otherwise)", path, i, j));
          }
        }
      }
    }
    one_ofs_.clear();
  }

 private:
  std::vector<Node>& nodes() { return grammar_->nodes; }

  int add(NodeKind kind) {
    if (nodes().size() >= kMaxNodes) throw SchemaError(root_path_, "", fmt::format("{}: the schema is too large", root_path_));
    Node node;
    node.kind = kind;
    nodes().push_back(std::move(node));
    return static_cast<int>(nodes().size()) - 1;
  }

  int literals(std::vector<std::string> texts) {
    std::sort(texts.begin(), texts.end());
    texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
    const int node = add(NodeKind::kLiterals);
    nodes()[node].literals = std::move(texts);
    return node;
  }

  int unsatisfiable() { return literals({}); }

  int number(NodeKind kind) {
    int& cached = kind == NodeKind::kNumber ? number_ : integer_;
    if (cached < 0) cached = add(kind);
    return cached;
  }

  // Any JSON value: object, array, string, number, true/false/null; built once, recursive.
  int any() {
    if (any_ >= 0) return any_;
    any_ = add(NodeKind::kUnion);
    const int object = add(NodeKind::kObject);
    nodes()[object].additional = any_;
    const int array = add(NodeKind::kArray);
    nodes()[array].items = any_;
    const int string = add(NodeKind::kString);
    nodes()[any_].branches = {object, array, string, number(NodeKind::kNumber), literals({"false", "null", "true"})};
    return any_;
  }

  static uint32_t count(const json& schema, const char* key, const std::string& path, uint32_t fallback) {
    if (!schema.contains(key)) return fallback;
    const json& value = schema[key];
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      throw SchemaError(path + "/" + key, key, fmt::format("{}/{}: must be a non-negative integer", path, key));
    }
    return static_cast<uint32_t>(std::min<int64_t>(value.get<int64_t>(), UINT32_MAX - 1));
  }

  int string(const json& schema, const std::string& path) {
    const int node = add(NodeKind::kString);
    nodes()[node].min_count = count(schema, "minLength", path, 0);
    nodes()[node].max_count = count(schema, "maxLength", path, UINT32_MAX);
    if (nodes()[node].min_count > nodes()[node].max_count) {
      throw SchemaError(path, "minLength", fmt::format("{}: minLength is above maxLength", path));
    }
    return node;
  }

  int array(const json& schema, const std::string& path, int depth) {
    const int node = add(NodeKind::kArray);
    int items = -1;
    if (schema.contains("items")) {
      if (schema["items"].is_array()) throw SchemaError(path + "/items", "items", fmt::format("{}/items: a list of item schemas (tuples) is not supported", path));
      items = compile(schema["items"], path + "/items", depth + 1);
    } else {
      items = any();
    }
    Node& array = nodes()[node];
    array.items = items;
    array.min_count = count(schema, "minItems", path, 0);
    array.max_count = count(schema, "maxItems", path, UINT32_MAX);
    if (array.min_count > array.max_count) throw SchemaError(path, "minItems", fmt::format("{}: minItems is above maxItems", path));
    return node;
  }

  std::string key_text(const std::string& name, const std::string& path) const {
    std::string text;
    if (grammar_->syntax == Syntax::kJson) {
      append_json_string(name, text);
      text.erase(0, 1);  // the opening quote is read by the object
      return text;
    }
    const bool bare = !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
      return static_cast<unsigned char>(c) <= 0x20 || std::string_view(" :{}[],\"<").find(c) != std::string_view::npos;
    });
    if (!bare) throw SchemaError(path, "properties", fmt::format("{}: the property name \"{}\" cannot be written as a bare key of a Gemma-4 tool call", path, name));
    return name + ":";
  }

  int object(const json& schema, const std::string& path, int depth) {
    const int node = add(NodeKind::kObject);
    std::vector<Property> properties;
    if (schema.contains("properties")) {
      const json& declared = schema["properties"];
      if (!declared.is_object()) throw SchemaError(path + "/properties", "properties", fmt::format("{}/properties: must be an object", path));
      for (const auto& [name, item] : declared.items()) {
        Property property;
        property.name = name;
        property.key_text = key_text(name, path + "/properties");
        property.node = compile(item, path + "/properties/" + name, depth + 1);
        properties.push_back(std::move(property));
      }
    }
    int additional = any();
    if (schema.contains("additionalProperties")) {
      const json& extra = schema["additionalProperties"];
      additional = extra.is_boolean() && !extra.get<bool>() ? -1 : compile(extra, path + "/additionalProperties", depth + 1);
    }
    if (schema.contains("required")) {
      const json& required = schema["required"];
      const std::string here = path + "/required";
      if (!required.is_array()) throw SchemaError(here, "required", fmt::format("{}: must be a list of property names", here));
      for (const json& name : required) {
        if (!name.is_string()) throw SchemaError(here, "required", fmt::format("{}: must be a list of property names", here));
        auto found = std::find_if(properties.begin(), properties.end(), [&](const Property& p) { return p.name == name.get<std::string>(); });
        if (found == properties.end()) {
          if (additional < 0) {
            throw SchemaError(here, "required", fmt::format("{}: \"{}\" is required, but additionalProperties is false and properties does not declare it",
                                                            here, name.get<std::string>()));
          }
          Property property;
          property.name = name.get<std::string>();
          property.key_text = key_text(property.name, path + "/required");
          property.node = additional;
          properties.push_back(std::move(property));
          found = properties.end() - 1;
        }
        found->required = true;
      }
    }
    if (properties.size() > kMaxProperties) {
      throw SchemaError(path + "/properties", "properties", fmt::format("{}/properties: more than {} properties in one object", path, kMaxProperties));
    }
    std::sort(properties.begin(), properties.end(), [](const Property& a, const Property& b) { return a.key_text < b.key_text; });
    Node& object = nodes()[node];
    object.properties = std::move(properties);
    object.additional = grammar_->syntax == Syntax::kGemma ? -1 : additional;
    return node;
  }

  int reference(const json& target, const std::string& path, int depth) {
    if (!target.is_string()) throw SchemaError(path, "$ref", fmt::format("{}: must be a string", path));
    const std::string ref = target.get<std::string>();
    if (auto found = references_.find(ref); found != references_.end()) return found->second;
    if (ref.empty() || ref[0] != '#') {
      throw SchemaError(path, "$ref", fmt::format("{}: only references into the same schema (\"#...\") are supported, got \"{}\"", path, ref));
    }
    const json* resolved = nullptr;
    try {
      resolved = &document_.at(json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      throw SchemaError(path, "$ref", fmt::format("{}: \"{}\" does not point at a schema in this document", path, ref));
    }
    // The alias is registered before the target compiles, so recursive definitions end here.
    const int alias = add(NodeKind::kUnion);
    references_[ref] = alias;
    const int node = compile(*resolved, root_path_ + ref.substr(1), depth + 1);
    nodes()[alias].branches = {node};
    return alias;
  }

  // JSON types (and, for enums, texts) a node can produce, for oneOf overlap checks.
  unsigned types_of(int node, std::set<int>& visiting) {
    const Node& n = nodes()[node];
    switch (n.kind) {
      case NodeKind::kObject: return kObjectBit;
      case NodeKind::kArray: return kArrayBit;
      case NodeKind::kString: return kStringBit;
      case NodeKind::kNumber: return kNumberBit | kIntegerBit;
      case NodeKind::kInteger: return kNumberBit | kIntegerBit;
      case NodeKind::kLiterals: {
        unsigned types = 0;
        for (const std::string& text : n.literals) {
          const char c = text[0];
          types |= c == '{' ? kObjectBit : c == '[' ? kArrayBit : c == 't' || c == 'f' ? kBooleanBit : c == 'n' ? kNullBit
                 : (c == '"' || static_cast<uint8_t>(c) == kStringDelimiterSymbol) ? kStringBit : (kNumberBit | kIntegerBit);
        }
        return types;
      }
      case NodeKind::kUnion: {
        if (!visiting.insert(node).second) return 0;
        unsigned types = 0;
        for (int branch : n.branches) types |= types_of(branch, visiting);
        visiting.erase(node);
        return types;
      }
    }
    return 0;
  }

  // The literal texts of a branch that is only an enum (through $ref aliases), else nullptr.
  const std::vector<std::string>* literal_texts(int node) {
    for (int hops = 0; hops < 64; ++hops) {
      const Node& n = nodes()[node];
      if (n.kind == NodeKind::kLiterals) return &n.literals;
      if (n.kind != NodeKind::kUnion || n.branches.size() != 1) return nullptr;
      node = n.branches[0];
    }
    return nullptr;
  }

  // Every union's branches become the non-union nodes it reaches, so the automaton forks once.
  void flatten_unions() {
    for (size_t node = 0; node < nodes().size(); ++node) {
      if (nodes()[node].kind != NodeKind::kUnion) continue;
      std::vector<int> flat;
      std::set<int> seen = {static_cast<int>(node)};
      std::vector<int> stack(nodes()[node].branches.rbegin(), nodes()[node].branches.rend());
      while (!stack.empty()) {
        const int branch = stack.back();
        stack.pop_back();
        if (!seen.insert(branch).second) continue;
        if (nodes()[branch].kind == NodeKind::kUnion) {
          stack.insert(stack.end(), nodes()[branch].branches.rbegin(), nodes()[branch].branches.rend());
        } else {
          flat.push_back(branch);
        }
      }
      nodes()[node].branches = std::move(flat);
    }
  }

  // Nodes with at least one finite value: the least fixed point, from nothing.
  std::vector<bool> finite_nodes() {
    std::vector<bool> finite(nodes().size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < nodes().size(); ++i) {
        if (finite[i]) continue;
        const Node& node = nodes()[i];
        bool value = false;
        switch (node.kind) {
          case NodeKind::kObject:
            value = std::all_of(node.properties.begin(), node.properties.end(),
                                [&](const Property& property) { return !property.required || finite[property.node]; });
            break;
          case NodeKind::kArray: value = node.min_count == 0 || (node.items >= 0 && finite[node.items]); break;
          case NodeKind::kString:
          case NodeKind::kNumber:
          case NodeKind::kInteger: value = true; break;
          case NodeKind::kLiterals: value = !node.literals.empty(); break;
          case NodeKind::kUnion:
            value = std::any_of(node.branches.begin(), node.branches.end(), [&](int branch) { return finite[branch]; });
            break;
        }
        if (value) {
          finite[i] = true;
          changed = true;
        }
      }
    }
    return finite;
  }

  void compute_first_bytes() {
    const bool json = grammar_->syntax == Syntax::kJson;
    for (Node& node : nodes()) {
      switch (node.kind) {
        case NodeKind::kObject: node.first_bytes.set('{'); break;
        case NodeKind::kArray: node.first_bytes.set('['); break;
        case NodeKind::kString: node.first_bytes.set(json ? '"' : kStringDelimiterSymbol); break;
        case NodeKind::kNumber:
        case NodeKind::kInteger:
          node.first_bytes.set('-');
          for (char c = '0'; c <= '9'; ++c) node.first_bytes.set(static_cast<uint8_t>(c));
          break;
        case NodeKind::kLiterals:
          for (const std::string& text : node.literals) node.first_bytes.set(static_cast<uint8_t>(text[0]));
          break;
        case NodeKind::kUnion: break;
      }
    }
    for (Node& node : nodes()) {
      if (node.kind != NodeKind::kUnion) continue;
      for (int branch : node.branches) node.first_bytes |= nodes()[branch].first_bytes;
    }
  }

  const json& document_;
  std::string root_path_;
  std::shared_ptr<Grammar> grammar_;
  std::map<std::string, int> references_;
  std::vector<std::pair<int, std::string>> one_ofs_;
  int any_ = -1, number_ = -1, integer_ = -1;
};

}  // namespace

std::string render_value(const json& value, Syntax syntax) {
  std::string text;
  render(value, syntax, text);
  return text;
}

std::shared_ptr<const Grammar> compile_json_schema(const json& schema, Syntax syntax) {
  Compiler compiler(schema, syntax, "#");
  const int root = compiler.compile(schema, "#", 0);
  compiler.grammar().root = root;
  return compiler.finish({{root, "#"}});
}

std::shared_ptr<const Grammar> json_object_grammar() {
  static const std::shared_ptr<const Grammar> grammar = compile_json_schema(json{{"type", "object"}});
  return grammar;
}

std::shared_ptr<const Grammar> compile_tool_calls(const std::vector<ToolSchema>& tools) {
  if (tools.empty()) throw SchemaError("tools", "", "no tool to call");
  // All tools share one node table; each one's $refs resolve inside its own parameters.
  auto grammar = std::make_shared<Grammar>();
  grammar->syntax = Syntax::kGemma;
  std::vector<std::pair<int, std::string>> roots;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolSchema& tool = tools[i];
    const std::string path = fmt::format("tools[{}].function.parameters", i);
    const bool name_ok = !tool.name.empty() && std::none_of(tool.name.begin(), tool.name.end(), [](char c) {
      return static_cast<unsigned char>(c) <= 0x20 || std::string_view("<>{}[],\":").find(c) != std::string_view::npos;
    });
    if (!name_ok) throw SchemaError(fmt::format("tools[{}].function.name", i), "", fmt::format("tools[{}]: the name \"{}\" cannot be written in a Gemma-4 tool call", i, tool.name));
    if (!names.insert(tool.name).second) throw SchemaError(fmt::format("tools[{}].function.name", i), "", fmt::format("tools[{}]: two tools are named \"{}\"", i, tool.name));
    const json parameters = tool.parameters.is_null() ? json{{"type", "object"}, {"properties", json::object()}} : tool.parameters;
    Compiler compiler(parameters, Syntax::kGemma, path);
    compiler.grammar().nodes = std::move(grammar->nodes);
    int root = compiler.compile(parameters, path, 0);
    compiler.check_one_ofs();
    // Follow $ref aliases to the object itself.
    for (int hops = 0; hops < 64 && compiler.grammar().nodes[root].kind == NodeKind::kUnion &&
                       compiler.grammar().nodes[root].branches.size() == 1; ++hops) {
      root = compiler.grammar().nodes[root].branches[0];
    }
    if (compiler.grammar().nodes[root].kind != NodeKind::kObject) {
      throw SchemaError(path, "type", fmt::format("{}: a tool's parameters must be one object schema", path));
    }
    grammar->nodes = std::move(compiler.grammar().nodes);
    grammar->tools.push_back({"call:" + tool.name + "{", root});
    roots.emplace_back(root, path);
  }
  std::sort(grammar->tools.begin(), grammar->tools.end(), [](const ToolEntry& a, const ToolEntry& b) { return a.prefix < b.prefix; });
  // The finishing passes run over the whole table once.
  static const json kNoDocument;  // the finishing passes resolve no $ref
  Compiler finisher(kNoDocument, Syntax::kGemma, "tools");
  finisher.grammar().nodes = std::move(grammar->nodes);
  finisher.grammar().tools = std::move(grammar->tools);
  return finisher.finish(roots);
}

}  // namespace gemma4rt::constrain
