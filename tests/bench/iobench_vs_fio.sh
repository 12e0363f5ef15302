#!/usr/bin/env bash
# zero3 iobench against fio on the same directory, size, block size and queue depth (O_DIRECT, io_uring,
# sequential), for write and read. Prints both figures and the ratio (target: zero3 >= 0.9 x fio).
#
#   tests/bench/iobench_vs_fio.sh DIR [SIZE=1G] [BLOCK=1M] [QD=8] [LOOPS=3] [ENGINE=io_uring]
#
# ZERO3 (default: build/bin/zero3 beside this checkout) is the zero3 binary. Both tools write a
# fresh preallocated file once, then time a write over it and a read of it; the tools alternate and each
# figure is the best of LOOPS rounds, in GB/s (10^9 bytes/s).
set -euo pipefail

dir=${1:?usage: iobench_vs_fio.sh DIR [SIZE] [BLOCK] [QD] [LOOPS] [ENGINE]}
size=${2:-1G}
block=${3:-1M}
qd=${4:-8}
loops=${5:-3}
engine=${6:-io_uring}
here=$(cd "$(dirname "$0")/../.." && pwd)
zero3=${ZERO3:-$here/build/bin/zero3}

command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
[[ -x $zero3 ]] || { echo "no zero3 binary at $zero3 (set ZERO3=...)" >&2; exit 1; }
[[ -d $dir ]] || { echo "$dir is not a directory" >&2; exit 1; }

fio_file="$dir/zero3-fio-$$.bin"
trap 'rm -f "$fio_file"' EXIT

# One fio round, the same sequence as one `zero3 iobench --mode both --loops 1` in one process: three jobs
# run back to back (stonewall) on one fresh file: an untimed layout write, a timed write, a timed read.
# Prints "WRITE_GBS READ_GBS".
fio_round() {
  rm -f "$fio_file"
  local common=(--filename="$fio_file" --size="$size" --bs="$block" --iodepth="$qd" --ioengine="$engine"
                --direct=1 --numjobs=1 --fallocate=native)
  fio --output-format=json "${common[@]}" --name=layout --rw=write \
      --name=write --stonewall --rw=write --name=read --stonewall --rw=read 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs']; print(j[1]['write']['bw_bytes'] / 1e9, j[2]['read']['bw_bytes'] / 1e9)"
}

max() { python3 -c "print(max($1, $2))"; }

# Both tools see the same file history in every round: a fresh preallocated file, written once untimed
# (zero3 iobench's layout pass; a first fio write), then a timed sequential write over it, then a timed
# sequential read of it. A file reused across rounds would let a caching layer below the file system (a
# virtual disk's host cache) favour one tool. The tools alternate, so that a busy period hits both.
declare -A best=([zero3-write]=0 [fio-write]=0 [zero3-read]=0 [fio-read]=0)
for ((i = 0; i < loops; i++)); do
  out=$("$zero3" iobench --path "$dir" --size "$size" --block-size "$block" --queue-depth "$qd" --engine "$engine" \
          --mode both --loops 1)
  best[zero3-write]=$(max "${best[zero3-write]}" "$(awk '$1 == "write" {print $2}' <<<"$out")")
  best[zero3-read]=$(max "${best[zero3-read]}" "$(awk '$1 == "read" {print $2}' <<<"$out")")
  read -r fw fr <<<"$(fio_round)"
  best[fio-write]=$(max "${best[fio-write]}" "$fw")
  best[fio-read]=$(max "${best[fio-read]}" "$fr")
done

printf '%-6s %12s %12s %8s\n' "" "zero3 GB/s" "fio GB/s" "ratio"
for op in write read; do
  python3 -c "z, f = ${best[zero3-$op]}, ${best[fio-$op]}; print('%-6s %12.3f %12.3f %8.3f' % ('$op', z, f, z / f))"
done
echo "(dir $dir, size $size, block $block, queue depth $qd, engine $engine, O_DIRECT, best of $loops rounds)"
