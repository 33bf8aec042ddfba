"""test_side_by_side.py: dev/bench/side_by_side.py reads each log as its program writes it, puts a "-"
where a log or its figure is missing, and never fails on a log it cannot read.

The sample logs below copy the formats of bench_train_step --best (dev/bench/train_step.cu),
dev/bench/torch_gpt2.py, .device/peers.sh (../shared/peers/llm.c.sh) and llm.c's own step lines
(train_gpt2.cu). Run: /usr/bin/python3 test/test_side_by_side.py (make test).
"""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev/bench"))
import side_by_side  # noqa: E402

BEST_D12 = """\
bench_train_step --best on NVIDIA H200: d12, T 1024, fp8 off; B doubling from 4, -r 0..3 each only where the lower ones run out of memory; per try 1 untimed, 1 warm-up and 5 timed steps; budget 120 s

| B | recompute | result | step ms | tokens/s | MFU | llmc memory | device memory | try s |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| 4 | 0 | ok | 12.0 | 341333 | 27.6% | 2.6 GiB | 3.4 GiB | 1.9 |
| 64 | 0 | ok | 136.0 | 481882 | 39.0% | 22.1 GiB | 23.0 GiB | 3.1 |
| 128 | 0 | ok | 270.0 | 485451 | 39.3% | 41.9 GiB | 42.8 GiB | 5.2 |
end: B 128 -r 0 gained less than 2% over the batch before it (the card is saturated)
best: model=d12 T=1024 fp8=off B=64 recompute=0 tokens_per_s=481882 mfu_pct=39.0 step_ms=136.0 llmc_gib=22.1 device_gib=23.0
"""
BEST_D48 = """\
| 32 | 0 | out of memory | - | - | - | - | - | 2.0 |
| 32 | 1 | ok | 810.0 | 40454 | 40.1% | 90.3 GiB | 91.0 GiB | 9.9 |
end: B 64 -r 1 would end past the 160 s budget
best: model=d48 T=1024 fp8=off B=32 recompute=1 tokens_per_s=40454 mfu_pct=40.1 step_ms=810.0 llmc_gib=90.3 device_gib=91.0
"""
TORCH_D12 = """\
find-max-batch: B=64 fits (eager)
find-max-batch: B=64 fits (compiled)
torch d12 B=64 T=1024 compile=1 ckpt=0: 521000 tok/s, step 125.8 ms, MFU 42.1% (peak 989 TFLOP/s), peak mem 40.1 GiB (last loss 7.1234)
{"impl": "torch", "model": "d12", "B": 64, "T": 1024, "compile": 1, "ckpt": 0, "steps": 20, "tokens_per_s": 521000.0, "step_ms": 125.8, "mfu": 0.421, "peak_tflops": 989.0, "peak_mem_gib": 40.1, "params": 124337664, "flops_per_token": 802160640, "device": "NVIDIA H200", "torch": "2.11.0"}
"""
PEERS = """\
llm.c d12_b64: 136.2 ms/step, 481176 tokens/s
"""
PEERS_NO_CUDNN = """\
llm.c with cuDNN failed; without it:
llm.c d12_b64: 150.0 ms/step, 436907 tokens/s
"""
LLMC_STEPS_D48 = """\
| use_master_weights    | enabled                                            |
val loss 11.033154
step    1/10 | loss 11.032358 (+nanz)| norm 22.1414 (+nanz)| lr 8.57e-07 | 2494.73 ms | 40.3% bf16 MFU | 10000 tok/s
step    2/10 | loss 10.958507 (+nanz)| norm 22.0968 (+nanz)| lr 1.71e-06 | 488.33 ms | 40.4% bf16 MFU | 33000 tok/s
step    3/10 | loss 10.811316 (+nanz)| norm 21.1251 (+nanz)| lr 2.57e-06 | 491.77 ms | 40.3% bf16 MFU | 35000 tok/s
"""


def write(logdir, name, text):
    with open(os.path.join(logdir, name), "w") as f:
        f.write(text)


def rows(table):
    """{model: cells} of a table side_by_side printed."""
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = cells[1:]
    return out


