"""hellaswag.py: HellaSwag's validation split (10,042 items) as llm.c's evaluation file, for -h 1.

Each item is a context and four endings, one of them right (the label). The context is tokenized
with GPT-2's BPE as it is, each ending as " " + ending (it continues the context's last word), and
the file is written in llm.c's layout (docs/file-formats.md), so files move between the two:
  int32[256] header: [0] 20240522, [1] 1, [2] items, [3] the longest item in bytes;
  per item, uint16: 65535, the item's bytes, its index, its label, 4, the context's length and
  tokens, then per ending its length and tokens.

  hellaswag.py [--bpe-dir data/gpt2_bpe] [--out-dir data/hellaswag] [--input FILE.jsonl]
downloads hellaswag_val.jsonl into --out-dir (kept, so a second run is offline), or reads --input,
and writes <out-dir>/hellaswag_val.bin. A failed download or write leaves no partial file.

  hellaswag.py --synthetic N --vocab V --out FILE [--seed S]
writes N synthetic items over a vocabulary of V tokens whose right ending is known: each context
is an arithmetic run of tokens (a, a+d, a+2d, ... modulo V) and the labelled ending continues it,
the other three are random tokens. A model that learnt such runs picks the label; tests use the
files to check the metric, not a model.
"""
import argparse
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402
from download import download  # noqa: E402

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
VAL_ITEMS = 10042
EVAL_MAGIC, EVAL_VERSION, HEADER_INTS = 20240522, 1, 256
ENDINGS, DELIMITER = 4, 65535


def item_words(index, label, context, endings):
    """One item's uint16 run, its byte count filled in."""
    if len(endings) != ENDINGS:
        raise ValueError(f"item {index}: {len(endings)} endings, the format takes {ENDINGS}")
    if not 0 <= label < ENDINGS:
        raise ValueError(f"item {index}: label {label} is not 0 to {ENDINGS - 1}")
    words = [DELIMITER, 0, index, label, ENDINGS]
    for what, tokens in [("context", context)] + [(f"ending {e}", t) for e, t in enumerate(endings)]:
        if not tokens:
            raise ValueError(f"item {index}: its {what} is empty")
        if not all(0 <= t < DELIMITER for t in tokens):
            raise ValueError(f"item {index}: its {what} has a token outside [0, {DELIMITER})")
        words += [len(tokens)] + list(tokens)
    if 2 * len(words) >= 2 ** 16:
        raise ValueError(f"item {index}: {2 * len(words)} bytes do not fit the uint16 byte count")
    words[1] = 2 * len(words)
    return words


def write_evalfile(path, items):
    """items: [(label, context tokens, [4 x ending tokens])]. Written whole or not at all."""
    if not 0 < len(items) < 2 ** 16:
        raise ValueError(f"{path}: {len(items)} items; the uint16 index takes 1 to 65535")
    runs = [item_words(i, label, ctx, ends) for i, (label, ctx, ends) in enumerate(items)]
    header = [0] * HEADER_INTS
    header[:4] = [EVAL_MAGIC, EVAL_VERSION, len(items), max(2 * len(r) for r in runs)]
    body = b"".join(struct.pack(f"<{len(r)}H", *r) for r in runs)
    gpt2_bpe._write_atomic(path, [struct.pack(f"<{HEADER_INTS}i", *header), body])


def read_evalfile(path):
    """The items of an evaluation file as write_evalfile takes them (checks the format, not the tokens)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 * HEADER_INTS:
        raise SystemExit(f"error: '{path}' is truncated: {len(data)} bytes, the header alone takes {4 * HEADER_INTS}")
    header = struct.unpack_from(f"<{HEADER_INTS}i", data)
    if header[0] != EVAL_MAGIC or header[1] != EVAL_VERSION:
        raise SystemExit(f"error: '{path}' is not an evaluation file (magic {header[0]}, version {header[1]}; "
                         f"expected {EVAL_MAGIC}, {EVAL_VERSION})")
    words = struct.unpack_from(f"<{(len(data) - 4 * HEADER_INTS) // 2}H", data, 4 * HEADER_INTS)
    items, at = [], 0
    for i in range(header[2]):
        if at + 5 > len(words) or words[at] != DELIMITER or words[at + 2] != i or words[at + 4] != ENDINGS:
            raise SystemExit(f"error: '{path}': item {i} is not where it should be (truncated or corrupt)")
        end, p = at + words[at + 1] // 2, at + 5
        runs = []
        for _ in range(1 + ENDINGS):
            n = words[p]
            runs.append(list(words[p + 1:p + 1 + n]))
            p += 1 + n
        if p != end:
            raise SystemExit(f"error: '{path}': item {i}'s byte count does not match its tokens")
        items.append((words[at + 3], runs[0], runs[1:]))
        at = end
    return items


def synthetic_items(n, vocab, seed):
    """n items whose labelled ending continues the context's arithmetic run (see the module doc)."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        a, d = rng.randrange(vocab), rng.randrange(1, vocab)
        context_len, label = rng.randint(3, 8), rng.randrange(ENDINGS)
        run = [(a + d * i) % vocab for i in range(context_len + 4)]
        endings = []
        for e in range(ENDINGS):
            length = rng.randint(1, 4)
            if e == label:
                endings.append(run[context_len:context_len + length])
            else:  # a wrong ending never starts as the run goes on
                wrong = [rng.randrange(vocab) for _ in range(length)]
                while wrong[0] == run[context_len]:
                    wrong[0] = rng.randrange(vocab)
                endings.append(wrong)
        items.append((label, run[:context_len], endings))
    return items


