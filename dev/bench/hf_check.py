#!/usr/bin/env python3
"""hf_check.py: Hugging Face transformers loads dev/export_hf.py's export of llmc model files, and its
logits are those of test/test_export_hf.py's independent float64 forward pass over the same export
(which that test holds to llmc's CPU model's logits). Run where transformers is installed (the GPU
session's machine; not a dependency of llmc's tests).

    python3 dev/bench/hf_check.py MODEL.bin [MODEL.bin ...] [--limit 1e-4] [--device cuda]

For each model file (GPT-2 or Llama, fp32 or bf16): export it to a temporary directory,
AutoModelForCausalLM.from_pretrained it in float32, run 2 sequences of min(64, max_seq_len) random
tokens, and compare the logits over the real vocabulary with the float64 reference: the largest
difference over the largest |logit| must be at most --limit. Prints one line per model; exit status
0 when every model passes, 1 when one does not, 3 when transformers is not installed.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test"))
import test_export_hf as ref  # noqa: E402  (the float64 forward passes and the safetensors reader)


def check(model_file, limit, device, torch, auto_model):
    with tempfile.TemporaryDirectory() as tmp:
        config, tensors = ref.export(model_file, tmp)
        llama = config["model_type"] == "llama"
        vocab = config["vocab_size"]
        T = min(64, config["max_position_embeddings"] if llama else config["n_positions"])
        inputs = np.random.default_rng(0).integers(0, vocab, size=(2, T))
        expected = (ref.hf_llama_logits if llama else ref.hf_gpt2_logits)(tensors, config, inputs)[..., :vocab]
        model = auto_model.from_pretrained(tmp, torch_dtype=torch.float32).to(device).eval()
        with torch.no_grad():
            got = model(torch.tensor(inputs, device=device)).logits.double().cpu().numpy()[..., :vocab]
    diff = float(np.abs(got - expected).max() / np.abs(expected).max())
    ok = diff <= limit
    print(f"{'ok' if ok else 'FAIL'} {model_file}: transformers' {type(model).__name__} gives the float64 "
          f"reference's logits within {diff:.2g} of the largest (limit {limit:g}; {T} tokens x 2)")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="llmc model files (.bin)")
    p.add_argument("--limit", type=float, default=1e-4)
    p.add_argument("--device", default=None, help="cuda where available, else cpu")
    args = p.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(f"hf_check.py: transformers (and torch) not installed here ({e}): nothing to check")
        return 3
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products, for a 1e-4 comparison
    results = []
    for m in args.models:
        if not os.path.isfile(m):
            print(f"hf_check.py: {m}: no such model file")
            return 1
        results.append(check(m, args.limit, device, torch, AutoModelForCausalLM))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
