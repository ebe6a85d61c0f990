#!/usr/bin/env bash
# Scale benchmark: Flotilla (3 replicas, release build) against a bare client creating the
# same Deployments and Services, and (--with-argo) against Argo Rollouts with the same count
# of canary Rollouts, on a private local control plane with the components' QPS limits lifted.
# Prints a table at the end and keeps the raw figures as JSON in bench/results/ so that two
# runs can be compared. Never asserted by a test (tests/scale.rs checks correctness only).
#
#   bash bench/scale.sh [--with-argo] [NAMESPACES] [APPS]      default 1000 namespaces, 10000 Apps
#   FLOTILLA_BENCH_IDLE=600 FLOTILLA_BENCH_CHANGES=50 FLOTILLA_BENCH_REPLICAS_PER_APP=0 bash bench/scale.sh 100 1000
#   FLOTILLA_BENCH_OPERATOR_REPLICAS=5 bash bench/scale.sh 100 1000     replicas of the operator (default 3)
#   FLOTILLA_BENCH_BIN=path      another build of the replica to run (default: the release build)
#   FLOTILLA_BENCH_BASELINE=0    skips the bare client (no ratio): for runs about the rest
#   FLOTILLA_BENCH_FLOOR=1       also times a bare client that makes the writes any operator
#                                must make for an App (the App, its Deployment, Service and
#                                status), on a control plane of its own with the CRDs and
#                                no operator: what the apiserver alone needs for them;
#                                FLOTILLA_BENCH_FLOOR=apps the same without the status writes
#   FLOTILLA_BENCH_LOGS=dir      keeps the replicas' logs and the audit log of Flotilla's run
#   FLOTILLA_BENCH_ENV_I="K=V ..." environment of replica I alone (MALLOC_ARENA_MAX=1, ...);
#                                shards go to replicas by name, the first ones take one more
#                                when they do not split evenly: compare per namespace served
#   FLOTILLA_BENCH_HEAPTRACK=I   runs replica I under heaptrack (Debian package heaptrack) and,
#                                after the idle time and the changes, kills it with -9 and
#                                prints what its heap held then (no failover, no Argo Rollouts
#                                in such a run; its RSS and CPU include heaptrack's)
#
# Measured:
# - baseline: time for a bare client (kubectl, 8 in parallel) to create what the operator
#   creates for an App with no rollout in progress, a Deployment and a Service each, APPS of
#   them spread over NAMESPACES namespaces, until all exist;
# - Flotilla: time from the first App created until every App has its Deployment and a
#   status at its current generation (Healthy), same objects, same parallelism; the Apps
#   are canaries (one step of 50% and a pause), which a first deployment skips;
# - Argo Rollouts (--with-argo, built by hack/build-argo-rollouts.sh, run with its default
#   flags): the same count of canary Rollouts with the same step and a Service each, created
#   by the same clients, until every Rollout is Healthy; its RSS, CPU, connections, requests
#   and writes per Rollout as for the operator;
# - per replica: peak and steady RSS, CPU seconds, open connections to the apiserver,
#   requests sent (from the audit log, by User-Agent);
# - writes by the operator in tenant namespaces during IDLE seconds after convergence;
# - the time for one changed App to be reconciled (its rollout started) while all are present (p50/p99);
# - failover with every App present (FLOTILLA_BENCH_FAILOVER=0 skips it): kill -9 of a
#   replica, its restart, then SIGTERM of another; after each, the time until every shard
#   is held by the live replicas (the last of the new holders' acquireTime stamps on the
#   departed replica's Leases, and what a poll of the Leases saw) and until changed Apps in
#   30 namespaces are reconciled (the last replica's status write of each, from the audit
#   log; a poll of the 30 one after another, also printed, adds up to its own length).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
WITH_ARGO=0
if [ "${1:-}" = --with-argo ]; then WITH_ARGO=1; shift; fi
NAMESPACES=${1:-1000}
APPS=${2:-10000}
REPLICAS=${FLOTILLA_BENCH_OPERATOR_REPLICAS:-3}
ids=$(seq 0 $((REPLICAS - 1)))
IDLE=${FLOTILLA_BENCH_IDLE:-600}
CHANGES=${FLOTILLA_BENCH_CHANGES:-50}
POD_REPLICAS=${FLOTILLA_BENCH_REPLICAS_PER_APP:-0}
PARALLEL=8
CLUSTER=flotilla-bench-scale
WORK=$(mktemp -d)
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
per_ns=$(( (APPS + NAMESPACES - 1) / NAMESPACES ))
# Both sides are polled with a full list; at 10k objects a list takes seconds of the
# apiserver's time, so the poll slows with the size (0.5 s at 1000, 5 s at 10,000).
POLL=$(awk -v n="$APPS" 'BEGIN{p=n/2000; if(p<0.5)p=0.5; print p}')

bash hack/prerequisites.sh
HEAPTRACK=${FLOTILLA_BENCH_HEAPTRACK:-}
if [ -n "$HEAPTRACK" ]; then
  if ! [[ "$HEAPTRACK" =~ ^[0-9]+$ ]] || [ "$HEAPTRACK" -ge "$REPLICAS" ]; then
    echo "error: FLOTILLA_BENCH_HEAPTRACK=$HEAPTRACK names no replica (0 to $((REPLICAS - 1)))" >&2
    exit 1
  fi
  if [ "$WITH_ARGO" = 1 ]; then
    echo "error: FLOTILLA_BENCH_HEAPTRACK and --with-argo together would compare Argo Rollouts with a replica slowed by the profiler" >&2
    exit 1
  fi
  . bench/heaptrack.sh
  heaptrack_installed
