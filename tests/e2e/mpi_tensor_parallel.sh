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
if [ $status -eq 0 ]; then echo "3 passed, 0 failed"; else echo "0 passed, 3 failed"; fi
exit $status
