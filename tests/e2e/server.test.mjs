// End-to-end tests of `gemma4rt serve`, the OpenAI-compatible HTTP server, with the official `openai`
// client and raw HTTP. Each group starts its own server on a free port of 127.0.0.1 with a trained tiny
// model of models/ (see models/README.md) and kills it afterwards.
//
//   GEMMA4RT_BINARY=build/gemma4rt GEMMA4RT_MODELS=models node --test tests/e2e/server.test.mjs
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import OpenAI from 'openai';

import {
  BINARY,
  MODELS,
  checkEnvironment,
  isErrorObject,
  loadCoherence,
  loadPieces,
  metrics,
  openStream,
  postJson,
  request,
  startServer,
  waitFor,
} from './serve_harness.mjs';

checkEnvironment();

// One engine thread per server: the machine may have only two cores, and the tests also need one.
const THREADS = ['--threads', '1'];

function clientFor(server, options = {}) {
  return new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 30000, ...options });
}

const E2B = loadCoherence('tiny-e2b');
const AGENT = loadCoherence('tiny-e2b-agent');
const byKind = (fixture, kind) => fixture.prompts.filter((prompt) => prompt.kind === kind);
const E2B_CHAT = byKind(E2B, 'chat_capital_of_country');
const E2B_REVERSE = byKind(E2B, 'chat_country_of_capital');
const E2B_RAW = byKind(E2B, 'raw_completion');
const FRANCE = E2B_CHAT.find((prompt) => prompt.country === 'France');
const FRANCE_RAW = E2B_RAW.find((prompt) => prompt.country === 'France');

// Collects a streamed chat completion made with the openai client.
async function collectChatStream(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const result = { chunks, content: '', reasoning: '', finishReasons: [], toolCalls: [], usage: null, logprobs: [] };
  for (const chunk of chunks) {
    if (chunk.usage) result.usage = chunk.usage;
    for (const choice of chunk.choices) {
      const delta = choice.delta ?? {};
      if (typeof delta.content === 'string') result.content += delta.content;
      if (typeof delta.reasoning_content === 'string') result.reasoning += delta.reasoning_content;
      for (const call of delta.tool_calls ?? []) {
        const index = call.index ?? 0;
        result.toolCalls[index] ??= { id: '', type: '', name: '', arguments: '' };
        const entry = result.toolCalls[index];
        if (call.id) entry.id += call.id;
        if (call.type) entry.type = call.type;
        if (call.function?.name) entry.name += call.function.name;
        if (call.function?.arguments) entry.arguments += call.function.arguments;
      }
      if (choice.logprobs?.content) result.logprobs.push(...choice.logprobs.content);
      if (choice.finish_reason) result.finishReasons.push(choice.finish_reason);
    }
  }
  return result;
}

function assertErrorResponse(response, { status, type, what }) {
  const label = `${what}: ${response.status} ${response.text.slice(0, 300)}`;
  if (status !== undefined) assert.equal(response.status, status, label);
  else assert.ok(response.status >= 400 && response.status < 500, `expected a 4xx status: ${label}`);
  assert.ok(isErrorObject(response), `expected {error: {message, type}}: ${label}`);
  assert.match(response.headers.get('content-type') ?? '', /application\/json/, label);
  if (type) assert.equal(response.json.error.type, type, label);
}

