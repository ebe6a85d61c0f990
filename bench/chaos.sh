#!/usr/bin/env bash
# Chaos at size: tests/chaos.rs run longer and bigger (3 replicas under the operator's real
# ServiceAccount, a fault every few seconds on a random replica, App versions changing all
# along, a quarter of them failing their canary analysis against a real Prometheus), on its
# private local control plane. Prints the figures, also when the test's assertions fail.
#
#   bash bench/chaos.sh [SECONDS] [APPS]      default 600 s of faults, 500 Apps (5 per namespace)
#   FLOTILLA_CHAOS_FAULT_EVERY=3 FLOTILLA_CHAOS_SEED=42 FLOTILLA_CHAOS_PROFILE=debug bash bench/chaos.sh 120 200
#
# Figures: faults injected (by kind), version changes, failing versions given, shard Lease
# writes and ownership intervals in the apiserver audit log, namespace writes checked against
# them, writes the apiserver refused (and how many of those came from a writer without a
# current hold), violations (overlap: another replica held the shard; stale: the writer's
# hold had lapsed), failing versions ever promoted, Apps not settled, and the time from the
# end of the last fault until every App was at its last version (or rolled back from it).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
export FLOTILLA_CHAOS_SECONDS=${1:-600}
export FLOTILLA_CHAOS_APPS=${2:-500}
export FLOTILLA_CHAOS_CONVERGE_SECONDS=${FLOTILLA_CHAOS_CONVERGE_SECONDS:-600}
PROFILE=${FLOTILLA_CHAOS_PROFILE:-release}
profile_flag=()
[ "$PROFILE" = release ] && profile_flag=(--release)
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}

bash hack/prerequisites.sh
# A fresh cluster: Apps and Tenants left by an earlier run would be served (and counted) too.
bash hack/cluster.sh down flotilla-test-chaos >/dev/null 2>&1 || true
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
set +e
cargo test --locked "${profile_flag[@]}" --test chaos -- --nocapture 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
took=$(( $(date +%s) - start ))

line=$(grep -o 'chaos figures: .*' "$out" | tail -1 || true)
if [ -z "$line" ]; then
  echo "error: the chaos test printed no figures (exit $status); see the output above" >&2
  exit 1
fi
fig() { echo "$line" | grep -o "$1=[^ ]*" | head -1 | cut -d= -f2-; }
echo
echo "| figure | value |"
echo "|---|---|"
echo "| Apps / namespaces | $(fig apps) / $(fig namespaces) |"
echo "| chaos phase | $(fig chaos) |"
echo "| faults | $(fig faults) $(echo "$line" | grep -o '{[^}]*}' | head -1) |"
echo "| version changes (failing ones) | $(fig version_changes) ($(fig failing_versions_given)) |"
echo "| shard Lease writes / ownership intervals | $(fig lease_writes) / $(fig ownership_intervals) |"
echo "| namespace writes checked | $(fig writes_checked) |"
echo "| writes refused by the apiserver (from a writer without a current hold) | $(fig writes_refused) ($(fig stale_writes_refused)) |"
echo "| of which refused by the apiserver's shard fence (403) | $(fig refused_by_shard_fence) |"
echo "| violating writes (overlap / stale) | $(fig violations) $(echo "$line" | grep -o '(overlap=[^)]*)') |"
echo "| failing versions promoted | $(fig failed_versions_promoted) |"
echo "| Apps not settled | $(fig unsettled_apps) |"
echo "| converged after the last fault | $(fig converged_after_last_fault) |"
echo "| SIGTERMed replicas that did not exit in 20 s | $(fig sigterm_hangs) |"
echo "| seed | $(fig seed) |"
echo "| wall time (build included) | ${took}s |"
echo
echo "test exit status: $status"
exit "$status"
