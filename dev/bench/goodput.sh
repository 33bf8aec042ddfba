#!/usr/bin/env bash
# dev/bench/goodput.sh: goodput under injected failures (issue 11's benchmark; not a test). A CPU run
# of a fixed number of steps on 4 ranks ("2 nodes" of 2) loses a rank every KILL_EVERY steps and is
# restarted by scripts/supervise.sh, once resuming from the shared tier only (-n SHARED_EVERY) and
# once with the local tier as well (--local-ckpt-every LOCAL_EVERY). Prints, for each: wall time,
# the time of the steps kept, effective training time (kept step time over wall time), restarts,
# and the steps lost per failure; and an undisturbed run's step time, with and without the local
# tier, for its overhead.
#   dev/bench/goodput.sh            (about 4 minutes on 2 cores)
# Knobs (environment): STEPS (120), KILL_EVERY (25), SHARED_EVERY (20), LOCAL_EVERY (2), OUT (out/goodput).
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-120} KILL_EVERY=${KILL_EVERY:-25} SHARED_EVERY=${SHARED_EVERY:-20} LOCAL_EVERY=${LOCAL_EVERY:-2}
OUT=${OUT:-out/goodput}
[ -x ./train_gpt_cpu ] || { echo "goodput.sh: build ./train_gpt_cpu first (make train_gpt_cpu)" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1
rm -rf "$OUT"
mkdir -p "$OUT"
common=(-i 'data/default/default_train_*.bin' -j "" --tokenizer "" --num-layers 2 --channels 64 --num-heads 2
        --max-seq-len 64 -b 4 -t 64 -d 1024 -x "$STEPS" -v 0 -s 0 -z 1 --straggler-factor 0)

# The job the supervisor relaunches: each launch kills rank 1 KILL_EVERY steps after the step it
# starts from (the last step in metrics.jsonl, a resumed run's first), so failures keep coming at
# a steady rate whatever the tier; the last kill is skipped when it would fall past the end.
cat >"$OUT/job.sh" <<'JOB'
#!/usr/bin/env bash
out=$1; shift
last=$(sed -nE '/"superseded"/d; s/.*"step":([0-9]+),.*"train_loss".*/\1/p' "$out/metrics.jsonl" 2>/dev/null | tail -1)
resume=$(ls -d "$out"/ckpt_* "$out".local/node_00000/ckpt_* 2>/dev/null | sed -E 's/.*ckpt_0*//' | sort -n | tail -1)
at=$(( ${resume:-0} + KILL_EVERY ))
faults=""
[ "$at" -lt "$STEPS" ] && faults="kill@$at:1"
LLMC_FAULTS=$faults exec mpirun --oversubscribe -np 4 "$@"
JOB
chmod +x "$OUT/job.sh"
export KILL_EVERY STEPS

row() {  # row NAME FLAGS...
    local name=$1
    shift
    local out="$OUT/$name"
    local start end
    start=$(date +%s.%N)
    scripts/supervise.sh --max-restarts 50 --output-dir "$out" -- "$OUT/job.sh" "$out" ./train_gpt_cpu "${common[@]}" -o "$out" "$@" \
        >"$out.log" 2>&1 || { tail -20 "$out.log"; echo "goodput.sh: the $name run failed" >&2; exit 1; }
    end=$(date +%s.%N)
    local restarts lost kept
    restarts=$(grep -c "relaunching with -y 1" "$out.log" || true)
    lost=$(sed -nE 's/.*recovered: resumed from step [0-9]+.*, ([0-9]+) step\(s\) lost.*/\1/p' "$out.log" | paste -sd, -)
    kept=$(sed -nE '/"superseded"/d; s/.*"step_ms":([0-9.]+),.*"train_loss".*/\1/p' "$out/metrics.jsonl" | awk '{ s += $1 } END { printf "%.1f", s / 1000 }')
    awk -v n="$name" -v w="$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" -v k="$kept" -v r="$restarts" -v l="$lost" \
        'BEGIN { split(l, a, ","); t = 0; for (i in a) t += a[i];
                 printf "| %s | %.1f | %.1f | %.0f%% | %d | %s (mean %.1f) |\n", n, w, k, 100 * k / w, r, l, (r ? t / r : 0) }'
}
undisturbed() {  # undisturbed NAME FLAGS...: median step time of a run without failures
    local out="$OUT/$1"
    shift
    LLMC_FAULTS="" mpirun --oversubscribe -np 4 ./train_gpt_cpu "${common[@]}" -x 60 -o "$out" "$@" >"$out.log" 2>&1
    sed -nE '/"superseded"/d; s/.*"step_ms":([0-9.]+),.*"train_loss".*/\1/p' "$out/metrics.jsonl" | tail -50 | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}

echo "goodput: $STEPS steps on 4 ranks (2 nodes of 2), rank 1 killed $KILL_EVERY steps after each start"
echo
echo "| run | wall s | steps kept s | effective | restarts | steps lost per failure |"
echo "| --- | ---: | ---: | ---: | ---: | --- |"
row shared_only -n "$SHARED_EVERY"
row with_local -n "$SHARED_EVERY" --local-ckpt-every "$LOCAL_EVERY" --local-ckpt-dir "$OUT/with_local.local" --ranks-per-node 2
echo
base=$(undisturbed plain -n "$SHARED_EVERY")
local_ms=$(undisturbed local -n "$SHARED_EVERY" --local-ckpt-every "$LOCAL_EVERY" --local-ckpt-dir "$OUT/local.local" --ranks-per-node 2)
echo "undisturbed median step: $base ms with the shared tier only, $local_ms ms with the local tier every $LOCAL_EVERY steps ($(awk -v a="$base" -v b="$local_ms" 'BEGIN { printf "%+.1f%%", 100 * (b - a) / a }'))"
