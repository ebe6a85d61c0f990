#!/usr/bin/env bash
# One real node beside kwok's fake ones: a kubelet of the control plane's version
# (hack/build-control-plane.sh kubelet), Debian's containerd and runc, and CNI bridge networking, so that
# pods really run and their IPs answer from this machine (the apiserver can call a webhook
# at a pod IP). The node is tainted flotilla.dev/real-node=true:NoSchedule: only pods that
# tolerate it land there; the fake nodes stay for scale. Images come from no registry: they
# are built here and imported into containerd (`import IMAGE`), and pods use them with
# imagePullPolicy: Never or IfNotPresent.
#
#   hack/real-node.sh up     [CLUSTER]   the cluster (created for a real node) and the node
#   hack/real-node.sh import IMAGE [CLUSTER]   a local (buildah) image into the node
#   hack/real-node.sh down   [CLUSTER]   stop the node, its pods and the cluster; remove their
#                                        mounts, network namespaces, bridge, NAT rule and state
#
# CLUSTER defaults to flotilla-real. It must be created by this script (it starts it when
# absent): kwok must leave the real node alone, and kube-apiserver must reach pods by their
# IPs (there is no kube-proxy) and kubelets by their InternalIP. Pods reach the apiserver at the
# `kubernetes` Service's address (10.96.0.1:443) as on any cluster: one NAT rule stands in
# for kube-proxy there, and the serving certificate names that address. Needs root (containerd,
# network namespaces, the bridge). What was checked on these machines: kubelet v1.36 runs on
# containerd 1.6 (it logs that RuntimeConfig is unimplemented and falls back to cgroupDriver,
# a fallback removed in 1.37) and on cgroup v1 with failCgroupV1: false.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
cmd=${1:-up}; shift || true
image=
if [ "$cmd" = import ]; then image=${1:?usage: $0 import IMAGE [CLUSTER]}; shift; fi
cluster=${1:-flotilla-real}
[[ $cluster =~ ^[a-z0-9][a-z0-9-]*$ ]] || { echo "error: cluster name '$cluster': lowercase letters, digits and -" >&2; exit 2; }
node=flotilla-node-0
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
work=$FLOTILLA_CACHE/realnode/$cluster
pki=$KWOK_WORKDIR/clusters/$cluster/pki
kubeconfig=$KWOK_WORKDIR/clusters/$cluster/kubeconfig.yaml
sock=$work/containerd-state/containerd.sock
service_ip=10.96.0.1
gateway=10.244.0.1
bridge=flotilla0
ctr() { command ctr --address "$sock" -n k8s.io "$@"; }

stop() { # stop PIDFILE: only a process that is still ours (a PID may be reused after a reboot)
  [ -f "$1" ] || return 0
  local pid; pid=$(cat "$1")
  if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$work/"; then
    kill "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

prerequisites() {
  [ "$(id -u)" = 0 ] || { echo "error: the real node needs root (containerd, network namespaces, iptables)" >&2; exit 1; }
  bash "$here/prerequisites.sh"
}

kwokctl_config() {
  cat >"$work/kwokctl.yaml" <<YAML
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: "false"}
  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}
- name: kube-apiserver
  extraArgs:
  - {key: enable-aggregator-routing, value: "true"}
  - {key: kubelet-preferred-address-types, value: InternalIP}
  - {key: kubelet-client-certificate, value: "$pki/admin.crt"}
  - {key: kubelet-client-key, value: "$pki/admin.key"}
options:
  # Pods dial the apiserver at the kubernetes Service's ClusterIP (service_route).
  kubeApiserverCertSANs: ["$service_ip"]
YAML
  echo "$work/kwokctl.yaml"
}

# The part of kube-proxy pods need: the `kubernetes` Service's ClusterIP:443 leads to the
# apiserver (on every host address; the bridge's gateway is the one pods reach).
service_rule() { # service_rule -A|-C|-D DESTINATION
  iptables -t nat "$1" PREROUTING -i "$bridge" -d "$service_ip/32" -p tcp --dport 443 \
    -m comment --comment "flotilla-real-node $cluster" -j DNAT --to-destination "$2"
}

# Destinations of this cluster's rules (a rule of an earlier run may point at an old port).
service_destinations() {
  iptables -t nat -S PREROUTING 2>/dev/null \
    | awk -v c="--comment \"flotilla-real-node $cluster\" " 'index($0, c) {for (i = 1; i < NF; i++) if ($i == "--to-destination") print $(i + 1)}' \
    | grep -E '^[0-9.]+:[0-9]+$' || true
}

