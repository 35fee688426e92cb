# Sourced by the scripts that need two hosts on this machine: two network
# namespaces joined by a veth, addresses only inside them. Sets h1 h2 (the
# namespaces), a1 a2 (their addresses), v2 (the second host's end of the
# link, in h2) and ANVIL_NETNS_MAP for tests/parallel/netns_agent.sh;
# netns_hosts_down removes them and kills what still runs inside.
#   netns_hosts_up TAG   (TAG: a few letters, unique per script)
h1=${h1:-} h2=${h2:-}
netns_hosts_up() {
  local tag=$1 id=$$
  h1=anvil-$tag-1-$id h2=anvil-$tag-2-$id
  a1=10.79.$((id % 250)).1 a2=10.79.$((id % 250)).2
  v2=$tag-b-$id
  ip netns add "$h1"
  ip netns add "$h2"
  ip link add "$tag-a-$id" type veth peer name "$v2"
  ip link set "$tag-a-$id" netns "$h1"
  ip link set "$v2" netns "$h2"
  ip -n "$h1" addr add "$a1/24" dev "$tag-a-$id"
  ip -n "$h2" addr add "$a2/24" dev "$v2"
  for h in "$h1" "$h2"; do ip -n "$h" link set lo up; done
  ip -n "$h1" link set "$tag-a-$id" up
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
