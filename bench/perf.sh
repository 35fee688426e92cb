#!/usr/bin/env bash
# Every CPU speed figure anvil has a target for, each against its baseline
# measured in the same run, interleaved round by round, medians of ROUNDS:
#   train     bf16 vs fp32 tokens/s (gpt2-124m B=4 T=256, zaya-small B=8
#             T=256); MFU of each against the same round's `bench gemm`
#             peak of its own dtype (2048^3, fp32 sgemm / oneDNN bf16); the
#             16-expert zaya-small against its single-expert twin (same
#             active FLOPs)
#   loss      a 200-step zaya-small run on data/kjv.txt in bf16 against fp32:
#             the gap of the last 10 steps' mean loss (deterministic; 1 run)
#   attention `anvil bench attention`: forward+backward GFLOP/s as a % of the
#             sgemm peak the same run measured, every grid shape
#   muon      Muon's step (bf16 Newton-Schulz where the CPU has native bf16)
#             against AdamW's, zaya-small at 2,048 and 8,192 tokens per step
#   comm      shm all-reduce and all-gather against MPI's own, 2 ranks,
#             1-16 MiB, on plain and on registered buffers (SharedBuffer,
#             both given the same): ratio of medians, smallest per-round ratio;
#             then with rank 1 joining each call 10 ms late while compute
#             threads run on both ranks: how much compute the waiting rank's
#             wait costs (shm, the worst size's median slowdown; MPI beside it)
#   torch     bench/torch_compare.sh (PyTorch 2 eager and compiled, fp32 and
#             bf16; needs the project venv)
# Writes bench/results/perf-<cpu>.json (<cpu>: vendor and best matrix ISA,
# e.g. amd-avx512bf16, intel-amx, amd-avx2) and prints the tables of
# docs/benchmarks.md in Markdown. A run of some sections keeps the other
# sections of an existing file, each with its own date. Each section also
# records the share of CPU time the hypervisor gave elsewhere while it ran
# (steal, from /proc/stat): on a shared host a noisy section says so.
# ANVIL=BINARY measures another build (default build/anvil, built when
# missing). Under ANVIL_ISA=avx2 (an AVX2-only CPU's run-time paths on a
# CPU with more; with an -DANVIL_MARCH=x86-64-v3 build, its compiled
# kernels too) the file is perf-<vendor>-avx2-limited.json: a proxy for an
# AVX2 CPU, not a measurement on one.
# Usage: [SECTIONS=train,loss,attention,muon,comm,torch] bench/perf.sh [ROUNDS (default 3)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: expected a positive integer, got '$rounds'" >&2; exit 2; }
all=train,loss,attention,muon,comm,torch
sections=${SECTIONS:-$all}
for s in ${sections//,/ }; do
  [[ ",$all," == *",$s,"* ]] || { echo "SECTIONS: expected a comma list of $all, got '$s'" >&2; exit 2; }
done
want() { [[ ",$sections," == *",$1,"* ]]; }
anvil=${ANVIL:-build/anvil}
if [ -z "${ANVIL:-}" ]; then
  [ -x "$anvil" ] || scripts/build.sh
else
  [ -x "$anvil" ] || { echo "ANVIL: expected an anvil binary, got '$anvil'" >&2; exit 2; }
fi
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
say() { echo "[perf $(date +%H:%M:%S)] $*" >&2; }
# CPU time the hypervisor gave to others (steal) over a section, from
# /proc/stat: a section measured while the host was busy says so in the JSON.
stat_mark() {  # section begin|end
  awk -v s="$1" -v e="$2" '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print s, e, $9, t }' \
    /proc/stat >> "$out/steal.txt"
}
"$anvil" hw --json > "$out/hw.json"
cpu=$(python3 - "$out/hw.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(d["cpu"]["vendor"], "cpu")
isa = d["isa"]
best = ("amx" if isa.get("amx_bf16") else "avx512bf16" if isa.get("avx512_bf16")
        else "avx512" if isa.get("avx512f") else "avx2" if isa.get("avx2") else "sse")
print(f"{vendor}-{best}" + ("-limited" if d.get("isa_limit") else ""))
PY
)
result=bench/results/perf-$cpu.json
say "machine $cpu, sections $sections, $rounds round(s); results in $result"

train() {  # name, config, B, T, precision, peak, extra flags...
  local name=$1 config=$2 B=$3 T=$4 p=$5 peak=$6
  shift 6
  "$anvil" train --config "$config" -B "$B" -T "$T" --precision "$p" --peak-gflops "$peak" \
    --log-every 1000 "$@" < /dev/null > /dev/null
}
peak() {  # dtype -> GFLOP/s of the median 2048^3 call over 1 s
  "$anvil" bench gemm --sizes 2048 --dtype "$1" --threads 2 --baselines none --min-time 1 --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['rows'][0]['gflops'])"
}

