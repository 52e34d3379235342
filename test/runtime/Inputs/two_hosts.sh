#!/usr/bin/env bash
# Runs a torchrun-style job on two "hosts" of this machine: two network
# namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2), each
# process with a hostname of its host's (a UTS namespace). Ranks
# 0..PER-1 run on hosta, the rest on hostb; MASTER_ADDR is hosta's
# address. Each rank's output goes to OUT/rank-R.log; OUT/bytes gets the
# bytes hosta sent hostb over the link. Exits 0 when every rank did,
# else non-zero after printing the ranks' logs. Needs root (ip netns,
# unshare, veth).
#
#   two_hosts.sh OUT PER WORLD -- COMMAND...
set -u
if (($# < 5)) || [[ $4 != -- ]]; then
  echo "usage: two_hosts.sh OUT PER WORLD -- COMMAND..." >&2
  exit 2
fi
out=$1 per=$2 world=$3
shift 4
mkdir -p "$out"
tag="mgh$$"
pids=()
# The ranks go with the namespaces, however this script ends (but
# SIGKILL: a later run removes namespaces whose script is gone).
cleanup() {
  ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null && wait
  ip netns del "${tag}a" 2>/dev/null
  ip netns del "${tag}b" 2>/dev/null
}
trap cleanup EXIT
for ns in $(ip netns list | awk '{print $1}' | grep '^mgh[0-9]*[ab]$'); do
  owner=${ns%[ab]}
  kill -0 "${owner#mgh}" 2>/dev/null || ip netns del "$ns"
done
setup() {
  ip netns add "${tag}a" && ip netns add "${tag}b" &&
    ip link add "${tag}x" type veth peer name "${tag}y" &&
    ip link set "${tag}x" netns "${tag}a" &&
    ip link set "${tag}y" netns "${tag}b" &&
    ip -n "${tag}a" addr add 10.77.0.1/24 dev "${tag}x" &&
    ip -n "${tag}b" addr add 10.77.0.2/24 dev "${tag}y" &&
    ip -n "${tag}a" link set lo up && ip -n "${tag}b" link set lo up &&
    ip -n "${tag}a" link set "${tag}x" up &&
    ip -n "${tag}b" link set "${tag}y" up
}
setup || { echo "two_hosts.sh: cannot set up the two hosts" >&2; exit 1; }
sent() { ip netns exec "${tag}a" cat "/sys/class/net/${tag}x/statistics/tx_bytes"; }
before=$(sent)
for ((r = 0; r < world; r++)); do
  if ((r < per)); then ns=a; else ns=b; fi
  # Open MPI as across hosts: TCP between them, shared memory within one
  # (the suite's settings keep MPI on loopback, which joins no hosts).
  ip netns exec "${tag}$ns" unshare --uts env -u OMPI_MCA_btl_tcp_if_include \
    -u OMPI_MCA_oob_tcp_if_include OMPI_MCA_btl=self,vader,tcp \
    HOSTNAME_OF_RANK="host$ns" \
    WORLD_SIZE="$world" RANK="$r" LOCAL_RANK=$((r % per)) \
    LOCAL_WORLD_SIZE="$per" MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 \
    sh -c 'hostname "$HOSTNAME_OF_RANK" && exec "$@"' sh "$@" \
    > "$out/rank-$r.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
pids=()
echo $(($(sent) - before)) > "$out/bytes"
if ((status)); then
  for ((r = 0; r < world; r++)); do
    echo "== rank $r" >&2
    tail -n 20 "$out/rank-$r.log" >&2
  done
fi
exit $status
