#!/usr/bin/env python3
"""Writes the Llama model fixtures that test/test_llama_cpu.cpp checks llmc's CPU model against.

A tiny Llama 3 (max_seq_len 32, vocab 500 padded to 512, 2 layers, 4 query heads sharing 2 key/value
heads, 64 channels, a SwiGLU MLP 160 wide, RoPE base 10000) is written out plainly in PyTorch, as
Hugging Face's LlamaForCausalLM computes it, and run in float64 (weights drawn in fp32, exactly
representable in the model file, then widened):
  x = wte[token]; per block: x += wo(attention(rope(q), rope(k), v)) of rmsnorm(x) and
  x += wdown(silu(gate(h)) * up(h)), h = rmsnorm(x); logits = lm_head(rmsnorm(x)) (untied)
  RMSNorm    x * rsqrt(mean(x^2) + 1e-5) * w
  RoPE       rotate-half: each head's halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), angle
             pos * theta^(-2i/HS) for channel pair (i, i + HS/2)
  attention  causal, kv head j serving query heads j*G .. j*G+G-1 (G = heads / kv heads)
Nothing here is llmc's code: it is the oracle the C++ model must reproduce.

Outputs, in test/fixtures/ (or --out-dir):
  llama_tiny_model.bin  llmc model file, version 203 (fp32, Llama): header[2..7] as GPT-2's, header[12..14]
                        kv_heads, ffn_hidden, rope_theta's float bits; tensors wte attn_norm wq wkv wo
                        mlp_norm wgateup wdown norm_f lm_head, each over its layers, wte and lm_head
                        padded with zero rows to 512.
  llama_tiny_state.bin  make_fixture.py's state layout (magic 20241121, version 1): the batch, the
                        logits, the loss, every gradient in file order, and the losses of STEPS AdamW
                        steps with global grad-norm clipping on the same batch.

Run with Debian's python (torch 1.13 CPU): /usr/bin/python3 dev/ref/make_llama_model_fixture.py
"""
import argparse
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

from make_fixture import header, state_bytes, write_files  # the files' layout, shared with GPT-2's

MODEL_MAGIC, MODEL_VERSION = 20240326, 203

MAX_SEQ_LEN, VOCAB, PADDED_VOCAB, LAYERS, HEADS, KV_HEADS, CHANNELS, FFN = 32, 500, 512, 2, 4, 2, 64, 160
ROPE_THETA = 10000.0
B, T, STEPS = 4, 16, 10
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.9
# The gradient norm starts above GRAD_CLIP and falls below it: both branches of clipping run.
WEIGHT_STD, NORM_GAIN = 0.1, 0.4

HS = CHANNELS // HEADS
# Tensor names in the model file's order, and which AdamW decays.
PARAM_NAMES = ["wte", "attn_norm", "wq", "wkv", "wo", "mlp_norm", "wgateup", "wdown", "norm_f", "lm_head"]
DECAYED = {"wte", "wq", "wkv", "wo", "wgateup", "wdown", "lm_head"}