// ---------------------------------------------------------------------------------------------------
describe('openai client against tiny-e2b', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS]);
    client = clientFor(server);
  });
  after(async () => server?.stop());

  it('answers chat questions exactly, with consistent usage', async () => {
    for (const prompt of [...E2B_CHAT.slice(0, 5), ...E2B_REVERSE.slice(0, 3)]) {
      const completion = await client.chat.completions.create({ model: 'tiny-e2b', messages: prompt.messages, temperature: 0, max_tokens: 40 });
      assert.equal(completion.object, 'chat.completion');
      assert.equal(completion.model, 'tiny-e2b');
      assert.match(completion.id, /\S/);
      assert.equal(completion.choices.length, 1);
      const [choice] = completion.choices;
      assert.equal(choice.index, 0);
      assert.equal(choice.message.role, 'assistant');
      assert.equal(choice.message.content, prompt.expected_text, prompt.id);
      assert.equal(choice.finish_reason, 'stop', prompt.id);
      assert.equal(completion.usage.prompt_tokens, prompt.input_ids.length, `${prompt.id} prompt_tokens`);
      assert.equal(completion.usage.completion_tokens, prompt.output_ids.length, `${prompt.id} completion_tokens (stop token included)`);
      assert.equal(completion.usage.total_tokens, prompt.input_ids.length + prompt.output_ids.length);
    }
  });

  it('streams chat: role first, the same content as the whole answer, a finish reason and usage', async () => {
    for (const prompt of [FRANCE, E2B_CHAT[3], E2B_REVERSE[1]]) {
      const whole = await client.chat.completions.create({ messages: prompt.messages, model: 'tiny-e2b', temperature: 0 });
      const streamed = await collectChatStream(
        await client.chat.completions.create({ messages: prompt.messages, model: 'tiny-e2b', temperature: 0, stream: true, stream_options: { include_usage: true } }),
      );
      const { chunks } = streamed;
      assert.ok(chunks.length >= 3, `${prompt.id}: ${chunks.length} chunks`);
      assert.equal(chunks[0].choices[0].delta.role, 'assistant', 'the first chunk carries the role');
      for (const chunk of chunks) {
        assert.equal(chunk.object, 'chat.completion.chunk');
        assert.equal(chunk.id, chunks[0].id, 'one id for the whole stream');
      }
      assert.equal(streamed.content, whole.choices[0].message.content, prompt.id);
      assert.equal(streamed.content, prompt.expected_text, prompt.id);
      assert.deepEqual(streamed.finishReasons, ['stop']);
      const last = chunks.at(-1);
      assert.deepEqual(last.choices, [], 'the usage chunk has no choices');
      // The same prompt again starts from the K/V the whole answer left: all but its last token.
      assert.deepEqual(last.usage, { ...whole.usage, prompt_tokens_details: { cached_tokens: whole.usage.prompt_tokens - 1 } });
      assert.equal(last.usage.completion_tokens, prompt.output_ids.length);
      // Without include_usage there is no usage chunk.
      const plain = await collectChatStream(await client.chat.completions.create({ messages: prompt.messages, model: 'tiny-e2b', temperature: 0, stream: true }));
      assert.equal(plain.content, prompt.expected_text);
      assert.equal(plain.usage ?? null, null);
      assert.deepEqual(plain.finishReasons, ['stop']);
    }
  });

  it('completes raw prompts without the chat format; <bos> is prepended when missing', async () => {
    for (const prompt of E2B_RAW.slice(0, 6)) {
      const completion = await client.completions.create({ model: 'tiny-e2b', prompt: prompt.text, temperature: 0, max_tokens: 40 });
      assert.equal(completion.object, 'text_completion');
      assert.equal(completion.choices[0].text, prompt.expected_text, prompt.id);
      assert.equal(completion.choices[0].finish_reason, 'stop');
      assert.equal(completion.usage.prompt_tokens, prompt.input_ids.length);
      assert.equal(completion.usage.completion_tokens, prompt.output_ids.length);
      assert.ok(prompt.text.startsWith('<bos>'));
      const withoutBos = await client.completions.create({ model: 'tiny-e2b', prompt: prompt.text.slice('<bos>'.length), temperature: 0, max_tokens: 40 });
      assert.equal(withoutBos.choices[0].text, prompt.expected_text, `${prompt.id} without <bos>`);
      assert.equal(withoutBos.usage.prompt_tokens, prompt.input_ids.length);
      // Token ids as the prompt.
      const ids = await client.completions.create({ model: 'tiny-e2b', prompt: prompt.input_ids, temperature: 0, max_tokens: 40 });
      assert.equal(ids.choices[0].text, prompt.expected_text, `${prompt.id} as ids`);
    }
    const stream = await client.completions.create({ model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0, stream: true });
    let text = '';
    const reasons = [];
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      if (chunk.choices[0]?.finish_reason) reasons.push(chunk.choices[0].finish_reason);
    }
    assert.equal(text, ' Paris.');
    assert.deepEqual(reasons, ['stop']);
  });

  it('streams non-ASCII answers (byte fallback) whole, in chat and raw completions', async () => {
    const nonAscii = E2B.prompts.filter((prompt) => /[^\x00-\x7f]/.test(prompt.expected_text));
    assert.ok(nonAscii.length >= 10, `${nonAscii.length} non-ASCII answers`);
    for (const prompt of nonAscii) {
      if (prompt.messages) {
        const whole = await client.chat.completions.create({ model: 'tiny-e2b', messages: prompt.messages, temperature: 0, logprobs: true });
        assert.equal(whole.choices[0].message.content, prompt.expected_text, prompt.id);
        // Byte tokens show as U+FFFD in `token`, but their bytes add up to the answer.
        const bytes = whole.choices[0].logprobs.content.flatMap((entry) => entry.bytes);
        assert.equal(Buffer.from(bytes).toString('utf8'), prompt.expected_text, `${prompt.id}: logprob bytes`);
        const streamed = await collectChatStream(await client.chat.completions.create({ model: 'tiny-e2b', messages: prompt.messages, temperature: 0, stream: true }));
        assert.equal(streamed.content, prompt.expected_text, `${prompt.id} streamed`);
        for (const chunk of streamed.chunks) assert.ok(!(chunk.choices[0]?.delta?.content ?? '').includes('\uFFFD'), `${prompt.id}: a broken character in a chunk`);
      } else {
        const whole = await client.completions.create({ model: 'tiny-e2b', prompt: prompt.text, temperature: 0, logprobs: 1 });
        assert.equal(whole.choices[0].text, prompt.expected_text, prompt.id);
        // Offsets advance by each token's bytes, one byte for a byte-fallback token.
        const { text_offset: offsets, tokens } = whole.choices[0].logprobs;
        assert.equal(offsets[0], 0);
        assert.ok(offsets.every((offset, i) => i === 0 || offset > offsets[i - 1]));
        assert.equal(tokens.at(-1), '.');
        assert.equal(offsets.at(-1), Buffer.byteLength(prompt.expected_text) - 1, `${prompt.id}: ${offsets}`);
        let text = '';
        for await (const chunk of await client.completions.create({ model: 'tiny-e2b', prompt: prompt.text, temperature: 0, stream: true })) {
          const piece = chunk.choices[0]?.text ?? '';
          assert.ok(!piece.includes('\uFFFD'), `${prompt.id}: a broken character in a chunk`);
          text += piece;
        }
        assert.equal(text, prompt.expected_text, `${prompt.id} streamed`);
      }
    }
  });

  it('accepts content as a list of text parts', async () => {
    const completion = await client.chat.completions.create({
      model: 'tiny-e2b', temperature: 0, messages: [{ role: 'user', content: [{ type: 'text', text: FRANCE.messages[0].content }] }],
    });
    assert.equal(completion.choices[0].message.content, FRANCE.expected_text);
    assert.equal(completion.usage.prompt_tokens, FRANCE.input_ids.length);
  });

  it('ends at max_tokens with finish_reason length', async () => {
    for (const budget of [{ max_tokens: 3 }, { max_completion_tokens: 3 }]) {
      const chat = await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0, ...budget });
      assert.equal(chat.choices[0].finish_reason, 'length');
      assert.equal(chat.usage.completion_tokens, 3);
      assert.equal(chat.choices[0].message.content, 'The capital of');
    }
    const streamed = await collectChatStream(await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0, max_tokens: 3, stream: true }));
    assert.deepEqual(streamed.finishReasons, ['length']);
    assert.equal(streamed.content, 'The capital of');
    const raw = await client.completions.create({ model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0, max_tokens: 1 });
    assert.equal(raw.choices[0].text, ' Paris');
    assert.equal(raw.choices[0].finish_reason, 'length');
  });

  it('samples greedily with top_k 1 or min_p 1 whatever the temperature', async () => {
    for (const extra of [{ top_k: 1 }, { min_p: 1 }, { top_p: 0 }]) {
      for (const seed of [3, 4]) {
        const completion = await client.chat.completions.create({ model: 'tiny-e2b', messages: E2B_CHAT[4].messages, temperature: 2, seed, ...extra });
        assert.equal(completion.choices[0].message.content, E2B_CHAT[4].expected_text, JSON.stringify(extra));
      }
    }
  });

  it('applies logit_bias: +100 forces a token, -100 bans the greedy one, logprobs stay the model\'s own', async () => {
    const plain = await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0, max_tokens: 1, logprobs: true, top_logprobs: 2 });
    const [best, second] = plain.choices[0].logprobs.content[0].top_logprobs;
    const ids = (await postJson(server, '/tokenize', { content: best.token + second.token, with_pieces: true })).json.tokens;
    assert.deepEqual(ids.map((entry) => entry.piece), [best.token, second.token], 'the two pieces tokenize back to themselves');
    const bestId = ids[0].id;

    const banned = await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0, max_tokens: 1,
      logit_bias: { [bestId]: -100 }, logprobs: true, top_logprobs: 2 });
    const first = banned.choices[0].logprobs.content[0];
    assert.equal(first.token, second.token, 'the runner-up replaces the banned token');
    assert.ok(Math.abs(first.logprob - second.logprob) < 1e-4, `${first.logprob} against ${second.logprob}: the model's own log-probability`);
    assert.deepEqual(first.top_logprobs.map((entry) => entry.token), [best.token, second.token], 'alternatives are unbiased');

    const he = (await postJson(server, '/tokenize', { content: 'he' })).json.tokens;
    assert.equal(he.length, 1, 'one token');
    const forced = await postJson(server, '/v1/completions', { prompt: FRANCE_RAW.text, temperature: 0.7, seed: 1, max_tokens: 4, logit_bias: { [he[0]]: 100 } });
    assert.equal(forced.status, 200, forced.text);
    assert.equal(forced.json.choices[0].text, 'hehehehe');

    for (const [bias, what] of [[{ '-1': 1 }, '-1'], [{ 1e9: 1 }, 'not a token id'], [{ '3x': 1 }, '3x'], [{ 3: 100.5 }, '-100 to 100'], [{ 3: '5' }, '-100 to 100'], [[3], 'object']]) {
      const refused = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, logit_bias: bias });
      assertErrorResponse(refused, { status: 400, type: 'invalid_request_error', what: JSON.stringify(bias) });
      assert.equal(refused.json.error.param, 'logit_bias');
      assert.ok(refused.json.error.message.includes(what), refused.json.error.message);
    }
  });

  it('frames streams as server-sent events', async () => {
    for (const [route, body] of [['/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 }], ['/v1/completions', { prompt: FRANCE_RAW.text, temperature: 0 }]]) {
      const stream = await openStream(server, route, body);
      assert.equal(stream.response.status, 200);
      assert.match(stream.response.headers.get('content-type'), /^text\/event-stream/);
      const events = [];
      for await (const event of stream.events) events.push(event);
      assert.equal(events.at(-1), '[DONE]');
      assert.equal(events.indexOf('[DONE]'), events.length - 1, 'nothing after [DONE]');
      const chunks = events.slice(0, -1);
      assert.equal(new Set(chunks.map((chunk) => chunk.id)).size, 1);
      assert.ok(chunks.every((chunk) => Math.abs(chunk.created - Date.now() / 1000) < 600), 'created is the current time');
      assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
    }
    const whole = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
    assert.match(whole.headers.get('content-type'), /^application\/json/);
    const again = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
    assert.notEqual(again.json.id, whole.json.id, 'every completion has its own id');
  });

  it('lists the model', async () => {
    const models = [];
    for await (const model of client.models.list()) models.push(model);
    assert.equal(models.length, 1);
    assert.equal(models[0].id, 'tiny-e2b');
    assert.equal(models[0].object, 'model');
    const model = await client.models.retrieve('tiny-e2b');
    assert.equal(model.id, 'tiny-e2b');
    await assert.rejects(client.models.retrieve('gpt-4o'), (error) => error instanceof OpenAI.NotFoundError && error.code === 'model_not_found');
  });

  it('ends a request at its timeout', async () => {
    const start = Date.now();
    const completion = await client.completions.create({ model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0, ignore_eos: true, max_tokens: 4000, timeout: 0.2 });
    const elapsed = Date.now() - start;
    assert.ok(elapsed < 2000, `took ${elapsed} ms`);
    assert.ok(completion.usage.completion_tokens < 4000, `${completion.usage.completion_tokens} tokens`);
    assert.ok(completion.choices[0].text.startsWith(' Paris.'));
    assert.ok(completion.choices[0].finish_reason, 'a finish reason');
  });

  it('reproduces sampled output for the same seed', async () => {
    for (const seed of [1, 7, 1234, 987654321]) {
      const chat = { model: 'tiny-e2b', messages: FRANCE.messages, temperature: 1.0, top_p: 0.95, seed, max_tokens: 24 };
      const first = await client.chat.completions.create(chat);
      const second = await client.chat.completions.create(chat);
      assert.equal(second.choices[0].message.content, first.choices[0].message.content, `chat seed ${seed}`);
      const raw = { model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 1.0, top_p: 0.95, seed, max_tokens: 32, ignore_eos: true };
      const a = await client.completions.create(raw);
      const b = await client.completions.create(raw);
      assert.equal(b.choices[0].text, a.choices[0].text, `completion seed ${seed}`);
      assert.equal(a.usage.completion_tokens, 32);
    }
  });

  it('stops at stop strings, also across token boundaries, and leaves them out', async () => {
    const ask = async (stop, extra = {}) => client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0, stop, ...extra });
    const text = FRANCE.expected_text; // "The capital of France is Paris."
    const cases = [['Paris', 'The capital of France is '], [['zzz', 'France'], 'The capital of '], [['is P', 'capital'], 'The '], ['.', 'The capital of France is Paris']];
    // A stop string made of the end of one generated token and the start of the next.
    const pieces = loadPieces('tiny-e2b');
    const tokenTexts = FRANCE.output_ids.slice(0, -1).map((id) => pieces.get(id));
    assert.equal(tokenTexts.join(''), text, 'tokenizer pieces reproduce the answer');
    const k = tokenTexts.findIndex((piece, i) => i + 1 < tokenTexts.length && piece.length >= 3 && tokenTexts[i + 1].length >= 3);
    const spanning = tokenTexts[k].slice(-2) + tokenTexts[k + 1].slice(0, 2);
    cases.push([spanning, text.slice(0, text.indexOf(spanning))]);
    for (const [stop, expected] of cases) {
      const completion = await ask(stop);
      assert.equal(completion.choices[0].message.content, expected, `stop ${JSON.stringify(stop)}`);
      assert.equal(completion.choices[0].finish_reason, 'stop');
      assert.ok(completion.usage.completion_tokens < FRANCE.output_ids.length, 'generation ended early');
      const streamed = await collectChatStream(await ask(stop, { stream: true }));
      assert.equal(streamed.content, expected, `streamed, stop ${JSON.stringify(stop)}`);
      assert.deepEqual(streamed.finishReasons, ['stop']);
    }
    // A stop string that never appears changes nothing.
    const untouched = await ask(['Berlin', 'xyz']);
    assert.equal(untouched.choices[0].message.content, text);
    // Completions too.
    const raw = await client.completions.create({ model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0, stop: ['ris'] });
    assert.equal(raw.choices[0].text, ' Pa');
    assert.equal(raw.choices[0].finish_reason, 'stop');
  });

  it('returns chat logprobs with sorted top alternatives', async () => {
    for (const stream of [false, true]) {
      const params = { model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0, logprobs: true, top_logprobs: 3 };
      let entries;
      let content;
      if (stream) {
        const streamed = await collectChatStream(await client.chat.completions.create({ ...params, stream: true }));
        entries = streamed.logprobs;
        content = streamed.content;
      } else {
        const completion = await client.chat.completions.create(params);
        entries = completion.choices[0].logprobs.content;
        content = completion.choices[0].message.content;
      }
      assert.equal(content, FRANCE.expected_text);
      assert.equal(entries.length, FRANCE.output_ids.length - 1, 'one entry per generated token except the stop token');
      for (const entry of entries) {
        assert.equal(entry.top_logprobs.length, 3);
        assert.ok(entry.logprob <= 0, `logprob ${entry.logprob}`);
        for (let i = 0; i < entry.top_logprobs.length; ++i) {
          assert.ok(entry.top_logprobs[i].logprob <= 0);
          if (i > 0) assert.ok(entry.top_logprobs[i - 1].logprob >= entry.top_logprobs[i].logprob, 'sorted descending');
        }
        assert.equal(entry.token, entry.top_logprobs[0].token, 'greedy picks the most likely token');
        assert.equal(entry.logprob, entry.top_logprobs[0].logprob);
        assert.deepEqual(entry.bytes, [...Buffer.from(entry.token, 'utf8')]);
      }
      assert.equal(entries.map((entry) => entry.token).join(''), content);
    }
    // Without logprobs there are none.
    const plain = await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0 });
    assert.equal(plain.choices[0].logprobs ?? null, null);
  });

  it('returns completion logprobs', async () => {
    const completion = await client.completions.create({ model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0, logprobs: 2 });
    const { logprobs, text } = completion.choices[0];
    assert.equal(text, ' Paris.');
    assert.equal(logprobs.tokens.length, FRANCE_RAW.output_ids.length - 1);
    assert.equal(logprobs.tokens.join(''), text);
    assert.equal(logprobs.token_logprobs.length, logprobs.tokens.length);
    assert.equal(logprobs.top_logprobs.length, logprobs.tokens.length);
    assert.deepEqual(logprobs.text_offset, [0, logprobs.tokens[0].length]);
    for (let i = 0; i < logprobs.tokens.length; ++i) {
      const top = Object.entries(logprobs.top_logprobs[i]);
      assert.equal(top.length, 2);
      assert.ok(logprobs.token_logprobs[i] <= 0);
      const best = top.reduce((a, b) => (b[1] > a[1] ? b : a));
      assert.equal(best[0], logprobs.tokens[i]);
      assert.equal(best[1], logprobs.token_logprobs[i]);
    }
  });

  it('answers unsupported parameters with OpenAI error objects', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, n: 2 }),
      (error) => {
        assert.ok(error instanceof OpenAI.BadRequestError, `got ${error.constructor.name}: ${error.message}`);
        assert.equal(error.status, 400);
        assert.equal(error.type, 'invalid_request_error');
        assert.equal(error.param, 'n');
        return true;
      },
    );
    const raw = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, n: 2 });
    assertErrorResponse(raw, { status: 400, type: 'invalid_request_error', what: 'n: 2' });
    for (const [field, value] of [['suffix', ' and so on.'], ['echo', true], ['best_of', 2]]) {
      const refused = await postJson(server, '/v1/completions', { prompt: FRANCE_RAW.text, [field]: value });
      assertErrorResponse(refused, { status: 400, type: 'invalid_request_error', what: field });
      assert.equal(refused.json.error.param, field);
    }
  });

  it('exports Prometheus metrics that match the requests', async () => {
    const before = await metrics(server);
    for (const name of ['gemma4rt_prompt_tokens_total', 'gemma4rt_completion_tokens_total', 'gemma4rt_queue_depth', 'gemma4rt_kv_slots', 'gemma4rt_sequences_in_flight']) {
      assert.ok(before.has(name), `${name} is exported`);
    }
    assert.equal(before.get('gemma4rt_kv_slots'), 4);
    assert.equal(before.get('gemma4rt_queue_depth'), 0);
    assert.ok(before.get('gemma4rt_requests_total{route="/v1/chat/completions",status="200"}') > 0);
    assert.ok(before.get('gemma4rt_requests_total{route="/v1/chat/completions",status="400"}') >= 2);
    assert.ok(before.get('gemma4rt_prompt_tokens_total') > 0);
    assert.ok(before.get('gemma4rt_completion_tokens_total') > 0);

    let prompt = 0;
    let completion = 0;
    let cached = 0;
    for (const item of [E2B_CHAT[1], E2B_CHAT[2]]) {
      const answer = await client.chat.completions.create({ model: 'tiny-e2b', messages: item.messages, temperature: 0 });
      prompt += answer.usage.prompt_tokens;
      completion += answer.usage.completion_tokens;
      cached += answer.usage.prompt_tokens_details.cached_tokens;
    }
    const raw = await client.completions.create({ model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0 });
    prompt += raw.usage.prompt_tokens;
    completion += raw.usage.completion_tokens;
    cached += raw.usage.prompt_tokens_details.cached_tokens;
    // The counters are updated when a response has been written; give the server a moment.
    let after;
    await waitFor(async () => {
      after = await metrics(server);
      return after.get('gemma4rt_completion_tokens_total') - before.get('gemma4rt_completion_tokens_total') === completion;
    }, 2000, 'gemma4rt_completion_tokens_total to count the new requests');
    assert.equal(after.get('gemma4rt_prompt_tokens_total') - before.get('gemma4rt_prompt_tokens_total'), prompt);
    assert.ok(cached > 0, 'the chats share their system turn with earlier requests');
    assert.equal(after.get('gemma4rt_prompt_tokens_cached_total') - before.get('gemma4rt_prompt_tokens_cached_total'), cached);
    const chat200 = 'gemma4rt_requests_total{route="/v1/chat/completions",status="200"}';
    const completions200 = 'gemma4rt_requests_total{route="/v1/completions",status="200"}';
    assert.equal(after.get(chat200) - before.get(chat200), 2);
    assert.equal(after.get(completions200) - before.get(completions200), 1);
    assert.equal(after.get('gemma4rt_sequences_in_flight'), 0);
    assert.equal(after.get('gemma4rt_kv_slots_in_use'), 0);
    assert.equal(after.get('gemma4rt_ready'), 1);
    // Latency histograms: one first-token and one end-to-end observation per request, one inter-token
    // gap per token after the first; +Inf buckets equal the counts.
    const delta = (name) => after.get(name) - (before.get(name) ?? 0);
    assert.equal(delta('gemma4rt_time_to_first_token_seconds_count'), 3);
    assert.equal(delta('gemma4rt_e2e_request_latency_seconds_count'), 3);
    assert.equal(delta('gemma4rt_inter_token_latency_seconds_count'), completion - 3);
    assert.equal(delta('gemma4rt_generation_tokens_total'), completion);
    for (const name of ['gemma4rt_time_to_first_token_seconds', 'gemma4rt_inter_token_latency_seconds', 'gemma4rt_e2e_request_latency_seconds']) {
      assert.equal(after.get(`${name}_bucket{le="+Inf"}`), after.get(`${name}_count`), name);
      assert.ok(after.get(`${name}_sum`) > 0, name);
    }
    // One log line per answered request, with its route, status and token counts.
    assert.match(server.stderr(), /gemma4rt serve: \/v1\/completions 200 tokens in \d+ \(cached \d+\) out \d+, first token [\d.]+ s, [\d.]+ s, (stop|length)/);
  });

  it('tokenizes and detokenizes (llama-server routes) and tells its properties', async () => {
    const tokens = await postJson(server, '/tokenize', { content: 'The capital of France' });
    assert.equal(tokens.status, 200, tokens.text);
    assert.deepEqual(tokens.json.tokens, FRANCE_RAW.input_ids.slice(1, 1 + tokens.json.tokens.length));
    const special = await postJson(server, '/tokenize', { content: 'The', add_special: true, with_pieces: true });
    assert.equal(special.json.tokens[0].id, 2);
    assert.equal(special.json.tokens[1].piece, 'The');
    const text = await postJson(server, '/detokenize', { tokens: tokens.json.tokens });
    assert.equal(text.status, 200, text.text);
    assert.equal(text.json.content, 'The capital of France');
    assertErrorResponse(await postJson(server, '/detokenize', { tokens: [1, 99999999] }), { status: 400, type: 'invalid_request_error', what: 'id out of range' });
    assertErrorResponse(await postJson(server, '/tokenize', { text: 'x' }), { status: 400, type: 'invalid_request_error', what: 'no content' });
    const props = await request(server.url('/props'));
    assert.equal(props.status, 200);
    assert.equal(props.json.model, 'tiny-e2b');
    assert.equal(props.json.total_slots, 4);
    assert.equal(props.json.vocab_size, 1024);
    assert.match(props.json.backend, /^cpu/);
    assert.ok(props.json.n_ctx > 0);
  });
});

