// Helpers for the end-to-end tests of `gemma4rt serve`: starting and stopping server processes,
// bounded HTTP requests, a server-sent-events reader, the coherence fixtures and /metrics parsing.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export const BINARY = process.env.GEMMA4RT_BINARY;
export const MODELS = process.env.GEMMA4RT_MODELS;

export function checkEnvironment() {
  if (!BINARY) throw new Error('GEMMA4RT_BINARY is not set: point it at the built gemma4rt binary');
  if (!MODELS) throw new Error('GEMMA4RT_MODELS is not set: point it at the models/ directory');
}

// Every server this process started, so none outlives it even if a test or hook throws.
const liveServers = new Set();
process.on('exit', () => {
  for (const server of liveServers) {
    try {
      server.child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});

// Starts `gemma4rt serve` on a free port of 127.0.0.1 and waits until /health answers 200.
// The returned object has port, baseURL (…/v1), url(path), child, stderr(), exited (a promise of
// {code, signal}) and stop() (SIGKILL unless it already exited; safe to call twice).
export async function startServer(model, extraArgs = [], { readyTimeoutMs = 30000 } = {}) {
  checkEnvironment();
  // GEMMA4RT_SERVER_ARGS runs the same suite on another backend (e.g. "--backend vulkan --device 0").
  const backendArgs = (process.env.GEMMA4RT_SERVER_ARGS ?? '').split(' ').filter((word) => word !== '');
  const args = ['serve', '--model', path.join(MODELS, model), '--host', '127.0.0.1', '--port', '0', ...backendArgs, ...extraArgs];
  const child = spawn(BINARY, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const server = {
    child,
    exited,
    stderr: () => stderr,
    port: 0,
    get baseURL() {
      return `http://127.0.0.1:${this.port}/v1`;
    },
    url(route) {
      return `http://127.0.0.1:${this.port}${route}`;
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
      liveServers.delete(server);
    },
  };
  liveServers.add(server);
  try {
    server.port = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`gemma4rt serve printed no port within ${readyTimeoutMs} ms; stderr:\n${stderr}`)), readyTimeoutMs);
      child.on('error', (error) => {
        clearTimeout(timer);
        reject(new Error(`cannot start ${BINARY}: ${error.message}`));
      });
      child.stderr.on('data', (data) => {
        stderr += data;
        const match = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
        if (match) {
          clearTimeout(timer);
          resolve(Number(match[1]));
        }
      });
      exited.then(({ code, signal }) => {
        clearTimeout(timer);
        reject(new Error(`gemma4rt serve exited (code ${code}, signal ${signal}) before listening; stderr:\n${stderr}`));
      });
    });
    const deadline = Date.now() + readyTimeoutMs;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`gemma4rt serve exited while loading; stderr:\n${stderr}`);
      }
      try {
        const response = await fetch(server.url('/health'), { signal: AbortSignal.timeout(2000) });
        await response.arrayBuffer();
        if (response.status === 200) break;
        if (response.status !== 503) throw new Error(`/health answered ${response.status} while loading`);
      } catch (error) {
        if (error.message?.includes('while loading')) throw error;
        // not accepting yet: retry
      }
      if (Date.now() > deadline) throw new Error(`gemma4rt serve did not become ready within ${readyTimeoutMs} ms; stderr:\n${stderr}`);
      await sleep(50);
    }
  } catch (error) {
    await server.stop();
    throw error;
  }
  return server;
}

// fetch with a time limit; returns {status, headers, text, json} (json undefined when not JSON).
export async function request(url, { method = 'GET', body, headers = {}, timeoutMs = 20000 } = {}) {
  const init = { method, headers: { ...headers }, signal: AbortSignal.timeout(timeoutMs) };
  if (body !== undefined) {
    const raw = typeof body === 'string' || body instanceof Uint8Array || body instanceof FormData;
    init.body = raw ? body : JSON.stringify(body);
    const hasType = Object.keys(init.headers).some((key) => key.toLowerCase() === 'content-type');
    if (!hasType && !(body instanceof FormData)) init.headers['Content-Type'] = 'application/json';
  }
  const response = await fetch(url, init);
  const text = await response.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, json };
}

export function postJson(server, route, body, options = {}) {
  return request(server.url(route), { method: 'POST', body, ...options });
}

// Reads a server-sent-events body: yields each event's data string ("[DONE]" included).
export async function* sseEvents(response) {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data) yield data;
    }
  }
  if (buffer.trim()) throw new Error(`stream ended inside an event: ${JSON.stringify(buffer)}`);
}

// Starts a streamed request and returns {response, events (async iterator of parsed data),
// controller}; the whole exchange is bounded by timeoutMs.
export async function openStream(server, route, body, { timeoutMs = 30000, headers = {} } = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error(`stream not finished within ${timeoutMs} ms`)), timeoutMs);
  timer.unref(); // an abandoned stream must not keep the test process alive
  const response = await fetch(server.url(route), {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ ...body, stream: true }),
    signal: controller.signal,
  });
  const events = (async function* () {
    try {
      for await (const data of sseEvents(response)) yield data === '[DONE]' ? data : JSON.parse(data);
    } finally {
      clearTimeout(timer);
    }
  })();
  return { response, events, controller, cancelTimer: () => clearTimeout(timer) };
}

export function loadCoherence(model) {
  return JSON.parse(readFileSync(path.join(MODELS, model, 'coherence.json'), 'utf8'));
}

// id -> piece text ("▁" shown as a space) from the model's tokenizer.json.
export function loadPieces(model) {
  const tokenizer = JSON.parse(readFileSync(path.join(MODELS, model, 'tokenizer.json'), 'utf8'));
  const pieces = new Map();
  for (const [piece, id] of Object.entries(tokenizer.model.vocab)) pieces.set(id, piece.replaceAll('\u2581', ' '));
  for (const added of tokenizer.added_tokens) pieces.set(added.id, added.content);
  return pieces;
}

// Prometheus text -> Map of "name{labels}" -> number.
export function parseMetrics(text) {
  const values = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = /^(\S+)\s+(\S+)$/.exec(line);
    if (match) values.set(match[1], Number(match[2]));
  }
  return values;
}

export async function metrics(server) {
  const response = await request(server.url('/metrics'), { timeoutMs: 5000 });
  if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`);
  return parseMetrics(response.text);
}

// Polls `check` (async, returns truthy when done) every 20 ms until it holds or timeoutMs passes;
// returns the elapsed milliseconds, or throws with `what`.
export async function waitFor(check, timeoutMs, what) {
  const start = Date.now();
  for (;;) {
    if (await check()) return Date.now() - start;
    if (Date.now() - start > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

// Whether a response carries an OpenAI-style error body: {error: {message, type, ...}}.
export function isErrorObject(response) {
  const error = response.json?.error;
  return error !== undefined && typeof error.message === 'string' && error.message.length > 0 && typeof error.type === 'string' && error.type.length > 0;
}
