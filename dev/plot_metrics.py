"""plot_metrics.py: training curves from one or more llmc metrics.jsonl files, as one PNG.

    /usr/bin/python3 dev/plot_metrics.py out/metrics.jsonl -o out/curves.png
    /usr/bin/python3 dev/plot_metrics.py a/metrics.jsonl b/metrics.jsonl --labels lr3e-4 lr6e-4 -o cmp.png

Panels: train and validation loss against steps, the same against tokens seen, learning rate,
gradient norm and tokens/s (and MFU, and HellaSwag's accuracy, where the run recorded them). Several
files are overlaid, one color per run, with a legend. The records read are the trainer's
(llmc/training/metrics.h): a step record has "train_loss", an evaluation "val_loss" or
"hellaswag_acc" (those marked "superseded" by a rollback or replay are left out); tokens per step come from the run's config.json next to the metrics file when it is
there (resolved total_batch_tokens), else tokens are not drawn.

Needs matplotlib (Debian: python3-matplotlib, installed by scripts/install_deps.sh). Without it the
script says so and exits with status 3, which `make train` reports without failing the training.
"""
import argparse
import json
import os
import sys

EXIT_NO_MATPLOTLIB = 3


def read_records(path):
    """The records of one metrics.jsonl that make one curve: a resumed run's file has no repeated
    steps (metrics.h drops them), and the records a rollback or replay made obsolete are marked
    "superseded" and skipped here. A line cut off by a crash is skipped."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and not r.get("superseded"):
                records.append(r)
    return records


def read_run(path):
    """Step and validation records of one metrics.jsonl. A run that only evaluated (-x 0 -h 1) has
    neither, and that is no error where it has HellaSwag records (read_hellaswag)."""
    records = read_records(path)
    steps = [r for r in records if "train_loss" in r]
    vals = [r for r in records if "val_loss" in r and "train_loss" not in r]
    if not steps and not vals and not any("hellaswag_acc" in r for r in records):
        raise SystemExit(f"error: '{path}' has no training, validation or HellaSwag records")
    return steps, vals


def read_hellaswag(path):
    """HellaSwag's records of one metrics.jsonl: step, hellaswag_acc, hellaswag_correct, hellaswag_items."""
    return [r for r in read_records(path) if "hellaswag_acc" in r]


def tokens_per_step(metrics_path):
    """The run's tokens per optimizer step from the config.json beside its metrics, or None."""
    config = os.path.join(os.path.dirname(os.path.abspath(metrics_path)), "config.json")
    try:
        with open(config, encoding="utf-8") as f:
            c = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    tokens = c.get("total_batch_tokens") or 0
    return tokens if tokens > 0 else None


def plot(runs, out_path):
    """runs: (label, steps, vals, tokens_per_step, hellaswag records) tuples. Writes out_path."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    has_mfu = any("mfu" in r for _, steps, _, _, _ in runs for r in steps)
    has_hellaswag = any(hs for *_, hs in runs)
    trained = any(steps or vals for _, steps, vals, _, _ in runs)  # else only evaluated (-x 0 -h 1)
    panels = (["loss_steps", "loss_tokens", "lr", "grad_norm", "tokens_per_s"] if trained else []) + \
        (["mfu"] if has_mfu else []) + (["hellaswag"] if has_hellaswag else [])
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    ax = dict(zip(panels, axes.flat))
    for extra in list(axes.flat)[len(panels):]:
        extra.axis("off")

    for i, (label, steps, vals, tps, hs) in enumerate(runs):
        color = f"C{i % 10}"
        if trained:
            s = [r["step"] for r in steps]
            v = [r["step"] for r in vals]
            ax["loss_steps"].plot(s, [r["train_loss"] for r in steps], color=color, lw=1, alpha=0.8,
                                  label=f"{label} train")
            ax["loss_steps"].plot(v, [r["val_loss"] for r in vals], color=color, lw=2, ls="--", marker="o", ms=3,
                                  label=f"{label} val")
            if tps:
                ax["loss_tokens"].plot([x * tps for x in s], [r["train_loss"] for r in steps], color=color, lw=1,
                                       alpha=0.8, label=f"{label} train")
                ax["loss_tokens"].plot([x * tps for x in v], [r["val_loss"] for r in vals], color=color, lw=2,
                                       ls="--", marker="o", ms=3, label=f"{label} val")
            ax["lr"].plot(s, [r["lr"] for r in steps], color=color, label=label)
            ax["grad_norm"].plot(s, [r["grad_norm"] for r in steps], color=color, lw=1, label=label)
            ax["tokens_per_s"].plot(s, [r["tokens_per_s"] for r in steps], color=color, lw=1, label=label)
        if has_mfu:
            m = [r for r in steps if "mfu" in r]
            ax["mfu"].plot([r["step"] for r in m], [100 * r["mfu"] for r in m], color=color, lw=1, label=label)
        if hs:
            ax["hellaswag"].plot([r["step"] for r in hs], [100 * r["hellaswag_acc"] for r in hs], color=color, lw=2,
                                 marker="o", ms=3, label=f"{label} ({hs[-1]['hellaswag_items']} items)")

    titles = {"loss_steps": ("loss", "step"), "loss_tokens": ("loss", "tokens"), "lr": ("learning rate", "step"),
              "grad_norm": ("gradient norm (before clipping)", "step"), "tokens_per_s": ("tokens/s", "step"),
              "mfu": ("MFU (%)", "step"), "hellaswag": ("HellaSwag accuracy (%, acc_norm)", "step")}
    for name, a in ax.items():
        title, xlabel = titles[name]
        a.set_title(title if name != "loss_tokens" else "loss vs tokens")
        a.set_xlabel(xlabel)
        a.grid(alpha=0.3)
        if a.lines:
            a.legend(fontsize=7)
        elif name == "loss_tokens":
            a.text(0.5, 0.5, "no config.json beside the metrics", ha="center", va="center", transform=a.transAxes)
    if trained:
        ax["grad_norm"].set_yscale("log")
    fig.tight_layout()
    out_dir = os.path.dirname(out_path)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    tmp = f"{out_path}.tmp.{os.getpid()}.png"
    fig.savefig(tmp, dpi=80)
    os.replace(tmp, out_path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl files, one per run")
    ap.add_argument("-o", "--out", default="curves.png", help="the PNG to write (default curves.png)")
    ap.add_argument("--labels", nargs="+", help="a legend label per run (default: the run's directory name)")
    args = ap.parse_args()
    if args.labels and len(args.labels) != len(args.metrics):
        ap.error(f"{len(args.labels)} labels for {len(args.metrics)} metrics files")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_metrics.py: matplotlib is not installed, no plot written (Debian: apt-get install "
              "python3-matplotlib, or scripts/install_deps.sh)", file=sys.stderr)
        sys.exit(EXIT_NO_MATPLOTLIB)
    runs = []
    for i, path in enumerate(args.metrics):
        steps, vals = read_run(path)
        label = args.labels[i] if args.labels else os.path.basename(os.path.dirname(os.path.abspath(path)))
        runs.append((label, steps, vals, tokens_per_step(path), read_hellaswag(path)))
    plot(runs, args.out)
    print(f"wrote {args.out} ({len(runs)} run{'s' if len(runs) > 1 else ''})")


if __name__ == "__main__":
    main()
