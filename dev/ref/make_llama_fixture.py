#!/usr/bin/env python3
"""Writes the Llama 3 layer fixture that test/test_llama_ops.cpp checks llmc/cpu/llama_ops.h against.

Each layer is written out plainly in PyTorch, as Hugging Face's LlamaForCausalLM computes it, and run
in float64 with autograd (inputs drawn in float32, exactly representable, then widened):
  RMSNorm    out = x * rsqrt(mean(x^2) + eps) * w                                     (LlamaRMSNorm)
  RoPE       q, k of every head: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] with
             x1, x2 the two halves of the head, angle(pos, i) = pos * theta^(-2i/HS) for i < HS/2
             (apply_rotary_pos_emb; the angles here in float64, where Hugging Face's are fp32)
  attention  causal softmax(q k^T / sqrt(HS)) v, kv head j repeated for query heads j*G .. j*G+G-1,
             G = NH / KVH (repeat_kv)
  SwiGLU MLP out = down(silu(gate(x)) * up(x)), no biases                                 (LlamaMLP)
The gradients are those of the loss sum(out * dout) for a random dout.

Output: test/fixtures/llama_ops.bin (or --out), little-endian, float32 unless said:
  int32[4]   magic 20261201, version 1, number of RoPE cases, number of attention cases
  RMSNorm:   int32[4] N, C, 0, 0; float32[4] eps, 0, 0, 0
             x[N*C], w[C], dout[N*C]; expected out[N*C], rstd[N], dx[N*C], dw[C]
  per RoPE case (W = (NH + 2 KVH) * HS, rows [q: NH*HS | k: KVH*HS | v: KVH*HS]):
             int32[8] B, T, NH, KVH, HS, has_positions, 0, 0; float32[4] theta, 0, 0, 0
             int32 positions[T] (0 .. T-1 when has_positions is 0)
             qkv[B*T*W], dout[B*T*W]; expected out[B*T*W], dqkv[B*T*W]
  per attention case (W as above):
             int32[8] B, T, NH, KVH, HS, 0, 0, 0
             qkv[B*T*W], dout[B*T*NH*HS]; expected out[B*T*NH*HS], att[B*NH*T*T] (0 above the
             diagonal), dqkv[B*T*W]
  SwiGLU MLP: int32[4] N, C, H, 0
             x[N*C], w_gate_up[2H*C] (gate's H rows, then up's), w_down[C*H], dout[N*C]
             expected gate_up[N*2H] (each row [gate: H | up: H]), h[N*H] (silu(gate) * up),
             out[N*C], dh[N*H], dgate_up[N*2H], dx[N*C], dw_gate_up[2H*C], dw_down[C*H]

Run with Debian's python (torch 1.13 CPU): /usr/bin/python3 dev/ref/make_llama_fixture.py
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

MAGIC, VERSION = 20261201, 1
EPS = 1e-5


def draw(rng, shape, std=1.0):
    return (rng.standard_normal(shape) * std).astype(np.float32)


def wide(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def f32(t):
    return t.detach().numpy().astype(np.float32)


def rmsnorm_case(rng, N, C):
    x, w, dout = draw(rng, (N, C)), 1.0 + draw(rng, (C,), 0.2), draw(rng, (N, C))
    tx, tw = wide(x), wide(w)
    rstd = torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + EPS)
    out = tx * rstd * tw
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    parts = [np.array([N, C, 0, 0], np.int32), np.array([EPS, 0, 0, 0], np.float32), x, w, dout,
             f32(out), f32(rstd.reshape(N)), f32(tx.grad), f32(tw.grad)]
    print(f"rmsnorm N {N} C {C}")
    return parts


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, positions, theta):
    """x: (B, T, heads, HS); positions: (T,) ints."""
    HS = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, HS, 2, dtype=torch.float64) / HS)
    freqs = torch.outer(torch.tensor(positions, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, HS)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def split_qkv(qkv, B, T, NH, KVH, HS):
    q = qkv[..., :NH * HS].reshape(B, T, NH, HS)
    k = qkv[..., NH * HS:(NH + KVH) * HS].reshape(B, T, KVH, HS)
    v = qkv[..., (NH + KVH) * HS:].reshape(B, T, KVH, HS)
    return q, k, v


def rope_case(rng, B, T, NH, KVH, HS, theta, positions=None):
    W = (NH + 2 * KVH) * HS
    qkv, dout = draw(rng, (B, T, W)), draw(rng, (B, T, W))
    pos = list(range(T)) if positions is None else positions
    tqkv = wide(qkv)
    q, k, v = split_qkv(tqkv, B, T, NH, KVH, HS)
    out = torch.cat((rope(q, pos, theta).reshape(B, T, -1), rope(k, pos, theta).reshape(B, T, -1),
                     v.reshape(B, T, -1)), dim=-1)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    print(f"rope B {B} T {T} NH {NH} KVH {KVH} HS {HS} theta {theta} positions {pos}")
    return [np.array([B, T, NH, KVH, HS, positions is not None, 0, 0], np.int32),
            np.array([theta, 0, 0, 0], np.float32), np.array(pos, np.int32), qkv, dout, f32(out), f32(tqkv.grad)]


def attention_case(rng, B, T, NH, KVH, HS):
    W, G = (NH + 2 * KVH) * HS, NH // KVH
    qkv, dout = draw(rng, (B, T, W)), draw(rng, (B, T, NH * HS))
    tqkv = wide(qkv)
    q, k, v = (x.transpose(1, 2) for x in split_qkv(tqkv, B, T, NH, KVH, HS))  # (B, heads, T, HS)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(HS)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    out = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    print(f"attention B {B} T {T} NH {NH} KVH {KVH} HS {HS}")
    return [np.array([B, T, NH, KVH, HS, 0, 0, 0], np.int32), qkv, dout, f32(out), f32(att), f32(tqkv.grad)]


def swiglu_mlp_case(rng, N, C, H):
    x, dout = draw(rng, (N, C)), draw(rng, (N, C))
    w_gate, w_up, w_down = draw(rng, (H, C), 0.3), draw(rng, (H, C), 0.3), draw(rng, (C, H), 0.2)
    tx, tgate, tup, tdown = wide(x), wide(w_gate), wide(w_up), wide(w_down)
    gate, up = tx @ tgate.T, tx @ tup.T
    gate.retain_grad(), up.retain_grad()
    h = F.silu(gate) * up
    h.retain_grad()
    out = h @ tdown.T
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    print(f"swiglu mlp N {N} C {C} H {H}")
    cat = np.concatenate
    return [np.array([N, C, H, 0], np.int32), x, cat((w_gate, w_up)), w_down, dout,
            cat((f32(gate), f32(up)), axis=1), f32(h), f32(out), f32(h.grad),
            cat((f32(gate.grad), f32(up.grad)), axis=1), f32(tx.grad), cat((f32(tgate.grad), f32(tup.grad))), f32(tdown.grad)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../test/fixtures/llama_ops.bin"))
    args = parser.parse_args()
    rng = np.random.default_rng(20261201)
    rmsnorm = rmsnorm_case(rng, 10, 64)
    ropes = [
        rope_case(rng, 2, 5, 4, 2, 16, 500000.0),                                 # positions 0 .. T-1
        rope_case(rng, 2, 5, 4, 1, 16, 10000.0, [7, 100, 4095, 65536, 131071]),   # global (context-parallel) positions
    ]
    attentions = [attention_case(rng, 2, 6, 4, kvh, 16) for kvh in (4, 2, 1)]
    mlp = swiglu_mlp_case(rng, 10, 32, 64)
    parts = [np.array([MAGIC, VERSION, len(ropes), len(attentions)], np.int32), *rmsnorm]
    for case in ropes + attentions:
        parts += case
    parts += mlp
    with open(args.out, "wb") as f:
        for p in parts:
            f.write(np.ascontiguousarray(p).astype(p.dtype.newbyteorder("<")).tobytes())
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
