"""gpt2_bpe.py: GPT-2's byte-level BPE tokenizer, llm.c's token shard writer and tokenizer file writer.

GPT-2 splits text with a regex into words, maps each word's UTF-8 bytes to printable unicode characters
(bytes_to_unicode), then merges adjacent symbols in the order of vocab.bpe. Merging happens only inside a
word, so a word's token ids depend on the word alone: caching them per word turns the BPE loop into a
dict lookup for almost every word of a real corpus. tiktoken, when importable, does the same in Rust and
is used instead; both read the same local encoder.json, so no network access is ever needed.

CLI:
  gpt2_bpe.py --bpe-dir DIR --write-tokenizer PATH           llm.c tokenizer file (for decoding in C++)
  gpt2_bpe.py --bpe-dir DIR --write-roundtrip-fixture PATH   {"text", "ids"} pairs for the C++ tests
  gpt2_bpe.py --bpe-dir DIR --check-node [JSON_FILE...]      compare our ids with the gpt-3-encoder npm
                                                             package's JS encoder (needs node and npm)
"""
import argparse
import collections
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import regex

EOT_TOKEN = 50256
VOCAB_SIZE = 50257
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2
HEADER_INTS = 256

# GPT-2's pre-tokenization: contractions, letter runs, digit runs, other-symbol runs (each optionally
# with one leading space), and whitespace that is not followed by a non-space (so the last space before
# a word stays attached to that word).
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    """GPT-2's byte -> printable character map: printable Latin-1 bytes map to themselves, the other
    68 bytes to code points 256.., so every token string in encoder.json is visible text."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _read_encoder_json(bpe_dir):
    path = os.path.join(bpe_dir, "encoder.json")
    if not os.path.exists(path):
        raise SystemExit(f"error: '{path}' not found; run `make data` (or dev/data/fetch_gpt2_bpe.sh {bpe_dir})")
    with open(path, encoding="utf-8") as f:
        encoder = json.load(f)
    if len(encoder) != VOCAB_SIZE or sorted(encoder.values()) != list(range(VOCAB_SIZE)):
        raise SystemExit(f"error: '{path}' should map {VOCAB_SIZE} tokens to ids 0..{VOCAB_SIZE - 1}, found {len(encoder)} entries")
    if encoder.get("<|endoftext|>") != EOT_TOKEN:
        raise SystemExit(f"error: '{path}' should give <|endoftext|> id {EOT_TOKEN}, found {encoder.get('<|endoftext|>')}")
    return encoder


def _read_merges(bpe_dir):
    path = os.path.join(bpe_dir, "vocab.bpe")
    if not os.path.exists(path):
        raise SystemExit(f"error: '{path}' not found; run `make data` (or dev/data/fetch_gpt2_bpe.sh {bpe_dir})")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # Line 0 is "#version: 0.2"; the file ends with a newline, hence the empty last element.
    merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
    for i, m in enumerate(merges):
        if len(m) != 2:
            raise SystemExit(f"error: '{path}' line {i + 2}: expected two symbols, found {m!r}")
    return merges


def token_bytes_table(bpe_dir):
    """bytes of every token id, in id order (the special <|endoftext|> is its literal text)."""
    encoder = _read_encoder_json(bpe_dir)
    byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
    table = [b""] * VOCAB_SIZE
    for token, i in encoder.items():
        table[i] = bytes(byte_decoder[c] for c in token)
    return table


class PyBPE:
    """Our own GPT-2 encoder: regex split, byte->unicode map, ranked merges with a per-word cache."""

    eot_token = EOT_TOKEN
    n_vocab = VOCAB_SIZE

    def __init__(self, bpe_dir):
        self.encoder = _read_encoder_json(bpe_dir)
        self.ranks = {pair: i for i, pair in enumerate(_read_merges(bpe_dir))}
        self.byte_encoder = bytes_to_unicode()
        # One 256-entry translation table: bytes -> GPT-2 characters in a single C-level call.
        self.byte_to_char = "".join(self.byte_encoder[b] for b in range(256))
        self.token_bytes = token_bytes_table(bpe_dir)
        self.pattern = regex.compile(GPT2_SPLIT_PATTERN)
        self.cache = {}

    def _bpe(self, word):
        symbols = list(word)
        ranks = self.ranks
        while len(symbols) > 1:
            # The lowest-ranked adjacent pair merges first, everywhere it occurs, as in GPT-2.
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:]):
                r = ranks.get(pair)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = pair, r
            if best is None:
                break
            first, second = best
            merged = []
            i = 0
            n = len(symbols)
            while i < n:
                if i < n - 1 and symbols[i] == first and symbols[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return [self.encoder[s] for s in symbols]

    def encode(self, text):
        ids = []
        cache = self.cache
        for word in self.pattern.findall(text):
            cached = cache.get(word)
            if cached is None:
                chars = "".join(self.byte_to_char[b] for b in word.encode("utf-8"))
                cached = self._bpe(chars)
                cache[word] = cached
            ids.extend(cached)
        return ids

    def decode_bytes(self, ids):
        for i in ids:
            if not 0 <= i < VOCAB_SIZE:
                raise ValueError(f"token id {i} out of range [0, {VOCAB_SIZE})")
        return b"".join(self.token_bytes[i] for i in ids)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


class TiktokenBPE:
    """tiktoken's Rust BPE built from the local encoder.json (no download): GPT-2's merge order and
    its token ids coincide, so the ids themselves are valid tiktoken merge ranks."""

    eot_token = EOT_TOKEN
    n_vocab = VOCAB_SIZE

    def __init__(self, bpe_dir, tiktoken):
        self.token_bytes = token_bytes_table(bpe_dir)
        ranks = {b: i for i, b in enumerate(self.token_bytes) if i != EOT_TOKEN}
        self.enc = tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={"<|endoftext|>": EOT_TOKEN})

    def encode(self, text):
        # Ordinary: "<|endoftext|>" inside a text is plain text, exactly as in PyBPE.
        return self.enc.encode_ordinary(text)

    def decode_bytes(self, ids):
        return self.enc.decode_bytes(ids)

    def decode(self, ids):
        return self.enc.decode(ids, errors="replace")


def load_encoder(bpe_dir, use_tiktoken=True):
    """An object with encode(text) -> list[int], decode(ids) -> str and eot_token == 50256."""
    if use_tiktoken:
        try:
            import tiktoken
        except ImportError:
            tiktoken = None
        if tiktoken is not None:
            return TiktokenBPE(bpe_dir, tiktoken)
    return PyBPE(bpe_dir)


# ---- parallel tokenization of documents ----

_worker_encoder = None


def _init_worker(bpe_dir):
    global _worker_encoder
    _worker_encoder = load_encoder(bpe_dir)


def _encode_docs(docs):
    # EOT before every document: llm.c's convention, so a document's first token has a delimiter to
    # condition on and documents are separated in the token stream.
    out = []
    for doc in docs:
        out.append(EOT_TOKEN)
        out.extend(_worker_encoder.encode(doc))
    return np.array(out, dtype=np.uint16)


def tokenize_batches(bpe_dir, batches, processes=None):
    """Yields, in order, one uint16 token array per batch of documents (each document preceded by EOT).
    Batches go to os.cpu_count() worker processes, each keeping its own per-word cache. At most a few
    batches per worker are in flight, so a streaming source (fineweb) is never read far ahead."""
    for name in ("encoder.json", "vocab.bpe"):
        # Checked here: a worker failing in its initializer would be respawned forever by the pool.
        if not os.path.exists(os.path.join(bpe_dir, name)):
            raise SystemExit(f"error: '{os.path.join(bpe_dir, name)}' not found; run `make data`")
    processes = processes or os.cpu_count() or 1
    if processes == 1:
        _init_worker(bpe_dir)
        for b in batches:
            yield _encode_docs(b)
        return
    with multiprocessing.Pool(processes, initializer=_init_worker, initargs=(bpe_dir,)) as pool:
        in_flight = collections.deque()
        for b in batches:
            in_flight.append(pool.apply_async(_encode_docs, (b,)))
            if len(in_flight) >= 4 * processes:
                yield in_flight.popleft().get()
        while in_flight:
            yield in_flight.popleft().get()


def tokenize_documents(bpe_dir, docs, processes=None, docs_per_batch=256):
    """Like tokenize_batches, for a flat (possibly streaming) iterable of documents."""
    def batches():
        batch = []
        for doc in docs:
            batch.append(doc)
            if len(batch) == docs_per_batch:
                yield batch
                batch = []
        if batch:
            yield batch

    yield from tokenize_batches(bpe_dir, batches(), processes)


# ---- llm.c file formats ----

def write_shard(path, tokens):
    """llm.c data shard: int32[256] header (magic 20240520, version 1, token count), then uint16 tokens.
    Written to a temporary file and renamed, so `path` is either absent or complete."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"{path}: tokens must be one-dimensional, got shape {tokens.shape}")
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= 2 ** 16):
        raise ValueError(f"{path}: token ids must lie in [0, 65536) to fit uint16, found range "
                         f"[{tokens.min()}, {tokens.max()}]")
    if len(tokens) >= 2 ** 31:
        raise ValueError(f"{path}: {len(tokens)} tokens do not fit the int32 count in the header")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, len(tokens)
    _write_atomic(path, [header.tobytes(), tokens.astype(np.uint16).tobytes()])