if want train; then
  stat_mark train begin
  for r in $(seq 1 "$rounds"); do
    say "train round $r/$rounds: GEMM peaks"
    p32=$(peak fp32); p16=$(peak bf16)
    echo "{\"fp32\": $p32, \"bf16\": $p16}" > "$out/peak-$r.json"
    # Each ratio's two runs back to back (this host drifts over tens of
    # seconds): gpt2 fp32 | bf16, then zaya bf16 | fp32 | its 1-expert twin.
    for p in fp32 bf16; do
      pk=$p32; [ $p = bf16 ] && pk=$p16
      say "train round $r/$rounds: gpt2-124m $p"
      train gpt2 configs/gpt2-124m.json 4 256 $p "$pk" --steps 5 --json-out "$out/gpt2-$p-$r.json"
    done
    for p in bf16 fp32; do
      pk=$p32; [ $p = bf16 ] && pk=$p16
      say "train round $r/$rounds: zaya-small $p"
      train zaya configs/zaya-small.json 8 256 $p "$pk" --steps 6 --json-out "$out/zaya-$p-$r.json"
    done
    say "train round $r/$rounds: zaya-small fp32 with 1 expert"
    train zaya1 configs/zaya-small.json 8 256 fp32 "$p32" --steps 6 --set n_experts=1 \
      --json-out "$out/zaya1-fp32-$r.json"
  done
  stat_mark train end
fi
if want loss; then
  [ -s data/kjv.txt ] || scripts/kjv-text.sh > /dev/null
  stat_mark loss begin
  for p in fp32 bf16; do
    say "loss: zaya-small $p, 200 steps of 4 x 128 tokens of data/kjv.txt"
    "$anvil" train --config configs/zaya-small.json -B 4 -T 128 --steps 200 --precision $p \
      --data data/kjv.txt --log-every 1000 --json-out "$out/loss-$p.json" < /dev/null > /dev/null
  done
  stat_mark loss end
fi
if want attention; then
  stat_mark attention begin
  for r in $(seq 1 "$rounds"); do
    say "attention round $r/$rounds"
    "$anvil" bench attention --json > "$out/attention-$r.json"
  done
  stat_mark attention end
fi
if want muon; then
  stat_mark muon begin
  muon_flags=(); python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['bf16_gemm']['path'] == 'native' else 1)" \
    "$out/hw.json" && muon_flags=(--muon-bf16)
  for r in $(seq 1 "$rounds"); do
    for accum in 1 4; do
      for opt in adamw muon; do
        say "muon round $r/$rounds: $opt, $((2048 * accum)) tokens per step"
        extra=(); [ $opt = muon ] && extra=("${muon_flags[@]}")
        train muon configs/zaya-small.json 8 256 fp32 0 --accum $accum --steps 3 --optimizer $opt \
          "${extra[@]}" --json-out "$out/muon-$opt-$accum-$r.json"
      done
    done
  done
  echo "${muon_flags[*]}" > "$out/muon-flags"
  stat_mark muon end
