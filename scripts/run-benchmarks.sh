#!/usr/bin/env bash
# Reproduces the figures of docs/benchmarks.md on this machine. Writes synthetic full-size checkpoints
# to $WORK (default /tmp/gemma4rt-bench, about 60 GB; removed at the end unless KEEP=1) and prints JSON
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

# q4 and q8 decode, alternating (the VM's bandwidth drifts within minutes).
"$binary" quantize --model "$work/e2b" --out "$work/e2b-q8" --dtype q8 --force
"$binary" quantize --model "$work/e2b" --out "$work/e2b-q4" --dtype q4 --force
for d in e2b-q8 e2b-q4; do cp "$work/e2b/tokenizer.json" "$work/$d/"; done
for run in 1 2; do
  bench "e2b q8 checkpoint, run $run" --model "$work/e2b-q8" -p 64 -n 32
  bench "e2b q4 checkpoint, run $run" --model "$work/e2b-q4" -p 64 -n 32
done

# A step of 8 sequences against one, product by product, the two interleaved call by call (the
# figures behind the server's 8-stream speedup, steady where whole runs drift).
echo "== kernel products: 8 tokens against 1"
./build/gemma4rt_kernel_bench --benchmark_filter='BatchCost/.*/tokens:8/threads:2' --benchmark_min_time=0.5 \
  --benchmark_format=json | grep -E '"(name|step_ratio|speedup)"'

serve_load() {  # checkpoint dir, --parallel, concurrencies...
  local dir=$1 parallel=$2; shift 2
  echo "== serve $dir --parallel $parallel: aggregate decode at concurrency $*"
  "$binary" serve --model "$work/$dir" --port 18123 --parallel "$parallel" --ctx 512 > "$work/serve.log" 2>&1 &
  local server=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:18123/health >/dev/null && break; sleep 1; done
  node bench/serve_load.mjs http://127.0.0.1:18123 1 16 32 >/dev/null  # warm-up: touches every weight page
  for concurrency in "$@"; do node bench/serve_load.mjs http://127.0.0.1:18123 "$concurrency" 64 32; done
  kill -TERM "$server"; wait "$server" || true
}
serve_load e2b 8 1 4 8
serve_load e2b 16 16
serve_load e2b-q8 8 1 4 8
serve_load e2b-q8 16 16

[ "${KEEP:-0}" = 1 ] || rm -rf "$work"
