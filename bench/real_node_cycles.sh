#!/usr/bin/env bash
# Two `hack/real-node.sh up` / `down` cycles, each running a pod on the real node, must leave
# the host as it was: the same mounts, network links, network namespaces, NAT rules and no
# process of the node or its cluster. Prints what differs, if anything; exits 1 then.
#
#   sudo bash bench/real_node_cycles.sh [CLUSTER]
set -euo pipefail
here=$(cd "$(dirname "$0")/../hack" && pwd)
. "$here/versions.sh"
cluster=${1:-flotilla-real-cycles}
kubeconfig=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}/clusters/$cluster/kubeconfig.yaml
snapshot() {
  grep -v '^cgroup\|/proc' /proc/mounts | awk '{print "mount", $2}' | sort
  ip -o link | awk '{print "link", $2}'
  ip netns list | awk '{print "netns", $1}'
  iptables-save -t nat | { grep '^-A' || true; } | sed 's/^/nat /'
  ps -eo stat=,comm= | awk '$1 !~ /Z/ {print "process", $2}' | sort -u \
    | grep -E 'kubelet|containerd|etcd|kube-|kwok|pause' || true
}
before=$(mktemp); after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
snapshot >"$before"
for cycle in 1 2; do
  bash "$here/real-node.sh" up "$cluster" >/dev/null
  kubectl --kubeconfig "$kubeconfig" run "probe-$cycle" --image localhost/flotilla/pause:1 --image-pull-policy Never \
    --overrides '{"spec":{"tolerations":[{"operator":"Exists"}],"nodeName":"flotilla-node-0"}}' >/dev/null
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready "pod/probe-$cycle" --timeout=60s >/dev/null
  bash "$here/real-node.sh" down "$cluster" >/dev/null
  snapshot >"$after"
  if ! diff "$before" "$after"; then
    echo "cycle $cycle: the host changed (< before, > after)" >&2
    exit 1
  fi
  echo "cycle $cycle: a pod ran on the real node; after down the host is as before"
done
