"""test_export_hf.py: dev/export_hf.py's output, read back without its code, gives llmc's logits.

The fixture model (test/fixtures/gpt2_tiny_model.bin, fp32, vocab 500 padded to 512) is exported;
an independent safetensors reader (below: the length, the JSON header, the raw bytes) loads it, and
GPT-2 is computed from the Hugging Face tensors as GPT2LMHeadModel does (Conv1D: y = x W + b with W
stored [in, out]; tied lm head; gelu_new; LayerNorm eps 1e-5) in float64 with numpy (PyTorch is not
a dependency of llmc's tests; on a GPU session transformers itself can load the export, see README). The logits must match,
to 1e-5, the fixture's logits, which are the ones llmc's CPU model is held to (test_gpt2_cpu.cpp
checks the model against this very file). A bf16 (version 5) file of the same model exports to
BF16 tensors holding exactly its bits. Bad uses (no numpy, a directory or a truncated file as the
model, a file as the output directory) end with one line naming the problem and exit status 1, no
traceback. Run: /usr/bin/python3 test/test_export_hf.py (make test).
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "test/fixtures/gpt2_tiny_model.bin")
STATE = os.path.join(ROOT, "test/fixtures/gpt2_tiny_state.bin")


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
        raw = np.frombuffer(data[begin:end], dtype={"F32": np.float32, "BF16": np.uint16}[info["dtype"]])
        tensors[name] = (info["dtype"], raw.reshape(info["shape"]))
    return tensors


def as_float64(dtype, raw):
    if dtype == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float64)


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


def export(model, out):
    subprocess.run([sys.executable, os.path.join(ROOT, "dev/export_hf.py"), model, out], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f), read_safetensors(os.path.join(out, "model.safetensors"))


def check_refused(args, expected, env=None):
    """dev/export_hf.py with `args` exits 1 with one line on stderr holding `expected`."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "dev/export_hf.py")] + args, capture_output=True,
                         text=True, env=env)
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


def main():
    with open(STATE, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        B, T = int(header[2]), int(header[3])
        f.read(32)
        inputs = np.frombuffer(f.read(B * T * 4), dtype=np.int32).reshape(B, T)
        f.read(B * T * 4)
        with open(MODEL, "rb") as m:
            V = int(np.frombuffer(m.read(16), dtype=np.int32)[3])
        llmc_logits = np.frombuffer(f.read(B * T * V * 4), dtype=np.float32).reshape(B, T, V)

    with tempfile.TemporaryDirectory() as tmp:
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
        with open(MODEL, "rb") as m:
            head = bytearray(m.read(1024))
            params = np.frombuffer(m.read(), dtype=np.float32)
        struct.pack_into("<i", head, 4, 5)
        bits = params.view(np.uint32)
        bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        bf16_model = os.path.join(tmp, "model_bf16.bin")
        with open(bf16_model, "wb") as m:
            m.write(bytes(head) + bf16.tobytes())
        config16, tensors16 = export(bf16_model, os.path.join(tmp, "bf16"))
        assert config16["torch_dtype"] == "bfloat16"
        for name, (dtype32, t32) in tensors.items():
            dtype16, t16 = tensors16[name]
            b = t32.astype(np.float32).view(np.uint32)
            expected = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
            assert dtype16 == "BF16" and np.array_equal(t16, expected), name
        logits16 = hf_gpt2_logits(tensors16, config16, inputs)
        err16 = float(np.abs(logits16 - llmc_logits).max())
        print(f"bf16 export: every tensor holds the file's bf16 bits; logits within {err16:.2e} of fp32's")
        assert err16 < 0.5
        check_bad_uses(tmp)
    print("test_export_hf.py: OK")


if __name__ == "__main__":
    main()
