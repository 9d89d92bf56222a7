// The turns of one chat against `gemma4rt serve`: a long first user turn, then short follow-ups, each
// request resending the conversation (as chat clients do) and generating one token, so its time is the
// time to first token. Reports each turn's milliseconds, prompt tokens and the tokens the server reused
// (usage.prompt_tokens_details.cached_tokens).
// usage: node bench/chat_turns.mjs http://127.0.0.1:PORT [FIRST_TURN_WORDS] [TURNS]
const [base, wordsText = "300", turnsText = "4"] = process.argv.slice(2);
const words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split(" ");
const text = Array.from({ length: Number(wordsText) }, (_, i) => words[(i * 7) % words.length]).join(" ");

async function turn(messages) {
  const started = performance.now();
  const response = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: 1, temperature: 0, ignore_eos: true }),
  });
  const body = await response.json();
  if (!response.ok) throw new Error(`${response.status}: ${JSON.stringify(body)}`);
  return { ms: Math.round(performance.now() - started), prompt_tokens: body.usage.prompt_tokens, cached_tokens: body.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

const messages = [{ role: "user", content: `Summarise this text: ${text}` }];
const results = [];
for (let i = 0; i < Number(turnsText); ++i) {
  results.push(await turn(messages));
  // A fixed answer: a random-weight model's own would be noise; the next prompt resends it either way.
  messages.push({ role: "assistant", content: "Here is a short summary of the text you gave." }, { role: "user", content: `Follow-up number ${i + 1}?` });
}
console.log(JSON.stringify(results));
