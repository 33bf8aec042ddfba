"""test_export_hf.py: dev/export_hf.py's output, read back without its code, gives llmc's logits;
dev/import_hf.py brings it back to the same bytes.

GPT-2: the fixture model (test/fixtures/gpt2_tiny_model.bin, fp32, vocab 500 padded to 512) is
exported; an independent safetensors reader (below: the length, the JSON header, the raw bytes) loads
it, and GPT-2 is computed from the Hugging Face tensors as GPT2LMHeadModel does (Conv1D: y = x W + b
with W stored [in, out]; tied lm head; gelu_new; LayerNorm eps 1e-5) in float64 with numpy (PyTorch
is not a dependency of llmc's tests; on a GPU session transformers itself can load the export, see
README). The logits must match, to 1e-5, the fixture's logits, which are the ones llmc's CPU model is
held to (test_gpt2_cpu.cpp checks the model against this very file). A bf16 (version 5) file of the
same model exports to BF16 tensors holding exactly its bits. Bad uses (no numpy, a directory or a
truncated file as the model, a file as the output directory) end with one line naming the problem
and exit status 1, no traceback.

Llama: test/fixtures/llama_tiny_model.bin (version 203: 4 heads over 2 kv heads, MLP 160, RoPE base
10000) exports to a LlamaForCausalLM directory, and a Llama written here from the Hugging Face
tensors and config.json alone (nn.Linear y = x W^T; RMSNorm; rotate-half RoPE pairing channel i of a
head with i + head_dim/2 at the config's rope_theta; kv head j serving query heads j*G..j*G+G-1;
SwiGLU; the untied lm_head) must give, to 1e-5, the logits of test/fixtures/llama_tiny_state.bin, which
dev/ref/make_llama_model_fixture.py computed in PyTorch (and test_llama_cpu.cpp holds llmc to).

dev/import_hf.py: each export imports back to a file byte-identical to the fixture (so every tensor
is in its place, untransposed or transposed as it must be, the vocabulary padded with zeros, the
header's fields, rope_theta's bits included, as llmc wrote them); --dtype bf16 writes version 205/5
holding the fp32 values rounded to nearest even; a BF16 export imports back to its bf16 file; F16
tensors widen exactly; the same checkpoint split into two shards with an index json, and GPT-2 as the
original openai-community checkpoint names it (no "transformer." prefix, mask buffers, lm_head
stored), import to the same bytes; a tied Llama gets lm_head = embed_tokens. Bad uses (no
config.json, another architecture, rope_scaling, a missing or an extra tensor, biases, another
activation, epsilon or head_dim, an odd head size, a non-finite value) end with one line naming the
problem and exit status 1, and a failed import leaves the output as it was.
Run: /usr/bin/python3 test/test_export_hf.py (make test).
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "test/fixtures/gpt2_tiny_model.bin")
STATE = os.path.join(ROOT, "test/fixtures/gpt2_tiny_state.bin")
LLAMA_MODEL = os.path.join(ROOT, "test/fixtures/llama_tiny_model.bin")
LLAMA_STATE = os.path.join(ROOT, "test/fixtures/llama_tiny_state.bin")
EXPORT = os.path.join(ROOT, "dev/export_hf.py")
IMPORT = os.path.join(ROOT, "dev/import_hf.py")


ST_DTYPES = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = np.frombuffer(data[begin:end], dtype=ST_DTYPES[info["dtype"]])
        tensors[name] = (info["dtype"], raw.reshape(info["shape"]))
    return tensors


def write_safetensors(path, tensors):
    """{name: (dtype, array)} -> a safetensors file, data in the order given (this test's own writer,
    for the shards and edited checkpoints import_hf.py must read)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, t) in tensors.items():
        data = np.ascontiguousarray(t, dtype=ST_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def as_float64(dtype, raw):
    if dtype == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float64)