// ---------------------------------------------------------------------------------------------------
describe('thinking and tool calls (tiny-e2b-agent)', () => {
  let server;
  let client;
  const thinking = byKind(AGENT, 'chat_thinking');
  const toolCalls = byKind(AGENT, 'chat_tool_call');
  const toolResults = byKind(AGENT, 'chat_tool_result');
  const nonAscii = (prompt) => /[^\x00-\x7f]/.test(prompt.capital);
  // Streamed subsets: the first few plus every capital that goes through byte fallback.
  const streamed = (prompts) => prompts.filter((prompt, i) => i < 3 || nonAscii(prompt));
  before(async () => {
    server = await startServer('tiny-e2b-agent', [...THREADS]);
    client = clientFor(server);
  });
  after(async () => server?.stop());

  it('the fixture covers all four kinds and some non-ASCII capitals', () => {
    assert.equal(thinking.length, 27);
    assert.equal(toolCalls.length, 27);
    assert.equal(toolResults.length, 27);
    assert.ok(toolCalls.filter(nonAscii).length >= 2);
  });

  it('answers plain questions with thinking off', async () => {
    for (const prompt of byKind(AGENT, 'chat_capital_of_country').slice(0, 4)) {
      const completion = await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: prompt.messages, temperature: 0 });
      assert.equal(completion.choices[0].message.content, prompt.expected_parsed.content);
      assert.equal(completion.choices[0].message.reasoning_content ?? null, null);
    }
  });

  it('separates reasoning from content', async () => {
    for (const prompt of thinking) {
      const completion = await client.chat.completions.create({
        model: 'tiny-e2b-agent', messages: prompt.messages, temperature: 0, chat_template_kwargs: { enable_thinking: prompt.enable_thinking },
      });
      const { message, finish_reason: finishReason } = completion.choices[0];
      assert.equal(message.reasoning_content, prompt.expected_parsed.reasoning, prompt.id);
      assert.equal(message.content, prompt.expected_parsed.content, prompt.id);
      assert.equal(finishReason, 'stop');
      assert.ok(!(message.tool_calls?.length > 0), 'no tool calls');
      assert.equal(completion.usage.prompt_tokens, prompt.input_ids.length, `${prompt.id}: rendered prompt`);
      assert.equal(completion.usage.completion_tokens, prompt.output_ids.length);
    }
    // reasoning_effort turns thinking on as well.
    const [first] = thinking;
    const effort = await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: first.messages, temperature: 0, reasoning_effort: 'low' });
    assert.equal(effort.choices[0].message.reasoning_content, first.expected_parsed.reasoning);
    assert.equal(effort.choices[0].message.content, first.expected_parsed.content);
  });

  it('streams reasoning and content separately', async () => {
    for (const prompt of streamed(thinking)) {
      const result = await collectChatStream(
        await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: prompt.messages, temperature: 0, stream: true, chat_template_kwargs: { enable_thinking: true } }),
      );
      assert.equal(result.reasoning, prompt.expected_parsed.reasoning, prompt.id);
      assert.equal(result.content, prompt.expected_parsed.content, prompt.id);
      assert.deepEqual(result.finishReasons, ['stop']);
      for (const chunk of result.chunks) {
        const content = chunk.choices[0]?.delta?.content ?? '';
        assert.ok(!/thought|<\||\|>|\uFFFD/.test(content), `${prompt.id}: content chunk ${JSON.stringify(content)}`);
        assert.ok(!/<\||\|>|\uFFFD/.test(chunk.choices[0]?.delta?.reasoning_content ?? ''), `${prompt.id}: reasoning chunk`);
      }
      // No content arrives before the reasoning is complete.
      const firstContent = result.chunks.findIndex((chunk) => chunk.choices[0]?.delta?.content);
      const lastReasoning = result.chunks.findLastIndex((chunk) => chunk.choices[0]?.delta?.reasoning_content);
      assert.ok(lastReasoning >= 0 && firstContent > lastReasoning, `${prompt.id}: reasoning precedes content`);
    }
  });

  it('returns tool calls', async () => {
    const ids = new Set();
    for (const prompt of toolCalls) {
      const completion = await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: prompt.messages, tools: prompt.tools, temperature: 0 });
      const { message, finish_reason: finishReason } = completion.choices[0];
      assert.equal(finishReason, 'tool_calls', prompt.id);
      assert.ok(message.content === null || message.content === '', `${prompt.id}: content ${JSON.stringify(message.content)}`);
      assert.equal(message.reasoning_content ?? null, null);
      assert.equal(message.tool_calls.length, prompt.expected_parsed.tool_calls.length);
      message.tool_calls.forEach((call, i) => {
        const expected = prompt.expected_parsed.tool_calls[i];
        assert.equal(call.type, 'function');
        assert.match(call.id, /\S/, 'a call id');
        assert.ok(!ids.has(call.id), `call id ${call.id} is unique`);
        ids.add(call.id);
        assert.equal(call.function.name, expected.name);
        assert.equal(typeof call.function.arguments, 'string', 'arguments are a JSON string');
        assert.deepEqual(JSON.parse(call.function.arguments), expected.arguments, prompt.id);
      });
      assert.equal(completion.usage.prompt_tokens, prompt.input_ids.length, `${prompt.id}: rendered prompt`);
      assert.equal(completion.usage.completion_tokens, prompt.output_ids.length, `${prompt.id}: ends at <|tool_response>`);
    }
  });

  it('streams tool calls', async () => {
    for (const prompt of streamed(toolCalls)) {
      const result = await collectChatStream(
        await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: prompt.messages, tools: prompt.tools, temperature: 0, stream: true, stream_options: { include_usage: true } }),
      );
      assert.deepEqual(result.finishReasons, ['tool_calls'], prompt.id);
      assert.equal(result.content, '', `${prompt.id}: no content`);
      assert.equal(result.reasoning, '');
      assert.equal(result.toolCalls.length, 1);
      const [call] = result.toolCalls;
      assert.match(call.id, /\S/);
      assert.equal(call.type, 'function');
      assert.equal(call.name, 'get_weather');
      assert.deepEqual(JSON.parse(call.arguments), prompt.expected_parsed.tool_calls[0].arguments, prompt.id);
      assert.equal(result.usage.completion_tokens, prompt.output_ids.length);
    }
  });

  it('answers tool results sent the OpenAI way (JSON strings), using the ids it returned', async () => {
    for (const prompt of toolResults) {
      const [user, assistant, tool] = prompt.messages;
      // Step 1: the call, as the server returns it.
      const first = await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: [user], tools: prompt.tools, temperature: 0 });
      const call = first.choices[0].message.tool_calls?.[0];
      assert.ok(call, `${prompt.id}: a tool call`);
      assert.deepEqual(JSON.parse(call.function.arguments), assistant.tool_calls[0].function.arguments);
      // Step 2: the assistant message as received, and the result as a JSON string.
      const messages = [user, first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: JSON.stringify(tool.content) }];
      const second = await client.chat.completions.create({ model: 'tiny-e2b-agent', messages, tools: prompt.tools, temperature: 0 });
      assert.equal(second.choices[0].message.content, prompt.expected_parsed.content, prompt.id);
      assert.equal(second.choices[0].finish_reason, 'stop');
      assert.equal(second.usage.prompt_tokens, prompt.input_ids.length, `${prompt.id}: rendered prompt`);
    }
  });

  it('answers tool results in the fixture form (objects) and with string arguments', async () => {
    for (const prompt of toolResults.slice(0, 8)) {
      const objects = await postJson(server, '/v1/chat/completions', { messages: prompt.messages, tools: prompt.tools, temperature: 0 });
      assert.equal(objects.status, 200, objects.text);
      assert.equal(objects.json.choices[0].message.content, prompt.expected_parsed.content, `${prompt.id} (objects)`);
      assert.equal(objects.json.usage.prompt_tokens, prompt.input_ids.length);
      const strings = structuredClone(prompt.messages);
      strings[1].tool_calls[0].function.arguments = JSON.stringify(strings[1].tool_calls[0].function.arguments);
      strings[2].content = JSON.stringify(strings[2].content);
      const stream = await collectChatStream(await client.chat.completions.create({ model: 'tiny-e2b-agent', messages: strings, tools: prompt.tools, temperature: 0, stream: true }));
      assert.equal(stream.content, prompt.expected_parsed.content, `${prompt.id} (strings, streamed)`);
      assert.deepEqual(stream.finishReasons, ['stop']);
    }
  });
});

