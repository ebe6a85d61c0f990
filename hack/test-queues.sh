#!/usr/bin/env bash
# Runs the test binaries cargo built (`cargo test --no-run --message-format=json` on stdin)
# in queues side by side, one binary at a time in each, grouped so that binaries that would
# disturb one another never run at once (see the queues below). Each binary's output is
# printed whole when it ends, under a line with its time and exit code. Exits non-zero if
# any binary failed, once every queue has run, naming them.
#   cargo test --no-run --message-format=json >built.json; bash hack/test-queues.sh <built.json
# FLOTILLA_TEST_QUEUES=1 runs everything one after another, by name (2 queues by default).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The binaries' temporary files (operators' logs, kubeconfigs, Prometheus and Jaeger data,
# audit logs) go under this run's directory and leave with it: named by test and process,
# they piled up in /tmp run after run. A failed binary's operator logs are copied out first.
mkdir "$out/tmp"
export TMPDIR=$out/tmp

# "name path" of every test executable (the lib's and the binary's unit tests, and each file
# of tests/), by name: cargo lists them in the order they finished building, and the order
# of the binaries that share a cluster is kept the same from run to run.
python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = t["name"] if t["kind"] == ["test"] else t["kind"][0]
        print(name, m["executable"])
' | sort -k1,1 >"$out/all"
[ -s "$out/all" ] || { echo "error: cargo built no test binary" >&2; exit 1; }

# The queues, each in its order. Binaries named nowhere go to the last queue. Times are one
# warm CI run's, binaries one after another.
# - First queue: the binaries with a control plane of their own
#   (support::use_private_cluster): sharding 165 s, chaos 233, scale 152, in_cluster 83,
#   hostile_webhook 30, conversion 15, hostile_views 4 (CRD changed for a moment),
#   streaming_lists_off 10. One at a time: kwokctl picks
#   a new cluster's ports by probing for free ones, and sharding stops its control plane for
#   20 s and starts it again on the same ports, which a cluster made meanwhile could take.
# - Second queue: everything that shares the cluster of hack/test.sh, one at a time as
#   before (about 490 s). Not two at once: a sharded replica (hostile_analysis, tenancy, ...
#   run one without --namespace) marks every App of a namespace no Tenant onboarded as
#   Degraded, which is what every single-namespace test's namespace is; health_gate cordons
#   every node.
case ${FLOTILLA_TEST_QUEUES:-2} in
  1) queues=("") ;;
  2) queues=("sharding chaos scale in_cluster hostile_webhook conversion hostile_views streaming_lists_off" "") ;;
  *) echo "error: FLOTILLA_TEST_QUEUES is 1 or 2" >&2; exit 1 ;;
esac
last=$(( ${#queues[@]} - 1 ))
named=()
for q in $(seq 0 "$last"); do
  : >"$out/q$q"
  for name in ${queues[$q]}; do
    grep "^$name " "$out/all" >>"$out/q$q" || true
    named+=("$name")
  done
done
if [ ${#named[@]} -gt 0 ]; then
  grep -v -E "^($(IFS='|'; echo "${named[*]}")) " "$out/all" >>"$out/q$last" || true
else
  cat "$out/all" >>"$out/q$last"
fi

# keep_logs NAME T0: the operators' logs that a failed binary's run wrote (the next run of the
# same test overwrites them), copied out of the temp dir to a directory named on stderr.
keep_logs() {
  local dir
  dir=${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/failed-tests/$(date -u +%Y%m%dT%H%M%SZ)-$1
  mkdir -p "$dir"
  find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'flotilla-e2e-*.log' -newermt "@$2" -exec cp {} "$dir/" \; 2>/dev/null || true
  echo "$1 failed: the operators' logs of its run are kept in $dir" >&2
}

run_queue() { # run_queue FILE: each binary in turn; its output printed when it ends
  local name exe t0 rc
  while read -r name exe; do
    t0=$(date +%s)
    rc=0
    CARGO_MANIFEST_DIR=$root "$exe" >"$out/$name.log" 2>&1 </dev/null || rc=$?
    {
      echo
      echo "-- $name ($(( $(date +%s) - t0 ))s, exit $rc): $exe"
      cat "$out/$name.log"
    } >"$out/$name.block"
    # One block at a time on stdout, whichever queue ends first.
    flock "$out/print.lock" cat "$out/$name.block"
    [ "$rc" = 0 ] || { echo "$name" >>"$out/failed"; keep_logs "$name" "$t0"; }
  done <"$1"
}

pids=()
for q in $(seq 0 "$last"); do
  run_queue "$out/q$q" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
if [ -s "$out/failed" ]; then
  echo >&2
  echo "error: these test binaries failed (their output is above): $(tr '\n' ' ' <"$out/failed")" >&2
  exit 1
fi