def bf16_bits(x):
    """float32 -> bf16 bits rounded to nearest even (written out here, not taken from the scripts)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def hf_gpt2_logits(tensors, config, inputs):
    w = {n: as_float64(*t) for n, t in tensors.items()}
    B, T = inputs.shape
    C, NH, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    hs = C // NH
    x = w["transformer.wte.weight"][inputs] + w["transformer.wpe.weight"][:T]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for l in range(config["n_layer"]):
        p = f"transformer.h.{l}."
        ln = lambda t, n: layer_norm(t, w[p + n + ".weight"], w[p + n + ".bias"], eps)
        conv1d = lambda t, n: t @ w[p + n + ".weight"] + w[p + n + ".bias"]  # HF Conv1D: W is [in, out]
        qkv = conv1d(ln(x, "ln_1"), "attn.c_attn")
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, NH, hs).transpose(0, 2, 1, 3) for i in range(3))
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs)
        att[..., future] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + conv1d(y, "attn.c_proj")
        h = conv1d(ln(x, "ln_2"), "mlp.c_fc")
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))  # gelu_new
        x = x + conv1d(h, "mlp.c_proj")
    x = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].T  # the tied lm head


def rms_norm(x, weight, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * weight


def hf_llama_logits(tensors, config, inputs):
    """LlamaForCausalLM's forward pass from its tensors and config.json alone, in float64."""
    w = {n: as_float64(*t) for n, t in tensors.items()}
    B, T = inputs.shape
    NH, KVH, HS = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, half = config["rms_norm_eps"], HS // 2
    # Rotate-half RoPE: channel i of a head is paired with channel i + HS/2, both turned by the angle
    # pos * theta^(-2i/HS); written as x * cos + rotate_half(x) * sin with rotate_half(x1, x2) = (-x2, x1).
    inv_freq = config["rope_theta"] ** (-np.arange(half, dtype=np.float64) * 2 / HS)
    angle = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, HS/2)
    cos, sin = np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle, angle], -1))

    def rope(x):  # x: (B, heads, T, HS)
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    x = w["model.embed_tokens.weight"][inputs]
    for l in range(config["num_hidden_layers"]):
        p = f"model.layers.{l}."
        linear = lambda t, n: t @ w[p + n + ".weight"].T  # nn.Linear: W is [out, in]
        heads = lambda t, n: t.reshape(B, T, n, HS).transpose(0, 2, 1, 3)
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = rope(heads(linear(h, "self_attn.q_proj"), NH))
        k = rope(heads(linear(h, "self_attn.k_proj"), KVH))
        v = heads(linear(h, "self_attn.v_proj"), KVH)
        # Grouped-query attention: each kv head repeated for its NH / KVH query heads, in order.
        k, v = np.repeat(k, NH // KVH, axis=1), np.repeat(v, NH // KVH, axis=1)
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HS)
        att[..., future] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + linear((att @ v).transpose(0, 2, 1, 3).reshape(B, T, NH * HS), "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = linear(h, "mlp.gate_proj"), linear(h, "mlp.up_proj")
        x = x + linear(gate / (1 + np.exp(-gate)) * up, "mlp.down_proj")  # SwiGLU: silu(gate) * up
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T  # untied


def export(model, out):
    subprocess.run([sys.executable, EXPORT, model, out], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f), read_safetensors(os.path.join(out, "model.safetensors"))


def import_hf(hf_dir, out, *flags):
    """dev/import_hf.py hf_dir out flags...; its stdout, and the file it wrote."""
    run = subprocess.run([sys.executable, IMPORT, hf_dir, out] + list(flags), capture_output=True, text=True)
    assert run.returncode == 0 and not run.stderr, f"import_hf.py {hf_dir}: exit {run.returncode}\n{run.stderr}"
    with open(out, "rb") as f:
        return run.stdout, f.read()


def check_refused(args, expected, env=None, script=EXPORT):
    """`script` (dev/export_hf.py) with `args` exits 1 with one line on stderr holding `expected`."""
    run = subprocess.run([sys.executable, script] + args, capture_output=True, text=True, env=env)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and expected in lines[0] and "Traceback" not in run.stderr, \
        f"{args}: exit {run.returncode}, expected 1 with one line holding {expected!r}; stderr:\n{run.stderr}"


def check_bad_uses(tmp):
    check_refused([tmp, os.path.join(tmp, "out")], f"'{tmp}' is a directory; expected an llmc or llm.c model file")
    missing = os.path.join(tmp, "none.bin")
    check_refused([missing, os.path.join(tmp, "out")], f"'{missing}' does not exist")
    truncated = os.path.join(tmp, "truncated.bin")
    with open(MODEL, "rb") as m, open(truncated, "wb") as t:
        t.write(m.read(1024 + 4001))  # the header and an odd number of bytes of wte
    check_refused([truncated, os.path.join(tmp, "out")], "is truncated in tensor wte")
    check_refused([MODEL, MODEL], f"'{MODEL}' is a file; expected a directory")
    # Without numpy: a module of that name that fails to import, ahead of the real one on the path.
    fake = os.path.join(tmp, "no_numpy")
    os.makedirs(fake)
    with open(os.path.join(fake, "numpy.py"), "w") as f:
        f.write("raise ImportError('No module named numpy (simulated)')\n")
    check_refused([MODEL, os.path.join(tmp, "out")], "dev/export_hf.py needs numpy",
                  env=dict(os.environ, PYTHONPATH=fake))
    print("bad uses: each refused with one line and exit status 1")


def read_fixture(model, state):
    """The fixture batch's inputs and the logits (B x T x V, the real vocabulary) its state file holds."""
    with open(state, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        B, T = int(header[2]), int(header[3])
        f.read(32)
        inputs = np.frombuffer(f.read(B * T * 4), dtype=np.int32).reshape(B, T)
        f.read(B * T * 4)
        with open(model, "rb") as m:
            V = int(np.frombuffer(m.read(16), dtype=np.int32)[3])
        return inputs, np.frombuffer(f.read(B * T * V * 4), dtype=np.float32).reshape(B, T, V)


def model_parts(model):
    """(header as a bytearray, the fp32 parameters) of an fp32 model file."""
    with open(model, "rb") as m:
        return bytearray(m.read(1024)), np.frombuffer(m.read(), dtype=np.float32)


def bf16_model_bytes(model):
    """The bf16 file of an fp32 model: version 3 -> 5 (203 -> 205), every value rounded to nearest even."""
    head, params = model_parts(model)
    struct.pack_into("<i", head, 4, struct.unpack_from("<i", head, 4)[0] + 2)
    return bytes(head) + bf16_bits(params).tobytes()


def check_gpt2_export(tmp):
    inputs, llmc_logits = read_fixture(MODEL, STATE)
    (B, T), V = inputs.shape, llmc_logits.shape[2]
    config, tensors = export(MODEL, os.path.join(tmp, "fp32"))
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["vocab_size"] == V, config
    dtype, wte = tensors["transformer.wte.weight"]
    assert dtype == "F32" and wte.shape == (V, config["n_embd"]), (dtype, wte.shape)  # padding rows cut
    C = config["n_embd"]
    assert tensors["transformer.h.0.attn.c_attn.weight"][1].shape == (C, 3 * C)  # Conv1D: [in, out]
    assert tensors["transformer.h.0.mlp.c_proj.weight"][1].shape == (4 * C, C)
    logits = hf_gpt2_logits(tensors, config, inputs)
    err = float(np.abs(logits - llmc_logits).max())
    print(f"fp32 export: max |logit difference| {err:.2e} over {B}x{T}x{V} logits")
    assert err < 1e-5, f"exported model's logits differ from llmc's by {err}"

    # bf16: the same model as an llm.c version 5 file; the export keeps its bits exactly.
    bf16_model = os.path.join(tmp, "model_bf16.bin")
    with open(bf16_model, "wb") as m:
        m.write(bf16_model_bytes(MODEL))
    config16, tensors16 = export(bf16_model, os.path.join(tmp, "bf16"))
    assert config16["torch_dtype"] == "bfloat16"
    for name, (_, t32) in tensors.items():
        dtype16, t16 = tensors16[name]
        assert dtype16 == "BF16" and np.array_equal(t16, bf16_bits(t32)), name
    logits16 = hf_gpt2_logits(tensors16, config16, inputs)
    err16 = float(np.abs(logits16 - llmc_logits).max())
    print(f"bf16 export: every tensor holds the file's bf16 bits; logits within {err16:.2e} of fp32's")
    assert err16 < 0.5
    check_bad_uses(tmp)
    return os.path.join(tmp, "fp32"), os.path.join(tmp, "bf16")


def check_llama_export(tmp):
    inputs, llmc_logits = read_fixture(LLAMA_MODEL, LLAMA_STATE)
    (B, T), V = inputs.shape, llmc_logits.shape[2]
    out = os.path.join(tmp, "llama_fp32")
    config, tensors = export(LLAMA_MODEL, out)
    expected = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
                "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 160, "max_position_embeddings": 32, "rope_theta": 10000.0,
                "rope_scaling": None, "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": False,
                "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32"}
    for key, value in expected.items():
        got = config.get(key, "absent")
        assert got == value, f"config.json {key}: {got!r}, expected {value!r}"
    C, Q, KV, F = 64, 4 * 16, 2 * 16, 160
    shapes = {"model.embed_tokens.weight": (V, C), "lm_head.weight": (V, C), "model.norm.weight": (C,),
              "model.layers.1.self_attn.q_proj.weight": (Q, C), "model.layers.1.self_attn.k_proj.weight": (KV, C),
              "model.layers.1.self_attn.v_proj.weight": (KV, C), "model.layers.1.self_attn.o_proj.weight": (C, Q),
              "model.layers.1.mlp.gate_proj.weight": (F, C), "model.layers.1.mlp.up_proj.weight": (F, C),
              "model.layers.1.mlp.down_proj.weight": (C, F)}
    for name, shape in shapes.items():
        assert tensors[name][0] == "F32" and tensors[name][1].shape == shape, (name, tensors[name][1].shape, shape)
    assert len(tensors) == 3 + 9 * 2, sorted(tensors)
    logits = hf_llama_logits(tensors, config, inputs)
    err = float(np.abs(logits - llmc_logits).max())
    print(f"llama fp32 export: max |logit difference| {err:.2e} over {B}x{T}x{V} logits (GQA 4/2 heads, RoPE "
          f"theta {config['rope_theta']:g}, untied head)")
    assert err < 1e-5, f"exported Llama's logits differ from the fixture's by {err}"

    bf16_model = os.path.join(tmp, "llama_bf16.bin")
    with open(bf16_model, "wb") as m:
        m.write(bf16_model_bytes(LLAMA_MODEL))
    config16, tensors16 = export(bf16_model, os.path.join(tmp, "llama_bf16"))
    assert config16["torch_dtype"] == "bfloat16"
    for name, (_, t32) in tensors.items():
        assert tensors16[name][0] == "BF16" and np.array_equal(tensors16[name][1], bf16_bits(t32)), name
    err16 = float(np.abs(hf_llama_logits(tensors16, config16, inputs) - llmc_logits).max())
    print(f"llama bf16 export: every tensor holds the file's bf16 bits; logits within {err16:.2e} of fp32's")
    assert err16 < 0.5
    return out, os.path.join(tmp, "llama_bf16")


REMOVE = object()


def edited(src, dst, config=None, tensors=None):
    """A copy of Hugging Face directory `src` at `dst`: config.json's fields set from `config` (REMOVE
    deletes one), model.safetensors written from `tensors` ({name: (dtype, array)}) when given."""
    os.makedirs(dst)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    for key, value in (config or {}).items():
        if value is REMOVE:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    if tensors is None:
        shutil.copy(os.path.join(src, "model.safetensors"), dst)
    else:
        write_safetensors(os.path.join(dst, "model.safetensors"), tensors)
    return dst


def check_round_trips(tmp, gpt2_dir, gpt2_bf16_dir, llama_dir, llama_bf16_dir):
    out = os.path.join(tmp, "imported.bin")
    for name, hf_dir, model in [("llama", llama_dir, LLAMA_MODEL), ("gpt2", gpt2_dir, MODEL)]:
        with open(model, "rb") as f:
            original = f.read()
        _, data = import_hf(hf_dir, out)
        assert data == original, f"{name}: export then import differs from {model}"
        # --dtype bf16 from the F32 export: the file's version + 2, each value rounded to nearest even.
        _, data = import_hf(hf_dir, out, "--dtype", "bf16")
        assert data == bf16_model_bytes(model), f"{name}: the bf16 import is not the fp32 file rounded"
    print("round trips: llama and gpt2 fixtures -> export -> import byte-identical; --dtype bf16 gives version "
          "205/5 holding the values rounded to nearest even")
    # BF16 tensors: the bf16 files' exports import back to those files (read exactly, written as they are).
    for name, hf_dir, model in [("llama", llama_bf16_dir, LLAMA_MODEL), ("gpt2", gpt2_bf16_dir, MODEL)]:
        _, data = import_hf(hf_dir, out, "--dtype", "bf16")
        assert data == bf16_model_bytes(model), f"{name}: BF16 export -> bf16 import is not the bf16 file"
    # F16 tensors widen exactly: the file holds the fp32 values rounded to half precision.
    tensors = read_safetensors(os.path.join(llama_dir, "model.safetensors"))
    f16 = edited(llama_dir, os.path.join(tmp, "llama_f16"), {"torch_dtype": "float16"},
                 {n: ("F16", t.astype(np.float16)) for n, (_, t) in tensors.items()})
    head, params = model_parts(LLAMA_MODEL)
    _, data = import_hf(f16, out)
    assert data == bytes(head) + params.astype(np.float16).astype(np.float32).tobytes(), "F16 import"
    # GPT-2 as the original openai-community checkpoint stores it: no "transformer." prefix, the causal
    # mask buffers, and lm_head.weight (tied) stored beside wte.
    gpt2 = read_safetensors(os.path.join(gpt2_dir, "model.safetensors"))
    plain = {n[len("transformer."):]: t for n, t in gpt2.items()}
    for l in range(2):
        plain[f"h.{l}.attn.bias"] = ("F32", np.tril(np.ones((1, 1, 32, 32), np.float32)))
        plain[f"h.{l}.attn.masked_bias"] = ("F32", np.array(-1e4, np.float32))
    plain["lm_head.weight"] = plain["wte.weight"]
    original = edited(gpt2_dir, os.path.join(tmp, "gpt2_original"), tensors=plain)
    _, data = import_hf(original, out)
    with open(MODEL, "rb") as f:
        assert data == f.read(), "GPT-2 named as the original checkpoint does"
    # A tied Llama: lm_head becomes a copy of embed_tokens, and the import says so.
    tied = edited(llama_dir, os.path.join(tmp, "llama_tied"), {"tie_word_embeddings": True},
                  {n: t for n, t in tensors.items() if n != "lm_head.weight"})
    stdout, data = import_hf(tied, out)
    assert "lm_head written as a copy of model.embed_tokens.weight" in stdout, stdout
    rows = 512 * 64 * 4  # Vp x C fp32: wte first after the header, lm_head last
    assert data[1024:1024 + rows] == data[-rows:] and data[:-rows] == bytes(head) + params[:-rows // 4].tobytes()
    print("imports: BF16 tensors kept exactly, F16 widened exactly, GPT-2 without the transformer. prefix and with "
          "its mask buffers, a tied Llama's lm_head copied from embed_tokens")


def check_sharded(tmp, llama_dir):
    """The export split into two shards listed by model.safetensors.index.json imports to the same bytes."""
    tensors = read_safetensors(os.path.join(llama_dir, "model.safetensors"))
    names = list(tensors)
    sharded = os.path.join(tmp, "llama_sharded")
    os.makedirs(sharded)
    shutil.copy(os.path.join(llama_dir, "config.json"), sharded)
    weight_map = {}
    # The second shard gets the first half of the names, so file order differs from tensor order.
    for i, part in enumerate([names[len(names) // 2:], names[:len(names) // 2]]):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(sharded, file), {n: tensors[n] for n in part})
        weight_map.update({n: file for n in part})
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.nbytes for _, t in tensors.values())}, "weight_map": weight_map}, f)
    stdout, data = import_hf(sharded, os.path.join(tmp, "sharded.bin"))
    with open(LLAMA_MODEL, "rb") as f:
        assert data == f.read(), "the sharded checkpoint imports to other bytes"
    assert "(2 shards)" in stdout, stdout
    print(f"sharded: {len(names)} tensors in 2 shards + index json import byte-identical")
    return sharded


def check_import_bad_uses(tmp, gpt2_dir, llama_dir, sharded):
    out = os.path.join(tmp, "bad.bin")
    refused = lambda hf_dir, expected, env=None: check_refused([hf_dir, out], expected, env=env, script=IMPORT)
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    n = iter(range(100))
    variant = lambda src=llama_dir, **kw: edited(src, os.path.join(bad, str(next(n))), **kw)
    empty = os.path.join(bad, "empty")
    os.makedirs(empty)
    refused(empty, f"'{empty}' has no config.json")
    refused(os.path.join(tmp, "nowhere"), "does not exist; expected a Hugging Face model directory")
    refused(variant(config={"architectures": ["BertForMaskedLM"]}),
            'architectures is ["BertForMaskedLM"]; import_hf.py reads GPT2LMHeadModel and LlamaForCausalLM')
    refused(variant(config={"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
            'rope_scaling is {"rope_type": "llama3", "factor": 8.0}; llmc computes only null')
    refused(variant(config={"attention_bias": True}), "attention_bias is true; llmc computes only false")
    refused(variant(config={"mlp_bias": True}), "mlp_bias is true; llmc computes only false")
    refused(variant(config={"hidden_act": "gelu"}), 'hidden_act is "gelu"; llmc computes only silu')
    refused(variant(config={"rms_norm_eps": 1e-6}), "rms_norm_eps is 1e-06; llmc computes only 1e-5")
    refused(variant(config={"rms_norm_eps": REMOVE}), "rms_norm_eps is 1e-06")  # LlamaConfig's default
    refused(variant(config={"head_dim": 32}), "head_dim is 32; llmc computes only hidden_size / num_attention_heads")
    refused(variant(config={"num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": REMOVE}),
            "(hidden_size 64 / num_attention_heads 64 = 1) is odd")
    refused(variant(config={"num_key_value_heads": 3}), "num_key_value_heads is 3")
    refused(variant(config={"intermediate_size": 128}),
            "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [160, 64]; config.json says [128, 64]")
    refused(variant(gpt2_dir, config={"tie_word_embeddings": False}), "tie_word_embeddings is false")
    tensors = read_safetensors(os.path.join(llama_dir, "model.safetensors"))
    refused(variant(tensors={k: t for k, t in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}),
            "has no tensor 'model.layers.1.mlp.up_proj.weight'; LlamaForCausalLM needs it (llmc's wgateup of layer 1)")
    extra = dict(tensors, **{"model.layers.0.self_attn.q_proj.bias": ("F32", np.zeros(64, np.float32))})
    refused(variant(tensors=extra), "no place for, e.g. 'model.layers.0.self_attn.q_proj.bias'")
    gpt2 = read_safetensors(os.path.join(gpt2_dir, "model.safetensors"))
    untied = dict(gpt2, **{"lm_head.weight": ("F32", gpt2["transformer.wte.weight"][1] * 2)})
    refused(variant(gpt2_dir, tensors=untied), "lm_head.weight differs from transformer.wte.weight")
    os.remove(os.path.join(sharded, "model-00002-of-00002.safetensors"))
    refused(sharded, "in 'model-00002-of-00002.safetensors', which")
    # A NaN in the last tensor written: refused mid-write, and the output is as it was (here: a file
    # that was there before), no temporary file left beside it.
    nan_head = tensors["lm_head.weight"][1].copy()
    nan_head[7, 3] = np.nan
    nan_dir = variant(tensors=dict(tensors, **{"lm_head.weight": ("F32", nan_head)}))
    out_dir = os.path.join(tmp, "kept")
    os.makedirs(out_dir)
    kept = os.path.join(out_dir, "model.bin")
    with open(kept, "wb") as f:
        f.write(b"the previous model")
    check_refused([nan_dir, kept], "tensor 'lm_head.weight' holds 1 non-finite value(s) (the first at flat index "
                  "451: nan)", script=IMPORT)
    with open(kept, "rb") as f:
        assert f.read() == b"the previous model" and os.listdir(out_dir) == ["model.bin"], os.listdir(out_dir)
    check_refused([llama_dir, out_dir], f"'{out_dir}' is a directory", script=IMPORT)
    fake = os.path.join(tmp, "no_numpy")  # made by check_bad_uses
    refused(llama_dir, "dev/import_hf.py needs numpy", env=dict(os.environ, PYTHONPATH=fake))
    print("import bad uses: each refused with one line and exit status 1; a failed write leaves the output as it was")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        gpt2_dir, gpt2_bf16_dir = check_gpt2_export(tmp)
        llama_dir, llama_bf16_dir = check_llama_export(tmp)
        check_round_trips(tmp, gpt2_dir, gpt2_bf16_dir, llama_dir, llama_bf16_dir)
        sharded = check_sharded(tmp, llama_dir)
        check_import_bad_uses(tmp, gpt2_dir, llama_dir, sharded)
    print("test_export_hf.py: OK")


if __name__ == "__main__":
    main()
