#!/bin/sh
# Open MPI's plm_rsh_agent for hosts that are Linux network namespaces on
# this machine: called as `netns_agent.sh HOST CMD...`, it runs CMD inside
# HOST's namespace with its own hostname (a UTS namespace), so Open MPI sees
# separate nodes and talks TCP between them. ANVIL_NETNS_MAP lists
# "ADDRESS=NAMESPACE" pairs, space-separated.
host=$1
shift
for pair in $ANVIL_NETNS_MAP; do
  if [ "${pair%%=*}" = "$host" ]; then
    ns=${pair#*=}
    exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec $*"
  fi
done
echo "netns_agent: unknown host $host (ANVIL_NETNS_MAP: $ANVIL_NETNS_MAP)" >&2
exit 1