def write_tokenizer(path, bpe_dir):
    """llm.c tokenizer file: int32[256] header (magic 20240328, version 2, vocab size, eot id), then per
    token id: a uint8 byte count and the token's raw bytes."""
    table = token_bytes_table(bpe_dir)
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[0], header[1], header[2], header[3] = TOKENIZER_MAGIC, TOKENIZER_VERSION, VOCAB_SIZE, EOT_TOKEN
    parts = [header.tobytes()]
    for i, b in enumerate(table):
        if not 1 <= len(b) <= 255:
            raise ValueError(f"token {i} is {len(b)} bytes; the tokenizer file stores 1..255")
        parts.append(bytes([len(b)]))
        parts.append(b)
    _write_atomic(path, parts)


def _write_atomic(path, parts):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for p in parts:
                f.write(p)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class ShardWriter:
    """Cuts a token stream into shards of `shard_tokens` tokens (the last may be shorter), named
    `<name>_<split>_<index:06d>.bin`, where split_of(index) picks "val" or "train". Shards are staged in a
    hidden directory inside out_dir and moved into out_dir only by commit(), so an interrupted run (a
    failed download, ^C) leaves no shards at all rather than a set that looks complete but is not.

        with ShardWriter(out_dir, "fineweb", 10**8, lambda i: "val" if i == 0 else "train") as w:
            for tokens in ...: w.add(tokens)
            w.commit()
    """

    def __init__(self, out_dir, name, shard_tokens, split_of=lambda index: "train", first_index=0):
        if shard_tokens <= 0:
            raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
        self.out_dir, self.name, self.shard_tokens, self.split_of = out_dir, name, shard_tokens, split_of
        self.made_out_dir = not os.path.exists(out_dir)  # removed again if nothing is committed into it
        os.makedirs(out_dir, exist_ok=True)
        self.stage = tempfile.mkdtemp(prefix=f".{name}.partial.", dir=out_dir)
        self.index = first_index
        self.pending = []
        self.pending_tokens = 0
        self.written = []  # (file name, token count)

    def add(self, tokens):
        tokens = np.asarray(tokens, dtype=np.uint16)
        while len(tokens):
            take = min(len(tokens), self.shard_tokens - self.pending_tokens)
            self.pending.append(tokens[:take])
            self.pending_tokens += take
            tokens = tokens[take:]
            if self.pending_tokens == self.shard_tokens:
                self.flush()

    def flush(self):
        """Ends the current shard early (e.g. at a val/train boundary)."""
        if not self.pending_tokens:
            return
        file_name = f"{self.name}_{self.split_of(self.index)}_{self.index:06d}.bin"
        write_shard(os.path.join(self.stage, file_name), np.concatenate(self.pending))
        self.written.append((file_name, self.pending_tokens))
        self.index += 1
        self.pending, self.pending_tokens = [], 0

    def commit(self):
        self.flush()
        for file_name, _ in self.written:
            os.replace(os.path.join(self.stage, file_name), os.path.join(self.out_dir, file_name))
        shutil.rmtree(self.stage, ignore_errors=True)
        return self.written

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.stage, ignore_errors=True)
        if self.made_out_dir and os.path.isdir(self.out_dir) and not os.listdir(self.out_dir):
            os.rmdir(self.out_dir)  # a failed run leaves no empty directory behind
        return False


