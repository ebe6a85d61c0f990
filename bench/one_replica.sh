# Sourced by the benchmarks that run one replica on a private local control plane
# (bench/heap.sh, bench/replica_memory.sh, bench/analysis_isolation.sh,
# bench/analysis_fairness.sh): the cluster, the install, the Tenants, the Apps, the waits
# and the servers they share. Expects `here` (the repository), `CLUSTER`, `WORK`, `NAMESPACES`
# and `APPS`; sets KUBECONFIG and BIN.

# A new cluster with the operator's install, and the replica binary to run (the release
# build, or FLOTILLA_BENCH_BIN).
one_replica_cluster() {
  export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
  bash hack/prerequisites.sh
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  bash hack/cluster.sh up "$CLUSTER" --disable-qps-limits >/dev/null
  KUBECONFIG=$(bash hack/cluster.sh kubeconfig "$CLUSTER"); export KUBECONFIG
  if [ -z "${FLOTILLA_BENCH_BIN:-}" ]; then
    cargo build --locked --release --bin flotilla 2>&1 | tail -1
  fi
  BIN=${FLOTILLA_BENCH_BIN:-$CARGO_TARGET_DIR/release/flotilla}
  bash hack/install-local.sh "$CLUSTER" "$WORK/op.kubeconfig"
}

# The namespaces PREFIX-0000 ... of NAMESPACES, one per line.
one_replica_namespaces() { seq -f "$1-%04g" 0 $((NAMESPACES - 1)); }

# Tenants PREFIX-0, PREFIX-1, ... onboarding the namespaces: a Tenant lists at most 100.
one_replica_tenants() {
  local prefix=$1 t part
  for t in $(seq 0 $(( (NAMESPACES - 1) / 100 ))); do
    part=$(one_replica_namespaces "$prefix" | sed -n "$((t * 100 + 1)),$((t * 100 + 100))p" | paste -sd, -)
    printf 'apiVersion: flotilla.dev/v1beta1\nkind: Tenant\nmetadata: {name: %s-%d}\nspec: {namespaces: [%s]}\n' "$prefix" "$t" "$part"
    echo ---
  done | kubectl apply -f - >/dev/null
}

# Waits until the replica (PID, log in $WORK/replica.log) answers /readyz on PORT, then until
# every namespace is onboarded; fails with the log if the replica exits.
one_replica_wait_ready() {
  until curl -fs "127.0.0.1:$1/readyz" >/dev/null 2>&1; do
    kill -0 "$PID" 2>/dev/null || { echo "the replica exited; its log:" >&2; cat "$WORK/replica.log" >&2; exit 1; }
    sleep 0.5
  done
  until [ "$(kubectl get tenants -o jsonpath='{.items[*].status.namespaces[*].state}' | tr ' ' '\n' | grep -c '^Onboarded$')" -ge "$NAMESPACES" ]; do sleep 1; done
}

# APPS Apps of 0 pods, spread evenly over the namespaces of PREFIX, as YAML on stdout.
one_replica_apps() {
  local per_ns=$(( (APPS + NAMESPACES - 1) / NAMESPACES )) n=0 ns i
  for ns in $(one_replica_namespaces "$1"); do
    for i in $(seq 0 $((per_ns - 1))); do
      [ "$n" -ge "$APPS" ] && break
      n=$((n + 1))
      printf -- '---\napiVersion: flotilla.dev/v1beta1\nkind: App\nmetadata: {name: app-%d, namespace: %s}\nspec: {image: registry.example.com/bench/app, version: "1", replicas: 0}\n' "$i" "$ns"
    done
  done
}

# Waits until every App is Healthy.
one_replica_wait_healthy() {
  until [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')" -ge "$APPS" ]; do sleep 2; done
}

# For the benches that run their replica and servers in the background: PIDS collects them,
# and on exit they are stopped, the cluster brought down and WORK removed.
one_replica_background() {
  PIDS=()
  trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
        bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
        rm -rf "$WORK"' EXIT
}

# Runs the replica in the background (its log in $WORK/operator.log, its PID in PIDS) with its
# admin address on PORT, and waits until it is ready.
one_replica_run() {
  "$BIN" run --kubeconfig "$WORK/op.kubeconfig" --admin-addr "127.0.0.1:$1" --webhook-addr 127.0.0.1:0 \
    --replica-id bench-0 >"$WORK/operator.log" 2>&1 &
  PIDS+=($!)
  until curl -fs "127.0.0.1:$1/readyz" >/dev/null 2>&1; do sleep 0.2; done
}

# A free TCP port on 127.0.0.1.
one_replica_free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A server on PORT that accepts every connection and never answers. Run it in the background
# (`one_replica_hanging_server PORT &`): the background shell becomes the server, so `$!` is
# its PID.
one_replica_hanging_server() {
  exec python3 - "$1" <<'PY'
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4096)
held = []
while True:
    c, _ = s.accept(); held.append(c)
PY
}
