#!/usr/bin/env bash
# GPT-2 1558M (preset d48) on FineWeb sample-10BT with train_gpt, llm.c's 1.5B recipe: 32,000 steps of
# 1,048,576 tokens (33.6B tokens: about three passes over sample-10BT; llm.c used FineWeb-EDU 100B),
# lr 6e-4 with 700 warmup steps and a cosine decay to 10% of it, B 16 per GPU.
# A checkpoint every 500 steps in out/gpt2_1558M; the newest 2 are kept, and every 8000th. With -y 1,
# running the script again resumes from the newest checkpoint.
#   scripts/run_gpt2_1558M.sh [NGPU] [extra train_gpt flags, which override these]
#   PLAN=1 scripts/run_gpt2_1558M.sh 8    # print the per-GPU memory plan of the run instead
# NGPU defaults to the GPUs nvidia-smi lists (8 if it lists none); the batch needs 1048576 to be a
# multiple of 16*1024*NGPU (NGPU 1, 2, 4, ..., 64). On GPUs with less than 80 GB, add -r 1 to -r 3
# (recomputation; PLAN=1 prints the activation memory of each). Data: dev/data/fineweb.py
# makes data/fineweb10B (the script names the commands when it is missing); paths are from the repo root.
set -euo pipefail
# shellcheck source=scripts/preset_common.sh
source "$(dirname "$0")/preset_common.sh"
preset_run gpu "${PRESET_GPT2[@]}" -e d48 -b 16 -d 1048576 -l 0.0006 -q 0.1 -x 32000 \
    -n 500 -nk 2 -nm 8000 -y 1 -o out/gpt2_1558M -- "$@"
