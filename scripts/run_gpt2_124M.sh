#!/usr/bin/env bash
# GPT-2 124M (preset d12) on FineWeb sample-10BT with train_gpt, llm.c's recipe: 18,865 steps of
# 524,288 tokens (9.9B tokens, about one pass over the data), lr 6e-4 with 700 warmup steps and a cosine
# decay to 0, B 64 per GPU (gradient accumulation makes up the rest of the batch on fewer than 8 GPUs).
# A checkpoint every 1000 steps in out/gpt2_124M; the newest 2 are kept, and every 5000th. With -y 1,
# running the script again resumes from the newest checkpoint.
#   scripts/run_gpt2_124M.sh [NGPU] [extra train_gpt flags, which override these]
#   PLAN=1 scripts/run_gpt2_124M.sh 8     # print the per-GPU memory plan of the run instead
# NGPU defaults to the GPUs nvidia-smi lists (8 if it lists none); the batch needs 524288 to be a
# multiple of 64*1024*NGPU (NGPU 1, 2, 4, 8; pass -b 32 for 16). Data: dev/data/fineweb.py
# makes data/fineweb10B (the script names the commands when it is missing); paths are from the repo root.
set -euo pipefail
# shellcheck source=scripts/preset_common.sh
source "$(dirname "$0")/preset_common.sh"
preset_run gpu "${PRESET_GPT2[@]}" -e d12 -b 64 -d 524288 -l 0.0006 -q 0.0 -x 18865 \
    -n 1000 -nk 2 -nm 5000 -y 1 -o out/gpt2_124M -- "$@"
