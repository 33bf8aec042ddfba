"""Times torch's SDPA (causal, bf16) forward and forward+backward on GPT-2 attention shapes, with the
flash backend and with cuDNN's fused attention (where this torch and card have it); with --llmc PATH
it also runs the built dev/cuda/attention_backward binary, versions 2 (mma.sync), 3 (wgmma) and 4
(wgmma fed by TMA; both an sm_90 card only), and puts llmc's forward+backward times beside torch's.

    python3 dev/bench/attention_vs_sdpa.py [--llmc dev/cuda/build/attention_backward]

Times are medians of 20 runs timed with CUDA events, after warm-up. Issue 37's goal: llmc's best at
least as fast as cuDNN's (a ratio cuDNN ms / llmc ms of at least 1).
"""
import argparse
import re
import subprocess

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 1024, 12, 64), (2, 4096, 12, 64)]  # B, T, NH, HS
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None))]
LLMC_VERSIONS = [(2, "mma"), (3, "wgmma"), (4, "tma")]


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


def time_torch(backend, B, T, NH, HS):
    """(forward ms, forward+backward ms) with one SDPA backend, or None where it cannot run."""
    if backend is None:
        return None

    def make():
        return torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = make(), make(), make()
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel(backend):
            def forward():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def forward_backward():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (q, k, v), dout)

            return median_ms(forward), median_ms(forward_backward)
    except RuntimeError as e:  # "No available kernel": this backend does not run here
        print(f"  ({backend}: {str(e).splitlines()[0]})")
        return None


def time_llmc(path, version):
    """llmc's fwd+bwd ms per (B, T, NH, HS) from the binary's "fwd+bwd ms" lines for one version."""
    result = subprocess.run([path, str(version)], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"{path} {version} failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        return {}
    pattern = r"fwd\+bwd ms B=(\d+) T=(\d+) NH=(\d+) HS=(\d+): ([0-9.]+)"
    return {tuple(map(int, m[:4])): float(m[4]) for m in re.findall(pattern, result.stdout)}


def cell(ms):
    return f"{ms:.4f}" if ms else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llmc", metavar="PATH", help="the built dev/cuda/attention_backward binary")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("attention_vs_sdpa.py: no GPU (torch.cuda.is_available() is False): nothing to measure")
        raise SystemExit(3)
    llmc = {name: time_llmc(args.llmc, v) for v, name in LLMC_VERSIONS} if args.llmc else {}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, SDPA causal bf16; ms, median of 20")
    columns = [f"{b} fwd | {b} f+b" for b, _ in BACKENDS] + [f"llmc {n} f+b" for _, n in LLMC_VERSIONS if args.llmc]
    columns += ["cudnn / best llmc"] if args.llmc else []
    print("| B | T | NH | HS | " + " | ".join(columns) + " |")
    print("|" + " --- |" * (4 + 2 * len(BACKENDS) + (len(LLMC_VERSIONS) + 1 if args.llmc else 0)))
    for B, T, NH, HS in SHAPES:
        torch_ms = {name: time_torch(backend, B, T, NH, HS) for name, backend in BACKENDS}
        cells = [str(x) for x in (B, T, NH, HS)]
        for name, _ in BACKENDS:
            t = torch_ms[name]
            cells += [cell(t[0]), cell(t[1])] if t else ["-", "-"]
        if args.llmc:
            ours = [llmc[name].get((B, T, NH, HS)) for _, name in LLMC_VERSIONS]
            cells += [cell(ms) for ms in ours]
            best = min((ms for ms in ours if ms), default=None)
            cudnn = torch_ms["cudnn"]
            cells.append(f"{cudnn[1] / best:.2f}" if best and cudnn else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