// ---------------------------------------------------------------------------------------------------
describe('prompt prefix cache', () => {
  let cachedServer;
  let plainServer;
  before(async () => {
    cachedServer = await startServer('tiny-e2b', [...THREADS, '--parallel', '2']);
    plainServer = await startServer('tiny-e2b', [...THREADS, '--parallel', '2', '--no-prefix-cache']);
  });
  after(async () => {
    await cachedServer?.stop();
    await plainServer?.stop();
  });

  // Each turn of a chat resends the conversation: the next turn starts from the K/V the previous one
  // left (its prompt and every answer token but the stop token), and answers as if computed in full.
  it("starts a chat's next turn from the previous turn's K/V, with the same answers", async () => {
    const converse = async (server) => {
      const client = clientFor(server);
      const messages = [...FRANCE.messages];
      const turns = [];
      for (const next of ['And of Spain?', 'Tell me more.', 'Thanks!']) {
        const answer = await client.chat.completions.create({ model: 'tiny-e2b', messages, temperature: 0, max_tokens: 30 });
        turns.push({ content: answer.choices[0].message.content, usage: answer.usage });
        messages.push({ role: 'assistant', content: answer.choices[0].message.content }, { role: 'user', content: next });
      }
      return turns;
    };
    const cached = await converse(cachedServer);
    const plain = await converse(plainServer);
    assert.deepEqual(cached.map((turn) => turn.content), plain.map((turn) => turn.content));
    assert.equal(cached[0].content, FRANCE.expected_text);
    assert.equal(cached[0].usage.prompt_tokens_details.cached_tokens, 0);
    // The first answer (the fixture's, ended by the stop token) comes back in the history as the tokens
    // the model chose, so all of it is reused. A later answer may not: the chat format renders what the
    // parser made of it (turn markers the tiny model writes as text, trimmed whitespace), so at least the
    // previous prompt is reused, and at most all it fed.
    const first = cached[0].usage;
    assert.equal(cached[1].usage.prompt_tokens_details.cached_tokens, first.prompt_tokens + first.completion_tokens - 1);
    for (let turn = 1; turn < cached.length; ++turn) {
      const previous = cached[turn - 1].usage;
      const reused = cached[turn].usage.prompt_tokens_details.cached_tokens;
      assert.ok(reused >= previous.prompt_tokens && reused <= previous.prompt_tokens + previous.completion_tokens - 1, `turn ${turn}: ${reused}`);
      assert.equal(cached[turn].usage.prompt_tokens, plain[turn].usage.prompt_tokens);
    }
    for (const turn of plain) assert.equal(turn.usage.prompt_tokens_details.cached_tokens, 0);
  });

  // llama-server's per-request switch: cache_prompt false computes the whole prompt (and still leaves its
  // K/V for the next request).
  it('computes the whole prompt for a request with cache_prompt false', async () => {
    const body = { model: 'tiny-e2b', prompt: FRANCE_RAW.text, temperature: 0, max_tokens: 4 };
    const usage = async (extra) => (await postJson(cachedServer, '/v1/completions', { ...body, ...extra })).json.usage;
    const first = await usage({});
    assert.equal((await usage({ cache_prompt: false })).prompt_tokens_details.cached_tokens, 0);
    assert.equal((await usage({ cache_prompt: true })).prompt_tokens_details.cached_tokens, first.prompt_tokens - 1);
    const refused = await postJson(cachedServer, '/v1/completions', { ...body, cache_prompt: 'no' });
    assertErrorResponse(refused, { status: 400, type: 'invalid_request_error', what: 'cache_prompt' });
  });

  // A client that sends the previous answer back changed leaves only the previous prompt in common. With
  // one-row prompt chunks the sliding rings hold the window (8) plus one slot, long overwritten by the
  // answer's tokens, so nothing is reused; --full-sliding-cache keeps every position and reuses the prompt.
  it('reuses the previous prompt under a changed answer only with --full-sliding-cache', async () => {
    const args = [...THREADS, '--parallel', '1', '--prefill-chunk', '1'];
    const ring = await startServer('tiny-e2b', args);
    const full = await startServer('tiny-e2b', [...args, '--full-sliding-cache']);
    try {
      const results = [];
      for (const server of [ring, full]) {
        const client = clientFor(server);
        const first = await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0 });
        assert.equal(first.choices[0].message.content, FRANCE.expected_text);
        const messages = [...FRANCE.messages, { role: 'assistant', content: 'Paris, I believe.' }, { role: 'user', content: 'And of Spain?' }];
        const second = await client.chat.completions.create({ model: 'tiny-e2b', messages, temperature: 0, max_tokens: 20 });
        results.push({ first: first.usage, second: second.usage, content: second.choices[0].message.content });
      }
      const [fromRing, fromFull] = results;
      assert.equal(fromRing.second.prompt_tokens_details.cached_tokens, 0);
      assert.equal(fromFull.second.prompt_tokens_details.cached_tokens, fromFull.first.prompt_tokens);
      assert.equal(fromFull.content, fromRing.content);
    } finally {
      await ring.stop();
      await full.stop();
    }
  });
});

