// Structured output end to end: response_format json_schema / json_object and forced tool calls
// against a real `gemma4rt serve`, on a trained fixture and on a random-weight model with the real
// 262,144-token Gemma-4 vocabulary (which writes anything at all unless constrained). Every completed
// output must parse and validate under ajv (pinned in package.json), an independent JSON Schema
// validator; outputs cut by max_tokens must say finish_reason "length".
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

import Ajv2020Module from 'ajv/dist/2020.js';

import { BINARY, MODELS, openStream, postJson, startServer } from './serve_harness.mjs';

const Ajv2020 = Ajv2020Module.default ?? Ajv2020Module;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const CORPUS = JSON.parse(readFileSync(path.join(HERE, 'structured_output_schemas.json'), 'utf8'));
const TOKENIZER = path.join(process.env.GEMMA4RT_TEST_WORK ?? '', 'gemma4-tokenizer.json');
const THREADS = ['--threads', '1'];
// Generous: beside the rest of the suite on 2 cores a request can take many times its usual second.
const TIMEOUT_MS = 180000;

// strictTypes off: schemas without `type` (inferred from their keywords) are part of the corpus.
const ajv = new Ajv2020({ strict: true, strictTypes: false, allErrors: true });
const validators = new Map(CORPUS.map(({ name, schema }) => [name, ajv.compile(schema)]));

function assertValid(validate, text, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    assert.fail(`${what}: the completed output is not JSON (${error.message}): ${JSON.stringify(text)}`);
  }
  assert.ok(validate(value), `${what}: ${JSON.stringify(text)} does not validate: ${ajv.errorsText(validate.errors)}`);
  return value;
}

// A random-weight checkpoint of the E2B layout (2 layers, hidden 64) with the real tokenizer.
function makeRandomModel() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'gemma4rt-structured-'));
  const out = path.join(dir, 'random-e2b');
  const made = spawnSync(BINARY, ['make-model', '--config', path.join(HERE, '..', 'data', 'structured_output', 'random-e2b-config.json'),
    '--tokenizer', TOKENIZER, '--seed', '5', '--out', out], { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  return { dir, out };
}

// Random-model requests sample with top_k 40: the sampler sorts every candidate without it, and
// a mask inside a string keeps ~254,000 of them.
const schemaFormat = (schema) => ({ type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } });

