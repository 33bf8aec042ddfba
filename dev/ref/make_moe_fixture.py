#!/usr/bin/env python3
"""Writes the mixture-of-experts fixture that test/test_moe.cpp checks llmc/cpu/moe.h against.

The layer is written out plainly in PyTorch and run in float64 (inputs drawn in float32, exactly
representable, then widened): a linear router, softmax, each token to its top-K experts (ties to
the lower index), each expert a GPT-2 MLP (fc, tanh GELU, fcproj), outputs weighted by the
probabilities; with a capacity factor, each expert keeps its first ceil(cf * rows * K / E)
assignments (first choices first, then token order). The loss the gradients come from is
sum(out * dout) + dbalance * balance + dz * z, with
  balance = E * sum_e f_e * P_e   (f_e: share of the rows * K choices picking e, a constant;
                                   P_e: mean probability of e)
  z       = mean over tokens of logsumexp(scores)^2

Output: test/fixtures/moe_cases.bin (or --out), little-endian:
  int32[4]  magic 20261125, version 1, number of cases, 0
  per case: int32[8]  rows, C, F, E, K, 0, 0, 0
            float32[4] capacity_factor, dbalance, dz, 0
            float32 x[rows*C], router[E*C], fcw[E*F*C], fcb[E*F], fcprojw[E*C*F], fcprojb[E*C],
                    dout[rows*C]
            expected: int32 experts[rows*K], int32 dropped, float32 out[rows*C], float32 balance, z,
                    dx[rows*C], drouter[E*C], dfcw[E*F*C], dfcb[E*F], dfcprojw[E*C*F], dfcprojb[E*C]

Run with Debian's python (torch 1.13 CPU): /usr/bin/python3 dev/ref/make_moe_fixture.py
"""
import argparse
import math
import os

import numpy as np
import torch

MAGIC, VERSION = 20261125, 1


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def route(probs, K, E, capacity_factor):
    """The top K of each row (stable: ties to the lower index) and which choices are kept."""
    rows = probs.shape[0]
    experts = np.argsort(-probs, axis=1, kind="stable")[:, :K]
    capacity = math.ceil(capacity_factor * rows * K / E) if capacity_factor > 0 else rows * K
    taken = [0] * E
    kept = np.zeros((rows, K), dtype=bool)
    for k in range(K):
        for n in range(rows):
            e = experts[n, k]
            if taken[e] < capacity:
                taken[e] += 1
                kept[n, k] = True
    return experts, kept


def make_case(rng, rows, C, F, E, K, capacity_factor, dbalance, dz, skew_to=None):
    def draw(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    inputs = {
        "x": draw((rows, C), 1.0),
        "router": draw((E, C), 0.5),
        "fcw": draw((E, F, C), 0.2),
        "fcb": draw((E, F), 0.1),
        "fcprojw": draw((E, C, F), 0.2),
        "fcprojb": draw((E, C), 0.1),
        "dout": draw((rows, C), 1.0),
    }
    if skew_to is not None:  # a constant feature that only one expert's router row reads, strongly
        inputs["x"][:, 0] = 3.0
        inputs["router"][:, 0] = 0.0
        inputs["router"][skew_to, 0] = 4.0
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=(k not in ("x", "dout"))) for k, v in inputs.items()}
    t["x"].requires_grad_(True)

    scores = t["x"] @ t["router"].T
    probs = torch.softmax(scores, dim=1)
    lse = torch.logsumexp(scores, dim=1)
    experts, kept = route(probs.detach().numpy(), K, E, capacity_factor)
    out = torch.zeros(rows, C, dtype=torch.float64)
    for n in range(rows):
        for k in range(K):
            if not kept[n, k]:
                continue
            e = experts[n, k]
            h = gelu(t["fcw"][e] @ t["x"][n] + t["fcb"][e])
            y = t["fcprojw"][e] @ h + t["fcprojb"][e]
            out[n] = out[n] + probs[n, e] * y
    chosen = np.bincount(experts.reshape(-1), minlength=E) / (rows * K)
    balance = E * (torch.tensor(chosen, dtype=torch.float64) * probs.mean(dim=0)).sum()
    z = (lse**2).mean()
    loss = (out * t["dout"]).sum() + dbalance * balance + dz * z
    loss.backward()

    dropped = int((~kept).sum())
    print(f"case rows {rows} C {C} F {F} E {E} K {K} cf {capacity_factor}: dropped {dropped}, "
          f"balance {balance.item():.4f}, z {z.item():.4f}, load {np.bincount(experts[:, 0], minlength=E)}")
    parts = [np.array([rows, C, F, E, K, 0, 0, 0], dtype=np.int32),
             np.array([capacity_factor, dbalance, dz, 0], dtype=np.float32)]
    parts += [inputs[k] for k in ("x", "router", "fcw", "fcb", "fcprojw", "fcprojb", "dout")]
    parts += [experts.astype(np.int32), np.array([dropped], dtype=np.int32), out.detach().numpy().astype(np.float32),
              np.array([balance.item(), z.item()], dtype=np.float32)]
    parts += [t[k].grad.numpy().astype(np.float32) for k in ("x", "router", "fcw", "fcb", "fcprojw", "fcprojb")]
    return b"".join(p.astype(p.dtype.newbyteorder("<")).tobytes() for p in parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../test/fixtures/moe_cases.bin"))
    args = parser.parse_args()
    rng = np.random.default_rng(20261125)
    cases = [
        make_case(rng, 24, 16, 32, 4, 1, 0.0, 0.5, 0.3),                # top-1, dropless
        make_case(rng, 24, 16, 32, 4, 2, 0.0, 0.5, 0.3),                # top-2, dropless
        make_case(rng, 32, 16, 32, 4, 2, 1.0, 0.5, 0.3),                # top-2, capacity 1: drops
        make_case(rng, 24, 16, 32, 8, 2, 0.0, 0.5, 0.3),                # 8 experts
        make_case(rng, 24, 16, 32, 4, 2, 0.0, 0.5, 0.3, skew_to=2),     # every token to expert 2
        make_case(rng, 24, 16, 32, 4, 2, 1.25, 0.5, 0.3, skew_to=2),    # ... over capacity
    ]
    with open(args.out, "wb") as f:
        f.write(np.array([MAGIC, VERSION, len(cases), 0], dtype="<i4").tobytes())
        for c in cases:
            f.write(c)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
