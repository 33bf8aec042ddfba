#!/usr/bin/env bash
# ckpt_bench.sh: issue 10's checkpoint benchmark. For each configuration (a preset's state, or one
# rank's share of it), on the disk of $OUT:
#   (a) the raw disk: a plain sequential write of the same byte count with dd and fsync, from
#       /dev/zero and from a random file in /dev/shm (tmpfs: no disk read; incompressible, like the
#       state, in case the virtual disk treats zeros specially); the median of $DD_REPEATS each;
#   (b) build/ckpt_bench (dev/bench/ckpt_bench.cpp): the real CheckpointWriter on a synthetic state,
#       asynchronous and --ckpt-sync: training stall per checkpoint, write MB/s;
#   (c) the real CPU trainer (train_gpt_cpu) on $TRAINER_MODEL, asynchronous and --ckpt-sync 1, its
#       figures from metrics.jsonl;
# then a markdown table and the issue's two targets: the asynchronous stall under 5% of the
# synchronous one, and the write at 80% or more of the raw disk (dd from random data).
#
# Run from the repository root, on a quiet machine (other load changes every figure):
#   dev/bench/ckpt_bench.sh                       # full: d12 whole state, d48 rank 0 of 8, trainer d12
#   SMALL=1 dev/bench/ckpt_bench.sh               # a quick check: d4 whole, d6 rank 0 of 8, trainer d4
# Environment (defaults are the full run's):
#   OUT          where everything is written, on the disk under test (default out/ckpt_bench)
#   CONFIGS      "model:rank:ranks ..." (default "d12:0:1 d48:0:8")
#   STEP_MS      ckpt_bench's forward/backward stand-in per step (default 2000)
#   EVERY        steps between ckpt_bench's checkpoints; "auto" (default): enough steps that the
#                write, at the dd speed, takes at most half the interval
#   CHECKPOINTS  checkpoints measured per ckpt_bench run (default 3); WARMUP steps before them (default 3)
#   KEEP         ckpt_bench's --keep (-nk): 0 (default) keeps every checkpoint until the end, so no
#                deletion of the previous one falls inside the write time (dd deletes nothing either)
#   THREADS      ckpt_bench's work threads (default 1: the training thread; the CPU trainer uses all cores)
#   DD_REPEATS   dd runs of each kind per size (default 3)
#   TRAINER      1 (default) runs (c); 0 skips it. TRAINER_MODEL (d12), TRAINER_STEPS (4), TRAINER_EVERY (2),
#                TRAINER_ARGS (default '-b 1 -t 64 -v 0 -s 0 -j "" --tokenizer ""', shell words)
#   KEEP_LOGS    1 keeps $OUT/results.txt (every figure) and $OUT/bench.log (the big files go regardless)
# Full run: about 8 minutes; memory about 5 GB at its peak (d48's share: state 2.3 GB + snapshot
# 2.3 GB; the 2.3 GB random file in /dev/shm during the dd runs; the d12 trainer about 3.6 GB); disk
# about 8 GB free on $OUT's filesystem (CHECKPOINTS + 1 of the largest state at once with KEEP=0).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${SMALL:-0}" = 1 ]; then
    : "${CONFIGS:=d4:0:1 d6:0:8}" "${STEP_MS:=300}" "${CHECKPOINTS:=2}" "${WARMUP:=2}" "${DD_REPEATS:=1}"
    : "${TRAINER_MODEL:=d4}" "${TRAINER_STEPS:=2}" "${TRAINER_EVERY:=1}"
fi
OUT=${OUT:-out/ckpt_bench}
CONFIGS=${CONFIGS:-d12:0:1 d48:0:8}
STEP_MS=${STEP_MS:-2000}
EVERY=${EVERY:-auto}
CHECKPOINTS=${CHECKPOINTS:-3}
WARMUP=${WARMUP:-3}
THREADS=${THREADS:-1}
KEEP=${KEEP:-0}
DD_REPEATS=${DD_REPEATS:-3}
TRAINER=${TRAINER:-1}
TRAINER_MODEL=${TRAINER_MODEL:-d12}
TRAINER_STEPS=${TRAINER_STEPS:-4}
TRAINER_EVERY=${TRAINER_EVERY:-2}
KEEP_LOGS=${KEEP_LOGS:-0}
PY=${PYTHON:-python3}

