// Compiles what a request asks for into a Grammar: a JSON Schema (the subset below), any JSON object
// (response_format json_object), or forced tool calls whose arguments follow each tool's schema.
//
// Supported: type (one or a list), properties, required, additionalProperties (false, true or a
// schema), enum, const, items (one schema), minItems/maxItems, minLength/maxLength, anyOf, oneOf
// (branches of different types or disjoint enums), $ref to "#", "#/$defs/..." or any other pointer
// into the same document, boolean schemas; annotations (title, description, default, examples,
// $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Any other keyword is a
// SchemaError naming it, never silently dropped. A schema no finite value satisfies (a required
// property that recurses forever, minItems above maxItems, an empty enum) is a SchemaError too.
//
// Where a schema leaves a choice the grammar narrows it to values that always validate: without
// `type`, the keywords decide it (properties -> object, items -> array, minLength -> string);
// integers are written as digits; extra keys never use escapes (declared ones may); in tool-call
// arguments only declared properties are written.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "constrain/grammar.h"

namespace gemma4rt::constrain {

// Throws SchemaError.
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, Syntax syntax = Syntax::kJson);

// Any JSON object (OpenAI's json_object mode).
std::shared_ptr<const Grammar> json_object_grammar();

struct ToolSchema {
  std::string name;
  nlohmann::json parameters;  // a JSON Schema of an object; null: no arguments
};

// One or more calls <|tool_call>call:NAME{...}<tool_call|>, each naming one of `tools`, in Gemma-4's
// argument syntax. Throws SchemaError with a path starting "tools[i]".
std::shared_ptr<const Grammar> compile_tool_calls(const std::vector<ToolSchema>& tools);

// The text of a JSON value in the given syntax, as the grammar writes enum and const values: compact,
// '<' in JSON strings written \u003c.
std::string render_value(const nlohmann::json& value, Syntax syntax);

}  // namespace gemma4rt::constrain
