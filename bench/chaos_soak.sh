#!/usr/bin/env bash
# Chaos soak: zaya-tiny under `anvil launch` on two hosts (network
# namespaces, SLOTS ranks each (default 1: one per core of a 2-core machine),
# Open MPI over TCP, tests/parallel/netns_hosts.sh) for MINUTES, a random
# fault every EVERY seconds, then the same run uninterrupted at the same
# layout (2 x SLOTS ranks on one host) to compare:
#   kill       kill -9 of a random rank
#   hang       SIGSTOP of a random rank (never continued)
#   link-down  the second host's veth down for 15 s (a second time: the
#              host is excluded and the run ends on the first)
#   disk-full  the checkpoint tmpfs filled for 30 s (--on-save-error continue)
#   slow-rank  a random rank stopped 2/3 of the time for 30 s (3x slower)
# plus a NaN loss injected into the first attempt. Prints each fault, the
# journal's causes, goodput (productive step time / wall time; target >= 85%)
# and the final checkpoint against the uninterrupted run's (anvil ckpt diff:
# bit for bit when the layout never changed). Needs root (netns, tmpfs).
# While one host is out, its ranks' rows are the survivors' extra --accum.
# Usage: bench/chaos_soak.sh [MINUTES=20] [EVERY=120] [SEED=1] [SLOTS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-20}; every=${2:-120}; seed=${3:-1}; slots=${4:-1}
anvil=$PWD/build/anvil src=$PWD
. tests/parallel/netns_hosts.sh
netns_possible || { echo "chaos_soak: needs root and ip netns" >&2; exit 2; }
work=$(mktemp -d)
out=$work/run
cleanup() {
  netns_hosts_down
  umount "$out" 2>/dev/null || true
  [ -n "${ANVIL_KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
netns_hosts_up soak
mkdir -p "$out"
mount -t tmpfs -o size=1g anvil-soak "$out"
words_text "$work/text.txt" 200000
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# About STEP_MS a step (1 rank per host over TCP on 2 cores: ~30 ms; 2 per
# host, oversubscribed: ~60 ms): the steps for MINUTES; a checkpoint every
# CKPT steps (a few seconds).
step_ms=${ANVIL_SOAK_STEP_MS:-$((slots == 1 ? 30 : 60))}
ckpt=${ANVIL_SOAK_CKPT:-$((slots == 1 ? 200 : 50))}
steps=${ANVIL_SOAK_STEPS:-$((minutes * 60 * 1000 / step_ms))}
args="--config $src/tests/configs/zaya-tiny.json --set vocab_size=256 -T 64 --steps $steps \
  --lr 1e-3 --warmup 20 --schedule constant --data $work/text.txt --peak-gflops 1 --log-every 10000 \
  --ckpt-every $ckpt --keep 3 --on-save-error continue"
mpi="--mca plm_rsh_agent $src/tests/parallel/netns_agent.sh --mca btl tcp,self \
--mca btl_tcp_if_include $a1/24 --mca oob_tcp_if_include $a1/24 -x OMP_NUM_THREADS -x ANVIL_NETNS_MAP"
echo "chaos_soak: $steps steps on $a1:$slots,$a2:$slots, a fault every $every s, seed $seed; work $work"
ip netns exec "$h1" unshare --uts sh -c "hostname $h1 && exec $anvil launch \
  --hosts $a1:$slots,$a2:$slots --min-ranks $slots --hang-timeout 10 --probe-timeout 1 --probe-every 2 \
  --max-restarts 1000 --backoff 0.5 --inject nan@$((steps / 7)) --mpirun-args='$mpi' \
  -- $args -B 8 --out $out" > "$work/launch.log" 2>&1 &
launcher=$!
RANDOM=$seed
random_rank_pid() {
  local files=("$out"/heartbeat/pid-*)
  [ -e "${files[0]}" ] || return 1
  cut -d' ' -f1 "${files[RANDOM % ${#files[@]}]}"
}
t0=$(date +%s)
while kill -0 $launcher 2>/dev/null; do
  for _ in $(seq "$every"); do sleep 1; kill -0 $launcher 2>/dev/null || break 2; done
  kinds=(kill hang link-down disk-full slow-rank)
  kind=${kinds[RANDOM % 5]}
  echo "chaos_soak: t=$(( $(date +%s) - t0 )) s: $kind"
  case $kind in
    kill) pid=$(random_rank_pid) && kill -9 "$pid" 2>/dev/null || true ;;
    hang) pid=$(random_rank_pid) && kill -STOP "$pid" 2>/dev/null || true ;;
    link-down) ip -n "$h2" link set "$v2" down; sleep 15; ip -n "$h2" link set "$v2" up ;;
    disk-full) dd if=/dev/zero of="$out/.soak-filler" bs=1M 2>/dev/null || true
               sleep 30; rm -f "$out/.soak-filler" ;;
    slow-rank) if pid=$(random_rank_pid); then
                 for _ in $(seq 150); do
                   kill -STOP "$pid" 2>/dev/null || break; sleep 0.13
                   kill -CONT "$pid" 2>/dev/null || break; sleep 0.07
                 done
               fi ;;
  esac
done
wait $launcher || { echo "chaos_soak: anvil launch exited $?"; tail -20 "$work/launch.log"; exit 1; }
final=$(ls -d "$out"/step-* | tail -1)
cp -r "$final" "$work/final"
echo "chaos_soak: the uninterrupted run"
straight_t0=$(date +%s.%N)
timeout 7200 mpirun --oversubscribe -np $((2 * slots)) "$anvil" train $args -B 8 --out "$work/straight" \
  > "$work/straight.log" 2>&1 || { tail -20 "$work/straight.log"; exit 1; }
straight_t1=$(date +%s.%N)
python3 - "$out/journal.jsonl" "$work/straight/metrics.jsonl" "$straight_t0" "$straight_t1" <<'PY'
import collections, json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
straight_useful = sum(m.get("iteration_s", m.get("seconds", 0))
                     for m in map(json.loads, open(sys.argv[2])))
print(f"the uninterrupted run (one host, plain mpirun): goodput "
      f"{100 * straight_useful / (float(sys.argv[4]) - float(sys.argv[3])):.1f}% (start-up, saves and per-step "
      f"overheads outside the step times)")
faults = collections.Counter(e["cause"] for e in events if e["event"] == "fault")
done = [e for e in events if e["event"] == "done"][-1]
print("faults seen:", dict(faults))
print("layout changes:", sum(e["event"] in ("shrink", "grow") for e in events),
      "excluded:", [e["host"] for e in events if e["event"] == "exclude"])
print(f"wall {done['wall_s']:.0f} s, productive {done['useful_s']:.0f} s, goodput "
      f"{100 * done['goodput']:.1f}% (target >= 85%); lost by cause:",
      {k: round(v, 1) for k, v in done["lost_s"].items()})
PY
if "$anvil" ckpt diff "$work/final" "$work/straight" > "$work/diff.txt" 2>&1; then
  echo "final checkpoint: bit for bit the uninterrupted run's"
else
  echo "final checkpoint: differs from the uninterrupted run's:"; head -8 "$work/diff.txt"
fi
