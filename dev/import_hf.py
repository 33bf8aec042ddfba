"""import_hf.py: a Hugging Face directory (LlamaForCausalLM or GPT2LMHeadModel) -> an llmc model file.

    /usr/bin/python3 dev/import_hf.py hf_model/ out/model.bin            # fp32: version 3 or 203
    /usr/bin/python3 dev/import_hf.py hf_model/ out/model.bin --dtype bf16   # version 5 or 205
    ./train_gpt_cpu -e out/model.bin ...                                  # continue pretraining it

The reverse of dev/export_hf.py, for any checkpoint whose model llmc computes exactly. The directory
holds config.json and the weights as safetensors: model.safetensors, or shards model-XXXXX-of-
YYYYY.safetensors listed by model.safetensors.index.json (its weight_map: tensor name -> file). The
safetensors reader is this file's own (F32, BF16 and F16 tensors; each is widened to float32 exactly).
The model file written (llmc/models/model_file.h, docs/file-formats.md) is an int32[256] header and
every parameter in the family's order, fp32 by default, or bf16 rounded to nearest even (--dtype bf16).

GPT2LMHeadModel -> version 3 (fp32) or 5 (bf16), llm.c's own file:
  Hugging Face's GPT-2 linear layers are Conv1D modules storing the weight [in, out] (y = x W + b);
  llm.c stores [out, in], so c_attn, attn.c_proj, c_fc and mlp.c_proj are transposed back.
  max_seq_len = n_positions (the rows of wpe). The lm head must be tied to wte (llm.c's GPT-2 has no
  other). Names with or without the "transformer." prefix are read (the original openai-community
  checkpoint has none), and the attention mask buffers some checkpoints store (attn.bias,
  attn.masked_bias) are skipped.
LlamaForCausalLM -> version 203 (fp32) or 205 (bf16), header[12..14] = kv heads, intermediate_size,
  rope_theta's float32 bits. nn.Linear weights are [out, in] as llmc's; k_proj and v_proj become
  wkv's two blocks of rows (k, then v), gate_proj and up_proj wgateup's (gate, then up);
  max_seq_len = max_position_embeddings. llmc computes what LlamaForCausalLM does only for a part of
  what its config can say, and anything else is refused, naming the field: rope_scaling must be null
  (no Llama 3.1 / YaRN / linear scaling), attention_bias and mlp_bias false, hidden_act silu,
  rms_norm_eps 1e-5, head_dim = hidden_size / num_attention_heads, and that head size even (RoPE
  rotates pairs). A tied model (tie_word_embeddings true) gets its lm_head as a copy of
  embed_tokens, since llmc's Llama head is untied; it says so.
Both: the vocabulary is padded to a multiple of 128 rows with zeros (wte, and Llama's lm_head), as
llmc pads it. A tensor the family does not have is refused rather than dropped (a checkpoint with
biases llmc lacks would otherwise load as a different model), and so is any non-finite value.
The output is written to a temporary file beside it and renamed, so it is whole or absent. Needs
numpy only. Every error is one line on stderr and exit status 1.
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError as e:
    sys.exit(f"error: dev/import_hf.py needs numpy ({e}): install it (Debian: apt install python3-numpy; "
             f"elsewhere: pip install numpy) or run it with /usr/bin/python3")

# The model file's header and bf16 rounding, as the export writes them (a sibling script in dev/).
from export_hf import HEADER_INTS, LLAMA_VERSION, MODEL_MAGIC, to_bf16_bits  # noqa: E402

# llmc's bounds on a shape (llmc/models/model_config.h, ModelConfig::validate).
MAX_SEQ_LEN, MAX_VOCAB, MAX_LAYERS, MAX_CHANNELS = 1 << 20, 1 << 24, 1 << 12, 1 << 16
GPT2_VOCAB = 50257


def fail(message):
    raise SystemExit(f"error: {message}")


# ----------------------------------------------------------------------------
# safetensors: a little-endian uint64 n, n bytes of JSON (tensor name -> {dtype, shape, data_offsets
# [begin, end) into the data that follows}; an optional "__metadata__" entry), then the data.

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}


class SafetensorsFile:
    """One .safetensors file: its header is read and checked now, a tensor's bytes when asked for."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            first = f.read(8)
            if len(first) != 8:
                fail(f"'{path}' is not a safetensors file: {size} bytes, too short for its header length")
            n = struct.unpack("<Q", first)[0]
            if n > size - 8:
                fail(f"'{path}' is not a safetensors file: its header claims {n} bytes, the file has {size - 8} "
                     f"after the length")
            try:
                header = json.loads(f.read(n))
            except (ValueError, UnicodeDecodeError) as e:
                fail(f"'{path}' is not a safetensors file: its header is not JSON ({e})")
        if not isinstance(header, dict):
            fail(f"'{path}' is not a safetensors file: its header is not a JSON object")
        self.data_start, data_bytes = 8 + n, size - 8 - n
        self.tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (begin, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                fail(f"'{path}': tensor '{name}' has a malformed header entry {info!r}")
            if dtype not in SAFETENSORS_DTYPES:
                fail(f"'{path}': tensor '{name}' is {dtype}; import_hf.py reads F32, BF16 and F16 tensors")
            expected = math.prod(shape) * SAFETENSORS_DTYPES[dtype].itemsize
            if not 0 <= begin <= end <= data_bytes or end - begin != expected:
                fail(f"'{path}': tensor '{name}' ({dtype} {shape}: {expected} bytes) has data_offsets [{begin}, {end}) "
                     f"in {data_bytes} bytes of data")
            self.tensors[name] = (dtype, tuple(shape), begin)

    def read(self, name):
        """The tensor as float32 (BF16 and F16 widen exactly)."""
        dtype, shape, begin = self.tensors[name]
        count = math.prod(shape)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            raw = np.frombuffer(f.read(count * SAFETENSORS_DTYPES[dtype].itemsize), dtype=SAFETENSORS_DTYPES[dtype])
        if dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)  # bf16 is float32's upper half
        return raw.astype(np.float32).reshape(shape)


