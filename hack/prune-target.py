"""Deletes the crate's own stale build outputs from cargo's target dir.

Each change of the dependency graph or of the build flags gives the crate's test binaries
new names (a new hash); cargo never deletes the old ones, and each is 400 MB with its line
tables. The shared target dir outside the clone grew to 37 GB in a few days and filled the
disk mid-build. Reads `cargo test --no-run --message-format=json` on stdin (what was just
built) and deletes, in the directories those outputs are in, every other file named after
one of the crate's own targets (`<target>-<16 hex digits>...`). Dependencies' outputs are
left alone: their names do not change with the crate's sources.

    cargo test --no-run --message-format=json | python3 hack/prune-target.py
"""
import json
import os
import re
import sys

current = set()
dirs = set()
targets = set()
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    # The crate is the only package built from a path (its dependencies come from a registry).
    if m.get("reason") != "compiler-artifact" or not m.get("package_id", "").startswith("path+"):
        continue
    names = {m["target"]["name"].replace("-", "_")}
    for path in m.get("filenames", []) + ([m["executable"]] if m.get("executable") else []):
        current.add(os.path.basename(path))
        dirs.add(os.path.dirname(path))
    targets |= names
targets |= {"lib" + t for t in targets}
freed = 0
pattern = re.compile(r"^(.*)-([0-9a-f]{16})(\..*)?$")
for d in dirs:
    current_hashes = {pattern.match(f).group(2) for f in current if pattern.match(f)}
    for f in os.listdir(d):
        m = pattern.match(f)
        if not m or m.group(1) not in targets or m.group(2) in current_hashes:
            continue
        path = os.path.join(d, f)
        try:
            freed += os.path.getsize(path)
            os.remove(path)
        except OSError:
            pass
print(f"pruned {freed / 1e9:.1f} GB of the crate's stale build outputs from {sorted(dirs)}")
