#!/usr/bin/env python3
"""PyTorch GPT-2 (or Llama) training-throughput baseline, for comparison with llmc.

Measures tokens/s, step time, MFU and peak GPU memory of GPT-2 training steps in plain PyTorch:
fp32 params + bf16 autocast, SDPA causal attention (flash), fused AdamW, torch.compile, random
token batches already on the GPU (no data loading). Each timed step is forward, cross-entropy
loss, backward, clip_grad_norm_(1.0), optimizer step, zero_grad(set_to_none=True).
Warm-up steps (compilation included) are not timed. For measurement only.
--arch llama makes the preset a Llama as llmc's --arch llama does (llmc/models/llama/config.h):
RMSNorm, rotate-half RoPE (base 500000), kv heads = the largest divisor of the heads at most a
quarter of them, SwiGLU 8C/3 rounded up to 256, no biases, an untied head; the kv heads are
repeated for SDPA (as Hugging Face's LlamaForCausalLM does).

Run from the repo root, e.g.:
  python3 dev/bench/torch_gpt2.py --model d12 -t 1024 --find-max-batch
  python3 dev/bench/torch_gpt2.py --model d48 -b 8 --checkpoint
CPU smoke test (no GPU needed):
  python3 dev/bench/torch_gpt2.py --model tiny -b 2 -t 32 --steps 2 --warmup 1 --no-compile --device cpu
  python3 dev/bench/torch_gpt2.py --arch llama --model tiny -b 2 -t 32 --steps 2 --warmup 1 --no-compile --device cpu
"""
import argparse
import gc
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

# name: (layers, channels, heads), as llmc's presets (llmc/models/gpt2/config.h); "tiny" is for CPU smoke runs.
PRESETS = {"tiny": (2, 64, 2), "d4": (4, 256, 4), "d6": (6, 384, 6), "d12": (12, 768, 12),
           "d24": (24, 1024, 16), "d36": (36, 1280, 20), "d48": (48, 1600, 25)}