service_route() {
  local port; port=$(kubectl --kubeconfig "$kubeconfig" config view -o jsonpath='{.clusters[0].cluster.server}')
  local want=$gateway:${port##*:}
  for dest in $(service_destinations); do [ "$dest" = "$want" ] || service_rule -D "$dest"; done
  service_rule -C "$want" 2>/dev/null || service_rule -A "$want"
}

import_archive() { # import_archive IMAGE: buildah's image into the node's containerd
  local tar=$work/images/$(echo "$1" | tr '/:' '__').tar
  rm -f "$tar"
  buildah push -q "$1" "docker-archive:$tar:$1" >/dev/null
  ctr images import "$tar" >/dev/null
  rm -f "$tar"
}

pause_image() {
  ctr images ls -q 2>/dev/null | grep -qx localhost/flotilla/pause:1 && return
  local src; src=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION/build/pause/linux/pause.c
  [ -f "$src" ] || (cd "$(mktemp -d)" && go mod download "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
  gcc -static -O2 -o "$work/images/pause" "$src"
  local c; c=$(buildah from scratch)
  buildah copy -q "$c" "$work/images/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' "$c"
  buildah commit -q "$c" localhost/flotilla/pause:1 >/dev/null
  buildah rm "$c" >/dev/null
  import_archive localhost/flotilla/pause:1
}

start_containerd() {
  cat >"$work/containerd.toml" <<TOML
version = 2
root = "$work/containerd-root"
state = "$work/containerd-state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/flotilla/pause:1"
  # This machine's processes may not lower their OOM score (the pause container asks for -998).
  restrict_oom_score_adj = true
  # Pod network namespaces under the state directory, not /run/netns: "down" then removes
  # this node's and no one else's.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$work/cni"
TOML
  cat >"$work/cni/10-flotilla.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "flotilla", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24", "gateway": "$gateway"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$work/cni-ipam"}},
  {"type": "loopback"}]}
JSON
  command ctr --address "$sock" version >/dev/null 2>&1 && return
  nohup containerd --config "$work/containerd.toml" >"$work/logs/containerd.log" 2>&1 &
  echo $! >"$work/containerd.pid"
  for _ in $(seq 1 100); do command ctr --address "$sock" version >/dev/null 2>&1 && return; sleep 0.1; done
  echo "error: containerd did not start; see $work/logs/containerd.log" >&2
  exit 1
}

start_kubelet() {
  # A new cluster has a new CA: the node's certificate is made again when the CA does not sign it.
  if ! openssl verify -CAfile "$pki/ca.crt" "$work/node.crt" >/dev/null 2>&1; then
    stop "$work/kubelet.pid"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$work/node.key" -subj "/O=system:nodes/CN=system:node:$node" \
      -out "$work/node.csr" 2>/dev/null
    openssl x509 -req -in "$work/node.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 365 \
      -out "$work/node.crt" 2>/dev/null
  fi
  local server; server=$(kubectl --kubeconfig "$kubeconfig" config view -o jsonpath='{.clusters[0].cluster.server}')
  cat >"$work/kubelet.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}}]
users: [{name: node, user: {client-certificate: "$work/node.crt", client-key: "$work/node.key"}}]
contexts: [{name: node, context: {cluster: local, user: node}}]
current-context: node
KC
  cat >"$work/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: "$pki/ca.crt"}}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
rotateCertificates: false
serverTLSBootstrap: false
registerWithTaints: [{key: flotilla.dev/real-node, value: "true", effect: NoSchedule}]
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 30
failSwapOn: false
YAML
  curl -fs 127.0.0.1:10248/healthz >/dev/null 2>&1 && return
  nohup "$KUBELET_BIN/kubelet" --config "$work/kubelet.yaml" --kubeconfig "$work/kubelet.kubeconfig" \
    --hostname-override "$node" --root-dir "$work/kubelet" >"$work/logs/kubelet.log" 2>&1 &
  echo $! >"$work/kubelet.pid"
}

up() {
  local start; start=$(date +%s)
  # One real node per machine: the kubelet's ports, the bridge and the subnet are fixed.
  for other in "$FLOTILLA_CACHE"/realnode/*; do
    [ -d "$other" ] && [ "$other" != "$work" ] && {
      echo "error: the real node of cluster '${other##*/}' is up; take it down first: bash $0 down ${other##*/}" >&2
      exit 1
    }
  done
  prerequisites
  bash "$here/build-control-plane.sh" kubelet
  mkdir -p "$work"/{containerd-root,containerd-state,cni,cni-ipam,kubelet,images,logs}
  bash "$here/cluster.sh" up "$cluster" --config "$(kwokctl_config)" >/dev/null
  start_containerd
  pause_image
  service_route
  start_kubelet
  for _ in $(seq 1 120); do
    kubectl --kubeconfig "$kubeconfig" get node "$node" >/dev/null 2>&1 && break
    sleep 0.5
  done
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready "node/$node" --timeout=120s >/dev/null || {
    echo "error: node $node is not Ready; see $work/logs/kubelet.log" >&2
    exit 1
  }
  echo ">> real node $node Ready in cluster '$cluster' in $(( $(date +%s) - start ))s (taint flotilla.dev/real-node)"
  echo "   export KUBECONFIG=$kubeconfig"
}

# Stops the node and removes what it left on the host. Works from any state: a node half
# started, processes already gone (mounts and namespaces stay behind them), nothing at all.
down() {
  stop "$work/kubelet.pid"
  # Containers outlive containerd (each has a shim): kill them while it still answers.
  if command ctr --address "$sock" version >/dev/null 2>&1; then
    for task in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true; done
  fi
  stop "$work/containerd.pid"
  pkill -KILL -f "containerd-shim.*-address $sock" 2>/dev/null || true
  for _ in $(seq 1 50); do pgrep -f "containerd-shim.*-address $sock" >/dev/null || break; sleep 0.1; done
  # Mounts under the node's directories, deepest first: rootfs overlays, shm, pod volumes.
  # Pod network namespaces are among them (containerd keeps them under its state directory):
  # unmounted, each is gone with its end of the veth pair.
  { grep -F " $work/" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  ip link delete "$bridge" 2>/dev/null || true
  for dest in $(service_destinations); do service_rule -D "$dest" 2>/dev/null || true; done
  bash "$here/cluster.sh" down "$cluster" >/dev/null
  rm -rf --one-file-system "$work"
  echo ">> real node $node and cluster '$cluster' removed"
}

case $cmd in
  up) up ;;
  import) import_archive "$image" ;;
  down) down ;;
  *) echo "usage: $0 up|down [CLUSTER] | import IMAGE [CLUSTER]" >&2; exit 2 ;;
esac