class SideBySide(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_every_log_present_gives_every_figure_and_both_ratios(self):
        write(self.dir, "bench_d12_best.log", BEST_D12)
        write(self.dir, "bench_d48_best.log", BEST_D48)
        write(self.dir, "torch_d12.log", TORCH_D12)
        write(self.dir, "peers.log", PEERS)
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(r["d12"], ["481882", "B 64 x T 1024, -r 0", "481176", "B 64", "521000",
                                    "B 64 x T 1024, compiled", "1.00", "0.92"])
        self.assertEqual(r["d48"], ["40454", "B 32 x T 1024, -r 1", "-", "-", "-", "-", "-", "-"])

    def test_the_fastest_variant_of_a_model_counts_and_is_named(self):
        write(self.dir, "bench_d12_best.log", BEST_D12)
        write(self.dir, "bench_d12_wgmma_best.log", BEST_D12.replace("fp8=off", "fp8=off attention=wgmma")
              .replace("tokens_per_s=481882", "tokens_per_s=530000"))
        write(self.dir, "bench_d48_best.log", BEST_D48)
        write(self.dir, "bench_d48_wgmma_best.log", BEST_D48.replace("fp8=off", "fp8=off attention=wgmma")
              .replace("tokens_per_s=40454", "tokens_per_s=40000"))
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(r["d12"][0:2], ["530000", "B 64 x T 1024, -r 0, attention wgmma"])
        self.assertEqual(r["d48"][0:2], ["40454", "B 32 x T 1024, -r 1"])

    def test_no_logs_at_all_give_d12_and_d48_rows_of_dashes(self):
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(sorted(r), ["d12", "d48"])
        for cells in r.values():
            self.assertEqual(cells, ["-"] * 8)

    def test_a_missing_logdir_is_dashes_too(self):
        r = rows(side_by_side.side_by_side(os.path.join(self.dir, "nowhere")))
        self.assertEqual(r["d12"], ["-"] * 8)

    def test_a_sweep_cut_short_before_its_best_line_is_a_dash(self):
        write(self.dir, "bench_d12_best.log", BEST_D12.split("end:")[0])
        write(self.dir, "torch_d12.log", TORCH_D12)
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(r["d12"][0:2], ["-", "-"])
        self.assertEqual(r["d12"][6:], ["-", "-"])
        self.assertEqual(r["d12"][4], "521000")

    def test_llm_c_without_cudnn_is_named_in_its_config(self):
        write(self.dir, "peers.log", PEERS_NO_CUDNN)
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(r["d12"][2:4], ["436907", "B 64, no cuDNN"])

    def test_an_llm_c_run_cut_short_is_the_mean_of_its_steps_after_the_first(self):
        write(self.dir, "peers.log", PEERS)
        write(self.dir, "peers_d48_b16.log", LLMC_STEPS_D48)
        write(self.dir, "bench_d48_best.log", BEST_D48)
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(r["d48"][2:4], ["34000", "B 16, cut short: mean of its steps"])
        self.assertEqual(r["d48"][6], f"{40454 / 34000:.2f}")

    def test_garbage_and_other_models_logs(self):
        write(self.dir, "bench_d12_best.log", "best: model=d12 T=x B=64 tokens_per_s=oops\n\x00\xff")
        write(self.dir, "torch_d12.log", "{not json\n{\"impl\": \"torch\"}\n[1, 2]\n")
        write(self.dir, "peers.log", "llm.c d12_b64: killed\n")
        write(self.dir, "bench_d24_best.log", BEST_D12.replace("model=d12", "model=d24"))
        write(self.dir, "bench_d12_fp8_best.log", BEST_D12)  # not the bf16 sweep: not read
        with open(os.path.join(self.dir, "bench_d48_best.log"), "wb") as f:
            f.write(b"\xff\xfe\x00best: model=d48 B=\xff\n")  # not UTF-8
        os.mkdir(os.path.join(self.dir, "torch_d48.log"))  # unreadable
        r = rows(side_by_side.side_by_side(self.dir))
        self.assertEqual(list(r), ["d12", "d24", "d48"])
        self.assertEqual(r["d12"], ["-"] * 8)
        self.assertEqual(r["d24"][0], "481882")

    def test_the_command_line(self):
        write(self.dir, "bench_d12_best.log", BEST_D12)
        script = os.path.join(ROOT, "dev/bench/side_by_side.py")
        out = subprocess.run([sys.executable, script, self.dir], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| d12 | 481882 |", out.stdout)
        usage = subprocess.run([sys.executable, script], capture_output=True, text=True)
        self.assertNotEqual(usage.returncode, 0)
        self.assertIn("usage:", usage.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
