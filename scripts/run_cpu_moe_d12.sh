#!/usr/bin/env bash
# A mixture-of-experts run for machines without a GPU: train_gpt_cpu trains GPT-2 124M (preset d12)
# with 8 experts in every block, each token routed to 2 (521M parameters, about 2/8 of the experts'
# active per token), Switch Transformer's balance loss and ST-MoE's z-loss at their defaults,
# dropless, on the default corpus (data/default, made by `make data`): 2000 steps of B 4 x T 256 per
# rank, lr 6e-4 with 100 warmup steps and a cosine decay to 10%, ZeRO-1. On several ranks the experts
# are split over expert groups of as many ranks as divide both RANKS and 8 (--ep 2 on 2 ranks, 8 on
# 8; the rank's tokens go to their experts' ranks and back). A checkpoint every 200 steps in
# out/cpu_moe_d12; the newest 2 are kept, and every 1000th. With -y 1, running the script again
# resumes from the newest checkpoint.
#   scripts/run_cpu_moe_d12.sh [RANKS] [extra train_gpt_cpu flags, which override these]
#   PLAN=1 scripts/run_cpu_moe_d12.sh 8    # print the per-rank memory plan of the run instead
# See scripts/preset_common.sh for RANKS and the threads per rank.
set -euo pipefail
# shellcheck source=scripts/preset_common.sh
source "$(dirname "$0")/preset_common.sh"
ranks=${1:-1}
ep=1
if [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
    while [ $((ep * 2)) -le 8 ] && [ $((ranks % (ep * 2))) -eq 0 ]; do ep=$((ep * 2)); done
fi
preset_run cpu -i "data/default/default_train_*.bin" -e d12 --experts 8 --top-k 2 --ep "$ep" -b 4 -t 256 \
    -x 2000 -l 0.0006 -u 100 -z 1 -v 100 -s 500 -n 200 -nk 2 -nm 1000 -y 1 -o out/cpu_moe_d12 -- "$@"