VOCAB, PADDED_VOCAB = 50257, 50304
MAX_BATCH_TRIES = [64, 48, 32, 24, 16, 12, 8, 4, 2, 1]


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (CPU smoke runs only)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, NH, max_T, checkpoint=False):
        super().__init__()
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(PADDED_VOCAB, C)
        self.wpe = nn.Embedding(max_T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, PADDED_VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():  # GPT-2 init
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            if self.checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)  # torch < 2.0 (CPU smoke runs only)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def llama_kv_heads(heads):  # llmc/models/llama/config.h
    for kv in range(heads // 4, 1, -1):
        if heads % kv == 0:
            return kv
    return 1


def llama_ffn_hidden(channels):
    return (8 * channels // 3 + 255) // 256 * 256


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate_half(x):
    h = x.size(-1) // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, KV, F_hidden):
        super().__init__()
        self.nh, self.kv, self.hs = NH, KV, C // NH
        self.attn_norm = RMSNorm(C)
        self.wq = nn.Linear(C, C, bias=False)
        self.wkv = nn.Linear(C, 2 * KV * self.hs, bias=False)
        self.wo = nn.Linear(C, C, bias=False)
        self.mlp_norm = RMSNorm(C)
        self.wgateup = nn.Linear(C, 2 * F_hidden, bias=False)
        self.wdown = nn.Linear(F_hidden, C, bias=False)

    def attn(self, x, cos, sin):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.nh, self.hs).transpose(1, 2)
        k, v = (t.view(B, T, self.kv, self.hs).transpose(1, 2) for t in self.wkv(x).split(self.kv * self.hs, dim=2))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.nh // self.kv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return self.wo(causal_attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        gate, up = self.wgateup(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.wdown(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, C, NH, max_T, checkpoint=False, theta=500000.0):
        super().__init__()
        self.checkpoint = checkpoint
        self.embed = nn.Embedding(PADDED_VOCAB, C)
        self.blocks = nn.ModuleList(LlamaBlock(C, NH, llama_kv_heads(NH), llama_ffn_hidden(C)) for _ in range(L))
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, PADDED_VOCAB, bias=False)
        hs = C // NH
        inv = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        angles = torch.outer(torch.arange(max_T, dtype=torch.float64), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("wo.weight", "wdown.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.embed(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for block in self.blocks:
            if self.checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def default_peak_tflops(device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if ("H100" in name or "H200" in name) and "PCIe" not in name and "NVL" not in name:
        return 989.0
    if "A100" in name:
        return 312.0
    raise SystemExit(f"unknown GPU '{name}': pass --peak-tflops (dense bf16 peak, TFLOP/s)")


def setup(args, device, B):
    """Builds model, optimizer and a train-step function for batch size B."""
    L, C, NH = PRESETS[args.model]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if args.arch == "llama":  # what llmc counts: every parameter but the looked-up embedding
        model = Llama(L, C, NH, args.seq_len, checkpoint=args.checkpoint).to(device)
        n_params = sum(p.numel() for p in model.parameters()) - model.embed.weight.numel()
    else:
        model = GPT2(L, C, NH, args.seq_len, checkpoint=args.checkpoint).to(device)
        n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    extra = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), **extra)
    fwd = torch.compile(model) if args.compile else model

    def step():
        x = torch.randint(0, VOCAB, (B, args.seq_len), device=device)
        y = torch.randint(0, VOCAB, (B, args.seq_len), device=device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, opt, step, n_params


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fits(args, device, B, compile):
    """setup() at batch size B and two steps, or None where that runs out of GPU memory. The second
    step is the first with the optimizer state allocated during forward/backward: the real peak."""
    trial = argparse.Namespace(**{**vars(args), "compile": compile})
    s = None
    try:
        s = setup(trial, device, B)
        for _ in range(2):
            s[2]()
        sync(device)
        return s
    except torch.cuda.OutOfMemoryError:
        pass
    s = None  # drop everything from the failed try (outside the except, so no traceback holds it)
    if compile:
        torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return None


def find_max_batch(args, device):
    """Largest B in MAX_BATCH_TRIES that fits. The search runs eagerly: a try that runs out of memory
    then costs seconds, where a compiled one would compile again (a minute or more each, which once
    ran a session's call out of time). Compiled code usually needs no more memory than eager (fusion
    drops intermediates), so the model is compiled once, at the B found; should that still run out of
    memory, the next smaller B is compiled."""
    found = None
    for i, B in enumerate(MAX_BATCH_TRIES):
        s = fits(args, device, B, compile=False)
        print(f"find-max-batch: B={B} {'fits' if s else 'out of memory'} (eager)", flush=True)
        if s:
            found = i
            break
    if found is None:
        raise SystemExit("find-max-batch: even B=1 does not fit")
    if not args.compile:
        return MAX_BATCH_TRIES[found], s
    s = None
    gc.collect()
    torch.cuda.empty_cache()
    for B in MAX_BATCH_TRIES[found:]:
        s = fits(args, device, B, compile=True)
        print(f"find-max-batch: B={B} {'fits' if s else 'out of memory'} (compiled)", flush=True)
        if s:
            return B, s
    raise SystemExit("find-max-batch: even B=1 does not fit compiled")


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="MFU = tokens/s * FLOPs_per_token / (peak_tflops * 1e12), with "
               "FLOPs_per_token = 6*N + 6*L*C*T, where N = parameter count excluding the position embedding "
               "(lm head tied to the token embedding, counted once) and 6*L*C*T = causal attention's QK^T and PV "
               "matmuls, forward+backward (12*L*C*T), halved for the causal mask. "
               "The JSON line's mfu is a fraction (0.451 = 45.1%).")
    p.add_argument("--model", default="d12", choices=list(PRESETS))
    p.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"], help="the preset's family, as llmc's --arch")
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-t", "--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation included)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    p.add_argument("--find-max-batch", action="store_true",
                   help="use the largest B in " + ",".join(map(str, MAX_BATCH_TRIES)) + " that fits")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak of the GPU; default 989 for H100/H200 SXM, 312 for A100")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu for a smoke run")
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch_gpt2.py: no GPU (torch.cuda.is_available() is False): nothing to measure")
        raise SystemExit(3)
    if args.compile and not hasattr(torch, "compile"):
        raise SystemExit("this torch has no torch.compile: pass --no-compile")
    peak = args.peak_tflops if args.peak_tflops is not None else default_peak_tflops(device)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    if args.find_max_batch:
        if device.type != "cuda":
            raise SystemExit("--find-max-batch needs --device cuda")
        B, (model, opt, step, n_params) = find_max_batch(args, device)
        warmup = max(args.warmup - 2, 0)  # fits() already ran two steps
    else:
        B = args.batch_size
        model, opt, step, n_params = setup(args, device, B)
        warmup = args.warmup
    T = args.seq_len

    for _ in range(warmup):
        loss = step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync(device)
    elapsed = time.perf_counter() - t0

    L, C, NH = PRESETS[args.model]
    step_ms = 1000.0 * elapsed / args.steps
    tokens_per_s = B * T * args.steps / elapsed
    flops_per_token = 6 * n_params + 6 * L * C * T
    mfu = tokens_per_s * flops_per_token / (peak * 1e12) if peak else None
    peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None

    mfu_s = f"MFU {100 * mfu:.1f}% (peak {peak:g} TFLOP/s)" if mfu is not None else "MFU n/a"
    mem_s = f"peak mem {peak_mem_gib:.1f} GiB" if peak_mem_gib is not None else "peak mem n/a"
    print(f"torch {args.model} ({args.arch}) B={B} T={T} compile={int(args.compile)} ckpt={int(args.checkpoint)}: "
          f"{tokens_per_s:.0f} tok/s, step {step_ms:.1f} ms, {mfu_s}, {mem_s} (last loss {loss.item():.4f})")
    print(json.dumps({
        "impl": "torch", "model": args.model, "arch": args.arch, "B": B, "T": T, "compile": int(args.compile),
        "ckpt": int(args.checkpoint), "steps": args.steps, "tokens_per_s": round(tokens_per_s, 1),
        "step_ms": round(step_ms, 3), "mfu": round(mfu, 4) if mfu is not None else None, "peak_tflops": peak,
        "peak_mem_gib": round(peak_mem_gib, 3) if peak_mem_gib is not None else None,
        "params": n_params, "flops_per_token": flops_per_token,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__}))


if __name__ == "__main__":
    main()
