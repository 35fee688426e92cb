#!/usr/bin/env bash
# Two hosts made as network namespaces (veth link, addresses only inside the
# namespaces this script creates, removed on exit), the link shaped by a tbf
# qdisc, Open MPI's TCP transport between them: `anvil train` with one rank
# per host must give the same losses as two ranks on one host.
# Usage: multihost.sh ANVIL_BINARY SOURCE_DIR [RATE=1gbit] [STEPS=20] [CONFIG=tests/configs/zaya-tiny.json] [B=4] [T=32]
# Prints both runs' median step time and the all-reduce time over the link.
# With ANVIL_MULTIHOST_OUT=DIR, both runs' --json-out files are kept there
# (one-host.json, two-hosts.json).
set -euo pipefail
anvil=$1; src=$2; rate=${3:-1gbit}; steps=${4:-20}
config=${5:-$src/tests/configs/zaya-tiny.json}; B=${6:-4}; T=${7:-32}
. "$src/tests/parallel/netns_hosts.sh"
work=$(mktemp -d)
cleanup() {
  netns_hosts_down
  if [ -n "${ANVIL_MULTIHOST_OUT:-}" ]; then
    mkdir -p "$ANVIL_MULTIHOST_OUT"
    cp "$work"/*.json "$ANVIL_MULTIHOST_OUT"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
netns_hosts_up mh
# The inter-host link's bandwidth, both directions. tbf's bucket must hold
# at least a timer tick's worth of bytes (rate / HZ) or it caps the rate
# below the one asked for: 16 MB covers 10 Gbit/s at HZ 100.
ip netns exec "$h1" tc qdisc add dev "$v1" root tbf rate "$rate" burst 16mb latency 100ms
ip netns exec "$h2" tc qdisc add dev "$v2" root tbf rate "$rate" burst 16mb latency 100ms

words_text "$work/text.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args="train --config $config --set vocab_size=256 -B $B -T $T --steps $steps --lr 3e-3 --warmup 2 \
  --data $work/text.txt --peak-gflops 1 --log-every 1000"
OMP_NUM_THREADS=1 timeout 600 mpirun --oversubscribe -np 2 "$anvil" $args \
  --json-out "$work/one-host.json" > "$work/one-host.log" 2>&1 || { cat "$work/one-host.log"; exit 1; }
timeout 600 ip netns exec "$h1" unshare --uts sh -c "hostname $h1 && exec mpirun \
  --host $a1,$a2 -np 2 --mca plm_rsh_agent $src/tests/parallel/netns_agent.sh \
  --mca btl tcp,self --mca btl_tcp_if_include $a1/24 --mca oob_tcp_if_include $a1/24 \
  -x OMP_NUM_THREADS=1 -x ANVIL_NETNS_MAP $anvil $args --json-out $work/two-hosts.json" \
  > "$work/two-hosts.log" 2>&1 || { cat "$work/two-hosts.log"; exit 1; }
python3 - "$work" "$rate" <<'PY'
import json, statistics, sys
work, rate = sys.argv[1], sys.argv[2]
one = json.load(open(f"{work}/one-host.json"))
two = json.load(open(f"{work}/two-hosts.json"))
worst = max(abs(a - b) / abs(a) for a, b in zip(one["losses"], two["losses"]))
print(f"2 hosts x 1 rank over TCP ({rate} tbf link) vs 1 host x 2 ranks, {len(one['losses'])} steps")
print(f"losses: largest relative difference {worst:.2e}")
for name, r in (("one host", one), ("two hosts", two)):
    print(f"{name:10} median step {1e3 * statistics.median(r['step_seconds'][1:]):8.1f} ms, "
          f"gradient all-reduce {1e3 * r['comm_seconds']:.1f} ms ({1e3 * r['comm_exposed_seconds']:.1f} exposed)")
if len(one["losses"]) != len(two["losses"]) or worst > 1e-6:
    print("FAIL: the two-host run's losses differ from one host's")
    sys.exit(1)
PY
