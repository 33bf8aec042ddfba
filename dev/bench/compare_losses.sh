#!/usr/bin/env bash
# dev/bench/compare_losses.sh: the first STEPS training losses of two runs (their metrics.jsonl), step
# by step, against a relative tolerance: the GPU's loss curve against the CPU model's on the same seed
# and data, where bf16 allows about 2e-2. Prints both curves' last loss and the worst difference.
#   dev/bench/compare_losses.sh REF_RUN_DIR RUN_DIR STEPS LIMIT
set -euo pipefail
[ $# = 4 ] || { echo "usage: $0 REF_RUN_DIR RUN_DIR STEPS LIMIT" >&2; exit 2; }
ref=$1 run=$2 steps=$3 limit=$4
losses() { sed -nE '/"superseded"/d; s/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$1/metrics.jsonl" | head -n "$steps"; }
paste <(losses "$ref") <(losses "$run") | awk -v steps="$steps" -v limit="$limit" -v what="$run vs $ref" '
    $1 != $3 { print "FAIL " what ": step " $1 " beside step " $3; bad = 1; exit }
    { d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > worst) { worst = d; at = $1 } n++; last_ref = $2; last = $4 }
    END { if (bad) exit 1
          if (n != steps) { print "FAIL " what ": " n " common steps, expected " steps; exit 1 }
          printf "%s %s: %d steps, last loss %.4f vs %.4f, worst relative difference %.2g at step %d (limit %s)\n",
                 (worst <= limit ? "ok" : "FAIL"), what, n, last_ref, last, worst, at, limit
          exit worst <= limit ? 0 : 1 }'
