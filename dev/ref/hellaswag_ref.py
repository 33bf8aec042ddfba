#!/usr/bin/env python3
"""HellaSwag's metric computed independently in PyTorch (float64) over an llmc/llm.c GPT-2 model file.

For each item and ending: the row is the context then the ending; the score is the mean
cross-entropy of the ending's tokens, each predicted from everything before it; the prediction is
the ending with the lowest score (the first of equals), llm.c's acc_norm. Nothing here is shared
with the C++ (llmc/training/hellaswag.h): the model is read by dev/export_hf.py's reader, the
items by dev/data/hellaswag.py's, and the forward is written out plainly below.

  hellaswag_ref.py MODEL.bin EVAL.bin [--out REF.json]
prints the count of right items and writes every item's four scores, its prediction and the margin
between its two best scores to REF.json.

  hellaswag_ref.py --fixture [--out-dir test/fixtures]
writes the fixture test/test_hellaswag.cpp and test/mpi/run_hellaswag_tests.sh check against:
hellaswag_tiny.bin (24 synthetic items over the tiny model's 500-token vocabulary, seed 1337) and
hellaswag_tiny_ref.json (this script's answer for test/fixtures/gpt2_tiny_model.bin).

Run with Debian's python (torch 1.13 CPU): /usr/bin/python3 dev/ref/hellaswag_ref.py --fixture
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "data"))
from export_hf import read_model_file  # noqa: E402
import hellaswag  # noqa: E402

FIXTURE_ITEMS, FIXTURE_SEED = 24, 1337


def gpt2_logits(config, p, tokens):
    """Logits over the real vocabulary of a (rows, T) batch, in float64."""
    Bn, Tn = tokens.shape
    C, NH, L, V = config["channels"], config["num_heads"], config["num_layers"], config["vocab_size"]
    hs = C // NH

    def ln(x, w, b):
        return F.layer_norm(x, (C,), w, b, eps=1e-5)

    x = p["wte"][tokens] + p["wpe"][:Tn]
    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        h = ln(x, p["ln1w"][l], p["ln1b"][l])
        q, k, v = F.linear(h, p["qkvw"][l], p["qkvb"][l]).split(C, dim=-1)
        q, k, v = (t.view(Bn, Tn, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~causal, float("-inf"))
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        h = ln(x, p["ln2w"][l], p["ln2b"][l])
        h = F.linear(h, p["fcw"][l], p["fcb"][l])
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
    x = ln(x, p["lnfw"], p["lnfb"])
    return (x @ p["wte"].t())[:, :, :V]


def score_items(model_path, eval_path):
    """[{label, losses (4), prediction, margin}] per item."""
    config, arrays = read_model_file(model_path)
    if config["arch"] != "gpt2" or config["bf16"]:
        raise SystemExit(f"error: '{model_path}': this reference reads fp32 GPT-2 files (version 3)")
    p = {name: torch.from_numpy(np.array(a, dtype=np.float64)) for name, a in arrays.items()}
    results = []
    for label, ctx, endings in hellaswag.read_evalfile(eval_path):
        rows = [ctx + end for end in endings]
        width = max(len(r) for r in rows) - 1  # the last token predicts nothing scored
        if width > config["max_seq_len"]:
            raise SystemExit(f"error: an item needs {width} positions, the model has {config['max_seq_len']}")
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, :len(r) - 1] = torch.tensor(r[:-1])
        logp = torch.log_softmax(gpt2_logits(config, p, tokens), dim=-1)
        losses = []
        for i, (r, end) in enumerate(zip(rows, endings)):
            first = len(ctx) - 1  # the position whose target is the ending's first token
            targets = torch.tensor(end)
            picked = logp[i, first:first + len(end)].gather(1, targets[:, None])[:, 0]
            losses.append(float(-picked.mean()))
        order = sorted(range(len(losses)), key=lambda e: (losses[e], e))
        results.append({"label": label, "losses": losses, "prediction": order[0],
                        "margin": losses[order[1]] - losses[order[0]]})
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("eval", nargs="?")
    ap.add_argument("--out", help="write every item's scores here (JSON)")
    ap.add_argument("--fixture", action="store_true", help="write the test fixture (see above)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "..", "..", "test", "fixtures"))
    args = ap.parse_args()
    if args.fixture:
        args.model = os.path.join(args.out_dir, "gpt2_tiny_model.bin")
        args.eval = os.path.join(args.out_dir, "hellaswag_tiny.bin")
        args.out = os.path.join(args.out_dir, "hellaswag_tiny_ref.json")
        hellaswag.write_evalfile(args.eval, hellaswag.synthetic_items(FIXTURE_ITEMS, 500, FIXTURE_SEED))
    elif not args.model or not args.eval:
        ap.error("give MODEL.bin and EVAL.bin, or --fixture")
    results = score_items(args.model, args.eval)
    correct = sum(r["prediction"] == r["label"] for r in results)
    margin = min(r["margin"] for r in results)
    print(f"{correct}/{len(results)} items right (acc_norm {correct / len(results):.4f}); the smallest margin "
          f"between an item's two best endings {margin:.3g}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": os.path.basename(args.model), "eval": os.path.basename(args.eval),
                       "correct": correct, "items": len(results), "smallest_margin": margin, "items_scored": results},
                      f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
