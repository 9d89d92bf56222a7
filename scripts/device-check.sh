#!/usr/bin/env bash
# The GPU checks of the Vulkan backend, as one script for a machine with a GPU (e.g. the H200 lent to a
# session): built on the Debian machine, run there. Prepare here, then run there:
#   scripts/device-check.sh pack          # here: copies the shared libraries the binary needs (ldd) and
#                                         # the Vulkan loader into .device-libs/ (ignore it in .git/info/exclude)
#   scripts/device-check.sh run [OUT]     # there: devices, goldens on f32, coherence on bf16, verify and
#                                         # bench on full-size shapes made there; JSON lines into OUT
# The NVIDIA driver's Vulkan ICD is already on such a machine; only the loader travels.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=build/gemma4rt
libs=.device-libs

if [ "${1:-}" = pack ]; then
  mkdir -p "$libs"
  ldd "$binary" | awk '/=> \// { print $3 }' | while read -r library; do
    case "$(basename "$library")" in libc.so*|libm.so*|libpthread.so*|libdl.so*|ld-linux*) ;; *) cp -L "$library" "$libs/";; esac
  done
  cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 "$libs/"
  du -sh "$libs"
  exit 0
fi

out=${2:-${OUT:-/tmp/device-check}}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=${WORK:-/tmp/gemma4rt-device}
mkdir -p "$work"
log() { echo "== $*" | tee -a "$out/log"; }

log devices
"$binary" devices --json | tee "$out/devices.json"

log "goldens (f32) and coherence (bf16) on the GPU"
for model in tests/data/golden/*/; do
  name=$(basename "$model")
  ids=$(python3 -c "import json; p=json.load(open('$model/golden.json'))['prompts'][0]; print(','.join(map(str,p['input_ids'])), ','.join(map(str,p['greedy']['tokens'])))")
  prompt=${ids% *} expected=${ids#* }
  got=$("$binary" run --model "$model" --backend vulkan --dtype f32 --kv f32 --prompt-ids "$prompt" --ignore-eos \
        --max-tokens 24 --ctx 128 --json | python3 -c "import json,sys; print(','.join(map(str,json.load(sys.stdin)['tokens'])))")
  echo "{\"golden\": \"$name\", \"exact\": $([ "$got" = "$expected" ] && echo true || echo false)}" | tee -a "$out/results.jsonl"
done
for model in models/*/; do
  "$binary" verify --model "$model" --backend vulkan --dtype bf16 --no-builtin \
    --expect "What is the capital of France?=Paris" --json > "$out/coherence-$(basename "$model").json" || true
done

log "full-size shapes: verify and bench"
for shape in e2b e4b; do
  [ -f "$work/$shape/config.json" ] || "$binary" make-model --shape "$shape" --out "$work/$shape" --force
  "$binary" verify --model "$work/$shape" --backend vulkan --dtype f32 --kv f32 --max-tokens 8 --json > "$out/verify-$shape-f32.json" || true
  for dtype in bf16 q8 q4; do
    "$binary" bench --model "$work/$shape" --backend vulkan --dtype "$dtype" -p 512 -n 64 --json | tee -a "$out/bench.jsonl"
  done
done
for shape in 12b 31b 26b-a4b; do
  [ -f "$work/$shape-l4/config.json" ] || "$binary" make-model --shape "$shape" --layers 4 --out "$work/$shape-l4" --force
  "$binary" verify --model "$work/$shape-l4" --backend vulkan --dtype f32 --kv f32 --max-tokens 8 --json > "$out/verify-$shape-f32.json" || true
  "$binary" bench --model "$work/$shape-l4" --backend vulkan -p 512 -n 32 --json | tee -a "$out/bench.jsonl"
done