fi
if want comm; then
  stat_mark comm begin
  for r in $(seq 1 "$rounds"); do
    for buffers in plain registered; do
      say "comm round $r/$rounds: $buffers buffers"
      flag=(); [ $buffers = registered ] && flag=(--registered)
      "$anvil" bench comm --np 2 --op allreduce,allgather --algo shm -b 1M -e 16M -f 2 -n 20 -w 3 --passes 3 \
        "${flag[@]}" --json > "$out/comm-$buffers-$r.json"
      say "comm round $r/$rounds: $buffers buffers, a peer 10 ms late, compute threads beside"
      "$anvil" bench comm --np 2 --op allreduce,allgather --algo shm -b 1M -e 16M -f 2 -n 10 -w 2 \
        --late-peer 10 "${flag[@]}" --json > "$out/comm-late-$buffers-$r.json"
    done
  done
  stat_mark comm end
fi
if want torch; then
  if [ -x .venv/bin/python ]; then
    say "torch: bench/torch_compare.sh $rounds"
    stat_mark torch begin
    bench/torch_compare.sh "$rounds" > "$out/torch.txt"
    stat_mark torch end
    cp bench/results/torch_compare.json "$out/torch.json"
  else
    say "torch: skipped (no .venv: run scripts/install-deps.sh)"
  fi
fi

mkdir -p bench/results
python3 - "$out" "$rounds" "$sections" "$result" <<'PY'
import datetime, json, os, statistics as st, sys
out, rounds, sections, result = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
R = range(1, rounds + 1)
load = lambda f: json.load(open(f"{out}/{f}"))
med = st.median
now = datetime.date.today().isoformat()
hw = load("hw.json")
old = json.load(open(result)) if os.path.exists(result) else {}
res = {"cpu": hw["cpu"], "isa": {k: v for k, v in hw["isa"].items() if v}, "bf16_gemm": hw["bf16_gemm"]["description"],
       "blas": hw["blas"]["corename"], "threads": hw["threads"], "sections": old.get("sections", {})}
if hw.get("isa_limit"):  # ANVIL_ISA: the CPU's features masked (a proxy run)
    res["isa_limit"] = hw["isa_limit"]
if hw.get("onednn_isa"):
    res["onednn_isa"] = hw["onednn_isa"]
# Machines of one file name (vendor and ISA) differ in family and model:
# each section names the CPU it was measured on.
cpu_name = lambda c: f"{c['vendor']} {c['model_name']} family {c['family']} model {c['model']}"
for sec in res["sections"].values():
    sec.setdefault("cpu", cpu_name(old["cpu"]))

def check(value, target, more_is_better=True):
    # target None: a figure reported without a target on this CPU
    if target is None:
        return {"value": value, "target": None, "met": None}
    return {"value": value, "target": target, "met": (value >= target) if more_is_better else (value <= target)}