# ---- test fixture and cross-check ----

ROUNDTRIP_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space and trailing space ",
    "   three leading spaces",
    "I'm sure you've seen it; they'll say it's what we'd do, and I'd've liked it.",
    "Numbers: 3.14159, 1,000,000 and 2024-05-20 at 12:34pm; 42 is the answer!",
    "Punctuation!?... (parens) [brackets] {braces} \"quotes\" 'single' -- dashes — em; semi:colon",
    "line one\nline two\n\nafter blank line\n\n\n",
    "tabs\tand\t\tdouble tabs\r\nwindows newline",
    "multiple     spaces   between    words",
    "naïve café 日本語 🙂",
    "Ünïcödé: Ελληνικά, русский, العربية, हिन्दी, 한국어",
    "emoji sequence 👩‍👩‍👧‍👦 flags 🇫🇷 and symbols ∑∫√≈ ©®™",
    "code: def f(x):\n    return x ** 2  # square\n",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "<|endoftext|> appears here as plain text",
    "",
]


def write_roundtrip_fixture(path, encoder):
    entries = [{"text": t, "ids": encoder.encode(t)} for t in ROUNDTRIP_TEXTS]
    for e in entries:
        if encoder.decode(e["ids"]) != e["text"]:
            raise SystemExit(f"error: decode(encode({e['text']!r})) does not give the text back")
    # One entry per line: readable in a diff, and the ids stay next to their text.
    text = "[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n"
    _write_atomic(path, [text.encode("utf-8")])