describe('structured output on a random-weight model (real vocabulary)', () => {
  let model;
  let server;
  before(async () => {
    model = makeRandomModel();
    server = await startServer(path.relative(MODELS, model.out), [...THREADS, '--parallel', '4']);
  });
  after(async () => {
    await server?.stop();
    if (model) rmSync(model.dir, { recursive: true, force: true });
  });

  const complete = (schema, seed, extra = {}) =>
    postJson(server, '/v1/completions', {
      prompt: `Answer ${seed}:`, temperature: 1, top_k: 40, seed, max_tokens: 100, response_format: schemaFormat(schema), ...extra,
    }, { timeoutMs: TIMEOUT_MS });

  it('completes outputs that validate for every schema of the corpus', async (t) => {
    let completed = 0;
    const jobs = CORPUS.map(({ name, schema }) => async () => {
      const answer = await complete(schema, 1);
      assert.equal(answer.status, 200, `${name}: ${answer.text}`);
      const choice = answer.json.choices[0];
      if (choice.finish_reason === 'stop') {
        assertValid(validators.get(name), choice.text, name);
        ++completed;
      } else {
        assert.equal(choice.finish_reason, 'length', `${name}: ${answer.text}`);
        assert.equal(answer.json.usage.completion_tokens, 100);
      }
    });
    // Four at a time: the server batches them, as it would any client's.
    for (let i = 0; i < jobs.length; i += 4) await Promise.all(jobs.slice(i, i + 4).map((job) => job()));
    // Most schemas of the corpus bound their strings and arrays, so most outputs finish.
    t.diagnostic(`${completed} of ${jobs.length} outputs completed`);
    assert.ok(completed >= jobs.length * 0.75, `only ${completed} of ${jobs.length} outputs completed`);
  });

  it('keeps json_object outputs objects, and reports cut ones as length', async () => {
    const validate = ajv.compile({ type: 'object' });
    const answers = await Promise.all([3, 4, 5, 6].map((seed) => complete(null, seed, { max_tokens: 60, response_format: { type: 'json_object' } })));
    for (const answer of answers) {
      assert.equal(answer.status, 200, answer.text);
      const choice = answer.json.choices[0];
      if (choice.finish_reason === 'stop') {
        assertValid(validate, choice.text, 'json_object');
      } else {
        assert.equal(choice.finish_reason, 'length');
        assert.throws(() => JSON.parse(choice.text), `a cut output parsed as JSON: ${choice.text}`);
      }
    }
  });

  it('streams the same constrained text as it answers whole', async () => {
    for (const name of ['nested', 'escaped_keys', 'numbers_record', 'recursive_tree']) {
      const schema = CORPUS.find((entry) => entry.name === name).schema;
      const whole = await complete(schema, 9);
      assert.equal(whole.status, 200, whole.text);
      const { events } = await openStream(server, '/v1/completions', {
        prompt: 'Answer 9:', temperature: 1, top_k: 40, seed: 9, max_tokens: 100, response_format: schemaFormat(schema),
      }, { timeoutMs: TIMEOUT_MS });
      let text = '';
      let finish = null;
      for await (const event of events) {
        if (event === '[DONE]') break;
        text += event.choices[0].text ?? '';
        finish = event.choices[0].finish_reason ?? finish;
      }
      assert.equal(text, whole.json.choices[0].text, name);
      assert.equal(finish, whole.json.choices[0].finish_reason, name);
    }
  });

  it('keeps constrained and free requests in one batch isolated', async () => {
    const free = (seed) => postJson(server, '/v1/completions', { prompt: `Tell ${seed}`, temperature: 1, top_k: 40, seed, max_tokens: 30, ignore_eos: true },
      { timeoutMs: TIMEOUT_MS });
    const names = ['person', 'any_of_objects', 'event'];
    const schemaOf = (name) => CORPUS.find((entry) => entry.name === name).schema;
    const alone = [];
    for (let i = 0; i < names.length; ++i) {
      alone.push((await complete(schemaOf(names[i]), 20 + i)).json.choices[0].text);
      alone.push((await free(30 + i)).json.choices[0].text);
    }
    // A greedy free request takes the argmax-only path alone and the logits path beside constrained ones.
    const greedy = () => postJson(server, '/v1/completions', { prompt: 'Tell 40', temperature: 0, max_tokens: 30, ignore_eos: true },
      { timeoutMs: TIMEOUT_MS });
    alone.push((await greedy()).json.choices[0].text);
    const together = await Promise.all([...names.flatMap((name, i) => [complete(schemaOf(name), 20 + i), free(30 + i)]), greedy()]);
    assert.deepEqual(together.map((answer) => answer.json.choices[0].text), alone);
  });

  it('says length, not a truncated value, when max_tokens is too small', async () => {
    const answer = await complete({ const: 'a long constant that needs many tokens to write out in full' }, 1, { max_tokens: 3 });
    assert.equal(answer.status, 200, answer.text);
    assert.equal(answer.json.choices[0].finish_reason, 'length');
    assert.throws(() => JSON.parse(answer.json.choices[0].text));
  });

  it('forces tool calls whose arguments validate against the tool', async (t) => {
    const tools = [
      { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'unit'] } } },
      { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'number' }, note: { type: 'array', items: { type: 'boolean' }, maxItems: 2 } }, required: ['a', 'b'] } } },
    ];
    const validate = new Map(tools.map((tool) => [tool.function.name, ajv.compile(tool.function.parameters)]));
    let calls = 0;
    for (const [seed, choice] of [[1, 'required'], [2, 'required'], [3, { type: 'function', function: { name: 'add' } }], [4, { type: 'function', function: { name: 'get_weather' } }]]) {
      const answer = await postJson(server, '/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Use a tool.' }], tools, tool_choice: choice, temperature: 1, top_k: 40, seed, max_tokens: 100,
      }, { timeoutMs: TIMEOUT_MS });
      assert.equal(answer.status, 200, answer.text);
      const result = answer.json.choices[0];
      if (result.finish_reason === 'length') continue;
      assert.equal(result.finish_reason, 'tool_calls', answer.text);
      assert.ok(result.message.tool_calls.length >= 1, answer.text);
      for (const call of result.message.tool_calls) {
        if (typeof choice === 'object') assert.equal(call.function.name, choice.function.name);
        assert.ok(validate.has(call.function.name), answer.text);
        assertValid(validate.get(call.function.name), call.function.arguments, `${call.function.name} arguments`);
        ++calls;
      }
    }
    t.diagnostic(`${calls} forced calls completed`);
    assert.ok(calls >= 2, `only ${calls} forced calls completed`);
  });
});

