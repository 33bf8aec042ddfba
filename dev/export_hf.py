"""export_hf.py: an llmc or llm.c GPT-2 model file -> a Hugging Face GPT2LMHeadModel directory.

    /usr/bin/python3 dev/export_hf.py out/model.bin hf_model/
    # then, where transformers is installed:
    #   GPT2LMHeadModel.from_pretrained("hf_model")   (tokenizer: the stock "gpt2" one)

Writes <dir>/model.safetensors and <dir>/config.json. The model file is llm.c's (llmc/models/gpt2/
model_file.h): an int32[256] header (magic 20240326; version 3 = fp32 or 5 = bf16; max_seq_len,
vocab_size, layers, heads, channels, padded_vocab_size), then every parameter in llm.c's order. Two
things differ in Hugging Face's layout:
  - GPT-2's linear layers there are Conv1D modules, whose weight is stored [in, out] (y = x W + b);
    llm.c stores [out, in] (y = x W^T + b), so every matrix but the embeddings is transposed;
  - the vocabulary is the real one: wte's padding rows (vocab_size..padded_vocab_size) are cut.
The lm head is tied to wte (tie_word_embeddings), as in GPT-2, so it is not stored. The numbers are
kept as they are (fp32 stays F32, bf16 stays BF16) unless --dtype says otherwise. Needs numpy only.
Every error (no numpy, a model path that is not a file, a file that is not a model, a failed write) is
one line on stderr and exit status 1.
"""
import argparse
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError as e:
    sys.exit(f"error: dev/export_hf.py needs numpy ({e}): install it (Debian: apt install python3-numpy; "
             f"elsewhere: pip install numpy) or run it with /usr/bin/python3")

MODEL_MAGIC = 20240326
HEADER_INTS = 256
EOT_TOKEN = 50256


def read_model_file(path):
    """(config dict, {llm.c name: array}) with arrays of float32, or of uint16 holding bf16 bits."""
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist" if not os.path.exists(path) \
            else "is not a regular file"
        raise SystemExit(f"error: '{path}' {what}; expected an llmc or llm.c model file (e.g. out/model.bin)")
    with open(path, "rb") as f:
        head = f.read(HEADER_INTS * 4)
        header = np.frombuffer(head[: len(head) // 4 * 4], dtype=np.int32)
        if len(header) != HEADER_INTS or header[0] != MODEL_MAGIC:
            raise SystemExit(f"error: '{path}' is not an llm.c model file (magic {header[0] if len(header) else '?'}, "
                             f"expected {MODEL_MAGIC})")
        version = int(header[1])
        if version in (103, 105):
            raise SystemExit(f"error: '{path}' is a mixture-of-experts model (version {version}, {int(header[8])} "
                             f"experts): Hugging Face transformers has no GPT-2 class with experts to export it to")
        if version not in (3, 5):
            raise SystemExit(f"error: '{path}' has version {version}; expected 3 (fp32) or 5 (bf16)")
        maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
        Vp = Vp or V  # files from before the padded vocabulary have 0 there
        dtype = np.float32 if version == 3 else np.uint16
        shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                  ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
                  ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
                  ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
        params = {}
        for name, shape in shapes:
            count = int(np.prod(shape))
            raw = f.read(count * np.dtype(dtype).itemsize)
            if len(raw) != count * np.dtype(dtype).itemsize:
                raise SystemExit(f"error: '{path}' is truncated in tensor {name}")
            data = np.frombuffer(raw, dtype=dtype)
            params[name] = data.reshape(shape)
        if f.read(1):
            raise SystemExit(f"error: '{path}' has bytes after the last tensor; the header does not describe it")
    config = {"version": version, "max_seq_len": maxT, "vocab_size": V, "num_layers": L, "num_heads": NH,
              "channels": C, "padded_vocab_size": Vp}
    return config, params


def to_bf16_bits(x):
    """float32 -> bf16 bits (uint16), rounded to nearest even, as PyTorch's .to(torch.bfloat16)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(x):
    return (x.astype(np.uint32) << 16).view(np.float32)


def hf_tensors(config, params):
    """{Hugging Face name: array} in GPT2LMHeadModel's layout (Conv1D weights [in, out], real vocab)."""
    out = {"transformer.wte.weight": params["wte"][: config["vocab_size"]],
           "transformer.wpe.weight": params["wpe"]}
    for l in range(config["num_layers"]):
        h = f"transformer.h.{l}."
        out[h + "ln_1.weight"] = params["ln1w"][l]
        out[h + "ln_1.bias"] = params["ln1b"][l]
        out[h + "attn.c_attn.weight"] = params["qkvw"][l].T
        out[h + "attn.c_attn.bias"] = params["qkvb"][l]
        out[h + "attn.c_proj.weight"] = params["attprojw"][l].T
        out[h + "attn.c_proj.bias"] = params["attprojb"][l]
        out[h + "ln_2.weight"] = params["ln2w"][l]
        out[h + "ln_2.bias"] = params["ln2b"][l]
        out[h + "mlp.c_fc.weight"] = params["fcw"][l].T
        out[h + "mlp.c_fc.bias"] = params["fcb"][l]
        out[h + "mlp.c_proj.weight"] = params["fcprojw"][l].T
        out[h + "mlp.c_proj.bias"] = params["fcprojb"][l]
    out["transformer.ln_f.weight"] = params["lnfw"]
    out["transformer.ln_f.bias"] = params["lnfb"]
    return out


def write_safetensors(path, tensors, dtype_name):
    """safetensors: uint64 little-endian header length, the JSON header (name -> dtype, shape and
    [begin, end) byte offsets into the data), padded with spaces to 8 bytes, then the raw data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = np.ascontiguousarray(t).tobytes()
        header[name] = {"dtype": dtype_name, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def hf_config(config, torch_dtype):
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config["vocab_size"], "n_positions": config["max_seq_len"], "n_ctx": config["max_seq_len"],
        "n_embd": config["channels"], "n_layer": config["num_layers"], "n_head": config["num_heads"],
        "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
        "bos_token_id": EOT_TOKEN, "eos_token_id": EOT_TOKEN, "tie_word_embeddings": True,
        "torch_dtype": torch_dtype,
    }


def export(model_path, out_dir, dtype=None):
    config, params = read_model_file(model_path)
    source = "fp32" if config["version"] == 3 else "bf16"
    dtype = dtype or source
    if dtype != source:
        params = {n: (to_bf16_bits(t) if dtype == "bf16" else from_bf16_bits(t)) for n, t in params.items()}
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), hf_tensors(config, params),
                      "F32" if dtype == "fp32" else "BF16")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(config, "float32" if dtype == "fp32" else "bfloat16"), f, indent=2)
        f.write("\n")
    return config, dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="llmc or llm.c model file (version 3 fp32 or 5 bf16)")
    ap.add_argument("out_dir", help="directory for model.safetensors and config.json")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], help="the exported numbers (default: the file's)")
    args = ap.parse_args()
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        sys.exit(f"error: '{args.out_dir}' is a file; expected a directory (made if missing) for model.safetensors "
                 f"and config.json")
    try:
        config, dtype = export(args.model, args.out_dir, args.dtype)
    except OSError as e:
        sys.exit(f"error: {e.filename or args.model}: {e.strerror or e}")
    print(f"wrote {args.out_dir}/model.safetensors ({dtype}) and config.json: GPT-2 with {config['num_layers']} "
          f"layers, {config['num_heads']} heads, {config['channels']} channels, vocab {config['vocab_size']} "
          f"(padded {config['padded_vocab_size']} in the file)")


if __name__ == "__main__":
    main()
