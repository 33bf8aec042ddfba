"""tinyshakespeare.py: Tiny Shakespeare (~1MB of plays, ~338k GPT-2 tokens) as llm.c token shards.

The text is split into documents at blank lines (speeches), each preceded by EOT. The first
VAL_TOKENS tokens are the validation split and the rest is train, the usual split for this corpus.
The download is kept under <out-dir>/input.txt (written atomically), so a second run is offline.

  tinyshakespeare.py --bpe-dir data/gpt2_bpe --out-dir data/tinyshakespeare [--input FILE]
writes tinyshakespeare_val_000000.bin and tinyshakespeare_train_000000.bin. --input uses a local text
file instead of downloading.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402
from download import download  # noqa: E402

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
VAL_TOKENS = 32768
SHARD_TOKENS = 100_000_000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bpe-dir", default="data/gpt2_bpe", help="directory with encoder.json and vocab.bpe")
    ap.add_argument("--out-dir", default="data/tinyshakespeare")
    ap.add_argument("--input", help="local text file to use instead of downloading")
    args = ap.parse_args()

    made_out_dir = not os.path.exists(args.out_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    path = args.input
    if path is None:
        path = os.path.join(args.out_dir, "input.txt")
        if not os.path.exists(path):
            try:
                download(URL, path)
            except SystemExit:
                if made_out_dir and not os.listdir(args.out_dir):
                    os.rmdir(args.out_dir)  # a failed download leaves no empty directory behind
                raise
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"error: cannot read '{path}' as UTF-8 text: {e}")
    if not text.strip():
        raise SystemExit(f"error: '{path}' is empty")

    docs = [d for d in text.split("\n\n") if d]
    tokens = np.concatenate(list(gpt2_bpe.tokenize_documents(args.bpe_dir, docs)))
    n_val = min(VAL_TOKENS, len(tokens) // 2)  # a tiny --input file still gets train tokens
    # Both writers are filled before either commits, so a failure leaves neither split behind.
    with gpt2_bpe.ShardWriter(args.out_dir, "tinyshakespeare", SHARD_TOKENS, lambda i: "val") as val, \
         gpt2_bpe.ShardWriter(args.out_dir, "tinyshakespeare", SHARD_TOKENS, lambda i: "train") as train:
        val.add(tokens[:n_val])
        train.add(tokens[n_val:])
        val.flush()
        train.flush()
        written = val.commit() + train.commit()
    for name, n in written:
        print(f"{os.path.join(args.out_dir, name)}: {n:,} tokens")


if __name__ == "__main__":
    main()
