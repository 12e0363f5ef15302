#!/usr/bin/env bash
# A multi-rank test program (tests/dist) on the simulated cluster, NODES nodes x RANKS ranks: it must pass on
# every rank (its own checks: e.g. test_equivalence against the unsharded reference), every node's link must
# have carried traffic both ways, and nothing of the cluster may be left afterwards.
# usage: test_program.sh ZERO3 ROOT WORK NODES RANKS PROGRAM [ARGS...]
ZERO3=$1 ROOT=$2 WORK=$3 NODES=$4 RANKS=$5
shift 5
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
run_cluster launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate 1gbit --zero3 "$ZERO3" --workdir "$WORK" \
  --timeout 600 --quiet -- "$@"
expect_nothing_left "$SIM_PID"
[ "$SIM_STATUS" = 0 ] || { cat "$WORK"/node*.log; fail "$(basename "$1") failed on the cluster (status $SIM_STATUS)"; }
grep -h "PASSED\|FAILED" "$WORK"/node*.log || true
for ((i = 0; i < NODES; ++i)); do
  rx=$(node_bytes "$WORK" "$i" rx)
  tx=$(node_bytes "$WORK" "$i" tx)
  echo "node $i: received $rx bytes, sent $tx bytes"
  [ "$rx" -gt 0 ] && [ "$tx" -gt 0 ] || fail "node $i's link carried nothing: the ranks did not talk across nodes"
done
echo PASS
