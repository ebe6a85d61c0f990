#!/usr/bin/env bash
# Runs the test binaries cargo built (`cargo test --no-run --message-format=json` on stdin)
# in two queues side by side, one binary at a time in each:
# - the tests that bring up a control plane of their own (support::use_private_cluster:
#   chaos, sharding, scale, conversion), which are isolated from everything else;
# - all the others, which share the cluster of hack/test.sh (flotilla-test) one after the
#   other, as they always have, plus the rest of the private ones to even the queues out.
# Each binary's output is printed whole when it ends. Exits non-zero if any binary failed,
# after both queues have run, naming them.
#   cargo test --no-run --message-format=json >built.json; bash hack/test-queues.sh <built.json
# FLOTILLA_TEST_QUEUES=1 runs everything in one queue, in cargo's order.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "name path" of every test executable: the lib's and the binary's unit tests, then each
# file of tests/.
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
' >"$out/all"
[ -s "$out/all" ] || { echo "error: cargo built no test binary" >&2; exit 1; }

# The first queue, in this order: the longest first, so that the queues end together
# (chaos about 240 s, sharding 160 s, scale 150 s, conversion 12 s, measured one after the
# other; the second queue's share is about 590 s).
own=(chaos sharding scale conversion)
: >"$out/q1"
: >"$out/q2"
if [ "${FLOTILLA_TEST_QUEUES:-2}" = 1 ]; then
  cp "$out/all" "$out/q2"
else
  for name in "${own[@]}"; do grep "^$name " "$out/all" >>"$out/q1" || true; done
  grep -v -E "^($(IFS='|'; echo "${own[*]}")) " "$out/all" >"$out/q2" || true
fi

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
    [ "$rc" = 0 ] || echo "$name" >>"$out/failed"
  done <"$1"
}

run_queue "$out/q1" &
first=$!
run_queue "$out/q2"
wait "$first"
if [ -s "$out/failed" ]; then
  echo >&2
  echo "error: these test binaries failed (their output is above): $(tr '\n' ' ' <"$out/failed")" >&2
  exit 1
fi