// ---------------------------------------------------------------------------------------------------
describe('batch isolation (--parallel 4)', () => {
  let server;
  let client;
  before(async () => {
    // Small prefill chunks make prompts span several steps, mixed with other sequences' decode rows.
    server = await startServer('tiny-e2b', [...THREADS, '--parallel', '4', '--prefill-chunk', '5']);
    client = clientFor(server);
  });
  after(async () => server?.stop());

  it('gives concurrent requests exactly what they get alone', async () => {
    const jobs = [];
    for (const prompt of E2B_RAW.slice(0, 6)) {
      jobs.push(async () => {
        const answer = await client.completions.create({ model: 'tiny-e2b', prompt: prompt.text, temperature: 0, max_tokens: 24, ignore_eos: true });
        return `${answer.choices[0].text}|${answer.choices[0].finish_reason}|${answer.usage.completion_tokens}`;
      });
    }
    for (const prompt of [...E2B_CHAT.slice(6, 9), E2B_REVERSE[4]]) {
      jobs.push(async () => {
        const answer = await client.chat.completions.create({ model: 'tiny-e2b', messages: prompt.messages, temperature: 0 });
        assert.equal(answer.choices[0].message.content, prompt.expected_text);
        return `${answer.choices[0].message.content}|${answer.usage.completion_tokens}`;
      });
    }
    for (const seed of [11, 12]) {
      jobs.push(async () => {
        const answer = await client.completions.create({ model: 'tiny-e2b', prompt: E2B_RAW[seed].text, temperature: 1, top_p: 0.95, seed, max_tokens: 24, ignore_eos: true });
        return answer.choices[0].text;
      });
    }
    jobs.push(async () => {
      const streamed = await collectChatStream(
        await client.chat.completions.create({ model: 'tiny-e2b', messages: E2B_CHAT[9].messages, temperature: 0, max_tokens: 40, stream: true, logprobs: true }),
      );
      return `${streamed.content}|${streamed.logprobs.map((entry) => entry.token).join('')}`;
    });
    assert.equal(jobs.length, 13);
    const alone = [];
    for (const job of jobs) alone.push(await job());
    for (let round = 0; round < 2; ++round) {
      const together = await Promise.all(jobs.map((job) => job()));
      together.forEach((answer, i) => assert.equal(answer, alone[i], `request ${i}, round ${round}`));
    }
  });

  it('is not disturbed by a neighbour that goes away', async () => {
    const body = (prompt) => ({ model: 'tiny-e2b', prompt: prompt.text, temperature: 0, max_tokens: 200, ignore_eos: true });
    const alone = [];
    for (const prompt of E2B_RAW.slice(20, 23)) alone.push((await client.completions.create(body(prompt))).choices[0].text);
    const leaving = await openStream(server, '/v1/completions', { ...body(E2B_RAW[23]), max_tokens: 3000 });
    const together = E2B_RAW.slice(20, 23).map((prompt) => client.completions.create(body(prompt)));
    const seen = [];
    while (seen.length < 5) {
      const { value, done } = await leaving.events.next();
      if (done) break;
      seen.push(value);
    }
    leaving.controller.abort();
    (await Promise.all(together)).forEach((answer, i) => assert.equal(answer.choices[0].text, alone[i], `request ${i}`));
  });
});

// ---------------------------------------------------------------------------------------------------
describe('the other model shapes', () => {
  for (const model of ['tiny-e4b', 'tiny-12b', 'tiny-31b', 'tiny-26b-a4b']) {
    it(`${model} answers through the server`, async () => {
      const fixture = loadCoherence(model);
      const server = await startServer(model, [...THREADS, '--parallel', '2']);
      try {
        const client = clientFor(server);
        const chats = fixture.prompts.filter((prompt) => prompt.messages).slice(0, 4);
        const raws = fixture.prompts.filter((prompt) => !prompt.messages).slice(0, 2);
        const answers = await Promise.all([
          ...chats.map((prompt) => client.chat.completions.create({ model, messages: prompt.messages, temperature: 0 })),
          ...raws.map((prompt) => client.completions.create({ model, prompt: prompt.text, temperature: 0 })),
        ]);
        chats.forEach((prompt, i) => {
          assert.equal(answers[i].choices[0].message.content, prompt.expected_text, prompt.id);
          assert.equal(answers[i].usage.prompt_tokens, prompt.input_ids.length, `${prompt.id}: rendered prompt`);
          assert.equal(answers[i].usage.completion_tokens, prompt.output_ids.length);
        });
        raws.forEach((prompt, i) => assert.equal(answers[chats.length + i].choices[0].text, prompt.expected_text, prompt.id));
      } finally {
        await server.stop();
      }
    });
  }
});