def hellaswag_items(path, bpe_dir):
    """The items of a HellaSwag .jsonl file, tokenized as llm.c does."""
    encoder = gpt2_bpe.load_encoder(bpe_dir)
    items = []
    try:
        with open(path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    example = json.loads(line)
                    ctx, endings, label = example["ctx"], example["endings"], int(example["label"])
                except (ValueError, KeyError, TypeError) as e:
                    raise SystemExit(f"error: '{path}' line {line_number}: not a HellaSwag item with ctx, endings "
                                     f"and label: {e}")
                items.append((label, encoder.encode(ctx), [encoder.encode(" " + end) for end in endings]))
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"error: cannot read '{path}' as UTF-8 JSON lines: {e}")
    if not items:
        raise SystemExit(f"error: '{path}' holds no items")
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bpe-dir", default="data/gpt2_bpe", help="directory with encoder.json and vocab.bpe")
    ap.add_argument("--out-dir", default="data/hellaswag")
    ap.add_argument("--input", help="a local hellaswag_val.jsonl to use instead of downloading")
    ap.add_argument("--synthetic", type=int, metavar="N", help="write N synthetic items instead (with --vocab, --out)")
    ap.add_argument("--vocab", type=int, help="--synthetic: the vocabulary size, 2 to 65535")
    ap.add_argument("--seed", type=int, default=1337, help="--synthetic: the random seed")
    ap.add_argument("--out", help="the file to write (default <out-dir>/hellaswag_val.bin)")
    args = ap.parse_args()

    if args.synthetic is not None:
        if not args.out or args.vocab is None:
            ap.error("--synthetic needs --vocab V and --out FILE")
        if not 0 < args.synthetic < 2 ** 16:
            ap.error(f"--synthetic {args.synthetic}: the format holds 1 to 65535 items")
        if not 2 <= args.vocab < DELIMITER:
            ap.error(f"--vocab {args.vocab}: expected 2 to {DELIMITER - 1} (tokens are uint16, 65535 the delimiter)")
        write_evalfile(args.out, synthetic_items(args.synthetic, args.vocab, args.seed))
        print(f"{args.out}: {args.synthetic} synthetic items, vocabulary {args.vocab}, seed {args.seed}")
        return

    out = args.out or os.path.join(args.out_dir, "hellaswag_val.bin")
    path = args.input
    if path is None:
        made_out_dir = not os.path.exists(args.out_dir)
        os.makedirs(args.out_dir, exist_ok=True)
        path = os.path.join(args.out_dir, "hellaswag_val.jsonl")
        if not os.path.exists(path):
            try:
                download(URL, path, "--input FILE.jsonl")
            except SystemExit:
                if made_out_dir and not os.listdir(args.out_dir):
                    os.rmdir(args.out_dir)  # a failed download leaves no empty directory behind
                raise
    items = hellaswag_items(path, args.bpe_dir)
    if args.input is None and len(items) != VAL_ITEMS:
        print(f"warning: '{path}' holds {len(items)} items, HellaSwag's validation split {VAL_ITEMS}")
    try:
        write_evalfile(out, items)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    longest = max(len(ctx) + max(len(e) for e in ends) - 1 for _, ctx, ends in items)
    print(f"{out}: {len(items)} items, the longest row {longest} positions (-t {longest} or more)")


if __name__ == "__main__":
    main()