if "train" in sections:
    amx = bool(hw["isa"].get("amx_bf16"))
    peaks = {p: [load(f"peak-{r}.json")[p] for r in R] for p in ("fp32", "bf16")}
    models = {}
    for m in ("gpt2", "zaya", "zaya1"):
        for p in ("fp32", "bf16"):
            if m == "zaya1" and p == "bf16":
                continue
            runs = [load(f"{m}-{p}-{r}.json") for r in R]
            tps = [x["tokens_per_second"] for x in runs]
            mfu = [x["tokens_per_second"] * x["flops_per_token"] / 1e9 / pk for x, pk in zip(runs, peaks[p])]
            models[f"{m}-{p}"] = {"tokens_per_s": tps, "median_tokens_per_s": med(tps),
                                  "mfu_vs_same_round_peak": mfu, "median_mfu": med(mfu)}
            # Where the steps went (anvil train's step parts), medians over the rounds.
            if all(x.get("part_seconds") for x in runs):
                models[f"{m}-{p}"]["median_part_seconds"] = {
                    k: med(x["part_seconds"][k] for x in runs) for k in runs[0]["part_seconds"]}
    ratio = lambda a, b: med(models[a]["tokens_per_s"]) / med(models[b]["tokens_per_s"])
    pair = lambda a, b: [x / y for x, y in zip(models[a]["tokens_per_s"], models[b]["tokens_per_s"])]
    # bf16 on matrix units: 3x with AMX, 1.3x with AVX512_BF16; emulated
    # bf16 (AVX2) has no target.
    bf16_target = 3.0 if amx else 1.3 if hw["isa"].get("avx512_bf16") else None
    checks = {
        "gpt2-124m bf16/fp32 tokens/s": check(ratio("gpt2-bf16", "gpt2-fp32"), bf16_target),
        "zaya-small bf16/fp32 tokens/s": check(ratio("zaya-bf16", "zaya-fp32"), bf16_target),
        "zaya-small fp32 MFU vs sgemm": check(models["zaya-fp32"]["median_mfu"],
                                              0.70 if hw["isa"].get("avx512f") else 0.60),
        "zaya-small 16 experts / 1 expert": check(ratio("zaya-fp32", "zaya1-fp32"), 0.9),
    }
    if amx:
        checks["gpt2-124m bf16 MFU vs bf16 GEMM"] = check(models["gpt2-bf16"]["median_mfu"], 0.60)
        checks["zaya-small bf16 MFU vs bf16 GEMM"] = check(models["zaya-bf16"]["median_mfu"], 0.60)
    res["sections"]["train"] = {"date": now, "rounds": rounds, "peak_gflops": peaks, "runs": models,
                                "pairwise": {"gpt2 bf16/fp32": pair("gpt2-bf16", "gpt2-fp32"),
                                             "zaya bf16/fp32": pair("zaya-bf16", "zaya-fp32"),
                                             "zaya 16/1 experts": pair("zaya-fp32", "zaya1-fp32")},
                                "checks": checks}
if "loss" in sections:
    l = {p: load(f"loss-{p}.json")["losses"] for p in ("fp32", "bf16")}
    tail = {p: sum(v[-10:]) / 10 for p, v in l.items()}
    gap = abs(tail["bf16"] - tail["fp32"]) / tail["fp32"]
    res["sections"]["loss"] = {"date": now, "steps": len(l["fp32"]), "last10_mean": tail,
                               "first_loss": {p: v[0] for p, v in l.items()},
                               "checks": {"zaya-small 200-step bf16 loss gap": check(gap, 0.01, False)}}
if "attention" in sections:
    runs = [load(f"attention-{r}.json") for r in R]
    rows = []
    for row in runs[0]["rows"]:
        key = (row["seq"], row["head_dim"])
        pct = [next(x["pct_of_sgemm_peak"] for x in run["rows"] if (x["seq"], x["head_dim"]) == key) for run in runs]
        gf = [next(x["total_gflops"] for x in run["rows"] if (x["seq"], x["head_dim"]) == key) for run in runs]
        rows.append({"seq": key[0], "head_dim": key[1], "pct_of_peak": pct, "median_pct": med(pct), "gflops": gf})
    worst = min(rows, key=lambda x: x["median_pct"])
    res["sections"]["attention"] = {"date": now, "rounds": rounds, "rows": rows,
                                    "sgemm_peak_gflops": [x["sgemm_peak_gflops"] for x in runs],
                                    "checks": {f"attention fwd+bwd, worst shape (T={worst['seq']}, D={worst['head_dim']}) % of sgemm":
                                               check(worst["median_pct"] / 100, 0.50)}}
if "muon" in sections:
    flags = open(f"{out}/muon-flags").read().strip()
    rows = {}
    for accum in (1, 4):
        step = {o: [med(load(f"muon-{o}-{accum}-{r}.json")["step_seconds"][1:]) for r in R] for o in ("adamw", "muon")}
        rows[str(2048 * accum)] = {"adamw_step_s": step["adamw"], "muon_step_s": step["muon"],
                                   "muon_over_adamw": med(step["muon"]) / med(step["adamw"])}
    res["sections"]["muon"] = {"date": now, "rounds": rounds, "muon_flags": flags, "tokens_per_step": rows,
                               "checks": {"Muon/AdamW step at 8192 tokens": check(rows["8192"]["muon_over_adamw"], 1.3, False)}}