// ---------------------------------------------------------------------------------------------------
describe('bad input', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, '--ctx', '64', '--max-body-mb', '2']);
  });
  after(async () => server?.stop());
  const chat = (body, options) => postJson(server, '/v1/chat/completions', body, options);
  const messages = FRANCE.messages;

  it('rejects malformed and mistyped requests with 4xx error objects', async () => {
    const cases = [
      ['malformed JSON', () => chat('{"messages": [{"role": "user", "content": "hi"}'), 400],
      ['not an object', () => chat('[1, 2, 3]'), 400],
      ['empty body', () => chat(''), 400],
      ['temperature "hot"', () => chat({ messages, temperature: 'hot' }), 400],
      ['temperature 5', () => chat({ messages, temperature: 5 }), 400],
      ['messages "hi"', () => chat({ messages: 'hi' }), 400],
      ['messages missing', () => chat({ model: 'tiny-e2b' }), 400],
      ['empty messages', () => chat({ messages: [] }), 400],
      ['unknown role', () => chat({ messages: [{ role: 'wizard', content: 'hi' }] }), 400],
      ['message without content', () => chat({ messages: [{ role: 'user' }] }), 400],
      ['max_tokens "5"', () => chat({ messages, max_tokens: '5' }), 400],
      ['max_tokens 0', () => chat({ messages, max_tokens: 0 }), 400],
      ['max_tokens -3', () => chat({ messages, max_tokens: -3 }), 400],
      ['max_tokens 1e9', () => chat({ messages, max_tokens: 1e9 }), 400],
      ['max_tokens beyond the context', () => chat({ messages, max_tokens: 60 }), 400],
      ['stream "yes"', () => chat({ messages, stream: 'yes' }), 400],
      ['stop 42', () => chat({ messages, stop: 42 }), 400],
      ['stop ""', () => chat({ messages, stop: [''] }), 400],
      ['top_logprobs without logprobs', () => chat({ messages, top_logprobs: 2 }), 400],
      ['top_logprobs 99', () => chat({ messages, logprobs: true, top_logprobs: 99 }), 400],
      ['tools not a list', () => chat({ messages, tools: 'get_weather' }), 400],
      ['chat_template_kwargs not an object', () => chat({ messages, chat_template_kwargs: 'x' }), 400],
      ['an unknown model', () => chat({ model: 'gpt-4o', messages }), 404],
      ['an image part', () => chat({ messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] }), 400],
      ['an audio part', () => chat({ messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }] }] }), 400],
      ['prompt missing', () => postJson(server, '/v1/completions', { max_tokens: 3 }), 400],
      ['prompt token id out of range', () => postJson(server, '/v1/completions', { prompt: [2, 999999] }), 400],
      ['prompt of the wrong type', () => postJson(server, '/v1/completions', { prompt: { text: 'hi' } }), 400],
    ];
    for (const [what, send, status] of cases) assertErrorResponse(await send(), { status, type: 'invalid_request_error', what });
  });

  it('answers JSON nested 100,000 deep anywhere in a request without a 5xx, and stays up', async () => {
    const deepArray = '['.repeat(100000) + ']'.repeat(100000);
    const deepObjectText = '{"a":'.repeat(50000) + '1' + '}'.repeat(50000);
    const weather = (parameters) => [{ type: 'function', function: { name: 'get_weather', parameters } }];
    const cases = [
      ['deep messages', () => chat(`{"messages": ${deepArray}}`)],
      ['deep tool parameters', () => chat(`{"messages": ${JSON.stringify(messages)}, "tools": [{"type": "function", "function": {"name": "f", "parameters": ${deepObjectText}}}]}`)],
      ['deep tool response', () => chat(`{"messages": [{"role": "tool", "tool_call_id": "a", "content": "x", "tool_responses": [{"name": "f", "response": ${deepObjectText}}]}]}`)],
      // Inside strings the nesting reaches the server as text: arguments and tool results the chat
      // format would parse as JSON.
      ['deep tool-call arguments string', () => chat({ messages: [...messages, { role: 'assistant', tool_calls: [{ id: 'a', type: 'function', function: { name: 'f', arguments: deepObjectText } }] }], tools: weather({ type: 'object' }) })],
      ['deep tool message content', () => chat({ messages: [...messages, { role: 'tool', tool_call_id: 'a', content: deepObjectText }] })],
    ];
    // Deep nesting in the body itself is a 400; inside strings it is only text (a 400 when it no longer
    // fits the context, else an answer). Never a 5xx or a crash.
    for (const [what, send, bodyLevel] of cases.map((entry, index) => [...entry, index < 3])) {
      const response = await send();
      if (bodyLevel) assertErrorResponse(response, { status: 400, type: 'invalid_request_error', what });
      else assert.ok(response.status < 500, `${what}: status ${response.status}`);
    }
    const health = await fetch(server.url('/health'));
    assert.equal(health.status, 200);
  });

  it('answers 150 seeded mutations of a chat body without a 5xx, and stays up', async () => {
    // A linear congruential generator: the same cases on every run (the seed is in the failure message).
    let state = 12345;
    const next = (n) => { state = (state * 1103515245 + 12345) % 2147483648; return state % n; };
    const odd = ['1e999', '-1', '18446744073709551616', '"x"', '[]', '{}', 'null', 'true', '"\\ud800"', '['.repeat(3000) + ']'.repeat(3000)];
    const original = JSON.stringify({ messages: [...messages, { role: 'assistant', content: 'Paris.' }, { role: 'user', content: 'And Spain?' }],
      temperature: 0, max_tokens: 3, stop: ['x'], logprobs: true, top_logprobs: 2 });
    for (let seed = 0; seed < 150; ++seed) {
      const bytes = Buffer.from(original);
      let body;
      const at = next(bytes.length);
      switch (next(4)) {
        case 0: bytes[at] = next(256); body = bytes; break;                                   // a byte, often invalid UTF-8
        case 1: body = bytes.subarray(0, at); break;                                          // truncated
        case 2: body = Buffer.concat([bytes.subarray(0, at), Buffer.from(odd[next(odd.length)]), bytes.subarray(at)]); break;
        default: {                                                                            // a value replaced
          const text = original;
          const start = text.indexOf(':', at) + 1 || 1;
          const end = Math.min(...[',', '}', ']'].map((c) => { const i = text.indexOf(c, start); return i < 0 ? text.length : i; }));
          body = Buffer.from(text.slice(0, start) + odd[next(odd.length)] + text.slice(end));
        }
      }
      const response = await request(server.url('/v1/chat/completions'), { method: 'POST', body, headers: { 'Content-Type': 'application/json' } });
      assert.ok(response.status < 500, `seed ${seed}: status ${response.status}: ${response.text.slice(0, 200)}`);
      if (response.status >= 400) assert.ok(isErrorObject(response), `seed ${seed}: ${response.text.slice(0, 200)}`);
    }
    assert.equal((await request(server.url('/health'))).status, 200);
  });

  it('rejects prompts longer than the context', async () => {
    const long = 'The capital of France is Paris. '.repeat(20);
    const chatResponse = await chat({ messages: [{ role: 'user', content: long }] });
    assertErrorResponse(chatResponse, { status: 400, type: 'invalid_request_error', what: 'long chat prompt' });
    assert.equal(chatResponse.json.error.code, 'context_length_exceeded');
    const completion = await postJson(server, '/v1/completions', { prompt: long });
    assertErrorResponse(completion, { status: 400, what: 'long raw prompt' });
    assert.equal(completion.json.error.code, 'context_length_exceeded');
  });

  it('rejects invalid UTF-8', async () => {
    const body = Buffer.concat([Buffer.from('{"messages": [{"role": "user", "content": "caf'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]);
    assertErrorResponse(await chat(body), { status: 400, type: 'invalid_request_error', what: 'invalid UTF-8 in a string' });
    const lone = Buffer.concat([Buffer.from('{"prompt": "<bos>The capital of '), Buffer.from([0xc3]), Buffer.from('", "max_tokens": 2}')]);
    assertErrorResponse(await postJson(server, '/v1/completions', lone), { status: 400, what: 'truncated UTF-8 sequence' });
  });

  it('handles large bodies', async () => {
    // 1 MB: within --max-body-mb 2, but far beyond the context.
    const megabyte = await chat({ messages: [{ role: 'user', content: 'a'.repeat(1 << 20) }] }, { timeoutMs: 30000 });
    assertErrorResponse(megabyte, { status: 400, what: '1 MB prompt' });
    assert.equal(megabyte.json.error.code, 'context_length_exceeded');
    // 3 MB: beyond --max-body-mb 2.
    let tooLarge;
    try {
      tooLarge = await chat({ messages: [{ role: 'user', content: 'a'.repeat(3 << 20) }] }, { timeoutMs: 30000 });
    } catch (error) {
      // The server may answer and close before the client finished sending; that is a refusal too.
      tooLarge = null;
      assert.match(String(error.cause?.code ?? error.message), /EPIPE|ECONNRESET|UND_ERR_SOCKET|other side closed|fetch failed/, String(error));
    }
    if (tooLarge) assertErrorResponse(tooLarge, { status: 413, what: '3 MB body' });
    // A JSON body sent with a form content type (as `curl -d` does) is still JSON, whatever its size.
    const padded = JSON.stringify({ prompt: FRANCE_RAW.text, temperature: 0 }) + ' '.repeat(20000);
    const form = await postJson(server, '/v1/completions', padded, { headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(form.status, 200, form.text);
    assert.equal(form.json.choices[0].text, FRANCE_RAW.expected_text);
  });

  it('answers unknown routes and wrong methods with 4xx error objects', async () => {
    const cases = [
      ['unknown route', () => request(server.url('/v1/nothing-here')), 404],
      ['unknown POST route', () => postJson(server, '/v2/chat/completions', { messages }), 404],
      ['a path that is not UTF-8', () => request(server.url('/%FF%FE')), 404],
      ['an unknown model', () => request(server.url('/v1/models/%FFnope')), 404],
      ['multipart form data', () => request(server.url('/v1/chat/completions'), { method: 'POST', body: (() => { const form = new FormData(); form.append('messages', 'hi'); return form; })() }), 400],
      ['GET on a POST route', () => request(server.url('/v1/chat/completions')), 405, 'POST'],
      ['DELETE /v1/models', () => request(server.url('/v1/models'), { method: 'DELETE' }), 405, 'GET'],
      ['PUT /v1/completions', () => request(server.url('/v1/completions'), { method: 'PUT', body: { prompt: 'x' } }), 405, 'POST'],
      ['POST /health', () => postJson(server, '/health', {}), 405, 'GET'],
    ];
    for (const [what, send, status, allow] of cases) {
      const response = await send();
      assertErrorResponse(response, { status, what });
      if (allow) assert.equal(response.headers.get('allow'), allow, what);
    }
  });

  it('reads chunked request bodies', async () => {
    const body = JSON.stringify({ prompt: FRANCE_RAW.text, temperature: 0 });
    const stream = new ReadableStream({
      start(controller) {
        for (let i = 0; i < body.length; i += 7) controller.enqueue(new TextEncoder().encode(body.slice(i, i + 7)));
        controller.close();
      },
    });
    const response = await fetch(server.url('/v1/completions'), {
      method: 'POST', body: stream, duplex: 'half', headers: { 'Content-Type': 'application/json' }, signal: AbortSignal.timeout(10000),
    });
    const json = await response.json();
    assert.equal(response.status, 200, JSON.stringify(json));
    assert.equal(json.choices[0].text, FRANCE_RAW.expected_text);
  });

  // Sends raw bytes and returns what the server answers first (status line and headers), or all of it
  // once the server closes, within `timeoutMs`.
  const rawExchange = (text, { timeoutMs = 5000, untilClose = false } = {}) => new Promise((resolve, reject) => {
    const socket = net.connect(server.port, '127.0.0.1');
    let answer = '';
    const timer = setTimeout(() => { socket.destroy(); resolve(answer); }, timeoutMs);
    socket.on('data', (data) => {
      answer += data.toString('latin1');
      if (!untilClose && answer.includes('\r\n\r\n')) { clearTimeout(timer); socket.destroy(); resolve(answer); }
    });
    socket.on('close', () => { clearTimeout(timer); resolve(answer); });
    socket.on('error', (error) => { clearTimeout(timer); if (answer) resolve(answer); else reject(error); });
    socket.write(text);
  });

  it('applies --max-body-mb to chunked bodies, answers Expect: 100-continue with 413, refuses conflicting lengths', async () => {
    // 3 MB of chunked JSON against the 2 MB limit: 413 before the body ends.
    const chunk = 'x'.repeat(64 * 1024);
    const chunks = [`{"prompt": "`, ...Array(48).fill(chunk), '"}'];
    const chunked = chunks.map((part) => `${part.length.toString(16)}\r\n${part}\r\n`).join('') + '0\r\n\r\n';
    const big = await rawExchange(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`);
    assert.match(big, /^HTTP\/1\.1 413/, big.slice(0, 200));
    // Expect: 100-continue with a body over the limit: 413 at once, never "100 Continue".
    const expect = await rawExchange('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\nExpect: 100-continue\r\n\r\n');
    assert.match(expect, /^HTTP\/1\.1 413/, expect.slice(0, 200));
    // Two Content-Length headers that disagree.
    const body = JSON.stringify({ prompt: 'hi', max_tokens: 1 });
    const conflicting = await rawExchange(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nContent-Length: 3\r\n\r\n${body}`);
    assert.match(conflicting, /^HTTP\/1\.1 400/, conflicting.slice(0, 200));
  });

  it('refuses a second server on the same port', async () => {
    const second = spawn(BINARY, ['serve', '--model', path.join(MODELS, 'tiny-e2b'), '--host', '127.0.0.1', '--port', String(server.port)], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    second.stderr.on('data', (data) => { stderr += data; });
    const code = await new Promise((resolve) => second.on('exit', (exitCode) => resolve(exitCode)));
    assert.equal(code, 1, stderr);
    assert.match(stderr, /port in use/, stderr);
  });

  it('still serves afterwards', async () => {
    const health = await request(server.url('/health'));
    assert.equal(health.status, 200);
    assert.equal(health.json.status, 'ok');
    const answer = await chat({ messages, temperature: 0 });
    assert.equal(answer.status, 200, answer.text);
    assert.equal(answer.json.choices[0].message.content, FRANCE.expected_text);
    const metricsAfter = await metrics(server);
    assert.ok(metricsAfter.get('gemma4rt_requests_total{route="/v1/chat/completions",status="400"}') > 10);
  });
});

// ---------------------------------------------------------------------------------------------------
// A copy of tiny-e2b with one weight matrix of NaN (every bit set): no forward pass gives a finite logit.
function makeNanModel() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'gemma4rt-nan-'));
  const out = path.join(dir, 'nan-e2b');
  cpSync(path.join(MODELS, 'tiny-e2b'), out, { recursive: true });
  const file = path.join(out, 'model.safetensors');
  const bytes = readFileSync(file);
  const headerLength = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8'));
  const [begin, end] = header['model.language_model.layers.1.mlp.down_proj.weight'].data_offsets;
  bytes.fill(0xff, 8 + headerLength + begin, 8 + headerLength + end);
  writeFileSync(file, bytes);
  return { dir, out };
}