fi
[ "$WITH_ARGO" = 1 ] && bash hack/build-argo-rollouts.sh
# Fake nodes of 1,000 pods each, enough for every App's pods with room to spare.
FLOTILLA_NODES=$(( (APPS * POD_REPLICAS * 12 / 10 + 999) / 1000 )); [ "$FLOTILLA_NODES" -ge 3 ] || FLOTILLA_NODES=3
export FLOTILLA_NODES
# Each system is measured on a control plane of its own: after the deletion of 1,000
# namespaces, a Service creation took 21 s on the same control plane (ConfigMaps 0.3 s),
# which made whatever came next pay for what came before.
fresh_cluster() {
  echo ">> new cluster $CLUSTER (QPS limits of the control-plane components lifted)"
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  bash hack/cluster.sh up "$CLUSTER" --disable-qps-limits >/dev/null
  KUBECONFIG=$(bash hack/cluster.sh kubeconfig "$CLUSTER"); export KUBECONFIG
  AUDIT=$(bash hack/cluster.sh audit-log "$CLUSTER")
  api_port=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's/.*://')
}
# The apiserver rotates its audit log at 100 MB (a 10k run writes several), so windows are
# cut by time, across the log and its rotated files, not by line numbers.
stamp() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }
audit_between() { # audit_between FROM TO: the audit events completed in [FROM, TO), JSON lines
  python3 - "$1" "$2" "$(dirname "$AUDIT")" <<'PY'
import glob, json, os, sys
start, end, logs = sys.argv[1], sys.argv[2], sys.argv[3]
for path in sorted(glob.glob(os.path.join(logs, "audit*.log")), key=os.path.getmtime):
    for line in open(path):
        e = json.loads(line)
        if start <= e.get("stageTimestamp", "") < end:
            sys.stdout.write(line)
PY
}
writes_count() { # FROM TO PREFIX: audited writes (the controllers' only) in PREFIX-NNNN namespaces
  audit_between "$1" "$2" | python3 -c '
import json, sys
prefix = sys.argv[1]
print(sum(1 for line in sys.stdin for e in [json.loads(line)]
          if e.get("stage") == "ResponseComplete" and e.get("verb") in ("create", "update", "patch", "delete")
          and e.get("objectRef", {}).get("namespace", "").removeprefix(prefix).isdigit()))' "$3"
}
writes() { # $1 $2: time window, $3: prefix of the namespaces, $4: objects created
  audit_between "$1" "$2" | python3 -c '
import collections, json, sys
prefix, objects = sys.argv[1], int(sys.argv[2])
counts = collections.Counter()
for line in sys.stdin:
    e = json.loads(line)
    ref = e.get("objectRef", {})
    if e.get("stage") != "ResponseComplete" or e.get("verb") not in ("create", "update", "patch", "delete"):
        continue
    ns = ref.get("namespace", "")
    if not (ns.startswith(prefix) and ns[len(prefix):].isdigit()):
        continue
    agent = e.get("userAgent", "")
    who = "flotilla" if agent.startswith("flotilla/") else agent.split("/")[0]
    what = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
    counts[(who, e["verb"], what)] += 1
total = sum(counts.values())
print(f"| writer | verb | resource | per object |")
print(f"|---|---|---|---|")
for (who, verb, what), n in counts.most_common():
    print(f"| {who} | {verb} | {what} | {n / objects:.2f} |")
print(f"| all | | | {total / objects:.2f} |")
' "$3" "$4"
}
if [ -z "${FLOTILLA_BENCH_BIN:-}" ]; then
  echo ">> release build"
  cargo build --locked --release --bin flotilla 2>&1 | tail -1
