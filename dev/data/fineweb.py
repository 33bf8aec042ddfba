"""fineweb.py: FineWeb sample-10BT (HuggingFaceFW/fineweb, ~10B GPT-2 tokens) as llm.c token shards.

The dataset is streamed with the `datasets` library, so nothing but the shards lands on disk, and
documents are tokenized by all cores while the next ones download (gpt2_bpe.tokenize_documents keeps
only a few batches in flight). Each document is preceded by EOT. Shards hold SHARD_TOKENS tokens; shard 0
is validation and the rest train, as in llm.c: fineweb_val_000000.bin, fineweb_train_000001.bin, ...
All shards are staged and moved into place only at the end, so a failed download leaves none behind.

  fineweb.py --bpe-dir data/gpt2_bpe --out-dir data/fineweb10B [--max-tokens N]
  fineweb.py ... --input FILE.jsonl   local JSON lines with a "text" field instead of the download
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402

DATASET = "HuggingFaceFW/fineweb"
CONFIG = "sample-10BT"
SHARD_TOKENS = 100_000_000


def import_datasets():
    """The Hugging Face `datasets` library, or an exit that says how to get it on Debian, whose
    system Python refuses `pip install` (PEP 668) and which packages no python3-datasets."""
    try:
        import datasets
    except ImportError:
        raise SystemExit(
            "error: fineweb.py needs the Hugging Face `datasets` library to stream FineWeb, and it is not installed.\n"
            "       Debian has no package for it and its system python refuses `pip install`; use a virtual environment:\n"
            "         apt-get install python3-venv   # Debian's python3 has no venv module without it\n"
            "         python3 -m venv ~/.venv-fineweb && ~/.venv-fineweb/bin/pip install datasets numpy regex\n"
            "         ~/.venv-fineweb/bin/python dev/data/fineweb.py --bpe-dir data/gpt2_bpe --out-dir data/fineweb10B\n"
            "       or, without internet here, pass local documents: --input FILE.jsonl (one {\"text\": ...} per line).")
    return datasets


def hub_texts(datasets):
    try:
        stream = datasets.load_dataset(DATASET, name=CONFIG, split="train", streaming=True)
        for row in stream:
            yield row["text"]
    except Exception as e:  # network, auth, schema: all end the same way, with the reason
        raise SystemExit(f"error: cannot stream {DATASET} ({CONFIG}): {type(e).__name__}: {e}\n"
                         f"       (no internet here? pass local documents with --input FILE.jsonl)")


def jsonl_texts(path):
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                        raise SystemExit(f"error: {path}:{line_no}: expected an object with a string \"text\"")
                    yield row["text"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"error: cannot read '{path}' as JSON lines: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bpe-dir", default="data/gpt2_bpe", help="directory with encoder.json and vocab.bpe")
    ap.add_argument("--out-dir", default="data/fineweb10B")
    ap.add_argument("--input", help="local .jsonl file (one {\"text\": ...} per line) instead of the download")
    ap.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS)
    ap.add_argument("--max-tokens", type=int, default=0, help="stop after this many tokens (0: the whole set)")
    args = ap.parse_args()
    if args.shard_tokens <= 0 or args.shard_tokens >= 2 ** 31:
        ap.error(f"--shard-tokens must be in [1, 2^31), got {args.shard_tokens}")

    texts = jsonl_texts(args.input) if args.input else hub_texts(import_datasets())
    t0 = time.time()
    total = 0
    with gpt2_bpe.ShardWriter(args.out_dir, "fineweb", args.shard_tokens,
                              lambda i: "val" if i == 0 else "train") as writer:
        for tokens in gpt2_bpe.tokenize_documents(args.bpe_dir, texts):
            if args.max_tokens:
                tokens = tokens[:args.max_tokens - total]
            writer.add(tokens)
            total += len(tokens)
            if args.max_tokens and total >= args.max_tokens:
                break
            if total // args.shard_tokens != (total - len(tokens)) // args.shard_tokens:
                print(f"{total:,} tokens, {total / (time.time() - t0):,.0f} tokens/s", flush=True)
        written = writer.commit()
    if not written:
        raise SystemExit("error: no documents were read")
    for name, n in written:
        print(f"{os.path.join(args.out_dir, name)}: {n:,} tokens")


if __name__ == "__main__":
    main()
