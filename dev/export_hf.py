"""export_hf.py: an llmc or llm.c model file -> a Hugging Face directory (GPT2LMHeadModel or LlamaForCausalLM).

    /usr/bin/python3 dev/export_hf.py out/model.bin hf_model/
    # then, where transformers is installed:
    #   AutoModelForCausalLM.from_pretrained("hf_model")   (tokenizer: the stock "gpt2" one)

Writes <dir>/model.safetensors and <dir>/config.json. The model file (llmc/models/model_file.h,
docs/file-formats.md) is an int32[256] header (magic 20240326; version; max_seq_len, vocab_size,
layers, heads, channels, padded_vocab_size), then every parameter in the family's order. The version
says the family and the numbers: 3 = GPT-2 fp32, 5 = GPT-2 bf16 (llm.c's own files), 203 = Llama
fp32, 205 = Llama bf16 (header[12..14]: kv_heads, ffn_hidden, rope_theta as the float32's bits).

GPT-2 (version 3 or 5) -> GPT2LMHeadModel:
  - GPT-2's linear layers there are Conv1D modules, whose weight is stored [in, out] (y = x W + b);
    llm.c stores [out, in] (y = x W^T + b), so every matrix but the embeddings is transposed;
  - the lm head is tied to wte (tie_word_embeddings), as in GPT-2, so it is not stored.
Llama (version 203 or 205) -> LlamaForCausalLM, whose nn.Linear weights are [out, in] as llmc's, so
nothing is transposed; llmc computes what Hugging Face's Llama does (RMSNorm eps 1e-5, rotate-half
RoPE pairing channel i of a head with i + head_dim/2, grouped-query attention with kv head j serving
query heads j*G .. j*G+G-1, SwiGLU, no biases), so the rows map 1:1, unpermuted:
  wte            -> model.embed_tokens.weight                    (V x C)
  attn_norm[l]   -> model.layers.{l}.input_layernorm.weight      (C)
  wq[l]          -> model.layers.{l}.self_attn.q_proj.weight     (Q x C)
  wkv[l]         -> model.layers.{l}.self_attn.k_proj.weight     (its first KV rows)
                    model.layers.{l}.self_attn.v_proj.weight     (its last KV rows)
  wo[l]          -> model.layers.{l}.self_attn.o_proj.weight     (C x Q)
  mlp_norm[l]    -> model.layers.{l}.post_attention_layernorm.weight
  wgateup[l]     -> model.layers.{l}.mlp.gate_proj.weight        (its first F rows)
                    model.layers.{l}.mlp.up_proj.weight          (its last F rows)
  wdown[l]       -> model.layers.{l}.mlp.down_proj.weight        (C x F)
  norm_f         -> model.norm.weight
  lm_head        -> lm_head.weight                               (V x C; untied)
  (Q = heads x head_dim, KV = kv_heads x head_dim, F = ffn_hidden, head_dim = C / heads.)
Both families: the vocabulary is the real one, the padding rows (vocab_size..padded_vocab_size) of
wte (and Llama's lm_head) are cut. The numbers are kept as they are (fp32 stays F32, bf16 stays
BF16) unless --dtype says otherwise. dev/import_hf.py does the reverse. Needs numpy only.
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
LLAMA_VERSION = 200  # added to 3 (fp32) or 5 (bf16) for a Llama file


def tensor_shapes(config):
    """[(llmc name, shape)] in the model file's order (llmc/models/{gpt2,llama}/params.h)."""
    maxT, L, C, Vp = config["max_seq_len"], config["num_layers"], config["channels"], config["padded_vocab_size"]
    if config["arch"] == "gpt2":
        return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
                ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
                ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    hs = C // config["num_heads"]
    Q, KV, F = config["num_heads"] * hs, config["kv_heads"] * hs, config["ffn_hidden"]
    return [("wte", (Vp, C)), ("attn_norm", (L, C)), ("wq", (L, Q, C)), ("wkv", (L, 2 * KV, C)),
            ("wo", (L, C, Q)), ("mlp_norm", (L, C)), ("wgateup", (L, 2 * F, C)), ("wdown", (L, C, F)),
            ("norm_f", (C,)), ("lm_head", (Vp, C))]


def read_model_file(path):
    """(config dict, {llmc name: array}) with arrays of float32, or of uint16 holding bf16 bits."""
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
        if version not in (3, 5, LLAMA_VERSION + 3, LLAMA_VERSION + 5):
            raise SystemExit(f"error: '{path}' has version {version}; expected 3 (fp32) or 5 (bf16) for GPT-2, "
                             f"203 or 205 for Llama")
        maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
        Vp = Vp or V  # files from before the padded vocabulary have 0 there
        config = {"version": version, "arch": "llama" if version > LLAMA_VERSION else "gpt2",
                  "bf16": version % LLAMA_VERSION == 5, "max_seq_len": maxT, "vocab_size": V, "num_layers": L,
                  "num_heads": NH, "channels": C, "padded_vocab_size": Vp}
        if config["arch"] == "llama":
            # The same fields llmc's reader takes: 0 kv heads or MLP width mean its defaults (heads, 4C).
            config["kv_heads"] = int(header[12]) or NH
            config["ffn_hidden"] = int(header[13]) or 4 * C
            config["rope_theta"] = float(header[14:15].view(np.float32)[0])
            if NH <= 0 or C % NH != 0 or NH % config["kv_heads"] != 0:
                raise SystemExit(f"error: '{path}' has an invalid header: {C} channels, {NH} heads, "
                                 f"{config['kv_heads']} kv heads (heads must divide channels, kv heads heads)")
        dtype = np.uint16 if config["bf16"] else np.float32
        params = {}
        for name, shape in tensor_shapes(config):
            count = int(np.prod(shape))
            raw = f.read(count * np.dtype(dtype).itemsize)
            if len(raw) != count * np.dtype(dtype).itemsize:
                raise SystemExit(f"error: '{path}' is truncated in tensor {name}")
            data = np.frombuffer(raw, dtype=dtype)
            params[name] = data.reshape(shape)
        if f.read(1):
            raise SystemExit(f"error: '{path}' has bytes after the last tensor; the header does not describe it")
    return config, params