describe('structured output on a trained fixture (tiny-e2b-agent)', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b-agent', [...THREADS, '--parallel', '4']);
  });
  after(async () => server?.stop());

  it('answers chat requests with outputs that validate for every schema of the corpus', async (t) => {
    let completed = 0;
    for (let i = 0; i < CORPUS.length; i += 4) {
      await Promise.all(CORPUS.slice(i, i + 4).map(async ({ name, schema }) => {
        const answer = await postJson(server, '/v1/chat/completions', {
          messages: [{ role: 'user', content: 'What is the capital of France?' }],
          temperature: 0, max_tokens: 160, response_format: schemaFormat(schema),
        }, { timeoutMs: TIMEOUT_MS });
        assert.equal(answer.status, 200, `${name}: ${answer.text}`);
        const choice = answer.json.choices[0];
        if (choice.finish_reason === 'stop') {
          assertValid(validators.get(name), choice.message.content, name);
          ++completed;
        } else {
          assert.equal(choice.finish_reason, 'length', `${name}: ${answer.text}`);
        }
      }));
    }
    t.diagnostic(`${completed} of ${CORPUS.length} outputs completed`);
    assert.ok(completed >= CORPUS.length * 0.75, `only ${completed} of ${CORPUS.length} outputs completed`);
  });

  it('forces the named tool with arguments that validate', async () => {
    const parameters = { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] };
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters } },
      { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
    const answer = await postJson(server, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'What is the capital of France?' }], tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 0, max_tokens: 60,
    }, { timeoutMs: TIMEOUT_MS });
    assert.equal(answer.status, 200, answer.text);
    const choice = answer.json.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', answer.text);
    assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
    assertValid(ajv.compile(parameters), choice.message.tool_calls[0].function.arguments, 'get_weather arguments');
  });

  it('answers bad structured-output requests with a 400 that names the problem', async () => {
    const chat = (extra) => postJson(server, '/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, ...extra });
    const cases = [
      [{ response_format: schemaFormat({ type: 'string', pattern: '^a' }) }, 'response_format', /'pattern'/],
      [{ response_format: schemaFormat({ type: 'object', properties: { n: { type: 'integer', minimum: 0 } } }) }, 'response_format', /'minimum'.*#\/properties\/n|#\/properties\/n.*'minimum'/],
      [{ response_format: schemaFormat({ $ref: '#' }) }, 'response_format', /no finite value/],
      [{ response_format: schemaFormat({ type: 'array', minItems: 2, maxItems: 1 }) }, 'response_format', /minItems/],
      [{ response_format: schemaFormat({ $ref: '#/$defs/missing' }) }, 'response_format', /does not point/],
      [{ response_format: schemaFormat({ oneOf: [{ type: 'number' }, { type: 'integer' }] }) }, 'response_format', /oneOf/],
      [{ response_format: schemaFormat({ type: 'nope' }) }, 'response_format', /not a JSON Schema type/],
      [{ response_format: { type: 'json_schema' } }, 'response_format', /json_schema/],
      [{ response_format: { type: 'yaml' } }, 'response_format', /yaml/],
      [{ response_format: { type: 'json_object' }, stop: ['}'] }, 'stop', /stop/],
      [{ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }, 'tool_choice', /'g'/],
      [{ tool_choice: 'required' }, 'tool_choice', /tools/],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: {} } } } } }], tool_choice: 'required' }, 'tools', /'not'/],
    ];
    for (const [extra, param, message] of cases) {
      const answer = await chat(extra);
      assert.equal(answer.status, 400, `${JSON.stringify(extra)}: ${answer.text}`);
      assert.equal(answer.json.error.param, param, answer.text);
      assert.match(answer.json.error.message, message);
    }
    const completion = await postJson(server, '/v1/completions', { prompt: 'Hi', response_format: schemaFormat({ type: 'object', allOf: [] }) });
    assert.equal(completion.status, 400, completion.text);
    assert.match(completion.json.error.message, /'allOf'/);
  });
});
