# Sourced by the scripts that need two hosts on this machine: two network
# namespaces joined by a veth, addresses only inside them. Sets h1 h2 (the
# namespaces), a1 a2 (their addresses), v2 (the second host's end of the
# link, in h2), v1 (the first host's end, in h1) and ANVIL_NETNS_MAP for tests/parallel/netns_agent.sh;
# netns_hosts_down removes them and kills what still runs inside.
#   netns_hosts_up TAG   (TAG: a few letters, unique per script)
h1=${h1:-} h2=${h2:-}
netns_hosts_up() {
  local tag=$1 id=$$
  h1=anvil-$tag-1-$id h2=anvil-$tag-2-$id
  a1=10.79.$((id % 250)).1 a2=10.79.$((id % 250)).2
  v1=$tag-a-$id v2=$tag-b-$id
  ip netns add "$h1"
  ip netns add "$h2"
  ip link add "$v1" type veth peer name "$v2"
  ip link set "$v1" netns "$h1"
  ip link set "$v2" netns "$h2"
  ip -n "$h1" addr add "$a1/24" dev "$v1"
  ip -n "$h2" addr add "$a2/24" dev "$v2"
  for h in "$h1" "$h2"; do ip -n "$h" link set lo up; done
  ip -n "$h1" link set "$v1" up
  ip -n "$h2" link set "$v2" up
  export ANVIL_NETNS_MAP="$a1=$h1 $a2=$h2"
}
netns_hosts_down() {
  for h in "$h1" "$h2"; do
    for pid in $(ip netns pids "$h" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$h" 2>/dev/null || true
  done
}
# True when network namespaces can be made here (root and ip netns).
netns_possible() {
  ip netns add "anvil-probe-$$" 2>/dev/null || return 1
  ip netns del "anvil-probe-$$"
}
# FILE: CHARS (default 60000) characters of words drawn with a fixed seed, a
# corpus with something to learn, made here (no download).
words_text() {
  python3 - "$1" "${2:-60000}" <<'PY'
import random, sys
random.seed(7)
words = "the and of to in that he was for it with as his on be at by had not are but from or".split()
text, size = [], 0
while size < int(sys.argv[2]):
    text.append(random.choice(words) + ("." if random.random() < 0.1 else ""))
    size += len(text[-1]) + 1
open(sys.argv[1], "w").write(" ".join(text))
PY
}
