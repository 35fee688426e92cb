#!/usr/bin/env python3
"""anvil against the GPU machine's own PyTorch, in one script, interleaved.

bf16 GEMM at 8192^3: `anvil bench gemm --device cuda` (cuBLASLt's default
algorithm, and the best of its top 8) against torch.matmul; HBM copy:
`anvil bench membw --device cuda --kernels copy` against Tensor.copy_ of the
same bytes. Each round runs both sides; the medians over --rounds rounds and
their ratios go to stdout and --out (JSON). Run through scripts/gpu-check.sh,
which defines the `anvil` shell function this calls.
"""
import argparse
import json
import statistics
import subprocess
import sys

import torch


def anvil(*args):
    cmd = "anvil " + " ".join(args)
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    if p.returncode:  # anvil's own one-line error, not only the exit status
        sys.stderr.write(p.stderr)
        p.check_returncode()
    return json.loads(p.stdout)


def torch_time(fn, min_seconds=0.3):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    samples, total = [], 0.0
    while total < min_seconds or len(samples) < 5:
        start.record()
        for _ in range(10):
            fn()
        stop.record()
        stop.synchronize()
        s = start.elapsed_time(stop) / 1e3 / 10
        samples.append(s)
        total += s * 10
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--copy-bytes", type=int, default=1 << 30, help="bytes per array copied")
    ap.add_argument("--out")
    a = ap.parse_args()
    n = a.size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.ones(a.copy_bytes // 8, device="cuda", dtype=torch.float64)
    dst = torch.empty_like(src)
    rows = {"anvil_gemm": [], "anvil_gemm_best_algo": [], "torch_matmul": [],
            "anvil_copy": [], "torch_copy": []}
    for _ in range(a.rounds):
        g = anvil("bench gemm --device cuda --dtype bf16 --sizes", str(n), "--json --min-time 0.3")
        row = g["rows"][0]
        rows["anvil_gemm"].append(row["gflops"])
        rows["anvil_gemm_best_algo"].append(row["baselines_gflops"]["best-algo"])
        rows["torch_matmul"].append(2 * n**3 / torch_time(lambda: torch.matmul(x, y)) / 1e9)
        m = anvil("bench membw --device cuda --kernels copy --sizes", str(2 * a.copy_bytes),
                  "--json --min-time 0.3")
        rows["anvil_copy"].append(m["rows"][0]["gbs_median"])
        rows["torch_copy"].append(2 * a.copy_bytes / torch_time(lambda: dst.copy_(src)) / 1e9)
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {
        "rounds": rows,
        "medians": med,
        "gemm_vs_torch": med["anvil_gemm"] / med["torch_matmul"],
        "gemm_vs_best_algo": med["anvil_gemm"] / med["anvil_gemm_best_algo"],
        "gemm_pct_of_989_tflops": 100 * med["anvil_gemm"] / 989.4e3,
        "copy_vs_torch": med["anvil_copy"] / med["torch_copy"],
        "copy_pct_of_4800_gbs": 100 * med["anvil_copy"] / 4800,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    ok = result["gemm_vs_torch"] >= 0.95 and result["gemm_vs_best_algo"] >= 0.90 and \
        result["copy_vs_torch"] >= 0.95
    print("targets (GEMM >= 0.95x torch and >= 0.90x best algo; copy >= 0.95x torch):",
          "met" if ok else "MISSED")


if __name__ == "__main__":
    main()
