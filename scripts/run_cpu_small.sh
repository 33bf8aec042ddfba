#!/usr/bin/env bash
# A small run for a machine without a GPU: train_gpt_cpu trains preset d6 (6 layers, 384 channels,
# 30M parameters) on the default corpus (data/default, made by `make data`) for 2000 steps of
# B 8 x T 256 per rank (2048 tokens per rank per step, no gradient accumulation), lr 1e-3 with 100
# warmup steps and a cosine decay to 10%. A checkpoint every 200 steps in out/cpu_d6; the newest 2
# are kept, and every 1000th. With -y 1, running the script again resumes from the newest checkpoint.
#   scripts/run_cpu_small.sh [RANKS] [extra train_gpt_cpu flags, which override these]
#   PLAN=1 scripts/run_cpu_small.sh 2    # print the per-rank memory plan of the run instead
# RANKS defaults to 1 (one process using every core); more ranks run under mpirun with ZeRO-1 and
# share the cores (OMP_NUM_THREADS = cores / RANKS unless set). See scripts/preset_common.sh.
set -euo pipefail
# shellcheck source=scripts/preset_common.sh
source "$(dirname "$0")/preset_common.sh"
preset_run cpu -i "data/default/default_train_*.bin" -e d6 -b 8 -t 256 -x 2000 -l 0.001 -u 100 -z 1 \
    -v 100 -s 500 -n 200 -nk 2 -nm 1000 -y 1 -o out/cpu_d6 -- "$@"