if "comm" in sections:
    rows, checks = [], {}
    # plain: the caller's own memory; registered: SharedBuffer (both
    # algorithms get the same buffers; shm reads registered ones in place).
    for buffers, label in (("plain", ""), ("registered", ", registered buffers")):
        runs = [load(f"comm-{buffers}-{r}.json") for r in R]
        for op, target in (("allreduce", 1.5), ("allgather", 1.3)):
            sizes = sorted({p["bytes"] for p in runs[0]["points"] if p["op"] == op})
            worst_med, worst_min = None, None
            for b in sizes:
                bw = {a: [next(p["busbw_gbs"] for p in run["points"] if p["op"] == op and p["bytes"] == b and p["algo"] == a)
                          for run in runs] for a in ("mpi", "shm")}
                per_round = [s / m for s, m in zip(bw["shm"], bw["mpi"])]
                row = {"op": op, "buffers": buffers, "bytes": b, "mpi_busbw_gbs": bw["mpi"],
                       "shm_busbw_gbs": bw["shm"], "ratio_of_medians": med(bw["shm"]) / med(bw["mpi"]),
                       "min_round_ratio": min(per_round)}
                rows.append(row)
                worst_med = min(worst_med or 1e9, row["ratio_of_medians"])
                worst_min = min(worst_min or 1e9, row["min_round_ratio"])
            checks[f"shm/MPI {op} 1-16 MiB{label}, worst size (medians)"] = check(worst_med, target)
            checks[f"shm/MPI {op} 1-16 MiB{label}, worst size and round"] = check(worst_min, target)
    late_rows = []
    for buffers, label in (("plain", ""), ("registered", ", registered buffers")):
        late_runs = [load(f"comm-late-{buffers}-{r}.json") for r in R]
        for op in ("allreduce", "allgather"):
            sizes = sorted({p["bytes"] for p in late_runs[0]["points"] if p["op"] == op})
            for b in sizes:
                row = {"op": op, "buffers": buffers, "bytes": b}
                for a in ("mpi", "shm"):
                    pts = [next(p for p in run["points"] if p["op"] == op and p["bytes"] == b and p["algo"] == a)
                           for run in late_runs]
                    row[a] = {k: [p[k] for p in pts] for k in ("p50_us", "wait_cpu", "compute_slowdown", "wait_slowdown")}
                    row[a]["median_p50_us"] = med(row[a]["p50_us"])
                    row[a]["median_slowdown"] = med(row[a]["compute_slowdown"])
                late_rows.append(row)
            worst = max(x["shm"]["median_slowdown"] for x in late_rows if x["op"] == op and x["buffers"] == buffers)
            checks[f"compute slowdown beside shm {op}{label}, a peer 10 ms late, worst size"] = check(worst, 0.05, False)
    res["sections"]["comm"] = {"date": now, "rounds": rounds, "ranks": 2, "rows": rows, "checks": checks,
                               "late_peer": {"late_ms": 10, "compute_threads": late_runs[0]["compute_threads"],
                                             "rows": late_rows}}
if "torch" in sections and os.path.exists(f"{out}/torch.json"):
    t = load("torch.json")
    checks = {f"{x['model']} {x['precision']} anvil / faster PyTorch": check(x["anvil_over_faster"] or 0.0,
                                                                            1.5 if x["model"] == "gpt2-124m" else 2.0)
              for x in t["rows"]}
    res["sections"]["torch"] = {"date": now, **t, "checks": checks}

for name in sections:
    if name in res["sections"] and res["sections"][name].get("date") == now:
        res["sections"][name]["cpu"] = cpu_name(hw["cpu"])