class Checkpoint:
    """A directory's tensors: model.safetensors, or the shards model.safetensors.index.json names."""

    def __init__(self, directory):
        self.files = {}  # tensor name -> the SafetensorsFile holding it
        single = os.path.join(directory, "model.safetensors")
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.isfile(single):
            shard = SafetensorsFile(single)
            self.files = {name: shard for name in shard.tensors}
            self.where = "model.safetensors"
            return
        if not os.path.isfile(index):
            others = sorted(f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".pth", ".h5", ".msgpack")))
            also = f" (it has {', '.join(others)}: convert those to safetensors first)" if others else ""
            fail(f"'{directory}' has neither model.safetensors nor model.safetensors.index.json{also}")
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError) as e:
            fail(f"'{index}' is not a safetensors index (a JSON object with a weight_map of tensor name -> file): {e}")
        shards = {}
        for name, file in weight_map.items():
            if file not in shards:
                path = os.path.join(directory, str(file))
                if not os.path.isfile(path):
                    fail(f"'{index}' puts tensor '{name}' in '{file}', which '{directory}' does not have")
                shards[file] = SafetensorsFile(path)
            if name not in shards[file].tensors:
                fail(f"'{index}' puts tensor '{name}' in '{file}', which does not hold it")
            self.files[name] = shards[file]
        self.where = f"{len(shards)} shards"

    def __contains__(self, name):
        return name in self.files

    def shape(self, name):
        return self.files[name].tensors[name][1]

    def read(self, name):
        return self.files[name].read(name)


# ----------------------------------------------------------------------------
# config.json -> llmc's shape, refusing what llmc does not compute

MISSING = object()


