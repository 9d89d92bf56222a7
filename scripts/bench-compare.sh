#!/usr/bin/env bash
# Side-by-side speed of two gemma4rt binaries on one checkpoint, alternating which goes first each round
# and pausing between rounds, because this VM's memory bandwidth drifts by minutes. Prints one JSON line
# per measurement: {"binary": LABEL, "round": N, "test": ..., ...the bench or load-test figures}.
#   scripts/bench-compare.sh OLD_BINARY NEW_BINARY MODEL_DIR [ROUNDS] [PAUSE_SECONDS]
# Tests: bf16 prefill of 512 tokens and decode of 64 (-p 512 -n 64), q8 decode (-p 64 -n 64 --dtype q8),
# and the 8-stream server aggregate (serve --parallel 8, bench/serve_load.mjs 8 streams of 64 tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 model=$3 rounds=${4:-3} pause=${5:-60}

bench() {  # label round test, then bench arguments
  local label=$1 round=$2 test=$3; shift 3
  "${!label}" bench --model "$model" "$@" --json 2>/dev/null |
    python3 -c "import json,sys; r=json.load(sys.stdin); r.update(binary='$label', round=$round, test='$test'); print(json.dumps(r))"
}

serve_load() {  # label round
  local label=$1 round=$2 port=18571 pid
  "${!label}" serve --model "$model" --port $port --parallel 8 --ctx 512 2>/dev/null &
  pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
  node bench/serve_load.mjs "http://127.0.0.1:$port" 8 64 32 |
    python3 -c "import json,sys; r=json.load(sys.stdin); r.update(binary='$label', round=$round, test='serve8'); print(json.dumps(r))"
  kill -TERM $pid
  wait $pid || true
}

for round in $(seq "$rounds"); do
  order=(old new)
  if (( round % 2 == 0 )); then order=(new old); fi
  for label in "${order[@]}"; do
    bench "$label" "$round" bf16 -p 512 -n 64
    bench "$label" "$round" q8 -p 64 -n 64 --dtype q8
    serve_load "$label" "$round"
  done
  (( round < rounds )) && sleep "$pause"
done
