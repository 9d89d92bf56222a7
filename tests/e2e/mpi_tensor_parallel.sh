#!/usr/bin/env bash
# Tensor parallelism across processes: `mpirun -np 2 gemma4rt run --tp 2` must give exactly the tokens
# of a single process, for a golden checkpoint whose global layers have one KV head (replicated).
set -euo pipefail
binary="$1"
data="$2"
# The test machine runs as root and has 2 cores: let OpenMPI run there.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
status=0
for model in tiny-e2b tiny-12b tiny-26b-a4b; do
  args=(run --model "$data/golden/$model" --prompt-ids 2,17,300,41,99 --reference --ignore-eos --max-tokens 16 --json)
  single=$("$binary" "${args[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  split=$(timeout 120 mpirun -np 2 "$binary" "${args[@]}" --tp 2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  if [ "$single" = "$split" ]; then
    echo "$model: mpirun -np 2 --tp 2 gives the single-process tokens $single"
  else
    echo "$model: MISMATCH single $single vs mpirun $split"
    status=1
  fi
done

# The server under mpirun: rank 0 answers HTTP, rank 1 mirrors every engine step.
models="$data/../../models"
port=$((20000 + RANDOM % 20000))
mpirun -np 2 "$binary" serve --model "$models/tiny-e2b" --port "$port" --tp 2 --threads 1 >/dev/null 2>&1 &
server=$!
answer=""
for _ in $(seq 60); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
    answer=$(curl -s --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" \
      -d '{"messages":[{"role":"user","content":"What is the capital of Japan?"}],"temperature":0}' |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
    break
  fi
  sleep 1
done
kill -TERM "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
if [ "$answer" = "The capital of Japan is Tokyo." ]; then
  echo "serve under mpirun -np 2 --tp 2 answers: $answer"
else
  echo "serve under mpirun -np 2 --tp 2: wrong answer '$answer'"
  status=1
fi
if [ $status -eq 0 ]; then echo "4 passed, 0 failed"; else echo "0 passed, 4 failed"; fi
exit $status
