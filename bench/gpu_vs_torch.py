#!/usr/bin/env python3
"""anvil against the GPU machine's own PyTorch, in one script, interleaved.

bf16 GEMM at 8192^3: `anvil bench gemm --device cuda` (cuBLASLt's default
algorithm, and the best of its top 8) against torch.matmul; HBM copy:
`anvil bench membw --device cuda --kernels copy` against Tensor.copy_ of the
same bytes. Each round runs both sides, which goes first alternating round
by round (a GPU that has idled runs its first work cooler); inputs are
uniform in [-1, 1) on both. The medians over --rounds rounds, their ratios,
the % of the GPU's datasheet peaks (anvil's own figures, from the profile
that matches the GPU; null where none does) and both sides' cuBLAS go to
stdout and --out (JSON), also when a round fails (the rounds done so far).
Run through scripts/gpu-check.sh, which defines the `anvil` shell function
this calls and puts PyTorch's CUDA libraries first on anvil's library path,
so that both sides load the same cuBLAS.
"""
import argparse
import json
import statistics
import importlib.metadata
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


def cublas_wheels():
    """The nvidia-cublas* packages PyTorch's CUDA libraries come from."""
    return {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()
            if (d.metadata["Name"] or "").lower().startswith("nvidia-cublas")}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--copy-bytes", type=int, default=1 << 30, help="bytes per array copied")
    ap.add_argument("--out")
    a = ap.parse_args()
    n = a.size
    x = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
    y = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
    src = torch.rand(a.copy_bytes // 8, device="cuda", dtype=torch.float64) * 2 - 1
    dst = torch.empty_like(src)
    rows = {"anvil_gemm": [], "anvil_gemm_best_algo": [], "torch_matmul": [],
            "anvil_copy": [], "torch_copy": []}
    pct = {"gemm": [], "copy": []}

    def anvil_side():
        g = anvil("bench gemm --device cuda --dtype bf16 --sizes", str(n), "--json --min-time 0.3")
        row = g["rows"][0]
        rows["anvil_gemm"].append(row["gflops"])
        rows["anvil_gemm_best_algo"].append(row["baselines_gflops"]["best-algo"])
        pct["gemm"].append(row.get("pct_of_datasheet"))
        m = anvil("bench membw --device cuda --kernels copy --sizes", str(2 * a.copy_bytes),
                  "--json --min-time 0.3")
        rows["anvil_copy"].append(m["rows"][0]["gbs_median"])
        pct["copy"].append(m["rows"][0].get("pct_of_datasheet"))

    def torch_side():
        rows["torch_matmul"].append(2 * n**3 / torch_time(lambda: torch.matmul(x, y)) / 1e9)
        rows["torch_copy"].append(2 * a.copy_bytes / torch_time(lambda: dst.copy_(src)) / 1e9)

    error = None
    try:
        for r in range(a.rounds):
            for side in ((anvil_side, torch_side) if r % 2 == 0 else (torch_side, anvil_side)):
                side()
    except Exception as e:  # keep the rounds done so far
        error = f"{type(e).__name__}: {e}"
    med = {k: statistics.median(v) if v else None for k, v in rows.items()}

    def ratio(p, q):
        return med[p] / med[q] if med[p] and med[q] else None

    def median_of(v):
        v = [x for x in v if x is not None]
        return statistics.median(v) if v else None

    hw = None
    try:
        hw = anvil("hw --json")["gpus"]["devices"][0].get("cublaslt_version")
    except Exception:
        pass
    result = {
        "rounds": rows,
        "medians": med,
        "gemm_vs_torch": ratio("anvil_gemm", "torch_matmul"),
        "gemm_vs_best_algo": ratio("anvil_gemm", "anvil_gemm_best_algo"),
        "gemm_pct_of_datasheet": median_of(pct["gemm"]),
        "copy_vs_torch": ratio("anvil_copy", "torch_copy"),
        "copy_pct_of_datasheet": median_of(pct["copy"]),
        "anvil_cublaslt_version": hw,
        "torch_cublas_wheels": cublas_wheels(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "error": error,
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    if error:
        print(f"gpu_vs_torch: a round failed: {error}", file=sys.stderr)
        return 1
    ok = result["gemm_vs_torch"] >= 0.95 and result["gemm_vs_best_algo"] >= 0.90 and \
        result["copy_vs_torch"] >= 0.95
    print("targets (GEMM >= 0.95x torch and >= 0.90x best algo; copy >= 0.95x torch):",
          "met" if ok else "MISSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