describe('a checkpoint whose forward pass gives no finite logit', () => {
  let model;
  let server;
  before(async () => {
    model = makeNanModel();
    server = await startServer(path.relative(MODELS, model.out), [...THREADS]);
  });
  after(async () => {
    await server?.stop();
    if (model) rmSync(model.dir, { recursive: true, force: true });
  });

  it('answers each request with a 500 error object naming the cause, not a 200, and stays up', async () => {
    const whole = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
    assertErrorResponse(whole, { status: 500, type: 'server_error', what: 'whole chat answer' });
    assert.match(whole.json.error.message, /no finite logit.*gemma4rt doctor/);
    const sampled = await postJson(server, '/v1/completions', { prompt: FRANCE_RAW.text, temperature: 0.8, logprobs: 2 });
    assertErrorResponse(sampled, { status: 500, type: 'server_error', what: 'sampled completion with logprobs' });
    const stream = await openStream(server, '/v1/completions', { prompt: FRANCE_RAW.text, temperature: 0 });
    assert.equal(stream.response.status, 500, 'streamed completion');
    assert.match((await stream.response.json()).error.message, /no finite logit/);
    await assert.rejects(clientFor(server).chat.completions.create({ model: 'nan-e2b', messages: FRANCE.messages }),
      (error) => error instanceof OpenAI.APIError && error.status === 500 && /no finite logit/.test(error.message));
    assert.equal((await request(server.url('/health'))).status, 200);
    const values = await metrics(server);
    assert.equal(values.get('gemma4rt_requests_total{route="/v1/chat/completions",status="500"}'), 2);
    assert.equal(values.get('gemma4rt_requests_total{route="/v1/completions",status="500"}'), 2);
    assert.equal(values.get('gemma4rt_sequences_in_flight'), 0);
  });
});

// ---------------------------------------------------------------------------------------------------
// Its own server: the thread counts start from a server that has served nothing yet.
describe('slow clients', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, '--ctx', '64']);
  });
  after(async () => server?.stop());
  // Sends raw bytes and resolves when the server closes the connection (or after `timeoutMs`).
  const halfRequest = (timeoutMs) => new Promise((resolve) => {
    const socket = net.connect(server.port, '127.0.0.1');
    const timer = setTimeout(() => { socket.destroy(); resolve(); }, timeoutMs);
    socket.on('close', () => { clearTimeout(timer); resolve(); });
    socket.on('error', () => {});
    socket.write('GET /hea');
  });

  it('drops half-sent requests after 5 s, serves others meanwhile and ends idle HTTP threads', async () => {
    const threads = () => Number(/Threads:\s+(\d+)/.exec(readFileSync(`/proc/${server.child.pid}/status`, 'utf8'))[1]);
    const idle = threads();
    const started = Date.now();
    await halfRequest(15000);
    const closedAfter = (Date.now() - started) / 1000;
    assert.ok(closedAfter > 4 && closedAfter < 12, `a half-sent request was closed after ${closedAfter} s`);
    // 2,000 such clients at once each hold a thread until their read times out (more than the usual
    // 1,024 open files, and a burst beyond httplib's own listen backlog of 5); normal requests are still
    // answered within 1 s meanwhile.
    const halves = Array.from({ length: 2000 }, () => halfRequest(20000));
    await waitFor(() => threads() >= idle + 1500, 10000, 'threads for the slow clients');
    let start = Date.now();
    assert.equal((await request(server.url('/health'), { timeoutMs: 1000 })).status, 200);
    assert.ok(Date.now() - start < 1000, `/health took ${Date.now() - start} ms`);
    start = Date.now();
    const answer = await postJson(server, '/v1/completions', { prompt: 'The capital of France is', max_tokens: 4, temperature: 0 });
    assert.equal(answer.status, 200, answer.text);
    assert.ok(Date.now() - start < 1000, `a completion took ${Date.now() - start} ms`);
    await Promise.all(halves);
    // Idle threads end 10 s after their last connection.
    await waitFor(() => threads() <= idle + 5, 25000, 'the idle HTTP threads to end');
  });
});

describe('--api-key', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, '--api-key', 'sekrit-key']);
  });
  after(async () => server?.stop());

  it('refuses requests without the key', async () => {
    const body = { messages: FRANCE.messages, temperature: 0 };
    assertErrorResponse(await postJson(server, '/v1/chat/completions', body), { status: 401, what: 'no key' });
    assertErrorResponse(await postJson(server, '/v1/chat/completions', body, { headers: { Authorization: 'Bearer wrong' } }), { status: 401, what: 'wrong key' });
    assertErrorResponse(await postJson(server, '/v1/completions', { prompt: 'x' }, { headers: { Authorization: 'sekrit-key' } }), { status: 401, what: 'no Bearer' });
    assertErrorResponse(await request(server.url('/v1/models')), { status: 401, what: 'models without key' });
    await assert.rejects(clientFor(server, { apiKey: 'wrong' }).chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages }), (error) => {
      assert.ok(error instanceof OpenAI.AuthenticationError, `got ${error.constructor.name}`);
      assert.equal(error.status, 401);
      return true;
    });
    // /health stays open for load balancers.
    assert.equal((await request(server.url('/health'))).status, 200);
  });

  it('serves requests with the key', async () => {
    const client = clientFor(server, { apiKey: 'sekrit-key' });
    const answer = await client.chat.completions.create({ model: 'tiny-e2b', messages: FRANCE.messages, temperature: 0 });
    assert.equal(answer.choices[0].message.content, FRANCE.expected_text);
    const models = [];
    for await (const model of client.models.list()) models.push(model.id);
    assert.deepEqual(models, ['tiny-e2b']);
  });
});

// A long raw completion: ignore_eos keeps it going for thousands of tokens (seconds) on a server
// started with LONG_CONTEXT.
const LONG_CONTEXT = ['--ctx', '16384'];
const LONG = { prompt: FRANCE_RAW.text, temperature: 0, ignore_eos: true, max_tokens: 16000 };

// Reads `count` events without closing the stream (breaking out of for-await would cancel it).
async function firstEvents(stream, count) {
  const seen = [];
  while (seen.length < count) {
    const { value, done } = await stream.events.next();
    if (done) break;
    seen.push(value);
  }
  return seen;
}

// ---------------------------------------------------------------------------------------------------
describe('queue limit (--parallel 1 --max-queue 0)', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, ...LONG_CONTEXT, '--parallel', '1', '--max-queue', '0']);
  });
  after(async () => server?.stop());

  it('refuses a second request with 429 while the slot is busy', async () => {
    const stream = await openStream(server, '/v1/completions', LONG);
    try {
      assert.equal(stream.response.status, 200);
      const events = await firstEvents(stream, 2);
      assert.equal(events.length, 2, 'the long request is running');
      const refused = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages });
      assertErrorResponse(refused, { status: 429, type: 'rate_limit_error', what: 'second request' });
      assert.equal(refused.headers.get('retry-after'), '1');
      await assert.rejects(clientFor(server).completions.create({ model: 'tiny-e2b', prompt: 'hi' }), (error) => {
        assert.ok(error instanceof OpenAI.RateLimitError, `got ${error.constructor.name}`);
        return true;
      });
      const queueMetrics = await metrics(server);
      assert.equal(queueMetrics.get('gemma4rt_sequences_in_flight'), 1);
      assert.ok(queueMetrics.get('gemma4rt_requests_total{route="/v1/chat/completions",status="429"}') >= 1);
    } finally {
      stream.controller.abort();
    }
    await waitFor(async () => (await metrics(server)).get('gemma4rt_sequences_in_flight') === 0, 3000, 'the aborted request to end');
    const answer = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
    assert.equal(answer.status, 200, answer.text);
    assert.equal(answer.json.choices[0].message.content, FRANCE.expected_text);
  });
});