fi
BIN=${FLOTILLA_BENCH_BIN:-$CARGO_TARGET_DIR/release/flotilla}
PIDS=()
SAMPLER=
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  # FLOTILLA_BENCH_LOGS=DIR keeps the replicas' logs (and the Flotilla run's audit log, when
  # the run has no Argo part) for a closer look.
  if [ -n "${FLOTILLA_BENCH_LOGS:-}" ]; then
    mkdir -p "$FLOTILLA_BENCH_LOGS" && cp "$WORK"/*.log "$FLOTILLA_BENCH_LOGS"/ 2>/dev/null || true
    [ -n "${AUDIT:-}" ] && cp "$(dirname "$AUDIT")"/audit*.log "$FLOTILLA_BENCH_LOGS"/ 2>/dev/null || true
  fi
  [ -n "${HEAPTRACK_WRAPPER:-}" ] && kill "$HEAPTRACK_WRAPPER" 2>/dev/null || true
  # Only processes still ours: a PID that exited may have been reused.
  for p in "${PIDS[@]}"; do
    grep -qaE 'flotilla|rollouts-controller' "/proc/$p/cmdline" 2>/dev/null && kill -9 "$p" 2>/dev/null || true
  done
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.1f\", $(now) - $1}"; }

# Objects, written once: one file per namespace, created with PARALLEL clients.
make_files() { # make_files PREFIX KIND
  local prefix=$1 kind=$2 ns i n=0
  mkdir -p "$WORK/$prefix"
  for ns in $(seq -f "$prefix-%04g" 0 $((NAMESPACES - 1))); do
    : >"$WORK/$prefix/$ns.yaml"
    for i in $(seq 0 $((per_ns - 1))); do
      [ "$n" -ge "$APPS" ] && break
      n=$((n + 1))
      case $kind in
      Deployment | Rollout)
        if [ "$kind" = Deployment ]; then
          printf -- '---\napiVersion: apps/v1\nkind: Deployment\n' >>"$WORK/$prefix/$ns.yaml"
          strategy=
        else
          printf -- '---\napiVersion: argoproj.io/v1alpha1\nkind: Rollout\n' >>"$WORK/$prefix/$ns.yaml"
          strategy="  strategy: {canary: {steps: [{setWeight: 50}, {pause: {duration: 60}}]}}"
        fi
        cat >>"$WORK/$prefix/$ns.yaml" <<YAML
metadata: {name: app-$i, namespace: $ns, labels: {app.kubernetes.io/name: app-$i}}
spec:
  replicas: $POD_REPLICAS
  selector: {matchLabels: {app.kubernetes.io/name: app-$i}}
  template:
    metadata: {labels: {app.kubernetes.io/name: app-$i}}
    spec: {containers: [{name: app, image: "registry.example.com/bench/app:1", ports: [{name: http, containerPort: 8080}]}]}
$strategy
---
apiVersion: v1
kind: Service
metadata: {name: app-$i, namespace: $ns, labels: {app.kubernetes.io/name: app-$i}}
spec:
  selector: {app.kubernetes.io/name: app-$i}
  ports: [{name: http, port: 80, targetPort: http}]
YAML
        ;;
      App)
        cat >>"$WORK/$prefix/$ns.yaml" <<YAML
---
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: app-$i, namespace: $ns}
spec:
  image: registry.example.com/bench/app
  version: "1"
  replicas: $POD_REPLICAS
  rollout: {strategy: {type: Canary, canary: {steps: [{weight: 50, pause: 1m}]}}}
YAML
        ;;
      esac
    done
  done
}
# PARALLEL clients at once, each creating whole namespaces' files in turn.
per_client=$(( (NAMESPACES + PARALLEL - 1) / PARALLEL )); [ "$per_client" -le 20 ] || per_client=20
create_all() { ls "$WORK/$1"/*.yaml | xargs -P "$PARALLEL" -n "$per_client" sh -c 'for f; do kubectl create -f "$f" >/dev/null; done' _; }

BASELINE=${FLOTILLA_BENCH_BASELINE:-1}
if [ "$BASELINE" = 1 ]; then
fresh_cluster
echo ">> baseline: a bare client creates $APPS Deployments and Services in $NAMESPACES namespaces"
seq -f "base-%04g" 0 $((NAMESPACES - 1)) | xargs -P "$PARALLEL" -n 1 kubectl create namespace >/dev/null
make_files base Deployment
t0=$(now)
create_all base
echo "   the clients created every object after $(since "$t0")s"
# Until every Deployment is available (its pods ready, as an App's Healthy status says).
available() {
  kubectl get deployments -A -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.generation}={.status.observedGeneration}:{.spec.replicas}={.status.availableReplicas}{"\n"}{end}' \
    | awk -F'[ =:]' '$1 ~ /^base-/ && $2==$3 && $4==($5==""?0:$5)' | wc -l
}
until [ "$(available)" -ge "$APPS" ] \
  && [ "$(kubectl get services -A --no-headers 2>/dev/null | grep -c '^base-')" -ge "$APPS" ]; do sleep "$POLL"; done
baseline=$(since "$t0")
echo "   all $APPS Deployments available and Services created after ${baseline}s"
else
  baseline=null
  echo ">> baseline skipped (FLOTILLA_BENCH_BASELINE=0): no ratio in this run"
fi

# The floor: what no operator can write less than for a new App, written by the same clients
# without an operator. The App (the user's own write), its Deployment and Service, and one
# status write with what Flotilla's first status holds (its two conditions, the version and
# the replica counts). Each client creates its namespaces' objects, one kubectl per namespace
# as the bare client does, then applies all their statuses with one kubectl (one per
# namespace would add a process start for each, not a write).
FLOOR=${FLOTILLA_BENCH_FLOOR:-0}
floor=null
case $FLOOR in 0 | 1 | apps) ;; *) echo "error: FLOTILLA_BENCH_FLOOR is 0, 1 or apps" >&2; exit 1 ;; esac
if [ "$FLOOR" != 0 ]; then
fresh_cluster
floor_what="Apps, their Deployments, Services and statuses"
[ "$FLOOR" = apps ] && floor_what="Apps (no status), their Deployments and Services"
echo ">> floor: a bare client writes $APPS $floor_what (CRDs, no operator)"
kubectl apply --server-side -f crds/flotilla.dev.yaml >/dev/null
until kubectl get crd apps.flotilla.dev -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null | grep -q True; do sleep 0.2; done
seq -f "floor-%04g" 0 $((NAMESPACES - 1)) | xargs -P "$PARALLEL" -n 1 kubectl create namespace >/dev/null
make_files floor Deployment
make_files floor-app App
at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for f in "$WORK"/floor-app/*.yaml; do
  ns=$(basename "$f" .yaml)
  # The Apps go first in each namespace's file, as a user's create comes before the operator's.
  sed "s/namespace: floor-app-/namespace: floor-/" "$f" >"$WORK/floor/$ns.all"
  cat "$WORK/floor/${ns/floor-app-/floor-}.yaml" >>"$WORK/floor/$ns.all"
  grep -o 'name: app-[0-9]*' "$f" | while read -r _ name; do
    cat <<YAML
---
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: $name, namespace: ${ns/floor-app-/floor-}}
status:
  observedGeneration: 1
  currentVersion: "1"
  targetVersion: "1"
  replicas: 0
  readyReplicas: 0
  ready: 0/0
  phase: Healthy
  conditions:
  - {type: Ready, status: "True", reason: Available, message: "version 1 is available with 0/0 replicas ready", lastTransitionTime: "$at", observedGeneration: 1}
  - {type: Progressing, status: "True", reason: Available, message: "version 1 is available with 0/0 replicas ready", lastTransitionTime: "$at", observedGeneration: 1}
YAML
  done >"$WORK/floor/$ns.status"
  [ "$FLOOR" = 1 ] || : >"$WORK/floor/$ns.status"
done
rm -f "$WORK"/floor/floor-*.yaml
t0=$(now)
ls "$WORK"/floor/*.all | xargs -P "$PARALLEL" -n "$per_client" sh -c \
  'for f; do kubectl create -f "$f" >/dev/null; done
   for f; do cat "${f%.all}.status"; done >"${1%.all}.statuses"
   [ ! -s "${1%.all}.statuses" ] || kubectl apply --server-side --field-manager=floor --subresource=status -f "${1%.all}.statuses" >/dev/null' _
echo "   the clients wrote every object after $(since "$t0")s"
until [ "$(kubectl get deployments -A -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.generation}={.status.observedGeneration}:{.spec.replicas}={.status.availableReplicas}{"\n"}{end}' \
      | awk -F'[ =:]' '$1 ~ /^floor-/ && $2==$3 && $4==($5==""?0:$5)' | wc -l)" -ge "$APPS" ] \
  && { [ "$FLOOR" = apps ] || [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')" -ge "$APPS" ]; }; do sleep "$POLL"; done
floor=$(since "$t0")
echo "   all $APPS $floor_what written, the Deployments available, after ${floor}s"
fi

fresh_cluster
echo ">> Flotilla: CRDs, RBAC, $REPLICAS replicas, tenants onboarding $NAMESPACES namespaces"
bash hack/install-local.sh "$CLUSTER" "$WORK/op.kubeconfig"
for i in $ids; do
  # Pod-bound tokens, as in a cluster: the apiserver's shard fence evaluates every write.
  bash hack/operator-kubeconfig.sh "$CLUSTER" "$WORK/op-$i.kubeconfig" "scale-$i"
  profiler=(); [ "$i" = "$HEAPTRACK" ] && profiler=(heaptrack -o "$WORK/heap-$i")
  env_var=FLOTILLA_BENCH_ENV_$i
  # shellcheck disable=SC2086
  env ${!env_var:-} "${profiler[@]}" "$BIN" run --kubeconfig "$WORK/op-$i.kubeconfig" --admin-addr "127.0.0.1:$((9660 + i))" --webhook-addr 127.0.0.1:0 --replica-id "scale-$i" ${FLOTILLA_BENCH_OPERATOR_ARGS:-} \
    >"$WORK/scale-$i.log" 2>&1 &
  pid=$!
  if [ "$i" = "$HEAPTRACK" ]; then
    # The replica is heaptrack's child: its PID is the one measured and killed.
    HEAPTRACK_WRAPPER=$pid
    pid=$(heaptrack_child "$HEAPTRACK_WRAPPER" "$BIN" "$WORK/scale-$i.log")
  fi
  PIDS+=("$pid")
  echo "$pid" >"$WORK/pid-$i"
done
for i in $ids; do until curl -fs "127.0.0.1:$((9660 + i))/readyz" >/dev/null 2>&1; do sleep 0.2; done; done
# RSS of every replica, once a second: peak and steady come from here.
( while true; do
    for i in $ids; do
      # The PID from its file: a replica restarted by the failover has a new one.
      printf '%s %s %s\n' "$(date +%s)" "$i" "$(awk '/VmRSS/{print $2}' "/proc/$(cat "$WORK/pid-$i")/status" 2>/dev/null || echo 0)"
    done
    sleep 1
  done ) >"$WORK/rss" &
SAMPLER=$!
tenants=$(( (NAMESPACES + 99) / 100 ))
for t in $(seq 0 $((tenants - 1))); do
  first=$((t * 100)); last=$(( (t + 1) * 100 - 1 )); [ "$last" -ge "$NAMESPACES" ] && last=$((NAMESPACES - 1))
  list=$(seq -f "scale-%04g" "$first" "$last" | paste -sd, -)
  printf 'apiVersion: flotilla.dev/v1beta1\nkind: Tenant\nmetadata: {name: scale-%02d}\nspec: {namespaces: [%s]}\n' "$t" "$list" \
    | kubectl apply -f - >/dev/null
done
until [ "$(kubectl get tenants -o jsonpath='{range .items[*]}{.status.namespaces[*].state}{" "}{end}' | tr ' ' '\n' | grep -c '^Onboarded$')" -ge "$NAMESPACES" ]; do
  sleep 1
done
make_files scale App
echo ">> creating $APPS Apps"
conv_from=$(stamp)
t0=$(now); start=$(date +%s)
create_all scale
echo "   the clients created every App after $(since "$t0")s"
converged() {
  [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.metadata.generation}={.status.observedGeneration}:{.status.phase}{"\n"}{end}' \
      | awk -F'[=:]' '$1==$2 && $3=="Healthy"' | wc -l)" -ge "$APPS" ]
}
until converged; do sleep "$POLL"; done
flotilla=$(since "$t0"); converged_at=$(date +%s)
conv_to=$(stamp)
echo "   every App has its Deployment and a current Healthy status after ${flotilla}s"
# Where the time went, from the Apps themselves (the apiserver's timestamps, whole seconds):
# when the Apps were created and became Ready, from the first App's creation.
kubectl get apps -A -o jsonpath='{range .items[*]}{.metadata.creationTimestamp} {.status.conditions[?(@.type=="Ready")].lastTransitionTime}{"\n"}{end}' \
  | python3 -c '
import sys, datetime
t = lambda s: datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timestamp()
rows = [tuple(map(t, l.split())) for l in sys.stdin if len(l.split()) == 2]
if rows:
    t0 = min(c for c, _ in rows); made = sorted(c - t0 for c, _ in rows); ready = sorted(r - t0 for _, r in rows)
    lat = sorted(r - c for c, r in rows); q = lambda a, p: a[min(len(a) - 1, int(p * len(a)))]
    print("   from the first App created: the last created at %ds; Ready: half at %ds, 90%% at %ds, 99%% at %ds, all at %ds; each App created to Ready p50 %ds, p90 %ds, max %ds"
          % (made[-1], q(ready, .5), q(ready, .9), q(ready, .99), ready[-1], q(lat, .5), q(lat, .9), lat[-1]))
'

echo ">> idle for ${IDLE}s: writes by the operator in tenant namespaces"
idle_from=$(stamp)
sleep "$IDLE"
idle_writes=$(writes_count "$idle_from" "$(stamp)" scale-)
steady_at=$(date +%s)
# What each steady RSS is made of: anonymous pages (heap, stacks, the allocator's slack)
# against pages of the binary and its libraries, the threads, and the namespaces served.
declare -A made_of made_of_json
for i in $ids; do
  # Shards are not always split evenly: the namespaces served say what each replica holds.
  served=$(curl -fs --max-time 5 "127.0.0.1:$((9660 + i))/metrics" | awk '/^flotilla_namespaces_served /{print $2}') || served=
  read -r anon file threads < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} /^Threads/{t=$2}
    END{printf "%.0f %.0f %d\n", a/1024, f/1024, t}' "/proc/$(cat "$WORK/pid-$i")/status" 2>/dev/null || echo "0 0 0")
  made_of[$i]="$anon / $file MiB, $threads threads, ${served:-?} namespaces"
  made_of_json[$i]="\"steady_anonymous_mib\":$anon,\"steady_file_backed_mib\":$file,\"threads\":$threads,\"namespaces_served\":${served:-null}"
done

echo ">> $CHANGES changes of one App each, while all $APPS are present"
lat=()
for c in $(seq 1 "$CHANGES"); do
  ns=$(printf 'scale-%04d' $(( (c * 7919) % NAMESPACES ))); app="app-$(( c % per_ns ))"
  kubectl -n "$ns" get app "$app" >/dev/null 2>&1 || app=app-0
  t=$(now)
  kubectl -n "$ns" patch app "$app" --type=merge -p "{\"spec\":{\"version\":\"c$c\"}}" >/dev/null
  # Reconciled: the status is at the new generation and names the new version as its target
  # (the canary's first step has started; its pause is the App's own, not the operator's).
  until kubectl -n "$ns" get app "$app" -o jsonpath='{.metadata.generation}={.status.observedGeneration}:{.status.targetVersion}' \
    | awk -F'[=:]' -v v="c$c" '$1==$2 && $3==v {ok=1} END{exit !ok}'; do
    sleep 0.05
  done
  lat+=("$(since "$t")")
done
sorted=$(printf '%s\n' "${lat[@]}" | sort -n)
p50=$(echo "$sorted" | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
p99=$(echo "$sorted" | awk '{a[NR]=$1} END{i=int(NR*0.99+0.999); if(i<1)i=1; print a[i]}')

tck=$(getconf CLK_TCK)
# figures PID RSS_FILE KEY FROM TO AGENT: of one controller process, peak and steady RSS (its
# KEY's samples in RSS_FILE, steady between the unix times FROM and TO), CPU seconds,
# connections to the apiserver, and requests (audit events whose User-Agent contains AGENT;
# each system has a control plane of its own). Sets fig_json and fig_row.
figures() {
  local pid=$1 rss=$2 key=$3 from=$4 to=$5 agent=$6 peak steady cpu conns requests
  peak=$(awk -v r="$key" '$2==r && $3>m {m=$3} END{printf "%.0f", m/1024}' "$rss")
  steady=$(awk -v r="$key" -v a="$from" -v b="$to" '$2==r && $1>=a && $1<=b {s+=$3; n++} END{printf "%.0f", (n?s/n:0)/1024}' "$rss")
  cpu=$(awk -v t="$tck" '{printf "%.1f", ($14+$15)/t}' "/proc/$pid/stat")
  conns=$(ss -tnp 2>/dev/null | grep "pid=$pid," | grep -c ":$api_port " || true)
  requests=$(audit_between 0 9 | python3 -c '
import json, sys
print(len({e.get("auditID") for line in sys.stdin for e in [json.loads(line)] if sys.argv[1] in e.get("userAgent", "")}))' "$agent")
  fig_row="| $peak MiB | $steady MiB | $cpu s | $conns | $requests |"
  fig_json="\"peak_rss_mib\":$peak,\"steady_rss_mib\":$steady,\"cpu_seconds\":$cpu,\"apiserver_connections\":$conns,\"requests\":$requests"
}
rows=()
json_replicas=()
for i in $ids; do
  figures "${PIDS[$i]}" "$WORK/rss" "$i" "$converged_at" "$steady_at" "(scale-$i)"
  # Its RSS with every namespace onboarded, just before the first App: the base the Apps add to.
  onboarded=$(awk -v r="$i" -v a="$((start - 5))" -v b="$start" '$2==r && $1>=a && $1<=b {s+=$3; n++} END{printf "%.0f", (n?s/n:0)/1024}' "$WORK/rss")
  rows+=("| scale-$i $fig_row $onboarded MiB | ${made_of[$i]} |")
  env_var=FLOTILLA_BENCH_ENV_$i
  env_json=$(printf '%s' "${!env_var:-}" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read()))')
  heaptracked=false; [ "$i" = "$HEAPTRACK" ] && heaptracked=true
  json_replicas+=("{\"replica\":\"scale-$i\",$fig_json,\"onboarded_rss_mib\":$onboarded,${made_of_json[$i]},\"env\":$env_json,\"under_heaptrack\":$heaptracked}")
done
ratio=null; [ "$baseline" = null ] || ratio=$(awk "BEGIN{printf \"%.2f\", $flotilla / $baseline}")
floor_ratio=null; [ "$floor" = null ] || floor_ratio=$(awk "BEGIN{printf \"%.2f\", $flotilla / $floor}")

FAILOVER=${FLOTILLA_BENCH_FAILOVER:-1}
[ "$REPLICAS" -ge 2 ] || FAILOVER=0
if [ -n "$HEAPTRACK" ]; then
  # kill -9 frees nothing on the way out: what the profile still holds at its end is the heap
  # of the steady replica. The profile is kept beside bench/heap.sh's.
  FAILOVER=0
  echo ">> scale-$HEAPTRACK under heaptrack: RSS $(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/${PIDS[$HEAPTRACK]}/status") MiB; killing it (-9)"
  kill -9 "${PIDS[$HEAPTRACK]}" 2>/dev/null || true
  wait "$HEAPTRACK_WRAPPER" || true
  HEAPTRACK_WRAPPER=
  file=$(ls "$WORK"/heap-"$HEAPTRACK"* 2>/dev/null | head -1)
  [ -n "$file" ] || { echo "heaptrack wrote no profile; its output:" >&2; cat "$WORK/scale-$HEAPTRACK.log" >&2; exit 1; }
  mkdir -p "$FLOTILLA_CACHE/heap"
  kept="$FLOTILLA_CACHE/heap/$(date -u +%Y%m%dT%H%M%SZ)-scale-$(basename "$file")"
  cp "$file" "$kept"
  echo ">> profile kept in $kept"
  # A failed analysis loses the profile's reading, not the run's figures.
  python3 bench/heap_holders.py "$file" leaked 40 | tee "$kept.holders.txt" || echo "   (the profile could not be read: heaptrack_print $kept)"
fi
if [ "$FAILOVER" = 1 ]; then
  # Failover with every App present: kill -9 of one replica, then (once it is back, as in a
  # rolling upgrade) SIGTERM of another. After each, one App is changed in each of SAMPLE
  # namespaces spread over the shards (about a third of them served by the replica that went
  # away), and the time until all of them are reconciled is measured from the kill.
  SAMPLE=${FLOTILLA_BENCH_FAILOVER_SAMPLE:-30}
  holders() { kubectl -n flotilla-system get leases -l flotilla.dev/lease=shard -o jsonpath='{range .items[*]}{.spec.holderIdentity}{"\n"}{end}'; }
  held_by() { # held_by ID...: every shard held by one of IDs
    holders | awk -v ids="$*" 'BEGIN{n=split(ids,a," "); for(i=1;i<=n;i++) ok[a[i]]=1} {t++; if(!($0 in ok)) bad=1} END{exit (t>0 && !bad)?0:1}'
  }
  sample_ns() { for c in $(seq 1 "$SAMPLE"); do printf 'scale-%04d\n' $(( (c * 7919 + 13) % NAMESPACES )); done | sort -u; }
  change_sample() { # change_sample VERSION: patch app-0 of every sampled namespace, PARALLEL at a time
    sample_ns | xargs -P "$PARALLEL" -I{} kubectl -n {} patch app app-0 --type=merge -p "{\"spec\":{\"version\":\"$1\"}}" >/dev/null
  }
  sample_at() { # every sampled App reports VERSION
    local ns
    for ns in $(sample_ns); do
      kubectl -n "$ns" get app app-0 -o jsonpath='{.metadata.generation}={.status.observedGeneration}:{.status.targetVersion}' \
        | awk -F'[=:]' -v v="$1" '$1==$2 && $3==v {ok=1} END{exit !ok}' || return 1
    done
  }
  leases_of() { # leases_of ID: the shard Leases ID holds
    kubectl -n flotilla-system get leases -l flotilla.dev/lease=shard \
      -o jsonpath='{range .items[*]}{.metadata.name} {.spec.holderIdentity}{"\n"}{end}' | awk -v id="$1" '$2==id {print $1}'
  }
  acquired_after() { # acquired_after T0 LEASE...: seconds from T0 to the last of the LEASEs'
    # acquisitions, as each new holder stamped it (spec.acquireTime, in microseconds, from the
    # same clock as T0); null unless all were acquired after T0
    kubectl -n flotilla-system get leases -l flotilla.dev/lease=shard -o json | python3 -c '
import datetime, json, sys
t0, names = float(sys.argv[1]), set(sys.argv[2:])
stamps = [datetime.datetime.fromisoformat(l["spec"]["acquireTime"].replace("Z", "+00:00")).timestamp()
          for l in json.load(sys.stdin)["items"]
          if l["metadata"]["name"] in names and l.get("spec", {}).get("acquireTime")]
late = [t - t0 for t in stamps if t > t0]
print("%.2f" % max(late) if names and len(late) == len(names) else "null")' "$@"
  }
  reconciled_after() { # reconciled_after T0 FROM: from the audit log (events since the stamp
    # FROM, just before T0), for each sampled namespace the first status write of app-0 by a
    # replica (an idle replica writes none: this is the change's); prints the seconds from T0
    # to the last of them and their p50, or null if one is missing. Exact where a poll of 30
    # Apps one by one adds up to its own length (seconds on a loaded apiserver).
    audit_between "$2" 9 | python3 -c '
import datetime, json, sys
t0, names = float(sys.argv[1]), set(sys.argv[2:])
ts = lambda e: datetime.datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")).timestamp()
written = {}
for line in sys.stdin:
    e = json.loads(line)
    ref = e.get("objectRef", {})
    ns = ref.get("namespace")
    if e.get("stage") != "ResponseComplete" or ns not in names or ref.get("resource") != "apps" or ref.get("name") != "app-0":
        continue
    if e.get("verb") not in ("update", "patch") or e.get("responseStatus", {}).get("code", 500) >= 300:
        continue
    if ref.get("subresource") == "status" and e.get("userAgent", "").startswith("flotilla/") and ts(e) > t0:
        written[ns] = min(written.get(ns, ts(e)), ts(e))
late = sorted(t - t0 for t in written.values())
print("%.2f %.2f" % (late[-1], late[len(late) // 2]) if len(late) == len(names) else "null null")' "$1" $(sample_ns)
  }
  failover_step() { # failover_step SIGNAL I VERSION SURVIVOR...: signals replica I while the
    # sample is changed to VERSION; sets step_held (every shard of replica I acquired by a
    # SURVIVOR, from the Leases' acquireTime), step_polled (the same seen by a poll of the
    # Leases every 0.2 s, which adds up to a poll's time), step_reconciled and
    # step_reconciled_p50 (every changed App reconciled, from the audit log) and
    # step_reconciled_polled (the same seen by a poll), in seconds from the signal.
    local signal=$1 victim=$2 version=$3 t0 changer lost from
    shift 3
    lost=$(leases_of "scale-$victim")
    from=$(stamp)
    t0=$(now)
    kill "-$signal" "${PIDS[$victim]}"
    change_sample "$version" &
    changer=$!
    until held_by "$@"; do sleep 0.2; done
    step_polled=$(since "$t0")
    # shellcheck disable=SC2086
    step_held=$(acquired_after "$t0" $lost)
    wait "$changer"
    until sample_at "$version"; do sleep 0.5; done
    step_reconciled_polled=$(since "$t0")
    read -r step_reconciled step_reconciled_p50 < <(reconciled_after "$t0" "$from")
  }
  start_replica() { # start_replica I
    local env_var=FLOTILLA_BENCH_ENV_$1
    # shellcheck disable=SC2086
    env ${!env_var:-} "$BIN" run --kubeconfig "$WORK/op-$1.kubeconfig" --admin-addr "127.0.0.1:$((9660 + $1))" --webhook-addr 127.0.0.1:0 --replica-id "scale-$1" ${FLOTILLA_BENCH_OPERATOR_ARGS:-} \
      >>"$WORK/scale-$1.log" 2>&1 &
    PIDS[$1]=$!
    echo "$!" >"$WORK/pid-$1"
  }
  failover_from=$(date +%s)
  echo ">> failover with $APPS Apps present: kill -9 of scale-0, changes in $(sample_ns | wc -l) namespaces"
  # shellcheck disable=SC2046
  failover_step KILL 0 f1 $(printf 'scale-%s ' $(seq 1 $((REPLICAS - 1))))
  kill_held=$step_held kill_polled=$step_polled kill_reconciled=$step_reconciled kill_rec_p50=$step_reconciled_p50 kill_rec_polled=$step_reconciled_polled
  echo "   every shard held by the survivors after ${kill_held}s (seen by the poll after ${kill_polled}s); every changed App reconciled after ${kill_reconciled}s (p50 ${kill_rec_p50}s; seen by the poll after ${kill_rec_polled}s)"
  echo ">> scale-0 restarts (a rolling upgrade's next step)"
  t0=$(now)
  start_replica 0
  until curl -fs 127.0.0.1:9660/readyz >/dev/null 2>&1 && holders | grep -qx scale-0; do sleep 0.2; done
  rejoin=$(since "$t0")
  echo "   scale-0 holds shards again after ${rejoin}s"
  echo ">> SIGTERM of scale-1, changes in the same namespaces"
  # shellcheck disable=SC2046
  failover_step TERM 1 f2 $(printf 'scale-%s ' $(seq 0 $((REPLICAS - 1))) | sed 's/scale-1 //')
  term_held=$step_held term_polled=$step_polled term_reconciled=$step_reconciled term_rec_p50=$step_reconciled_p50 term_rec_polled=$step_reconciled_polled
  echo "   every shard held by the others after ${term_held}s (seen by the poll after ${term_polled}s); every changed App reconciled after ${term_reconciled}s (p50 ${term_rec_p50}s; seen by the poll after ${term_rec_polled}s)"
  failover_peak=$(awk -v a="$failover_from" '$1>=a && $3>m {m=$3} END{printf "%.0f", m/1024}' "$WORK/rss")
  failover_json=",\"failover\":{\"sample_namespaces\":$(sample_ns | wc -l),\"kill9_shards_held_seconds\":$kill_held,\"kill9_shards_held_polled_seconds\":$kill_polled,\"kill9_reconciled_seconds\":$kill_reconciled,\"kill9_reconciled_p50_seconds\":$kill_rec_p50,\"kill9_reconciled_polled_seconds\":$kill_rec_polled,\"restart_holds_shards_seconds\":$rejoin,\"sigterm_shards_held_seconds\":$term_held,\"sigterm_shards_held_polled_seconds\":$term_polled,\"sigterm_reconciled_seconds\":$term_reconciled,\"sigterm_reconciled_p50_seconds\":$term_rec_p50,\"sigterm_reconciled_polled_seconds\":$term_rec_polled,\"peak_rss_mib\":$failover_peak}"
fi

# Read from this control plane's audit log before the next system replaces it.
writes "$conv_from" "$conv_to" scale- "$APPS" >"$WORK/flotilla-writes.md"

if [ "$WITH_ARGO" = 1 ]; then
  # Argo Rollouts on a control plane of its own, once Flotilla's replicas are stopped: the
  # same count of canary Rollouts and Services created by the same clients. It runs outside the cluster like the operator's replicas, with its default
  # flags (one replica, leader election on, 40 requests/s) and a token of its own
  # ServiceAccount bound to its upstream ClusterRole, so that the audit log counts its writes.
  echo ">> Argo Rollouts $ARGO_ROLLOUTS_VERSION: Flotilla stopped, $APPS canary Rollouts and Services"
  for i in $ids; do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; done
  for i in $ids; do while kill -0 "${PIDS[$i]}" 2>/dev/null; do sleep 0.2; done; done
  kill "$SAMPLER" 2>/dev/null || true
  fresh_cluster
  kubectl create namespace argo-rollouts >/dev/null
  kubectl -n argo-rollouts create serviceaccount argo-rollouts >/dev/null
  kubectl apply -f "$ARGO_ROLLOUTS_BIN/clusterrole.yaml" >/dev/null
  kubectl create clusterrolebinding argo-rollouts --clusterrole=argo-rollouts --serviceaccount=argo-rollouts:argo-rollouts >/dev/null
  cp "$KUBECONFIG" "$WORK/argo.kubeconfig"
  kubectl --kubeconfig "$WORK/argo.kubeconfig" config set-credentials argo-rollouts \
    --token="$(kubectl -n argo-rollouts create token argo-rollouts --duration=24h)" >/dev/null
  kubectl --kubeconfig "$WORK/argo.kubeconfig" config set-context --current --user=argo-rollouts >/dev/null
  kubectl apply --server-side -f "$ARGO_ROLLOUTS_BIN/rollout-crd.yaml" -f "$ARGO_ROLLOUTS_BIN/analysis-run-crd.yaml" \
    -f "$ARGO_ROLLOUTS_BIN/analysis-template-crd.yaml" -f "$ARGO_ROLLOUTS_BIN/cluster-analysis-template-crd.yaml" \
    -f "$ARGO_ROLLOUTS_BIN/experiment-crd.yaml" >/dev/null
  until kubectl wait --for=condition=Established crd/rollouts.argoproj.io --timeout=60s >/dev/null 2>&1; do sleep 0.5; done
  seq -f "argo-%04g" 0 $((NAMESPACES - 1)) | xargs -P "$PARALLEL" -n 1 kubectl create namespace >/dev/null
  make_files argo Rollout
  POD_NAMESPACE=argo-rollouts "$ARGO_ROLLOUTS_BIN/rollouts-controller" --kubeconfig "$WORK/argo.kubeconfig" \
    --metricsPort 9680 --healthzPort 9681 >"$WORK/argo.log" 2>&1 &
  ARGO=$!
  PIDS+=("$ARGO")
  until curl -fs 127.0.0.1:9681/healthz >/dev/null 2>&1 && grep -q "I am the new leader" "$WORK/argo.log"; do
    kill -0 "$ARGO" 2>/dev/null || { tail -20 "$WORK/argo.log"; echo "error: rollouts-controller exited" >&2; exit 1; }
    sleep 0.2
  done
  ( while true; do printf '%s argo %s\n' "$(date +%s)" "$(awk '/VmRSS/{print $2}' "/proc/$ARGO/status" 2>/dev/null || echo 0)"; sleep 1; done ) >"$WORK/rss-argo" &
  SAMPLER=$!
  argo_from=$(stamp)
  t0=$(now)
  create_all argo
  # Bounded: a Rollout that never turns Healthy must not hold the run for ever.
  argo_timeout=${FLOTILLA_BENCH_ARGO_TIMEOUT:-3600}
  until argo_healthy=$(kubectl get rollouts.argoproj.io -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')
    [ "$argo_healthy" -ge "$APPS" ]; do
    if [ "$(( $(date +%s) - ${t0%.*} ))" -ge "$argo_timeout" ]; then
      echo "   only $argo_healthy of $APPS Rollouts Healthy after ${argo_timeout}s: stopped waiting (FLOTILLA_BENCH_ARGO_TIMEOUT)"
      break
    fi
    sleep "$POLL"
  done
  argo=$(since "$t0"); argo_converged_at=$(date +%s)
  argo_to=$(stamp)
  echo "   $argo_healthy of $APPS Rollouts Healthy after ${argo}s"
  echo ">> idle for ${IDLE}s"
  argo_idle_from=$(stamp)
  sleep "$IDLE"
  argo_idle_writes=$(writes_count "$argo_idle_from" "$(stamp)" argo-)
  argo_steady_at=$(date +%s)
  argo_idle_to=$(stamp)
  figures "$ARGO" "$WORK/rss-argo" argo "$argo_converged_at" "$argo_steady_at" rollouts-controller/
  argo_row=$fig_row
  argo_ratio=null; [ "$baseline" = null ] || argo_ratio=$(awk "BEGIN{printf \"%.2f\", $argo / $baseline}")
  argo_converged=false; [ "$argo_healthy" -lt "$APPS" ] || argo_converged=true
  argo_json=",\"argo_rollouts\":{\"version\":\"$ARGO_ROLLOUTS_VERSION\",\"seconds\":$argo,\"healthy\":$argo_healthy,\"converged\":$argo_converged,\"ratio\":$argo_ratio,\"idle_writes\":$argo_idle_writes,$fig_json}"
fi

mkdir -p bench/results
out=bench/results/scale-$(date -u +%Y%m%dT%H%M%SZ).json
cat >"$out" <<JSON
{"namespaces":$NAMESPACES,"apps":$APPS,"pod_replicas_per_app":$POD_REPLICAS,"parallel_clients":$PARALLEL,
 "baseline_seconds":$baseline,"flotilla_seconds":$flotilla,"ratio":$ratio,"floor":"$FLOOR","floor_seconds":$floor,"ratio_to_floor":$floor_ratio,
 "idle_seconds":$IDLE,"idle_writes":$idle_writes,
 "change_latency_seconds":{"p50":$p50,"p99":$p99,"samples":[$(IFS=,; echo "${lat[*]}")]},
 "operator_replicas":$REPLICAS,"operator_args":$(printf '%s' "${FLOTILLA_BENCH_OPERATOR_ARGS:-}" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))'),
 "operator_env":$(for i in $ids; do v=FLOTILLA_BENCH_ENV_$i; printf '%s\n' "${!v:-}"; done | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().splitlines()))'),"replicas":[$(IFS=,; echo "${json_replicas[*]}")]${failover_json:-}${argo_json:-}}
JSON

echo
echo "Scale: $NAMESPACES namespaces, $APPS Apps ($POD_REPLICAS pods each), $REPLICAS replicas; raw figures in $out"
echo
echo "| measurement | result | goal |"
echo "|---|---|---|"
# A skipped baseline (FLOTILLA_BENCH_BASELINE=0) prints as "-".
unit() { [ "$1" = null ] && echo - || echo "$1$2"; }
echo "| bare client: $APPS Deployments available and Services created | $(unit "$baseline" s) | |"
echo "| Flotilla: every App has its Deployment and current status | ${flotilla}s | |"
echo "| ratio Flotilla / bare client | $(unit "$ratio" x) | <= 1.3x |"
if [ "$floor" != null ]; then
  echo "| floor: a bare client writes $APPS $floor_what | ${floor}s | |"
  echo "| ratio Flotilla / floor | $(unit "$floor_ratio" x) | |"
fi
echo "| writes by the operator in ${IDLE} idle seconds | $idle_writes | 0 |"
echo "| one changed App's rollout started (status at the new generation and version; p50 / p99 over $CHANGES) | ${p50}s / ${p99}s | p99 <= 1 s |"
if [ "$FAILOVER" = 1 ]; then
  echo "| kill -9 of a replica: every shard held by the survivors / changed Apps in $(sample_ns | wc -l) namespaces reconciled | ${kill_held}s / ${kill_reconciled}s (p50 ${kill_rec_p50}s) | p99 <= 10 s (reconciled) |"
  echo "| SIGTERM of a replica: every shard held by the others / changed Apps reconciled | ${term_held}s / ${term_reconciled}s (p50 ${term_rec_p50}s) | <= 2 s (held) |"
  echo "| peak RSS of a replica during the failovers (the survivors serve more namespaces) | ${failover_peak} MiB | |"
fi
echo
echo "Writes by the operator in the tenant namespaces per App, until every App converged (audit"
echo "log; the bare client writes two objects per App, its Deployment and Service; the"
echo "controller-manager's writes for the Deployments are the same in both runs):"
echo
cat "$WORK/flotilla-writes.md"
if [ "$WITH_ARGO" = 1 ]; then
  echo
  echo "Argo Rollouts $ARGO_ROLLOUTS_VERSION, same count of canary Rollouts and Services:"
  echo
  echo "| measurement | bare client | Flotilla ($REPLICAS replicas) | Argo Rollouts (1 replica) |"
  echo "|---|---|---|---|"
  echo "| time until everything exists / converged | $(unit "$baseline" s) | ${flotilla}s ($(unit "$ratio" x)) | ${argo}s ($(unit "$argo_ratio" x)) |"
  echo "| writes in ${IDLE} idle seconds | | $idle_writes | $argo_idle_writes |"
  # Sums over table rows "| name | peak MiB | steady MiB | cpu s | ...".
  rss_total() { sed 's/ MiB//g' | awk -F'|' '{p+=$3; s+=$4} END{printf "%d / %d MiB", p, s}'; }
  cpu_total() { awk -F'|' '{gsub(/ s/,"",$5); c+=$5} END{printf "%.1f", c}'; }
  echo "| peak / steady RSS, all replicas | | $(printf '%s\n' "${rows[@]}" | rss_total) | $(echo "| argo $argo_row" | rss_total) |"
  echo "| CPU seconds, all replicas | | $(printf '%s\n' "${rows[@]}" | cpu_total) | $(echo "| argo $argo_row" | cpu_total) |"
  echo
  echo "Writes per Rollout until every Rollout was Healthy (audit log):"
  echo
  writes "$argo_from" "$argo_to" argo- "$APPS"
  if [ "$argo_idle_writes" -gt 0 ]; then
    echo
    echo "Argo Rollouts' writes in the ${IDLE} idle seconds, per Rollout:"
    echo
    writes "$argo_idle_from" "$argo_idle_to" argo- "$APPS"
  fi
fi
echo
echo "| replica | peak RSS | steady RSS | CPU | apiserver connections | requests sent | RSS before the first App | steady: anonymous / file-backed, threads, namespaces served |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
