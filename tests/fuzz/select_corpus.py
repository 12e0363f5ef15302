#!/usr/bin/env python3
"""Picks a small seed corpus from a libFuzzer merge control file: a greedy set cover of the coverage edges
(COV lines), taking inputs while each adds at least MIN_GAIN new edges. libFuzzer's own -merge=1 keeps
every input that adds a feature (edge hit-count buckets included), which is hundreds of files.

  fuzz_safetensors -merge=1 -merge_control_file=merge.ctl merged/ tests/fuzz/corpus work/
  select_corpus.py merge.ctl tests/fuzz/corpus [MIN_GAIN]
"""
import os
import shutil
import sys

control, out_dir = sys.argv[1], sys.argv[2]
min_gain = int(sys.argv[3]) if len(sys.argv) > 3 else 10
lines = open(control).read().split("\n")
count = int(lines[0])
files = lines[2:2 + count]
cov = {}
for line in lines[2 + count:]:
    parts = line.split()
    if parts and parts[0] == "COV":
        cov[int(parts[1])] = set(map(int, parts[2:]))
all_edges = set().union(*cov.values()) if cov else set()
covered = set()
chosen = []
while True:
    best = max(cov, key=lambda i: (len(cov[i] - covered), -os.path.getsize(files[i])))
    gain = len(cov[best] - covered)
    if gain < min_gain:
        break
    chosen.append(files[best])
    covered |= cov[best]
print(f"{len(chosen)} inputs cover {len(covered)} of {len(all_edges)} edges")
os.makedirs(out_dir, exist_ok=True)
for path in chosen:
    target = os.path.join(out_dir, os.path.basename(path))
    if os.path.abspath(path) != os.path.abspath(target):
        shutil.copyfile(path, target)
