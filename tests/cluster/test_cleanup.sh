#!/usr/bin/env bash
# sim-cluster.sh leaves nothing behind: no namespace (its veth pairs and bridge live only inside them) and no
# process it started, whether the run
#   1. is interrupted with SIGTERM, or with SIGINT (Ctrl-C), while its nodes run;
#   2. fails (a node's command exits non-zero: the status is passed on) or runs past --timeout (status 124);
#   3. is killed with SIGKILL (no trap can run): then `sim-cluster.sh clean` removes what it left.
# usage: test_cleanup.sh ROOT WORK
ROOT=$1 WORK=$2
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
set -m  # background jobs in their own process group: SIGINT reaches them (without job control bash ignores it)

marker="999.$$"  # a sleep of this many seconds is unique to this test: no other process has this command line
sleepers_left() { pgrep -f "^sleep $marker\$" || true; }

# Starts a 3-node cluster whose nodes sleep, and waits (bounded) until every node's sleep runs.
start_sleeping_cluster() {
  "$SIM" run --nodes 3 --rate 100mbit --workdir "$WORK/$1" --timeout 300 --quiet -- sleep "$marker" &
  SIM_PID=$!
  for _ in $(seq 1 300); do
    [ "$(sleepers_left | wc -l)" = 3 ] && return 0
    kill -0 "$SIM_PID" 2>/dev/null || fail "sim-cluster.sh exited before its nodes started"
    sleep 0.1
  done
  fail "the nodes did not start within 30 s"
}

# Waits (bounded) for the sim-cluster.sh of pid $1 to exit after $2; sets status. A run still going after 60 s
# fails the test (killed, and what it left removed with `clean`).
wait_exit() {
  for _ in $(seq 1 600); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$1" 2>/dev/null; then
    kill -KILL "$1"
    "$SIM" clean
    fail "sim-cluster.sh was still running 60 s after $2"
  fi
  status=0
  wait "$1" || status=$?
}

for sig in TERM INT; do
  echo "== SIG$sig while the nodes run"
  start_sleeping_cluster "sig$sig"
  [ -n "$(ip netns list | grep -E "^z3c$SIM_PID-")" ] || fail "no namespaces while the cluster runs"
  kill -"$sig" "$SIM_PID"
  wait_exit "$SIM_PID" "SIG$sig"
  want=$([ "$sig" = TERM ] && echo 143 || echo 130)
  [ "$status" = "$want" ] || fail "exit status $status after SIG$sig, expected $want"
  expect_nothing_left "$SIM_PID"
  [ -z "$(sleepers_left)" ] || fail "processes left after SIG$sig: $(sleepers_left)"
  echo "status $status, nothing left"
done

echo "== a node's command fails"
run_cluster run --nodes 2 --workdir "$WORK/fails" --timeout 60 --quiet -- sh -c 'exit $((3 + SIM_NODE_RANK))'
[ "$SIM_STATUS" = 3 ] || fail "exit status $SIM_STATUS, expected node 0's 3"
[ "$(cat "$WORK/fails/node1.status")" = 4 ] || fail "node 1's status is not recorded as 4"
expect_nothing_left "$SIM_PID"
echo "status 3 (node 0's), nothing left"

echo "== a run past --timeout"
run_cluster run --nodes 2 --workdir "$WORK/timeout" --timeout 2 --quiet -- sleep "$marker"
[ "$SIM_STATUS" = 124 ] || fail "exit status $SIM_STATUS after the timeout, expected 124"
expect_nothing_left "$SIM_PID"
[ -z "$(sleepers_left)" ] || fail "processes left after the timeout: $(sleepers_left)"
echo "status 124, nothing left"

echo "== SIGKILL, then sim-cluster.sh clean"
start_sleeping_cluster sigkill
kill -KILL "$SIM_PID"
wait "$SIM_PID" 2>/dev/null || true
# What SIGKILL leaves (unless a parallel run's start-up clean got to it first) goes with `clean`.
"$SIM" clean
expect_nothing_left "$SIM_PID"
[ -z "$(sleepers_left)" ] || fail "processes left after clean: $(sleepers_left)"
echo "nothing left after clean"
echo PASS
