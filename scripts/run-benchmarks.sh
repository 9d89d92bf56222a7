#!/usr/bin/env bash
# Reproduces the figures of docs/benchmarks.md on this machine. Writes synthetic full-size checkpoints
# to $WORK (default /tmp/gemma4rt-bench, about 45 GB; removed at the end unless KEEP=1) and prints JSON
# lines. Run on an otherwise idle machine: the decode figures are memory-bandwidth measurements.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=./build/gemma4rt
work=${WORK:-/tmp/gemma4rt-bench}
mkdir -p "$work"

make_model() {  # shape dir [extra flags]
  [ -f "$work/$2/config.json" ] || "$binary" make-model --shape "$1" --out "$work/$2" --force "${@:3}"
}
bench() {  # label, then bench arguments
  local label=$1; shift
  echo "== $label"
  /usr/bin/time -f '{"max_rss_kb": %M}' "$binary" bench "$@" --json 2>&1 | grep -v '^bench:'
}

make_model e2b e2b
xz -dc tests/data/tokenizer/gemma4-tokenizer.json.xz > "$work/e2b/tokenizer.json"
bench "e2b bf16" --model "$work/e2b" -p 512 -n 64 -r 2
bench "e2b q8" --model "$work/e2b" --dtype q8 -p 512 -n 64
bench "e2b bf16 depth 4096" --model "$work/e2b" -p 64 -n 32 -d 4096
bench "e2b bf16 tp2 in-process" --model "$work/e2b" -p 64 -n 32 --tp 2
echo "== e2b bf16 tp2 mpi"
scripts/mpirun.sh -np 2 "$binary" bench --model "$work/e2b" -p 64 -n 32 --tp 2 --json 2>&1 | grep -v '^bench:'

make_model e4b e4b
bench "e4b bf16 (full size)" --model "$work/e4b" -p 64 -n 16
for shape in 12b 31b 26b-a4b; do
  make_model "$shape" "$shape-l4" --layers 4
  bench "$shape bf16, 4 layers" --model "$work/$shape-l4" -p 64 -n 16
done

echo "== serve e2b: aggregate decode at concurrency 1, 4, 8"
"$binary" serve --model "$work/e2b" --port 18123 --parallel 8 --ctx 512 > "$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 120); do curl -sf http://127.0.0.1:18123/health >/dev/null && break; sleep 1; done
for concurrency in 1 4 8; do node bench/serve_load.mjs http://127.0.0.1:18123 "$concurrency" 32 64; done
kill -TERM "$server"; wait "$server" || true

[ "${KEEP:-0}" = 1 ] || rm -rf "$work"