def to_bf16_bits(x):
    """float32 -> bf16 bits (uint16), rounded to nearest even, as PyTorch's .to(torch.bfloat16)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(x):
    return (x.astype(np.uint32) << 16).view(np.float32)


def hf_gpt2_tensors(config, params):
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


def hf_llama_tensors(config, params):
    """{Hugging Face name: array} in LlamaForCausalLM's layout: llmc's fused wkv and wgateup split
    into their two blocks of rows, nothing transposed, the vocabulary's padding rows cut."""
    V, hs = config["vocab_size"], config["channels"] // config["num_heads"]
    KV, F = config["kv_heads"] * hs, config["ffn_hidden"]
    out = {"model.embed_tokens.weight": params["wte"][:V]}
    for l in range(config["num_layers"]):
        h = f"model.layers.{l}."
        out[h + "input_layernorm.weight"] = params["attn_norm"][l]
        out[h + "self_attn.q_proj.weight"] = params["wq"][l]
        out[h + "self_attn.k_proj.weight"] = params["wkv"][l][:KV]
        out[h + "self_attn.v_proj.weight"] = params["wkv"][l][KV:]
        out[h + "self_attn.o_proj.weight"] = params["wo"][l]
        out[h + "post_attention_layernorm.weight"] = params["mlp_norm"][l]
        out[h + "mlp.gate_proj.weight"] = params["wgateup"][l][:F]
        out[h + "mlp.up_proj.weight"] = params["wgateup"][l][F:]
        out[h + "mlp.down_proj.weight"] = params["wdown"][l]
    out["model.norm.weight"] = params["norm_f"]
    out["lm_head.weight"] = params["lm_head"][:V]
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


def hf_gpt2_config(config, torch_dtype):
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config["vocab_size"], "n_positions": config["max_seq_len"], "n_ctx": config["max_seq_len"],
        "n_embd": config["channels"], "n_layer": config["num_layers"], "n_head": config["num_heads"],
        "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
        "bos_token_id": EOT_TOKEN, "eos_token_id": EOT_TOKEN, "tie_word_embeddings": True,
        "torch_dtype": torch_dtype,
    }


def hf_llama_config(config, torch_dtype):
    # Every field that changes what LlamaForCausalLM computes is written out, not left to
    # transformers' defaults (which differ between versions): no rope scaling, no biases, and
    # head_dim = C / heads, the only head size llmc has. rope_theta is the file's float32, widened
    # exactly, so dev/import_hf.py gets the same bits back.
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config["vocab_size"], "max_position_embeddings": config["max_seq_len"],
        "hidden_size": config["channels"], "intermediate_size": config["ffn_hidden"],
        "num_hidden_layers": config["num_layers"], "num_attention_heads": config["num_heads"],
        "num_key_value_heads": config["kv_heads"], "head_dim": config["channels"] // config["num_heads"],
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": config["rope_theta"], "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
        "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": EOT_TOKEN, "eos_token_id": EOT_TOKEN, "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
    }


def export(model_path, out_dir, dtype=None):
    config, params = read_model_file(model_path)
    source = "bf16" if config["bf16"] else "fp32"
    dtype = dtype or source
    if dtype != source:
        params = {n: (to_bf16_bits(t) if dtype == "bf16" else from_bf16_bits(t)) for n, t in params.items()}
    llama = config["arch"] == "llama"
    tensors = hf_llama_tensors(config, params) if llama else hf_gpt2_tensors(config, params)
    hf_config = hf_llama_config if llama else hf_gpt2_config
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, "F32" if dtype == "fp32" else "BF16")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(config, "float32" if dtype == "fp32" else "bfloat16"), f, indent=2)
        f.write("\n")
    return config, dtype


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # a usage error too is one line and exit status 1 (argparse: usage + 2)
        self.exit(1, f"error: {message} (see --help)\n")


def main():
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="llmc or llm.c model file (version 3/203 fp32 or 5/205 bf16)")
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
    if config["arch"] == "llama":
        what = (f"LlamaForCausalLM with {config['num_layers']} layers, {config['num_heads']} heads "
                f"({config['kv_heads']} kv heads), {config['channels']} channels, MLP {config['ffn_hidden']}, "
                f"rope_theta {config['rope_theta']:g}")
    else:
        what = (f"GPT2LMHeadModel with {config['num_layers']} layers, {config['num_heads']} heads, "
                f"{config['channels']} channels")
    print(f"wrote {args.out_dir}/model.safetensors ({dtype}) and config.json: {what}, vocab {config['vocab_size']} "
          f"(padded {config['padded_vocab_size']} in the file)")


if __name__ == "__main__":
    main()
