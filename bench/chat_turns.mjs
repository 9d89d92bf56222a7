// The turns of one chat against `gemma4rt serve`: a long first user turn, then short follow-ups, each
// request resending the conversation (as chat clients do). Each turn generates ANSWER_TOKENS tokens
// (streamed) and the client sends back a fixed answer instead (as when thinking is stripped). Reports
// each turn's time to first token, prompt tokens and the tokens the server reused
// (usage.prompt_tokens_details.cached_tokens).
// usage: node bench/chat_turns.mjs http://127.0.0.1:PORT [FIRST_TURN_WORDS] [TURNS] [ANSWER_TOKENS]
import { sseEvents } from "../tests/e2e/serve_harness.mjs";

const [base, wordsText = "300", turnsText = "4", answerText = "1"] = process.argv.slice(2);
const words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split(" ");
const text = Array.from({ length: Number(wordsText) }, (_, i) => words[(i * 7) % words.length]).join(" ");

async function turn(messages) {
  const started = performance.now();
  const response = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: Number(answerText), temperature: 0, ignore_eos: true, logprobs: true, stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (!response.ok) throw new Error(`${response.status}: ${await response.text()}`);
  // Every token's chunk carries its logprob, so the first one after the role chunk marks the first token.
  let firstToken = null, usage = null;
  for await (const data of sseEvents(response)) {
    if (data === "[DONE]") continue;
    const chunk = JSON.parse(data);
    if (chunk.usage) usage = chunk.usage;
    if (firstToken === null && chunk.choices?.[0]?.logprobs) firstToken = performance.now() - started;
  }
  return { first_token_ms: Math.round(firstToken), prompt_tokens: usage.prompt_tokens, cached_tokens: usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

const messages = [{ role: "user", content: `Summarise this text: ${text}` }];
const results = [];
for (let i = 0; i < Number(turnsText); ++i) {
  results.push(await turn(messages));
  // A fixed answer: a random-weight model's own would be noise; the next prompt resends it either way.
  messages.push({ role: "assistant", content: "Here is a short summary of the text you gave." }, { role: "user", content: `Follow-up number ${i + 1}?` });
}
console.log(JSON.stringify(results));