def field(cfg, name, default=MISSING, kind=int):
    """cfg[name] checked to be a `kind` (ints are accepted as floats); `default` (Hugging Face's own
    default for the field) when absent, an error when there is none."""
    value = cfg.get(name, default)
    if value is MISSING:
        fail(f"config.json has no '{name}'")
    if value is None and default is None:
        return None
    # JSON's true and false are Python bools, and bool is a subclass of int: keep them apart.
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        fail(f"config.json: {name} is {json.dumps(value)}; expected a{'n' if kind is int else ''} {kind.__name__}")
    return value


def refuse(name, value, supported):
    fail(f"config.json: {name} is {json.dumps(value)}; llmc computes only {supported}")


def check_range(name, value, low, high):
    if not low <= value <= high:
        fail(f"config.json: {name} is {value}; llmc's limit is [{low}, {high}]")


def check_eps(name, value):
    # 1e-5 exactly, or as a float32 widened (9.999999747e-06): a relative tolerance well below what
    # changes the computed norm.
    if not math.isclose(value, 1e-5, rel_tol=1e-6):
        refuse(name, value, "1e-5 (llmc's norm epsilon)")


def gpt2_shape(cfg):
    """llmc's GPT-2 shape from a GPT2Config (Hugging Face's defaults where a field is absent)."""
    C, NH = field(cfg, "n_embd"), field(cfg, "n_head")
    check_range("n_head", NH, 1, MAX_CHANNELS)
    shape = {"max_seq_len": field(cfg, "n_positions"), "vocab_size": field(cfg, "vocab_size"),
             "num_layers": field(cfg, "n_layer"), "num_heads": NH, "channels": C}
    inner = field(cfg, "n_inner", None)
    if inner is not None and inner != 4 * C:
        refuse("n_inner", inner, f"null or 4 x n_embd = {4 * C} (GPT-2's MLP width)")
    act = field(cfg, "activation_function", "gelu_new", str)
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        refuse("activation_function", act, "gelu_new (GELU's tanh approximation)")
    check_eps("layer_norm_epsilon", field(cfg, "layer_norm_epsilon", 1e-5, float))
    if not field(cfg, "scale_attn_weights", True, bool):
        refuse("scale_attn_weights", False, "true (attention scaled by 1/sqrt(head size))")
    if field(cfg, "scale_attn_by_inverse_layer_idx", False, bool):
        refuse("scale_attn_by_inverse_layer_idx", True, "false")
    if not field(cfg, "tie_word_embeddings", True, bool):
        refuse("tie_word_embeddings", False, "true for GPT-2 (its lm head is wte)")
    if C % NH != 0:
        fail(f"config.json: n_embd {C} is not a multiple of n_head {NH}")
    return shape


