#!/usr/bin/env python3
"""The golden replay: runs tests/golden/scenarios.sh with an anvil binary and
compares its results with a recording made by the same lines.

  golden.py record ANVIL SOURCE_DIR WORK [MPIRUN]   # writes tests/golden/MACHINE/
  golden.py replay ANVIL SOURCE_DIR WORK [MPIRUN]   # compares, exit 1 on a difference

Floating-point results depend on the kernels a CPU runs (BLAS core type, bf16
path, attention tiles, vector width), so a recording is kept per machine kind
(MACHINE, from `anvil hw --json`). On a kind with a recording the replay
requires bit-identical losses, the same sampled tokens, checkpoints whose
tensors have the same bytes (`anvil ckpt diff`) and the same exported files (their JSON less the source path).
On another kind it says so and compares losses within 1e-3 relative only.
"""
import json
import os
import shutil
import subprocess
import sys

SCENARIOS = ["gpt2", "llama", "zaya", "zaya-bf16", "resume", "dp2", "zero2", "ep2"]
EXPORTS = ["gpt2", "llama", "zaya"]


def machine_kind(anvil):
    hw = json.loads(subprocess.run([anvil, "hw", "--json"], check=True,
                                   capture_output=True, text=True).stdout)
    cpu = hw["cpu"]
    return "-".join(str(x) for x in (cpu["vendor"], cpu["family"], cpu["model"],
                                     hw["blas"]["corename"], hw["bf16_gemm"]["path"],
                                     hw["attention_tiles"]["path"]))


def run_scenarios(anvil, src, work, mpirun):
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["bash", os.path.join(src, "tests/golden/scenarios.sh"), anvil, src, work,
                    mpirun], check=True)


def record(anvil, src, work, mpirun):
    kind = machine_kind(anvil)
    run_scenarios(anvil, src, work, mpirun)
    out = os.path.join(src, "tests/golden", kind)
    shutil.rmtree(out, ignore_errors=True)
    for name in SCENARIOS:
        d = os.path.join(out, name)
        os.makedirs(d)
        shutil.copy(os.path.join(work, name, "losses.json"), d)
        shutil.copytree(os.path.join(work, name, "ckpt"), os.path.join(d, "ckpt"))
        if os.path.exists(os.path.join(work, name, "tokens.txt")):
            shutil.copy(os.path.join(work, name, "tokens.txt"), d)
        if name in EXPORTS:
            shutil.copytree(os.path.join(work, name, "hf"), os.path.join(d, "hf"))
    print(f"recorded {len(SCENARIOS)} scenarios for {kind} in {out}")


def without_source(j):
    """An export's JSON less the path it was exported from."""
    if isinstance(j, dict):
        return {k: without_source(v) for k, v in j.items() if k != "source"}
    return j


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)


def replay(anvil, src, work, mpirun):
    kind = machine_kind(anvil)
    want = os.path.join(src, "tests/golden", kind)
    kinds = sorted(k for k in os.listdir(os.path.join(src, "tests/golden"))
                   if os.path.isdir(os.path.join(src, "tests/golden", k)))
    exact = os.path.isdir(want)
    if not exact:
        print(f"NOTE: no recording for this machine kind ({kind}; recorded: {', '.join(kinds)}): "
              "losses are compared within 1e-3 relative, not bit for bit; make a recording "
              "with `golden.py record` and a build of the recording commit (README.md here)")
        want = os.path.join(src, "tests/golden", kinds[0])
    run_scenarios(anvil, src, work, mpirun)
    failures = []
    for name in SCENARIOS:
        with open(os.path.join(want, name, "losses.json")) as f:
            a = json.load(f)
        with open(os.path.join(work, name, "losses.json")) as f:
            b = json.load(f)
        if exact:
            if a != b:
                failures.append(f"{name}: losses differ: recorded {a}, now {b}")
        else:
            va = a["losses"] + [a["val_loss"]]
            vb = b["losses"] + [b["val_loss"]]
            if len(va) != len(vb) or not all(close(x, y, 1e-3) for x, y in zip(va, vb)):
                failures.append(f"{name}: losses beyond 1e-3: recorded {va}, now {vb}")
        if not exact:
            continue
        tokens = os.path.join(want, name, "tokens.txt")
        if os.path.exists(tokens):
            ta = open(tokens).read().split()
            tb = open(os.path.join(work, name, "tokens.txt")).read().split()
            if ta != tb:
                failures.append(f"{name}: sampled tokens differ: recorded {ta}, now {tb}")
        diff = subprocess.run([anvil, "ckpt", "diff", os.path.join(want, name, "ckpt"),
                               os.path.join(work, name, "ckpt")], capture_output=True, text=True)
        if diff.returncode != 0:
            failures.append(f"{name}: checkpoints differ (anvil ckpt diff, exit "
                            f"{diff.returncode}): {diff.stdout.strip()} {diff.stderr.strip()}")
        hf = os.path.join(want, name, "hf")
        if os.path.isdir(hf):
            for f in sorted(os.listdir(hf)):
                pa, pb = os.path.join(hf, f), os.path.join(work, name, "hf", f)
                if not os.path.exists(pb):
                    failures.append(f"{name}: export lacks {f}")
                elif f.endswith(".json"):
                    if without_source(json.load(open(pa))) != without_source(json.load(open(pb))):
                        failures.append(f"{name}: export {f} differs")
                elif open(pa, "rb").read() != open(pb, "rb").read():
                    failures.append(f"{name}: export {f} differs in bytes")
        print(f"  {name}: {'same' if not any(x.startswith(name + ':') for x in failures) else 'DIFFERENT'}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"golden replay: {len(SCENARIOS)} scenarios {'bit-identical' if exact else 'within 1e-3'} "
          f"({kind})")
    return 0


def main():
    if len(sys.argv) < 5 or sys.argv[1] not in ("record", "replay"):
        sys.exit(__doc__)
    mode, anvil, src, work = sys.argv[1:5]
    mpirun = sys.argv[5] if len(sys.argv) > 5 else "mpirun"
    if mode == "record":
        record(anvil, src, work, mpirun)
        return 0
    return replay(anvil, src, work, mpirun)


if __name__ == "__main__":
    sys.exit(main())
