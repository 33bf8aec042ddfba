#!/usr/bin/env python3
"""Writes the GPT-2 reference fixtures that test/test_gpt2_cpu.cpp checks the C++ model against.

A tiny GPT-2 (max_seq_len 32, vocab 500 padded to 512, 2 layers, 4 heads, 64 channels) is written
out plainly in PyTorch and run in float64, so the oracle is accurate far beyond fp32: the weights
are drawn in fp32 (exactly representable in the model file) and only then widened.

Outputs, in test/fixtures/ (or --out-dir):
  gpt2_tiny_model.bin  llm.c model file, version 3 (fp32), wte padded with zero rows to 512.
  gpt2_tiny_state.bin  int32[256] header: magic 20241121, version 1, B, T, n_steps;
                       float32[8]: lr, beta1, beta2, eps, weight_decay, grad_clip, 0, 0;
                       int32 inputs[B*T], int32 targets[B*T], float32 logits[B*T*V] (unpadded),
                       float32 loss, float32 grads[num_params] (ParamLayout order, padded rows 0),
                       float32 losses[n_steps]: the loss before each of n_steps AdamW updates on
                       the same batch, with global grad-norm clipping.

With --moe, the same model as a mixture of experts (cpu/moe.h; make_moe_fixture.py's layer):
layer 1 of 2 has 4 experts, top 2, dropless, in place of its MLP (moe_every 2, no shared expert),
and the training loss adds MOE_BALANCE_COEF x balance + MOE_Z_COEF x z; written to
gpt2_moe_tiny_model.bin (version 103: header[8..11] = experts, top-k, every, shared; the experts'
tensors after GPT-2's, fcw..fcprojb for layer 0 only) and gpt2_moe_tiny_state.bin (the same
layout, float32[8] ends with the two coefficients; logits and loss are the cross-entropy's).

Run with Debian's python (torch 1.13 CPU): /usr/bin/python3 dev/ref/make_fixture.py [--moe]
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from make_moe_fixture import route

MODEL_MAGIC, MODEL_VERSION = 20240326, 3
STATE_MAGIC, STATE_VERSION = 20241121, 1

MAX_SEQ_LEN, VOCAB, PADDED_VOCAB, LAYERS, HEADS, CHANNELS = 32, 500, 512, 2, 4, 64
B, T, STEPS = 4, 16, 10
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0
# Init scales chosen (see the printed norms) so that the gradient norm exceeds GRAD_CLIP on the
# first two steps and falls below it afterwards: both branches of clipping are exercised. Small
# LayerNorm gains shrink the gradients, the wider weights make the loss fall quickly.
WEIGHT_STD = 0.1
LN_GAIN = 0.4

EXPERTS, TOP_K, MOE_EVERY, MOE_BALANCE_COEF, MOE_Z_COEF = 4, 2, 2, 0.1, 0.01
MOE_NAMES = ["routerw", "efcw", "efcb", "efcprojw", "efcprojb"]
DENSE_MLP = {"fcw", "fcb", "fcprojw", "fcprojb"}


def moe_layers(moe):
    """Indices of the layers with experts (the last of each MOE_EVERY)."""
    return [l for l in range(LAYERS) if moe and l % MOE_EVERY == MOE_EVERY - 1]


# Tensor names in llm.c's (ParamLayout's) order.
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def make_params(seed, moe=False):
    """Random float64 parameters (fp32-representable), stacked over the layers that have them, like
    the model file."""
    g = torch.Generator().manual_seed(seed)
    L, C, V, maxT = LAYERS, CHANNELS, VOCAB, MAX_SEQ_LEN

    def normal(shape, std, mean=0.0):  # computed in fp32, so the widened value is exact in the file
        return (torch.randn(shape, generator=g, dtype=torch.float32) * std + mean).double()

    # Biases and LayerNorm parameters are random too (not 0 and 1), so that a wrong bias or gain
    # gradient cannot hide behind a trivial value.
    residual_std = WEIGHT_STD / math.sqrt(2 * L)
    shapes = {
        "wte": ((V, C), WEIGHT_STD), "wpe": ((maxT, C), WEIGHT_STD),
        "ln1w": ((L, C), None), "ln1b": ((L, C), 0.02),
        "qkvw": ((L, 3 * C, C), WEIGHT_STD), "qkvb": ((L, 3 * C), 0.02),
        "attprojw": ((L, C, C), residual_std), "attprojb": ((L, C), 0.02),
        "ln2w": ((L, C), None), "ln2b": ((L, C), 0.02),
        "fcw": ((L, 4 * C, C), WEIGHT_STD), "fcb": ((L, 4 * C), 0.02),
        "fcprojw": ((L, C, 4 * C), residual_std), "fcprojb": ((L, C), 0.02),
        "lnfw": ((C,), None), "lnfb": ((C,), 0.02),
    }
    dense, experts, E = LAYERS - len(moe_layers(moe)), len(moe_layers(moe)), EXPERTS
    for name in DENSE_MLP:
        shape, std = shapes[name]
        shapes[name] = ((dense,) + shape[1:], std)
    shapes.update({
        "routerw": ((experts, E, C), WEIGHT_STD), "efcw": ((experts, E, 4 * C, C), WEIGHT_STD),
        "efcb": ((experts, E, 4 * C), 0.02), "efcprojw": ((experts, E, C, 4 * C), residual_std),
        "efcprojb": ((experts, E, C), 0.02),
    })
    params = {}
    for name in PARAM_NAMES + (MOE_NAMES if moe else []):
        shape, std = shapes[name]
        value = normal(shape, 0.1 * LN_GAIN, LN_GAIN) if std is None else normal(shape, std)  # None: a gain
        params[name] = value.requires_grad_(True)
    return params


def moe_mlp(h, p, i):
    """The experts of MoE layer i (0-based among the MoE layers) on rows h: (out, balance, z)."""
    rows, C = h.shape
    scores = h @ p["routerw"][i].t()
    probs = torch.softmax(scores, dim=1)
    lse = torch.logsumexp(scores, dim=1)
    experts, kept = route(probs.detach().numpy(), TOP_K, EXPERTS, 0.0)
    out = torch.zeros(rows, C, dtype=h.dtype)
    for e in range(EXPERTS):
        idx = [n for n in range(rows) for k in range(TOP_K) if experts[n, k] == e and kept[n, k]]
        if not idx:
            continue
        idx = torch.tensor(idx)
        y = gelu_tanh(h[idx] @ p["efcw"][i][e].t() + p["efcb"][i][e])
        y = y @ p["efcprojw"][i][e].t() + p["efcprojb"][i][e]
        out = out.index_add(0, idx, probs[idx, e].unsqueeze(1) * y)
    chosen = np.bincount(experts.reshape(-1), minlength=EXPERTS) / (rows * TOP_K)
    balance = EXPERTS * (torch.tensor(chosen, dtype=h.dtype) * probs.mean(dim=0)).sum()
    return out, balance, (lse ** 2).mean()


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, inputs, targets, moe=False):
    """Returns (logits over the real vocabulary, mean cross-entropy, the training loss: with experts
    the cross-entropy plus the weighted auxiliary losses)."""
    Bn, Tn = inputs.shape
    C, NH = CHANNELS, HEADS
    hs = C // NH
    x = p["wte"][inputs] + p["wpe"][:Tn]
    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    aux = 0.0
    for l in range(LAYERS):
        h = layer_norm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = F.linear(h, p["qkvw"][l], p["qkvb"][l])
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(Bn, Tn, NH, hs).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        scores = scores.masked_fill(~causal, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        y = y.transpose(1, 2).reshape(Bn, Tn, C)
        x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        h = layer_norm(x, p["ln2w"][l], p["ln2b"][l])
        if l in moe_layers(moe):
            out, balance, z = moe_mlp(h.reshape(Bn * Tn, C), p, moe_layers(moe).index(l))
            x = x + out.view(Bn, Tn, C)
            aux = aux + MOE_BALANCE_COEF * balance + MOE_Z_COEF * z
            continue
        d = [m for m in range(LAYERS) if m not in moe_layers(moe)].index(l)  # among the dense layers
        h = gelu_tanh(F.linear(h, p["fcw"][d], p["fcb"][d]))
        x = x + F.linear(h, p["fcprojw"][d], p["fcprojb"][d])
    x = layer_norm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].t()  # tied lm head
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    return logits, loss, loss + aux


def flat_fp32(tensors):
    """Parameters (or gradients) as one fp32 array in model file order, wte padded with zero rows."""
    parts = []
    for name in PARAM_NAMES + [n for n in MOE_NAMES if n in tensors]:
        t = tensors[name].detach()
        if name == "wte":
            t = torch.cat([t, torch.zeros(PADDED_VOCAB - VOCAB, CHANNELS, dtype=t.dtype)])
        parts.append(t.reshape(-1).numpy().astype(np.float32))
    return np.concatenate(parts)


def header(values):
    h = np.zeros(256, dtype=np.int32)
    h[: len(values)] = values
    return h


def state_bytes(B, T, hyper, inputs, targets, logits, loss, grads, losses):
    """The state file (the layout in the docstring): the batch, the first forward and backward, and the
    losses of the AdamW steps; hyper is the 8 floats after the header."""
    return b"".join([
        header([STATE_MAGIC, STATE_VERSION, B, T, len(losses)]).tobytes(),
        np.array(hyper, dtype=np.float32).tobytes(),
        inputs.numpy().astype(np.int32).tobytes(),
        targets.numpy().astype(np.int32).tobytes(),
        logits.tobytes(),
        np.array([loss], dtype=np.float32).tobytes(),
        grads.tobytes(),
        np.array(losses, dtype=np.float32).tobytes(),
    ])


def write_files(out_dir, files):
    """Each (name, bytes) into out_dir, whole or not at all (a temporary file renamed)."""
    os.makedirs(out_dir, exist_ok=True)
    for name, data in files:
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        print(f"wrote {path} ({len(data)} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="test/fixtures")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--moe", action="store_true", help="the mixture-of-experts fixture")
    args = ap.parse_args()
    moe = args.moe

    params = make_params(args.seed, moe)
    names = PARAM_NAMES + (MOE_NAMES if moe else [])
    tokens = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(args.seed + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    fields = [MODEL_MAGIC, MODEL_VERSION + (100 if moe else 0), MAX_SEQ_LEN, VOCAB, LAYERS, HEADS, CHANNELS,
              PADDED_VOCAB] + ([EXPERTS, TOP_K, MOE_EVERY, 0] if moe else [])
    model_bytes = header(fields).tobytes() + flat_fp32(params).tobytes()

    logits, loss, total = forward(params, inputs, targets, moe)
    total.backward()
    logits0 = logits.detach().numpy().astype(np.float32)
    loss0 = float(loss)
    grads0 = flat_fp32({n: p.grad for n, p in params.items()})

    # Training: the same batch for STEPS steps, clip, AdamW (decay on the matrices only).
    ordered = [params[n] for n in names]
    decayed = DECAYED | {"routerw", "efcw", "efcprojw"}
    opt = torch.optim.AdamW(
        [{"params": [params[n] for n in names if n in decayed], "weight_decay": WEIGHT_DECAY},
         {"params": [params[n] for n in names if n not in decayed], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        _, loss, total = forward(params, inputs, targets, moe)
        total.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(ordered, max_norm=GRAD_CLIP))
        losses.append(float(loss))
        print(f"step {step}: loss {float(loss):.6f} grad norm {norm:.4f}"
              f"{' (clipped)' if norm > GRAD_CLIP else ''}")
        opt.step()

    state = state_bytes(B, T, [LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP]
                        + ([MOE_BALANCE_COEF, MOE_Z_COEF] if moe else [0, 0]),
                        inputs, targets, logits0, loss0, grads0, losses)
    prefix = "gpt2_moe_tiny" if moe else "gpt2_tiny"
    write_files(args.out_dir, [(prefix + "_model.bin", model_bytes), (prefix + "_state.bin", state)])


if __name__ == "__main__":
    main()
