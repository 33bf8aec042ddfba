#!/usr/bin/env bash
# GPT-2 774M (preset d36) on FineWeb sample-10BT with train_gpt: llm.c's hyperparameters (lr 2.5e-4,
# 700 warmup steps, cosine decay to 0, B 32 per GPU, 524,288 tokens per step) for 60,000 steps, 31.5B
# tokens: about three passes over sample-10BT (llm.c ran 286,102 steps on 150B tokens of FineWeb-100B;
# point -i/-j at bigger shards and raise -x for that).
# A checkpoint every 1000 steps in out/gpt2_774M; the newest 2 are kept, and every 10000th. With -y 1,
# running the script again resumes from the newest checkpoint.
#   scripts/run_gpt2_774M.sh [NGPU] [extra train_gpt flags, which override these]
#   PLAN=1 scripts/run_gpt2_774M.sh 8     # print the per-GPU memory plan of the run instead
# NGPU defaults to the GPUs nvidia-smi lists (8 if it lists none); the batch needs 524288 to be a
# multiple of 32*1024*NGPU (NGPU 1, 2, 4, 8, 16). Data: dev/data/fineweb.py
# makes data/fineweb10B (the script names the commands when it is missing); paths are from the repo root.
set -euo pipefail
# shellcheck source=scripts/preset_common.sh
source "$(dirname "$0")/preset_common.sh"
preset_run gpu "${PRESET_GPT2[@]}" -e d36 -b 32 -d 524288 -l 0.00025 -q 0.0 -x 60000 \
    -n 1000 -nk 2 -nm 10000 -y 1 -o out/gpt2_774M -- "$@"
