#!/usr/bin/env bash
# mpirun with what gemma4rt's multi-process runs need, for any arguments mpirun takes:
#   scripts/mpirun.sh -np 2 build/gemma4rt run --model DIR --tp 2 --chat "Hello"
#   scripts/mpirun.sh --hostfile hosts -np 4 build/gemma4rt serve --model DIR --tp 4
# OpenMPI refuses to start as root unless told it may (containers and CI machines run as root), and by
# default refuses more ranks than cores (a 2-core machine running TP=4 for a test).
set -euo pipefail
if ! command -v mpirun >/dev/null; then
  echo "mpirun: not installed (run scripts/install-deps.sh, which installs openmpi-bin)" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe="${OMPI_MCA_rmaps_base_oversubscribe:-1}"
exec mpirun "$@"
