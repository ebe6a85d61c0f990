#!/usr/bin/env python3
"""What holds a heaptrack profile's memory, by holder.

    python3 bench/heap_holders.py PROFILE peak|leaked [TOP]

peak:   the heap at its peak;
leaked: what was still allocated when the profile ended, which is the heap of the moment
        the process was killed (kill -9: nothing was freed on the way out).

Each allocation's stack is named by its innermost frames outside the allocator and the
standard containers (a cache's reflector, a serde_json value, an h2 buffer...), innermost
first. Needs heaptrack_print and c++filt (Debian packages heaptrack and binutils).
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

if len(sys.argv) < 3 or sys.argv[2] not in ("peak", "leaked"):
    sys.exit("usage: heap_holders.py PROFILE peak|leaked [TOP]")
profile, cost_type = sys.argv[1], sys.argv[2]
top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
with tempfile.TemporaryDirectory() as work:
    folded = os.path.join(work, "folded")
    subprocess.run(
        ["heaptrack_print", "-f", profile, "--print-peaks", "0", "--print-allocators", "0",
         "--print-temporary", "0", "--print-leaks", "0", "--print-flamegraph", folded,
         "--flamegraph-cost-type", cost_type],
        check=True, stdout=subprocess.DEVNULL)
    rows, frames = [], set()
    for line in open(folded):
        stack, _, cost = line.rstrip().rpartition(" ")
        fs = stack.split(";")
        rows.append((fs, int(cost)))
        frames.update(fs)
# Frames are Rust v0 symbols with their file's name, "sym (file.rs)": demangled with c++filt.
frames = sorted(frames)
names = [f.rsplit(" (", 1)[0] if f.endswith(")") else f for f in frames]
out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True).stdout.split("\n")
plain = {}
for f, o in zip(frames, out):
    file = f.rsplit(" (", 1)[1][:-1] if f.endswith(")") else ""
    plain[f] = (re.sub(r"\[[0-9a-f]{16}\]", "", o), file)
std = re.compile(r"^(alloc|mod|slice|boxed|string|sync|rc|map|clone|spec_from_iter.*|spec_extend|raw|cow|borrow|node"
                 r"|fmt|function|ops|option|result|iterator|collect|in_place_collect|set|append|entry|search|heaptrack.*)\.rs$|^$")
by, total = collections.Counter(), 0
for fs, cost in rows:
    total += cost
    kept = [(n, f) for n, f in (plain[x] for x in fs) if not std.match(f) and "malloc" not in n]
    by[" < ".join(f"{n[:60]} ({f})" for n, f in kept[-3:][::-1]) if kept else "?"] += cost
if total == 0:
    sys.exit(f"{profile}: no {cost_type} memory in the profile")
what = {"peak": "heap at peak", "leaked": "heap when the profile ended"}.get(cost_type, cost_type)
print(f"{what}: {total / 2**20:.1f} MiB; largest holders (innermost frames outside alloc/core/std):")
for name, cost in by.most_common(top):
    print(f"  {cost / 2**20:7.2f} MiB  {100 * cost / total:5.1f}%  {name}")
