#!/usr/bin/env python3
"""One table of tokens/s from a GPU session's bench logs: llmc's best configuration beside llm.c's and
PyTorch's, on the same card, with the ratios llmc / llm.c and llmc / PyTorch.

    python3 dev/bench/side_by_side.py LOGDIR    (dev/bench/gpu_session.sh's bench stage runs it)

What it reads in LOGDIR (python's standard library only; a missing log, or one without a figure, is a
"-" cell, never an error):
  bench_<model>_best.log   bench_train_step --best: its line "best: model=d12 T=1024 ... B=128
                           recompute=0 tokens_per_s=481234 ..."; also bench_<model>_wgmma_best.log
                           (--attention wgmma), the faster of the two counting
  peers.log                .device/peers.sh (../shared/peers/llm.c.sh): "llm.c d12_b64: 136.2 ms/step,
                           481176 tokens/s", after "llm.c with cuDNN failed; without it:" where it fell back;
                           for a run with no such line (cut short), the mean tok/s of the step lines
                           after the first in its own log, peers_<model>_b<B>.log
  torch_<model>.log        dev/bench/torch_gpt2.py: its JSON line {"impl": "torch", "tokens_per_s": ...}
Rows: d12 and d48 always, and any other model a log names.
"""
import glob
import json
import os
import re
import sys

ALWAYS = ["d12", "d48"]
MISSING = "-"


def read_lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def llmc_best(logdir):
    """{model: (tokens_per_s, config)} from each bench_<model>_best.log's last "best:" line."""
    found = {}
    for path in sorted(glob.glob(os.path.join(logdir, "bench_*_best.log"))):
        # bench_d12_best.log, or its sweep with the wgmma attention (bench_d12_wgmma_best.log): the
        # faster counts (an FP8 sweep, bench_d12_fp8_best.log, is not bf16's and is not read)
        m = re.fullmatch(r"bench_(d\d+)(?:_wgmma)?_best\.log", os.path.basename(path))
        if not m:
            continue
        for line in read_lines(path):
            if not line.startswith("best: "):
                continue
            fields = dict(kv.split("=", 1) for kv in line[len("best: "):].split() if "=" in kv)
            try:
                config = f"B {int(fields['B'])} x T {int(fields['T'])}, -r {int(fields['recompute'])}"
                if fields.get("attention", "mma") != "mma":
                    config += f", attention {fields['attention']}"
                tokens = float(fields["tokens_per_s"])
                if m.group(1) not in found or tokens > found[m.group(1)][0]:
                    found[m.group(1)] = (tokens, config)
            except (KeyError, ValueError):
                pass
    return found


# llm.c's step line (train_gpt2.cu): "step    2/30 | loss ... | 136.20 ms | 48.1% bf16 MFU | 481176 tok/s"
LLMC_STEP = re.compile(r"^step\s+(\d+)/\d+ \|.*\|\s*([\d.]+) tok/s\s*$")


def peers_from_steps(path):
    """The mean tok/s of llm.c's step lines after the first (which includes its warm-up), or None."""
    rates = [float(m.group(2)) for m in map(LLMC_STEP.match, read_lines(path)) if m and int(m.group(1)) > 1]
    return sum(rates) / len(rates) if rates else None


def llm_c(logdir):
    """{model: (tokens_per_s, config)} from peers.log, else from each run's own log's step lines."""
    found = {}
    no_cudnn = False
    for line in read_lines(os.path.join(logdir, "peers.log")):
        if line.startswith("llm.c with cuDNN failed"):
            no_cudnn = True  # peers.sh keeps the binary without cuDNN for every later run
        m = re.match(r"^llm\.c (d\d+)_b(\d+): [\d.]+ ms/step, ([\d.]+) tokens/s", line)
        if m:
            found[m.group(1)] = (float(m.group(3)), f"B {m.group(2)}" + (", no cuDNN" if no_cudnn else ""))
    for path in glob.glob(os.path.join(logdir, "peers_*.log")):
        m = re.fullmatch(r"peers_(d\d+)_b(\d+)\.log", os.path.basename(path))
        if m and m.group(1) not in found:
            rate = peers_from_steps(path)
            if rate is not None:
                found[m.group(1)] = (rate, f"B {m.group(2)}, cut short: mean of its steps")
    return found


def pytorch(logdir):
    """{model: (tokens_per_s, config)} from each torch_<model>.log's JSON line."""
    found = {}
    for path in glob.glob(os.path.join(logdir, "torch_*.log")):
        m = re.fullmatch(r"torch_(d\d+)\.log", os.path.basename(path))
        if not m:
            continue
        for line in read_lines(path):
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
                config = f"B {int(r['B'])} x T {int(r['T'])}" + (", compiled" if r.get("compile") else ", eager")
                config += ", checkpointed" if r.get("ckpt") else ""
                if r.get("impl") == "torch":
                    found[m.group(1)] = (float(r["tokens_per_s"]), config)
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
    return found


def side_by_side(logdir):
    """The markdown table, as a string."""
    ours, peer, torch = llmc_best(logdir), llm_c(logdir), pytorch(logdir)
    models = sorted(set(ALWAYS) | set(ours) | set(peer) | set(torch), key=lambda name: int(name[1:]))

    def rate(found, model):
        return (f"{found[model][0]:.0f}", found[model][1]) if model in found else (MISSING, MISSING)

    def ratio(other, model):
        if model not in ours or model not in other or other[model][0] <= 0:
            return MISSING
        return f"{ours[model][0] / other[model][0]:.2f}"

    lines = ["| model | llmc tokens/s | llmc best config | llm.c tokens/s | llm.c config | PyTorch tokens/s "
             "| PyTorch config | llmc / llm.c | llmc / PyTorch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model in models:
        cells = [model, *rate(ours, model), *rate(peer, model), *rate(torch, model), ratio(peer, model),
                 ratio(torch, model)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 dev/bench/side_by_side.py LOGDIR")
    sys.stdout.write(side_by_side(sys.argv[1]))


if __name__ == "__main__":
    main()