BENCH=build/ckpt_bench
make --no-print-directory "$BENCH" >/dev/null
if [ "$TRAINER" = 1 ]; then
    make --no-print-directory train_gpt_cpu >/dev/null
    if ! ls data/default/default_train_*.bin >/dev/null 2>&1; then
        echo "error: data/default has no training shards: run 'make data' first (or TRAINER=0)" >&2
        exit 1
    fi
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RAND=/dev/shm/ckpt_bench_rand.$$
RESULTS=$OUT/results.txt
: >"$RESULTS"
# Only what this script writes is removed (never $OUT's other contents): the big files always, the
# logs unless KEEP_LOGS=1, then $OUT itself if that leaves it empty.
cleanup() {
    rm -f "$RAND" "$OUT"/ddtest.*
    rm -rf "$OUT/bench" "$OUT/trainer_0" "$OUT/trainer_1"
    if [ "$KEEP_LOGS" = 1 ]; then
        echo "logs: $OUT/results.txt, $OUT/bench.log"
    else
        rm -f "$OUT/results.txt" "$OUT/bench.log"
    fi
    rmdir "$OUT" 2>/dev/null || true
}
trap cleanup EXIT

echo "== $(date -u +%FT%TZ) $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, disk: $(df -h "$OUT" | awk 'NR==2{print $1" ("$2")"}'), load: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- sizes ----
declare -A BYTES
max_bytes=0
for c in $CONFIGS; do
    IFS=: read -r model rank ranks <<<"$c"
    b=$("$BENCH" --model "$model" --rank "$rank" --ranks "$ranks" --bytes-only 1)
    BYTES[$c]=$b
    [ "$b" -gt "$max_bytes" ] && max_bytes=$b
done
if [ "$TRAINER" = 1 ]; then
    # The CPU model's checkpoint: params, adam_m, adam_v in fp32, the whole state on one rank.
    b=$("$BENCH" --model "$TRAINER_MODEL" --bytes-only 1)
    BYTES[trainer]=$b
    [ "$b" -gt "$max_bytes" ] && max_bytes=$b
fi

# ---- (a) raw disk: dd with fsync, the same byte counts ----
shm_free=$(df -B1 --output=avail /dev/shm | tail -1)
have_rand=0
if [ "$shm_free" -gt $((max_bytes + (1 << 30))) ]; then
    echo "generating $((max_bytes / 1000000)) MB of random data in $RAND"
    head -c "$max_bytes" /dev/urandom >"$RAND"
    have_rand=1
else
    echo "warning: /dev/shm has too little room for $max_bytes random bytes; dd from /dev/zero only" >&2
fi
# dd_mbps SRC BYTES N: MB/s of one plain sequential write (8 MiB blocks, fsync before dd ends) into
# a new file ddtest.N. No dd file is deleted before the end of the whole benchmark: on this
# thin-provisioned virtual disk, writing into blocks just freed is about 3x faster than writing
# new ones (measured: 385-398 MB/s for random data into new blocks, 1.1-1.4 GB/s for zeros right
# after deleting a file of the same size), and checkpoints, kept with KEEP=0, always write new
# blocks. So every dd run writes new blocks too (disk: about 3 x 2 x the largest state in all).
dd_mbps() {
    sync
    local line
    line=$(dd if="$1" of="$OUT/ddtest.$3" bs=8M count="$2" iflag=count_bytes conv=fsync 2>&1 | grep copied)
    # "N bytes (...) copied, T s, ...": N / T
    echo "$line" | awk -F', ' '{split($1, a, " "); split($(NF-1), t, " "); printf "%.1f\n", a[1] / t[1] / 1e6}'
}
for b in $(printf '%s\n' "${BYTES[@]}" | sort -un); do  # each distinct size once
    for kind in zero rand; do
        [ "$kind" = rand ] && [ "$have_rand" = 0 ] && continue
        src=/dev/zero
        [ "$kind" = rand ] && src=$RAND
        runs=""
        for i in $(seq "$DD_REPEATS"); do runs="$runs $(dd_mbps "$src" "$b" "$b.$kind.$i")"; done
        echo "dd from $src, $b bytes: MB/s$runs"
        echo "DD $b $kind$runs" >>"$RESULTS"
    done
