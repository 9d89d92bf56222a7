// Load test of `gemma4rt serve`: N concurrent streaming completions, each decoding a fixed number of
// tokens; reports aggregate decode tokens/s and time to first token. Loopback only, bounded in count.
// usage: node bench/serve_load.mjs http://127.0.0.1:PORT CONCURRENCY [TOKENS] [PROMPT_TOKENS]
import { sseEvents } from "../tests/e2e/serve_harness.mjs";

const [base, concurrencyText, tokensText = "32", promptText = "64"] = process.argv.slice(2);
const concurrency = Number(concurrencyText);
const maxTokens = Number(tokensText);
const promptTokens = Number(promptText);

// Times below are performance.now() milliseconds, one clock for every stream.
async function one(index) {
  // Token ids, so any tokenizer works; different prompts per stream.
  const prompt = [2, ...Array.from({ length: promptTokens - 1 }, (_, i) => 1000 + ((i * 7919 + index * 104729) % 200000))];
  const started = performance.now();
  const arrivals = [];  // when each token's chunk arrived
  const response = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    // logprobs 0 (the chosen token's own): every token then comes as its own chunk, also one whose text
    // is empty or held back (a random-weight checkpoint picks many such tokens).
    body: JSON.stringify({ prompt, max_tokens: maxTokens, ignore_eos: true, temperature: 0, stream: true, logprobs: 0 }),
    signal: AbortSignal.timeout(600_000),
  });
  if (!response.ok) {
    console.error(`serve_load: stream ${index}: HTTP ${response.status} ${await response.text()}`);
    process.exit(1);
  }
  let firstToken = null;
  let tokens = 0;
  for await (const data of sseEvents(response)) {
    if (data === "[DONE]") continue;
    const chunk = JSON.parse(data);
    if (chunk.choices?.[0]?.logprobs) {
      const now = performance.now();
      tokens += 1;
      arrivals.push(now);
      if (firstToken === null) firstToken = now - started;
    }
  }
  return { firstToken, tokens, arrivals };
}

const started = performance.now();
const results = await Promise.all(Array.from({ length: concurrency }, (_, i) => one(i)));
const seconds = (performance.now() - started) / 1000;
const generated = results.reduce((sum, r) => sum + r.tokens, 0);
const silent = results.filter((r) => r.firstToken === null).length;
if (silent > 0) {
  console.error(`serve_load: ${silent} of ${concurrency} streams received no token`);
  process.exit(1);
}
const ttft = results.map((r) => r.firstToken).sort((a, b) => a - b);
// Decode phase: the stretches in which the most streams decode together (each stream decodes from its
// first token to its last). With no more streams than the server has slots that is one stretch, from
// the last stream's first token to the first stream's end; with more, each slot's stream is followed by
// a waiting one, and the stretches are those at full occupancy. The rate counts only the tokens that
// arrived inside them: a stream whose prompt was served first has already decoded some tokens when the
// last stream's first token comes.
const spans = results.map((r) => [r.arrivals[0], r.arrivals[r.arrivals.length - 1]]);
const edges = spans.flatMap(([from, to]) => [[from, 1], [to, -1]]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
let active = 0;
let decodeStreams = 0;
const stretches = [];  // [from, to, streams decoding]
for (let i = 0; i + 1 < edges.length; ++i) {
  active += edges[i][1];
  if (edges[i + 1][0] > edges[i][0]) stretches.push([edges[i][0], edges[i + 1][0], active]);
  decodeStreams = Math.max(decodeStreams, active);
}
const full = stretches.filter(([, , streams]) => streams === decodeStreams);
const inside = (t) => full.some(([from, to]) => t > from && t <= to);
const decodeTokens = results.reduce((sum, r) => sum + r.arrivals.filter(inside).length, 0);
const decodeWindow = full.reduce((sum, [from, to]) => sum + (to - from), 0) / 1000;
if (decodeTokens === 0 || decodeWindow <= 0) {
  console.error("serve_load: no stretch in which the streams decoded together (raise TOKENS)");
  process.exit(1);
}
console.log(JSON.stringify({
  concurrency, max_tokens: maxTokens, prompt_tokens: promptTokens, seconds,
  chunks_received: generated, aggregate_tokens_per_s: (concurrency * maxTokens) / seconds,
  ttft_ms_median: ttft[Math.floor(ttft.length / 2)], ttft_ms_max: ttft[ttft.length - 1],
  decode_streams: decodeStreams, decode_window_s: decodeWindow, decode_window_tokens: decodeTokens,
  decode_phase_tokens_per_s: decodeTokens / decodeWindow,
}));