NODE_SCRIPT = r"""
const enc = require(process.argv[2]);
const texts = JSON.parse(require('fs').readFileSync(0, 'utf-8'));
process.stdout.write(JSON.stringify(texts.map(t => enc.encode(t))));
"""


def check_against_node(encoder, texts):
    """Encodes `texts` with the gpt-3-encoder npm package's own JS encoder and compares ids. Returns the
    number of mismatching texts (each is printed)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise SystemExit(f"error: {tool} not found; the node cross-check needs node and npm")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", "--silent", "gpt-3-encoder"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        tarball = [f for f in os.listdir(tmp) if f.endswith(".tgz")][0]
        subprocess.run(["tar", "-xzf", tarball], cwd=tmp, check=True)
        script = os.path.join(tmp, "encode.js")
        with open(script, "w") as f:
            f.write(NODE_SCRIPT)
        res = subprocess.run(["node", script, os.path.join(tmp, "package", "index.js")],
                             input=json.dumps(texts).encode("utf-8"), capture_output=True, check=True)
    node_ids = json.loads(res.stdout)
    bad = 0
    for text, ids in zip(texts, node_ids):
        ours = encoder.encode(text)
        if ours != ids:
            bad += 1
            print(f"MISMATCH {text[:80]!r}:\n  ours {ours[:40]}\n  node {ids[:40]}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bpe-dir", required=True, help="directory with encoder.json and vocab.bpe")
    ap.add_argument("--write-tokenizer", metavar="PATH")
    ap.add_argument("--write-roundtrip-fixture", metavar="PATH")
    ap.add_argument("--check-node", nargs="*", metavar="JSON_FILE",
                    help="compare with the npm gpt-3-encoder on the fixture texts and on the strings of each "
                         "JSON_FILE (a JSON list of strings, e.g. data/nlp-corpus/package/builds/doc-0.json)")
    ap.add_argument("--no-tiktoken", action="store_true", help="use our own BPE even if tiktoken is installed")
    args = ap.parse_args()
    if not (args.write_tokenizer or args.write_roundtrip_fixture or args.check_node is not None):
        ap.error("nothing to do: give --write-tokenizer, --write-roundtrip-fixture or --check-node")

    if args.write_tokenizer:
        write_tokenizer(args.write_tokenizer, args.bpe_dir)
        print(f"wrote {args.write_tokenizer} ({VOCAB_SIZE} tokens)")
    if args.write_roundtrip_fixture or args.check_node is not None:
        encoder = load_encoder(args.bpe_dir, use_tiktoken=not args.no_tiktoken)
    if args.write_roundtrip_fixture:
        write_roundtrip_fixture(args.write_roundtrip_fixture, encoder)
        print(f"wrote {args.write_roundtrip_fixture} ({len(ROUNDTRIP_TEXTS)} texts)")
    if args.check_node is not None:
        texts = list(ROUNDTRIP_TEXTS)
        for path in args.check_node:
            with open(path, encoding="utf-8") as f:
                texts += json.load(f)
        bad = check_against_node(encoder, texts)
        print(f"node cross-check ({type(encoder).__name__}): {len(texts) - bad} of {len(texts)} texts agree")
        if bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
