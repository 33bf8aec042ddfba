#!/usr/bin/env bash
# dev/plot_metrics.py on a short run: a 6-step run of a tiny model (validation every 3 steps) writes
# metrics.jsonl; the plot of it, and of it overlaid with itself under two labels, must each be a
# non-empty PNG. Fails (naming the package) where matplotlib is missing.
#   test/check_plot.sh [TRAINER] [PYTHON]   (defaults ./train_gpt_cpu, /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${1:-./train_gpt_cpu}
python=${2:-/usr/bin/python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL check_plot.sh: $*"; exit 1; }

"$trainer" --num-layers 1 --channels 32 --num-heads 2 -b 2 -t 32 -x 6 -v 3 -m 2 -s 0 -o "$dir/run" >"$dir/log" 2>&1 ||
    { cat "$dir/log"; fail "the training run failed"; }
is_png() { [ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
"$python" dev/plot_metrics.py "$dir/run/metrics.jsonl" -o "$dir/curves.png" || fail "plot_metrics.py exited with $?"
is_png "$dir/curves.png" || fail "no PNG (or an empty one) at $dir/curves.png"
"$python" dev/plot_metrics.py "$dir/run/metrics.jsonl" "$dir/run/metrics.jsonl" --labels a b -o "$dir/two.png" ||
    fail "plot_metrics.py with two runs exited with $?"
is_png "$dir/two.png" || fail "no PNG for two overlaid runs"
echo "check_plot.sh: plot_metrics.py drew one run ($(stat -c %s "$dir/curves.png") bytes) and two overlaid ($(stat -c %s "$dir/two.png") bytes)"