// ---------------------------------------------------------------------------------------------------
describe('many waiting clients (--parallel 1 --max-queue 70)', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, ...LONG_CONTEXT, '--parallel', '1', '--max-queue', '70']);
  });
  after(async () => server?.stop());

  it('queues up to the limit, refuses the rest with 429 and still answers /health', async () => {
    const streams = [];
    const refusals = [];
    try {
      // 1 runs, 70 wait, 2 are refused: more open requests than a fixed pool of 64 HTTP threads holds.
      const attempts = Array.from({ length: 73 }, async () => {
        try {
          const stream = await openStream(server, '/v1/completions', LONG, { timeoutMs: 20000 });
          if (stream.response.status === 200) streams.push(stream);
          else refusals.push({ status: stream.response.status, body: await stream.response.text() });
        } catch (error) {
          refusals.push({ error });
        }
      });
      await Promise.race([Promise.all(attempts), sleep(5000, null, { ref: false })]);
      assert.equal(streams.length + refusals.length, 73, 'every request got an answer');
      assert.equal(streams.length, 71, `71 accepted (${JSON.stringify(refusals.slice(0, 3))})`);
      assert.equal(refusals.length, 2);
      for (const refusal of refusals) {
        assert.equal(refusal.status, 429, JSON.stringify(refusal));
        assert.equal(JSON.parse(refusal.body).error.type, 'rate_limit_error');
      }
      const start = Date.now();
      const health = await request(server.url('/health'), { timeoutMs: 3000 });
      assert.equal(health.status, 200);
      assert.ok(Date.now() - start < 1000, '/health answers at once');
      const queued = await metrics(server);
      assert.equal(queued.get('gemma4rt_sequences_in_flight'), 1);
      assert.equal(queued.get('gemma4rt_queue_depth'), 70);
    } finally {
      for (const stream of streams) stream.controller.abort();
    }
    await waitFor(async () => {
      const values = await metrics(server);
      return values.get('gemma4rt_sequences_in_flight') === 0 && values.get('gemma4rt_queue_depth') === 0;
    }, 5000, 'the abandoned requests to be dropped');
    const answer = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
    assert.equal(answer.json?.choices?.[0]?.message?.content, FRANCE.expected_text, answer.text);
  });
});

// ---------------------------------------------------------------------------------------------------
describe('client disconnect (--parallel 1)', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, ...LONG_CONTEXT, '--parallel', '1']);
  });
  after(async () => server?.stop());

  async function assertSlotFreedQuickly() {
    const freedAfter = await waitFor(async () => (await metrics(server)).get('gemma4rt_sequences_in_flight') === 0, 1000, 'gemma4rt_sequences_in_flight to drop to 0');
    const start = Date.now();
    const answer = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
    const latency = Date.now() - start;
    assert.equal(answer.status, 200, answer.text);
    assert.equal(answer.json.choices[0].message.content, FRANCE.expected_text);
    assert.ok(latency < 1000, `the next request took ${latency} ms`);
    return freedAfter;
  }

  it('frees the slot when a stream is aborted', async () => {
    for (const route of ['/v1/completions', '/v1/chat/completions']) {
      const body = route === '/v1/completions' ? LONG : { messages: FRANCE.messages, temperature: 0, ignore_eos: true, max_tokens: 16000 };
      const stream = await openStream(server, route, body);
      const events = await firstEvents(stream, 3);
      assert.equal(events.length, 3);
      assert.equal((await metrics(server)).get('gemma4rt_sequences_in_flight'), 1, 'still generating');
      stream.controller.abort();
      await assertSlotFreedQuickly();
    }
  });

  it('drops a queued request at once when its client goes away or its timeout passes', async () => {
    const running = await openStream(server, '/v1/completions', LONG);
    try {
      assert.equal((await firstEvents(running, 2)).length, 2, 'the long request is running');
      // Abandoned while queued.
      const queued = await openStream(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 });
      assert.equal(queued.response.status, 200);
      assert.equal((await metrics(server)).get('gemma4rt_queue_depth'), 1);
      queued.controller.abort();
      await waitFor(async () => (await metrics(server)).get('gemma4rt_queue_depth') === 0, 1500, 'the abandoned request to leave the queue');
      // Timed out while queued.
      const start = Date.now();
      const timedOut = await postJson(server, '/v1/completions', { prompt: FRANCE_RAW.text, temperature: 0, timeout: 0.3 });
      const elapsed = Date.now() - start;
      assert.equal(timedOut.status, 200, timedOut.text);
      assert.ok(elapsed < 1500, `the request with a 0.3 s timeout took ${elapsed} ms`);
      assert.equal(timedOut.json.usage.completion_tokens, 0);
      assert.equal(timedOut.json.choices[0].text, '');
      const values = await metrics(server);
      assert.equal(values.get('gemma4rt_sequences_in_flight'), 1, 'the long request still runs');
      assert.equal(values.get('gemma4rt_queue_depth'), 0);
    } finally {
      running.controller.abort();
    }
    await assertSlotFreedQuickly();
  });

  it('frees the slot when a non-streamed request is abandoned', async () => {
    const controller = new AbortController();
    const pending = fetch(server.url('/v1/completions'), { method: 'POST', body: JSON.stringify(LONG), headers: { 'Content-Type': 'application/json' }, signal: controller.signal })
      .then((response) => response.text())
      .catch((error) => error);
    await waitFor(async () => (await metrics(server)).get('gemma4rt_sequences_in_flight') === 1, 3000, 'the request to start');
    await sleep(100);
    controller.abort();
    const outcome = await pending;
    assert.ok(outcome instanceof Error, 'the request was aborted before it finished');
    await assertSlotFreedQuickly();
  });
});

// ---------------------------------------------------------------------------------------------------
describe('draining on SIGTERM (--parallel 1)', () => {
  let server;
  before(async () => {
    server = await startServer('tiny-e2b', [...THREADS, ...LONG_CONTEXT, '--parallel', '1']);
  });
  after(async () => server?.stop());

  // Reads a whole stream in the background: {events, done (a flag), finished (a promise)}.
  function drainStream(stream, events = []) {
    const state = { events, done: false };
    state.finished = (async () => {
      for await (const event of stream.events) {
        events.push(event);
        if (event === '[DONE]') state.done = true;
      }
    })();
    return state;
  }

  function assertComplete(events, expectedTokens, what) {
    assert.equal(events.at(-1), '[DONE]', `${what}: the stream ends with [DONE]`);
    const chunks = events.slice(0, -1);
    const finishes = chunks.filter((chunk) => chunk.choices?.[0]?.finish_reason);
    assert.equal(finishes.length, 1, what);
    assert.equal(finishes[0].choices[0].finish_reason, 'length', what);
    assert.equal(chunks.at(-1).usage?.completion_tokens, expectedTokens, `${what}: every token generated`);
    assert.ok(chunks.map((chunk) => chunk.choices?.[0]?.text ?? '').join('').startsWith(' Paris.'), what);
  }

  it('finishes running and queued requests, refuses new ones with 503 and exits 0', async () => {
    const usage = { stream_options: { include_usage: true } };
    // Long enough (seconds of the tiny model) that the signal and the refusal come while it runs; the
    // streams may take minutes under the sanitizers.
    const slow = { timeoutMs: 180000 };
    const running = await openStream(server, '/v1/completions', { ...LONG, ...usage, max_tokens: 6000 }, slow);
    assert.equal(running.response.status, 200);
    const events = await firstEvents(running, 3);
    assert.equal(events.length, 3);
    // A second request waits for the only slot.
    const queued = await openStream(server, '/v1/completions', { ...LONG, ...usage, max_tokens: 300 }, slow);
    assert.equal(queued.response.status, 200);
    assert.equal((await metrics(server)).get('gemma4rt_queue_depth'), 1, 'the second request is queued');
    const first = drainStream(running, events);
    const second = drainStream(queued);

    server.child.kill('SIGTERM');
    // /health turns 503 as soon as the signal is handled (a completion request sent before that would
    // be queued behind the others, not refused).
    await waitFor(async () => {
      const health = await request(server.url('/health'), { timeoutMs: 2000 });
      if (health.status === 503) assert.equal(health.json?.status, 'draining');
      return health.status === 503;
    }, 5000, '/health to report draining');
    const refused = await postJson(server, '/v1/chat/completions', { messages: FRANCE.messages, temperature: 0 }, { timeoutMs: 5000 });
    const duringStream = !first.done;
    assertErrorResponse(refused, { status: 503, what: 'request while draining' });
    assert.ok(duringStream, 'the 503 came while the stream was still running');
    assertErrorResponse(await postJson(server, '/v1/completions', { prompt: 'x' }, { timeoutMs: 5000 }), { status: 503, what: 'completion while draining' });

    await Promise.all([first.finished, second.finished]);
    assertComplete(first.events, 6000, 'running request');
    assertComplete(second.events, 300, 'queued request');
    const exit = await Promise.race([server.exited, sleep(15000, null, { ref: false })]);
    assert.ok(exit, `the server did not exit within 15 s of finishing; stderr:\n${server.stderr()}`);
    assert.deepEqual(exit, { code: 0, signal: null }, server.stderr());
    assert.match(server.stderr(), /draining/);
  });
});
