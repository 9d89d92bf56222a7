// Oracle for the C++ chat format: renders every conversation in chat_cases.json with the published
// Gemma-4 large-model chat template (@huggingface/jinja) and writes the texts for chat_format_test.cc.
//
//   node tests/e2e/render_templates.mjs <test_data_dir> <out.json>
//
// Exits non-zero on any failure (unreadable input, a template error, a `same_as` pair that differs).
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const kTemplateFile = "google-gemma-4-31B-it.jinja";
// The other published revision; rendered for information only (see the report in chat_format.h).
const kInterleavedFile = "google-gemma-4-31B-it-interleaved.jinja";

// The published template has no branch for a role:"tool" message whose content is a JSON object: both
// Jinja engines treat a mapping as a sequence there and fail or render nothing. A server parses OpenAI's
// string content into an object (models/README.md), so the oracle adds the one missing branch, reusing
// the template's own format_tool_response_block, which the native `tool_responses` form already uses.
const kToolBodyBranch = "{%- if tool_body is string -%}";
const kToolBodyObjectBranch =
  "{%- if tool_body is mapping -%}{{- format_tool_response_block(ns_tname.name, tool_body) -}}" +
  "{%- elif tool_body is string -%}";

function parseObject(text) {
  try {
    const value = JSON.parse(text);
    return value !== null && typeof value === "object" && !Array.isArray(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

// What gemma4rt does before rendering when parse_json_strings is on: tool-call arguments and tool
// results that arrive as JSON text holding an object become that object.
function parseJsonStrings(messages) {
  return messages.map((message) => {
    const copy = structuredClone(message);
    if (copy.role === "tool" && typeof copy.content === "string") {
      const parsed = parseObject(copy.content);
      if (parsed !== undefined) copy.content = parsed;
    }
    for (const call of Array.isArray(copy.tool_calls) ? copy.tool_calls : []) {
      if (call && call.function && typeof call.function.arguments === "string") {
        const parsed = parseObject(call.function.arguments);
        if (parsed !== undefined) call.function.arguments = parsed;
      }
    }
    return copy;
  });
}

function main() {
  const [testDataDir, outPath] = process.argv.slice(2);
  if (!testDataDir || !outPath) {
    throw new Error("usage: node render_templates.mjs <test_data_dir> <out.json>");
  }
  const casesPath = join(dirname(fileURLToPath(import.meta.url)), "chat_cases.json");
  const { cases } = JSON.parse(readFileSync(casesPath, "utf8"));
  const source = readFileSync(join(testDataDir, "templates", kTemplateFile), "utf8");
  const interleavedSource = readFileSync(join(testDataDir, "templates", kInterleavedFile), "utf8");
  if (source.split(kToolBodyBranch).length !== 2) {
    throw new Error(`${kTemplateFile}: expected exactly one '${kToolBodyBranch}' to extend`);
  }
  const published = new Template(source);
  const withObjectToolContent = new Template(source.replace(kToolBodyBranch, kToolBodyObjectBranch));
  const interleaved = new Template(interleavedSource);

  const names = new Set();
  const out = [];
  for (const c of cases) {
    if (!c.name || names.has(c.name)) throw new Error(`case name missing or repeated: ${c.name}`);
    names.add(c.name);
    const options = {
      tools: c.tools ?? null,
      enable_thinking: c.enable_thinking ?? false,
      add_generation_prompt: c.add_generation_prompt ?? true,
      parse_json_strings: c.parse_json_strings ?? true,
    };
    const messages = options.parse_json_strings ? parseJsonStrings(c.messages) : c.messages;
    const hasObjectToolContent = messages.some(
      (m) => m.role === "tool" && m.content !== null && typeof m.content === "object" && !Array.isArray(m.content),
    );
    const context = {
      messages,
      tools: options.tools,
      bos_token: "<bos>",
      add_generation_prompt: options.add_generation_prompt,
      enable_thinking: options.enable_thinking,
    };
    let rendered;
    try {
      rendered = (hasObjectToolContent ? withObjectToolContent : published).render(context);
    } catch (error) {
      throw new Error(`case ${c.name}: ${error.message}`);
    }
    let renderedInterleaved;
    try {
      renderedInterleaved = interleaved.render(context);
    } catch (error) {
      renderedInterleaved = `error: ${error.message}`;
    }
    out.push({
      name: c.name,
      messages: c.messages,
      tools: options.tools,
      enable_thinking: options.enable_thinking,
      add_generation_prompt: options.add_generation_prompt,
      parse_json_strings: options.parse_json_strings,
      template: hasObjectToolContent ? `${kTemplateFile} + object tool content branch` : kTemplateFile,
      rendered,
      rendered_interleaved: renderedInterleaved,
      same_as: c.same_as ?? null,
    });
  }

  const byName = new Map(out.map((c) => [c.name, c]));
  for (const c of out) {
    if (c.same_as === null) continue;
    const other = byName.get(c.same_as);
    if (!other) throw new Error(`case ${c.name}: same_as names unknown case ${c.same_as}`);
    if (other.rendered !== c.rendered) {
      throw new Error(`case ${c.name} should render like ${c.same_as}:\n${JSON.stringify(c.rendered)}\n${JSON.stringify(other.rendered)}`);
    }
  }

  writeFileSync(outPath, JSON.stringify({ template: kTemplateFile, cases: out }, null, 1) + "\n");
  console.log(`rendered ${out.length} chat cases to ${outPath}`);
}

try {
  main();
} catch (error) {
  console.error(`render_templates.mjs: ${error.message}`);
  process.exit(1);
}