def make_params(seed):
    g = torch.Generator().manual_seed(seed)
    L, C, V, Q, KV = LAYERS, CHANNELS, VOCAB, HEADS * HS, KV_HEADS * HS

    def normal(shape, std, mean=0.0):  # in fp32, so the widened value is exact in the file
        return (torch.randn(shape, generator=g, dtype=torch.float32) * std + mean).double()

    residual_std = WEIGHT_STD / math.sqrt(2 * L)
    shapes = {
        "wte": ((V, C), WEIGHT_STD), "attn_norm": ((L, C), None), "wq": ((L, Q, C), WEIGHT_STD),
        "wkv": ((L, 2 * KV, C), WEIGHT_STD), "wo": ((L, C, Q), residual_std), "mlp_norm": ((L, C), None),
        "wgateup": ((L, 2 * FFN, C), WEIGHT_STD), "wdown": ((L, C, FFN), residual_std),
        "norm_f": ((C,), None), "lm_head": ((V, C), WEIGHT_STD),
    }
    params = {}
    for name in PARAM_NAMES:
        shape, std = shapes[name]
        # gains random around NORM_GAIN (None), so a wrong gain gradient cannot hide behind 1
        value = normal(shape, 0.1 * NORM_GAIN, NORM_GAIN) if std is None else normal(shape, std)
        params[name] = value.requires_grad_(True)
    return params


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rotary(x, positions):
    """x: (B, heads, T, HS), rotated pair (i, i + HS/2) by positions * theta^(-2i/HS)."""
    half = HS // 2
    inv_freq = ROPE_THETA ** (-torch.arange(0, half, dtype=torch.float64) * 2 / HS)
    angle = positions.double()[:, None] * inv_freq[None, :]  # (T, half)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(p, inputs, targets):
    Bn, Tn = inputs.shape
    C, NH, KVH = CHANNELS, HEADS, KV_HEADS
    group = NH // KVH
    positions = torch.arange(Tn)
    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    x = p["wte"][inputs]
    for l in range(LAYERS):
        h = rms_norm(x, p["attn_norm"][l])
        q = (h @ p["wq"][l].t()).view(Bn, Tn, NH, HS).transpose(1, 2)
        k, v = (h @ p["wkv"][l].t()).split(KVH * HS, dim=-1)
        k, v = (t.view(Bn, Tn, KVH, HS).transpose(1, 2) for t in (k, v))
        q, k = rotary(q, positions), rotary(k, positions)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        y = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        x = x + y.transpose(1, 2).reshape(Bn, Tn, NH * HS) @ p["wo"][l].t()
        h = rms_norm(x, p["mlp_norm"][l])
        gate, up = (h @ p["wgateup"][l].t()).split(FFN, dim=-1)
        x = x + (F.silu(gate) * up) @ p["wdown"][l].t()
    logits = rms_norm(x, p["norm_f"]) @ p["lm_head"].t()
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    return logits, loss


def flat_fp32(tensors):
    """Parameters (or gradients) as one fp32 array in model file order, vocabulary rows padded with 0."""
    parts = []
    for name in PARAM_NAMES:
        t = tensors[name].detach()
        if name in ("wte", "lm_head"):
            t = torch.cat([t, torch.zeros(PADDED_VOCAB - VOCAB, CHANNELS, dtype=t.dtype)])
        parts.append(t.reshape(-1).numpy().astype(np.float32))
    return np.concatenate(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="test/fixtures")
    ap.add_argument("--seed", type=int, default=1338)
    args = ap.parse_args()

    params = make_params(args.seed)
    tokens = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(args.seed + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    theta_bits = struct.unpack("<i", struct.pack("<f", ROPE_THETA))[0]
    fields = [MODEL_MAGIC, MODEL_VERSION, MAX_SEQ_LEN, VOCAB, LAYERS, HEADS, CHANNELS, PADDED_VOCAB,
              0, 0, 0, 0, KV_HEADS, FFN, theta_bits]
    model_bytes = header(fields).tobytes() + flat_fp32(params).tobytes()

    logits, loss = forward(params, inputs, targets)
    loss.backward()
    logits0 = logits.detach().numpy().astype(np.float32)
    loss0 = float(loss)
    grads0 = flat_fp32({n: p.grad for n, p in params.items()})

    ordered = [params[n] for n in PARAM_NAMES]
    opt = torch.optim.AdamW(
        [{"params": [params[n] for n in PARAM_NAMES if n in DECAYED], "weight_decay": WEIGHT_DECAY},
         {"params": [params[n] for n in PARAM_NAMES if n not in DECAYED], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        _, loss = forward(params, inputs, targets)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(ordered, max_norm=GRAD_CLIP))
        losses.append(float(loss))
        print(f"step {step}: loss {float(loss):.6f} grad norm {norm:.4f}{' (clipped)' if norm > GRAD_CLIP else ''}")
        opt.step()

    state = state_bytes(B, T, [LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP, 0, 0], inputs, targets, logits0,
                        loss0, grads0, losses)
    write_files(args.out_dir, [("llama_tiny_model.bin", model_bytes), ("llama_tiny_state.bin", state)])


if __name__ == "__main__":
    main()
