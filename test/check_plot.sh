#!/usr/bin/env bash
# dev/plot_metrics.py on a short run: a 6-step run of a tiny model (validation every 3 steps) writes
# metrics.jsonl (and HellaSwag's accuracy on 8 synthetic items, -h 1); the plot of it, and of it
# overlaid with itself under two labels, must each be a non-empty PNG, and so must the plot of a run
# that only evaluated its model (-x 0 -h 1). Then the same run with a rollback (NaN gradients in
# steps 3 and 4, --max-skips 2: back to step 2's checkpoint): the records of the abandoned steps 3-4
# and of step 3's evaluations stay in the file, and plot_metrics.py still reads one curve (steps 1-6
# once each, in order; evaluations after steps 0, 3 and 6).
# Fails (naming the package) where matplotlib is missing.
#   test/check_plot.sh [TRAINER] [PYTHON]   (defaults ./train_gpt_cpu, /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${1:-./train_gpt_cpu}
python=${2:-/usr/bin/python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL check_plot.sh: $*"; exit 1; }

"$python" dev/data/hellaswag.py --synthetic 8 --vocab 50257 --out "$dir/hellaswag.bin" >/dev/null ||
    fail "dev/data/hellaswag.py --synthetic failed"
hellaswag=(--eval-hellaswag "$dir/hellaswag.bin")
"$trainer" --num-layers 1 --channels 32 --num-heads 2 -b 2 -t 32 -x 6 -v 3 -m 2 -s 0 "${hellaswag[@]}" -o "$dir/run" \
    >"$dir/log" 2>&1 ||
    { cat "$dir/log"; fail "the training run failed"; }
is_png() { [ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
"$python" dev/plot_metrics.py "$dir/run/metrics.jsonl" -o "$dir/curves.png" || fail "plot_metrics.py exited with $?"
is_png "$dir/curves.png" || fail "no PNG (or an empty one) at $dir/curves.png"
"$python" dev/plot_metrics.py "$dir/run/metrics.jsonl" "$dir/run/metrics.jsonl" --labels a b -o "$dir/two.png" ||
    fail "plot_metrics.py with two runs exited with $?"
is_png "$dir/two.png" || fail "no PNG for two overlaid runs"
echo "check_plot.sh: plot_metrics.py drew one run ($(stat -c %s "$dir/curves.png") bytes) and two overlaid ($(stat -c %s "$dir/two.png") bytes)"
"$trainer" -e "$dir/run/model.bin" -b 2 -t 32 -x 0 -j "" -s 0 "${hellaswag[@]}" -o "$dir/eval" >"$dir/eval.log" 2>&1 ||
    { cat "$dir/eval.log"; fail "the evaluation-only run failed"; }
"$python" dev/plot_metrics.py "$dir/eval/metrics.jsonl" -o "$dir/eval.png" || fail "plot_metrics.py exited with $?"
is_png "$dir/eval.png" || fail "no PNG for the evaluation-only run"
echo "check_plot.sh: plot_metrics.py drew a run that only evaluated (-x 0 -h 1)"

"$trainer" --num-layers 1 --channels 32 --num-heads 2 -b 2 -t 32 -x 6 -v 3 -m 2 -s 0 -n 2 --max-skips 2 "${hellaswag[@]}" \
    --faults nan_grad@3:0,nan_grad@4:0 -o "$dir/rollback" >"$dir/rollback.log" 2>&1 ||
    { cat "$dir/rollback.log"; fail "the training run with a rollback failed"; }
grep -q "^rollback: 2 updates skipped in a row (steps 3-4)" "$dir/rollback.log" || { cat "$dir/rollback.log"; fail "no rollback"; }
[ "$(grep -c '"train_loss"' "$dir/rollback/metrics.jsonl")" = 8 ] || fail "expected 8 step records (6 and the 2 abandoned)"
curve=$("$python" - "$dir/rollback/metrics.jsonl" <<'PY'
import sys
sys.path.insert(0, "dev")
import plot_metrics
steps, vals = plot_metrics.read_run(sys.argv[1])
print([r["step"] for r in steps], [r["step"] for r in vals], [r["step"] for r in plot_metrics.read_hellaswag(sys.argv[1])])
PY
) || fail "plot_metrics.read_run failed on the run with a rollback"
[ "$curve" = "[1, 2, 3, 4, 5, 6] [0, 3, 6] [0, 3, 6]" ] || fail "the run with a rollback reads as steps and evaluations $curve"
"$python" dev/plot_metrics.py "$dir/rollback/metrics.jsonl" -o "$dir/rollback.png" || fail "plot_metrics.py exited with $?"
is_png "$dir/rollback.png" || fail "no PNG for the run with a rollback"
echo "check_plot.sh: a run with a rollback reads as one curve: steps and evaluations $curve"