marks = {}
if os.path.exists(f"{out}/steal.txt"):
    for line in open(f"{out}/steal.txt"):
        name, edge, steal, total = line.split()
        marks.setdefault(name, {})[edge] = (int(steal), int(total))
for name, m in marks.items():
    if name in res["sections"] and "begin" in m and "end" in m:
        d_total = m["end"][1] - m["begin"][1]
        res["sections"][name]["cpu_steal_pct"] = 100.0 * (m["end"][0] - m["begin"][0]) / max(d_total, 1)

tmp = result + ".tmp"
with open(tmp, "w") as f:
    json.dump(res, f, indent=2)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, result)

print(f"### {hw['cpu']['vendor']} {hw['cpu']['model_name']} (family {hw['cpu']['family']} model {hw['cpu']['model']}), "
      f"{hw['threads']} threads; bf16: {res['bf16_gemm']}")
print()
print("| figure | measured | target | met | date | CPU | CPU steal |")
print("|---|---:|---:|:-:|---|---|---:|")
for name, sec in res["sections"].items():
    for label, c in sec["checks"].items():
        fmt = (lambda v: f"{100 * v:.2f}%") if "gap" in label else (lambda v: f"{100 * v:.1f}%") \
            if ("MFU" in label or "%" in label or "slowdown" in label) else (lambda v: f"{v:.2f}x")
        op = "<=" if ("gap" in label or "Muon" in label or "slowdown" in label) else ">="
        steal = f"{sec['cpu_steal_pct']:.1f}%" if "cpu_steal_pct" in sec else "-"
        cpu = sec["cpu"].split(" family ")[-1].replace(" model ", "/")
        target = f"{op} {fmt(c['target'])}" if c["target"] is not None else "-"
        met = "-" if c["met"] is None else "yes" if c["met"] else "no"
        print(f"| {label} | {fmt(c['value'])} | {target} | {met} | {sec['date']} | {cpu} | {steal} |")
if "train" in res["sections"]:
    t = res["sections"]["train"]
    print()
    print(f"Tokens/s (medians of {t['rounds']}): " + ", ".join(
        f"{k} {v['median_tokens_per_s']:.0f} (MFU {100 * v['median_mfu']:.1f}%)" for k, v in t["runs"].items())
        + "; GEMM peaks (GFLOP/s) " + ", ".join(f"{p} {med(v):.1f}" for p, v in t["peak_gflops"].items()))
    parts = {k: v["median_part_seconds"] for k, v in t["runs"].items() if "median_part_seconds" in v}
    if parts:
        print("Step parts, ms (medians): " + "; ".join(
            f"{k} " + ", ".join(f"{name} {1e3 * s:.0f}" for name, s in v.items()) for k, v in parts.items()))
if "attention" in res["sections"]:
    print()
    print("Attention fwd+bwd, % of the same run's sgemm peak: " + ", ".join(
        f"T={x['seq']} D={x['head_dim']} {x['median_pct']:.0f}%" for x in res["sections"]["attention"]["rows"]))
if "comm" in res["sections"] and "late_peer" in res["sections"]["comm"]:
    print()
    print("A peer 10 ms late, median time (compute slowdown): " + ", ".join(
        f"{x['op']} {x['buffers']} {x['bytes'] >> 20} MiB shm {x['shm']['median_p50_us'] / 1e3:.1f} ms "
        f"({100 * x['shm']['median_slowdown']:.1f}%), mpi {x['mpi']['median_p50_us'] / 1e3:.1f} ms "
        f"({100 * x['mpi']['median_slowdown']:.1f}%)" for x in res["sections"]["comm"]["late_peer"]["rows"]))
if "muon" in res["sections"]:
    print()
    print("Muon / AdamW step: " + ", ".join(f"{k} tokens {v['muon_over_adamw']:.2f}x"
                                            for k, v in res["sections"]["muon"]["tokens_per_step"].items()))
PY