done
rm -f "$RAND"

# ---- (b) ckpt_bench: asynchronous and --ckpt-sync ----
for c in $CONFIGS; do
    IFS=: read -r model rank ranks <<<"$c"
    every=$EVERY
    if [ "$every" = auto ]; then
        # The write at the dd speed (random data, else zero), doubled, in whole steps (at least 1).
        mbps=$($PY - "$RESULTS" "${BYTES[$c]}" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("DD " + sys.argv[2] + " ")]  # DD bytes kind mbps...
by = {r[2]: statistics.median(map(float, r[3:])) for r in rows}
print(by.get("rand", by.get("zero", 100.0)))
EOF
)
        every=$($PY -c "import math; print(max(1, math.ceil(2 * ${BYTES[$c]} / 1e6 / $mbps * 1000 / $STEP_MS)))")
    fi
    for sync in 0 1; do
        label="$model r$rank/$ranks $([ $sync = 1 ] && echo sync || echo async)"
        echo "== ckpt_bench $label: every $every step(s) of $STEP_MS ms"
        sync
        "$BENCH" --model "$model" --rank "$rank" --ranks "$ranks" --out "$OUT/bench" --checkpoints "$CHECKPOINTS" \
            --every "$every" --warmup "$WARMUP" --step-ms "$STEP_MS" --threads "$THREADS" --keep "$KEEP" --sync "$sync" \
            --label "$label" | tee "$OUT/bench.log"
        grep '^RESULT ' "$OUT/bench.log" | sed "s|^RESULT |BENCH $c |" >>"$RESULTS"
        rm -rf "$OUT/bench"
    done
done

# ---- (c) the real CPU trainer ----
if [ "$TRAINER" = 1 ]; then
    if [ -n "${TRAINER_ARGS+x}" ]; then
        eval "targs=($TRAINER_ARGS)"
    else
        targs=(-b 1 -t 64 -v 0 -s 0 -j "" --tokenizer "")
    fi
    for sync in 0 1; do
        dir=$OUT/trainer_$sync
        echo "== train_gpt_cpu -e $TRAINER_MODEL -x $TRAINER_STEPS -n $TRAINER_EVERY ${targs[*]} --ckpt-sync $sync"
        sync
        ./train_gpt_cpu -e "$TRAINER_MODEL" "${targs[@]}" -x "$TRAINER_STEPS" -n "$TRAINER_EVERY" -o "$dir" \
            --ckpt-sync "$sync" | grep -E "^step|checkpoint|error"
        grep '"stall_ms"' "$dir/metrics.jsonl" | sed "s|^|TRAINER $sync $TRAINER_STEPS |" >>"$RESULTS"
        grep '"step_ms"' "$dir/metrics.jsonl" | sed "s|^|TSTEP $sync |" >>"$RESULTS"
        rm -rf "$dir"
    done
fi

# ---- the table ----
$PY - "$RESULTS" "$TRAINER_MODEL" <<'EOF'
import json, statistics, sys
med = statistics.median
dd, bench, trainer, tstep = {}, {}, {0: [], 1: []}, {0: [], 1: []}
for line in open(sys.argv[1]):
    kind = line.split(" ", 1)[0]
    if kind == "DD":  # DD bytes zero|rand mbps...
        f = line.split()
        dd.setdefault(f[1], {})[f[2]] = med([float(x) for x in f[3:]])
    elif kind == "BENCH":  # BENCH model:rank:ranks {json}
        f = line.split(" ", 2)
        r = json.loads(f[2])
        bench[(f[1], r["sync"])] = r
    elif kind == "TRAINER":  # TRAINER sync steps {json}
        f = line.split(" ", 3)
        trainer[int(f[1])].append((int(f[2]), json.loads(f[3])))
    elif kind == "TSTEP":  # TSTEP sync {json}
        tstep[int(line.split(" ", 2)[1])].append(json.loads(line.split(" ", 2)[2])["step_ms"])

