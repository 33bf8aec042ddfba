"""Times torch's flash SDPA (causal, bf16) forward and forward+backward on GPT-2 124M attention shapes;
with --llmc PATH it also runs the built dev/cuda/attention_backward binary and puts llmc's
forward+backward time beside torch's.

    python3 dev/bench/attention_vs_sdpa.py [--llmc build/attention_backward]

Times are medians of 20 runs timed with CUDA events, after warm-up. The goal for llmc is a speed
ratio (torch ms / llmc ms) of at least 0.8.
"""
import argparse
import re
import subprocess

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 1024, 12, 64), (2, 4096, 12, 64)]  # B, T, NH, HS


def median_ms(fn, repeats=20, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def time_torch(B, T, NH, HS):
    def make():
        return torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = make(), make(), make()
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        def forward():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), dout)

        return median_ms(forward), median_ms(forward_backward)


def time_llmc(path):
    """llmc's fwd+bwd ms per (B, T, NH, HS), from the binary's "fwd+bwd ms" lines (version 2 only)."""
    result = subprocess.run([path, "2"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{path} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    pattern = r"fwd\+bwd ms B=(\d+) T=(\d+) NH=(\d+) HS=(\d+): ([0-9.]+)"
    return {tuple(map(int, m[:4])): float(m[4]) for m in re.findall(pattern, result.stdout)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llmc", metavar="PATH", help="the built dev/cuda/attention_backward binary")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("attention_vs_sdpa.py: no GPU (torch.cuda.is_available() is False): nothing to measure")
        raise SystemExit(3)
    llmc = time_llmc(args.llmc) if args.llmc else {}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flash SDPA, causal, bf16")
    header = f"{'B':>3} {'T':>5} {'NH':>3} {'HS':>3} | {'torch fwd':>10} {'torch f+b':>10}"
    if args.llmc:
        header += f" | {'llmc f+b':>10} {'torch/llmc':>10}"
    print(header)
    for B, T, NH, HS in SHAPES:
        fwd_ms, fwd_bwd_ms = time_torch(B, T, NH, HS)
        line = f"{B:>3} {T:>5} {NH:>3} {HS:>3} | {fwd_ms:>10.4f} {fwd_bwd_ms:>10.4f}"
        if args.llmc:
            ms = llmc.get((B, T, NH, HS))
            line += f" | {ms:>10.4f} {fwd_bwd_ms / ms:>10.2f}" if ms else f" | {'missing':>10}"
        print(line)
    print("times in ms (median of 20); torch/llmc >= 0.8 is the goal" if args.llmc else "times in ms (median of 20)")


if __name__ == "__main__":
    main()
