#!/usr/bin/env bash
# Launches llmc on several machines with Open MPI and a hostfile (one line per node:
# "node1 slots=8"). Every node needs the same checkout, built, at the same path, and the data.
#   scripts/multi_node/mpirun_hostfile.sh hostfile 16 [extra trainer flags]
# The binary is train_gpt (GPU; one rank per GPU, picked by local rank), or set TRAINER=./train_gpt_cpu.
set -euo pipefail
hostfile=${1:?usage: $0 HOSTFILE NUM_RANKS [flags...]}
ranks=${2:?usage: $0 HOSTFILE NUM_RANKS [flags...]}
shift 2
cd "$(dirname "$0")/../.."
trainer=${TRAINER:-./train_gpt}
# --bind-to none: the trainer runs its own OpenMP threads; -x passes the environment to every rank.
exec mpirun --hostfile "$hostfile" -np "$ranks" --bind-to none -x PATH -x LD_LIBRARY_PATH -x OMP_NUM_THREADS \
    "$trainer" -z 1 --world-size "$ranks" "$@"