rows, checks = [], []
def row(name, nbytes, a_stall, s_stall, lost, a_mbps, s_mbps, step_ms, note=""):
    d = dd.get(str(nbytes), {})
    raw = d.get("rand", d.get("zero"))
    ratio = 100 * a_stall / s_stall if a_stall is not None and s_stall else float("nan")
    wr = 100 * a_mbps / raw if a_mbps is not None and raw else float("nan")
    fmt = lambda x, p=0: "-" if x is None else f"{x:,.{p}f}"
    rows.append(f"| {name} | {nbytes / 1e6:,.0f} MB | {fmt(step_ms)} | {fmt(a_stall, 1)} | {fmt(s_stall, 1)} | {ratio:.2f}% "
                f"| {fmt(lost)} | {fmt(a_mbps)} | {fmt(s_mbps)} | {fmt(d.get('rand'))} | {fmt(d.get('zero'))} | {wr:.0f}% |{note}")
    checks.append((name, ratio < 5, wr >= 80))

for (cfg, sync), r in sorted(bench.items()):
    if sync: continue
    s = bench.get((cfg, True))
    model, rank, ranks = cfg.split(":")
    name = f"ckpt_bench {model}" + ("" if ranks == "1" else f", rank {rank} of {ranks}")
    row(name, r["bytes"], r["stall_ms"], s["stall_ms"] if s else None, r["lost_ms"], r["mb_per_s"],
        s["mb_per_s"] if s else None, r["step_ms"])

def pick(recs, final_step):
    # Asynchronous: the checkpoints before the last step (the last one has no training after it to
    # overlap its snapshot copy, so finish() waits for the copy); all of them if there are no others.
    mid = [j for (steps, j) in recs if j["step"] != steps]
    return mid if mid and final_step else [j for (_, j) in recs]
if trainer[0] or trainer[1]:
    a, s = pick(trainer[0], True), pick(trainer[1], False)
    nbytes = (a or s)[0]["bytes"]
    row(f"train_gpt_cpu {sys.argv[2]}", nbytes, med([j["stall_ms"] for j in a]) if a else None,
        med([j["stall_ms"] for j in s]) if s else None, None, med([j["mb_per_s"] for j in a]) if a else None,
        med([j["mb_per_s"] for j in s]) if s else None, med(tstep[0]) if tstep[0] else None)
    finals = [j["stall_ms"] for (steps, j) in trainer[0] if j["step"] == steps]
    if finals and len(a) < len(trainer[0]):
        print(f"(trainer, asynchronous: the final checkpoint, not overlapped by training, stalled {finals[0]:.1f} ms; "
              "the row is the checkpoints before it)")

print()
print("| config | bytes | step ms | stall async ms | stall sync ms | async/sync | lost async ms | write MB/s async "
      "| write MB/s sync | dd MB/s random | dd MB/s zero | write/dd (random) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows: print(r)
print()
print("stall: the writer's report (save() + the wait in before_update for the snapshot copy, + the write with "
      "--ckpt-sync); medians over the checkpoints. lost: training time lost per checkpoint interval over the "
      "baseline step, which also counts the slowdown of the work while the copy and the write run. write MB/s: "
      "bytes / (snapshot start to marker), fsync included; dd: a plain write of the same bytes, conv=fsync.")
for name, stall_ok, write_ok in checks:
    print(f"targets, {name}: async stall < 5% of sync: {'PASS' if stall_ok else 'FAIL'}; "
          f"write >= 80% of dd (random): {'PASS' if write_ok else 'FAIL'}")
EOF