def llama_shape(cfg):
    """llmc's Llama shape from a LlamaConfig (Hugging Face's defaults where a field is absent)."""
    C, NH = field(cfg, "hidden_size"), field(cfg, "num_attention_heads")
    check_range("num_attention_heads", NH, 1, MAX_CHANNELS)
    KVH = field(cfg, "num_key_value_heads", NH)
    shape = {"max_seq_len": field(cfg, "max_position_embeddings", 2048),
             "vocab_size": field(cfg, "vocab_size"), "num_layers": field(cfg, "num_hidden_layers"),
             "num_heads": NH, "channels": C, "kv_heads": KVH, "ffn_hidden": field(cfg, "intermediate_size"),
             "rope_theta": float(field(cfg, "rope_theta", 10000.0, float))}
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        refuse("rope_scaling", scaling, "null (RoPE at its base frequencies, rope_theta only)")
    for bias in ("attention_bias", "mlp_bias"):
        if field(cfg, bias, False, bool):
            refuse(bias, True, "false (llmc's Llama has no biases)")
    act = field(cfg, "hidden_act", "silu", str)
    if act != "silu":
        refuse("hidden_act", act, "silu (SwiGLU's gate)")
    check_eps("rms_norm_eps", field(cfg, "rms_norm_eps", 1e-6, float))  # LlamaConfig's default is 1e-6
    if C % NH != 0:
        fail(f"config.json: hidden_size {C} is not a multiple of num_attention_heads {NH}; llmc's head size is "
             f"hidden_size / num_attention_heads")
    head_dim = field(cfg, "head_dim", None)
    if head_dim is not None and head_dim != C // NH:
        refuse("head_dim", head_dim, f"hidden_size / num_attention_heads = {C // NH}")
    if (C // NH) % 2 != 0:
        fail(f"config.json: the head size (hidden_size {C} / num_attention_heads {NH} = {C // NH}) is odd; RoPE "
             f"rotates pairs of a head's channels, so llmc needs it even")
    if KVH < 1 or NH % KVH != 0:
        refuse("num_key_value_heads", KVH, f"a divisor of num_attention_heads = {NH}")
    check_range("intermediate_size", shape["ffn_hidden"], 1, MAX_CHANNELS * 8)
    theta = shape["rope_theta"]
    if not 0 < theta < 3.4e38:  # positive and a finite float32 (the file holds its bits); NaN fails too
        refuse("rope_theta", theta, "a positive float32")
    return shape


ARCHITECTURES = {"GPT2LMHeadModel": gpt2_shape, "LlamaForCausalLM": llama_shape}
MODEL_TYPES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def read_config(directory):
    path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        what = "does not exist" if not os.path.exists(directory) else "is a file"
        fail(f"'{directory}' {what}; expected a Hugging Face model directory (config.json + model.safetensors)")
    if not os.path.isfile(path):
        fail(f"'{directory}' has no config.json; expected a Hugging Face model directory (config.json + "
             f"model.safetensors)")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except ValueError as e:
        fail(f"'{path}' is not JSON: {e}")
    if not isinstance(cfg, dict):
        fail(f"'{path}' is not a JSON object")
    # architectures names the class; a config saved without it still has model_type.
    archs = cfg.get("architectures")
    if archs:
        arch, said = archs[0] if isinstance(archs, list) else archs, f"architectures is {json.dumps(archs)}"
    else:
        model_type = cfg.get("model_type")
        arch, said = MODEL_TYPES.get(model_type), f"model_type is {json.dumps(model_type)} (no architectures)"
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        fail(f"'{path}': {said}; import_hf.py reads {' and '.join(ARCHITECTURES)}")
    shape = ARCHITECTURES[arch](cfg)
    shape["tied"] = field(cfg, "tie_word_embeddings", arch == "GPT2LMHeadModel", bool)
    # llmc's bounds, under the config's own names for the fields.
    names = {"GPT2LMHeadModel": ("n_positions", "n_layer", "n_embd"),
             "LlamaForCausalLM": ("max_position_embeddings", "num_hidden_layers", "hidden_size")}[arch]
    check_range(names[0], shape["max_seq_len"], 1, MAX_SEQ_LEN)
    check_range("vocab_size", shape["vocab_size"], 1, MAX_VOCAB)
    check_range(names[1], shape["num_layers"], 1, MAX_LAYERS)
    check_range(names[2], shape["channels"], 1, MAX_CHANNELS)
    shape["padded_vocab_size"] = (shape["vocab_size"] + 127) // 128 * 128  # as llm.c pads it
    return arch, shape


# ----------------------------------------------------------------------------
# The family's tensors in llmc's file order. Each entry: (llmc name, per layer?, [Hugging Face name,
# its shape], transpose?, rows padded to?). An llmc tensor is its parts' rows one after the other
# (transposed first where marked), then zero rows up to the padded vocabulary where marked.

def gpt2_table(s, prefix):
    V, Vp, C, maxT = s["vocab_size"], s["padded_vocab_size"], s["channels"], s["max_seq_len"]
    h = prefix + "h.{l}."
    return [
        ("wte", False, [(prefix + "wte.weight", (V, C))], False, Vp),
        ("wpe", False, [(prefix + "wpe.weight", (maxT, C))], False, None),
        ("ln1w", True, [(h + "ln_1.weight", (C,))], False, None),
        ("ln1b", True, [(h + "ln_1.bias", (C,))], False, None),
        ("qkvw", True, [(h + "attn.c_attn.weight", (C, 3 * C))], True, None),  # Conv1D [in, out]
        ("qkvb", True, [(h + "attn.c_attn.bias", (3 * C,))], False, None),
        ("attprojw", True, [(h + "attn.c_proj.weight", (C, C))], True, None),
        ("attprojb", True, [(h + "attn.c_proj.bias", (C,))], False, None),
        ("ln2w", True, [(h + "ln_2.weight", (C,))], False, None),
        ("ln2b", True, [(h + "ln_2.bias", (C,))], False, None),
        ("fcw", True, [(h + "mlp.c_fc.weight", (C, 4 * C))], True, None),
        ("fcb", True, [(h + "mlp.c_fc.bias", (4 * C,))], False, None),
        ("fcprojw", True, [(h + "mlp.c_proj.weight", (4 * C, C))], True, None),
        ("fcprojb", True, [(h + "mlp.c_proj.bias", (C,))], False, None),
        ("lnfw", False, [(prefix + "ln_f.weight", (C,))], False, None),
        ("lnfb", False, [(prefix + "ln_f.bias", (C,))], False, None),
    ]


def llama_table(s):
    V, Vp, C = s["vocab_size"], s["padded_vocab_size"], s["channels"]
    hs = C // s["num_heads"]
    Q, KV, F = s["num_heads"] * hs, s["kv_heads"] * hs, s["ffn_hidden"]
    h = "model.layers.{l}."
    # Tied: Hugging Face's lm head is embed_tokens itself; llmc's is a tensor of its own, so a copy.
    head = "model.embed_tokens.weight" if s["tied"] else "lm_head.weight"
    return [
        ("wte", False, [("model.embed_tokens.weight", (V, C))], False, Vp),
        ("attn_norm", True, [(h + "input_layernorm.weight", (C,))], False, None),
        ("wq", True, [(h + "self_attn.q_proj.weight", (Q, C))], False, None),
        ("wkv", True, [(h + "self_attn.k_proj.weight", (KV, C)), (h + "self_attn.v_proj.weight", (KV, C))],
         False, None),
        ("wo", True, [(h + "self_attn.o_proj.weight", (C, Q))], False, None),
        ("mlp_norm", True, [(h + "post_attention_layernorm.weight", (C,))], False, None),
        ("wgateup", True, [(h + "mlp.gate_proj.weight", (F, C)), (h + "mlp.up_proj.weight", (F, C))], False, None),
        ("wdown", True, [(h + "mlp.down_proj.weight", (C, F))], False, None),
        ("norm_f", False, [("model.norm.weight", (C,))], False, None),
        ("lm_head", False, [(head, (V, C))], False, Vp),
    ]


def tensor_table(arch, shape, ckpt):
    """The table, and the checkpoint's tensors that are not parameters (skipped)."""
    L = shape["num_layers"]
    if arch == "LlamaForCausalLM":
        # Old checkpoints saved RoPE's inverse frequencies, a buffer computed from rope_theta; a tied
        # model may still store lm_head.weight, which Hugging Face replaces with embed_tokens.
        skipped = {f"model.layers.{l}.self_attn.rotary_emb.inv_freq" for l in range(L)}
        if shape["tied"]:
            skipped.add("lm_head.weight")
        return llama_table(shape), skipped
    prefix = "transformer." if "transformer.wte.weight" in ckpt or "wte.weight" not in ckpt else ""
    # The causal mask (attn.bias) and masked_bias are buffers, not parameters; lm_head.weight, where a
    # checkpoint stores it, must be wte (checked in convert).
    skipped = {prefix + f"h.{l}.attn.{b}" for l in range(L) for b in ("bias", "masked_bias")}
    skipped.add("lm_head.weight")
    return gpt2_table(shape, prefix), skipped


def layer_entries(table, num_layers):
    """The table in file order with each per-layer tensor repeated for layers 0..L-1 (each llmc tensor
    holds all its layers back to back): [(llmc name, layer or None, parts with names filled in,
    transpose?, padded rows)]."""
    entries = []
    for name, per_layer, parts, transpose, pad in table:
        for layer in (range(num_layers) if per_layer else [None]):
            filled = [(hf_name.format(l=layer), hf_shape) for hf_name, hf_shape in parts]
            entries.append((name, layer, filled, transpose, pad))
    return entries


def check_tensors(arch, entries, skipped, ckpt, directory):
    """Before anything is written: every tensor the family needs is there with its shape, and the
    checkpoint holds nothing else (nothing is silently dropped)."""
    used = set()
    for name, layer, parts, _, _ in entries:
        for hf_name, hf_shape in parts:
            where = f"llmc's {name}" + (f" of layer {layer}" if layer is not None else "")
            if hf_name not in ckpt:
                fail(f"'{directory}' ({ckpt.where}) has no tensor '{hf_name}'; {arch} needs it ({where})")
            if ckpt.shape(hf_name) != hf_shape:
                fail(f"'{directory}': tensor '{hf_name}' has shape {list(ckpt.shape(hf_name))}; config.json says "
                     f"{list(hf_shape)} ({where})")
            used.add(hf_name)
    extra = sorted(set(ckpt.files) - used - skipped)
    if extra:
        fail(f"'{directory}' has {len(extra)} tensor(s) {arch} as llmc computes it has no place for, e.g. "
             f"'{extra[0]}'; refusing rather than dropping them")


def encode(t, dtype, hf_name):
    """float32 array -> the file's bytes: fp32 as is, or bf16 rounded to nearest even (PyTorch's
    .to(torch.bfloat16), llmc's write_model_file)."""
    if dtype == "fp32":
        return np.ascontiguousarray(t, dtype="<f4").tobytes()
    bf16 = to_bf16_bits(t).astype("<u2")
    if np.any((bf16 & 0x7F80) == 0x7F80):  # all exponent bits set: a finite float32 rounded up to infinity
        fail(f"tensor '{hf_name}' has a value beyond bf16's range (|x| > 3.39e38); write it with --dtype fp32")
    return bf16.tobytes()


def write_model(out_path, header, entries, ckpt, dtype, channels):
    """Streams the parameters into out_path in file order, one tensor of one layer in memory at a
    time (a published checkpoint can be larger than this machine's memory in fp32), through a
    temporary file renamed at the end: the output is whole or absent."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(out_path)), f".{os.path.basename(out_path)}.tmp.{os.getpid()}")
    try:
        f = open(tmp, "wb")
    except OSError as e:
        fail(f"cannot write '{out_path}': {e.strerror}")
    try:
        with f:
            f.write(header.astype("<i4").tobytes())
            for _, _, parts, transpose, pad in entries:
                rows = 0
                for hf_name, _ in parts:  # an llmc tensor is its parts' rows, one part after the other
                    t = ckpt.read(hf_name)
                    bad = np.flatnonzero(~np.isfinite(t))
                    if len(bad):
                        fail(f"tensor '{hf_name}' holds {len(bad)} non-finite value(s) (the first at flat index "
                             f"{bad[0]}: {t.flat[bad[0]]}); an llmc model file must hold finite values")
                    if transpose:
                        t = t.T  # Conv1D's [in, out] -> llmc's [out, in] (encode lays it out row-major)
                    f.write(encode(t, dtype, hf_name))
                    rows += t.shape[0]
                if pad is not None and pad > rows:
                    # the vocabulary's padding rows: zero, as llmc's init leaves them
                    f.write(encode(np.zeros((pad - rows, channels), np.float32), dtype, "padding"))
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def header_ints(arch, shape, dtype):
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    llama = arch == "LlamaForCausalLM"
    header[0] = MODEL_MAGIC
    header[1] = (3 if dtype == "fp32" else 5) + (LLAMA_VERSION if llama else 0)
    header[2:8] = [shape["max_seq_len"], shape["vocab_size"], shape["num_layers"], shape["num_heads"],
                   shape["channels"], shape["padded_vocab_size"]]
    if llama:
        header[12], header[13] = shape["kv_heads"], shape["ffn_hidden"]
        header[14] = np.array([shape["rope_theta"]], dtype=np.float32).view(np.int32)[0]
    return header


def convert(directory, out_path, dtype):
    arch, shape = read_config(directory)
    ckpt = Checkpoint(directory)
    table, skipped = tensor_table(arch, shape, ckpt)
    entries = layer_entries(table, shape["num_layers"])
    check_tensors(arch, entries, skipped, ckpt, directory)
    notes = []
    if arch == "GPT2LMHeadModel" and "lm_head.weight" in ckpt:
        # Stored although tied: it must be wte itself, the only head llm.c's GPT-2 has.
        wte_name = entries[0][2][0][0]
        if ckpt.shape("lm_head.weight") != ckpt.shape(wte_name) or \
                not np.array_equal(ckpt.read("lm_head.weight"), ckpt.read(wte_name)):
            fail(f"'{directory}': lm_head.weight differs from {wte_name}; llmc's GPT-2 ties its lm head to wte")
    if arch == "LlamaForCausalLM" and shape["tied"]:
        notes.append("tie_word_embeddings is true: lm_head written as a copy of model.embed_tokens.weight "
                     "(llmc's Llama head is untied; training updates the two separately)")
    if shape["vocab_size"] != GPT2_VOCAB:
        # llmc's data shards and prompts are GPT-2 BPE ids, stored as uint16.
        notes.append(f"the vocabulary is {shape['vocab_size']} tokens, not GPT-2's {GPT2_VOCAB}: train it on token "
                     f"shards made with this model's own tokenizer (llmc's shards hold uint16 ids: ids up to 65535)")
    write_model(out_path, header_ints(arch, shape, dtype), entries, ckpt, dtype, shape["channels"])
    return arch, shape, ckpt, notes


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # a usage error too is one line and exit status 1 (argparse: usage + 2)
        self.exit(1, f"error: {message} (see --help)\n")


def main():
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", help="Hugging Face model directory: config.json and model.safetensors (or shards "
                                   "with model.safetensors.index.json)")
    ap.add_argument("out", help="the llmc model file to write (e.g. out/model.bin)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="the file's numbers: fp32 (version 3 or 203, default) or bf16 (5 or 205)")
    args = ap.parse_args()
    if os.path.isdir(args.out):
        fail(f"'{args.out}' is a directory; expected the path of the model file to write (e.g. {args.out}/model.bin)")
    try:
        arch, shape, ckpt, notes = convert(args.hf_dir, args.out, args.dtype)
    except OSError as e:
        fail(f"{e.filename or args.hf_dir}: {e.strerror or e}")
    except MemoryError:
        fail(f"out of memory reading a tensor of '{args.hf_dir}'")
    version = (3 if args.dtype == "fp32" else 5) + (LLAMA_VERSION if arch == "LlamaForCausalLM" else 0)
    if arch == "LlamaForCausalLM":
        what = (f"Llama with {shape['num_layers']} layers, {shape['num_heads']} heads ({shape['kv_heads']} kv heads), "
                f"{shape['channels']} channels, MLP {shape['ffn_hidden']}, rope_theta {shape['rope_theta']:g}")
    else:
        what = f"GPT-2 with {shape['num_layers']} layers, {shape['num_heads']} heads, {shape['channels']} channels"
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out} (version {version}, {args.dtype}, {os.path.getsize(args.out)} bytes) from {arch} "
          f"({ckpt.where}): {what}, vocab {shape['vocab_size']} padded to {shape['padded_vocab_size']}, "
          f"max_seq_len {shape['max_seq_len']}")


if __name__ == "__main__":
    main()
