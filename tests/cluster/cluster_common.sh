# shellcheck shell=bash
# Shared by the cluster tests (sourced). Each test script sets ROOT (the source tree) and WORK (its own
# scratch directory) before sourcing it, and gets these helpers.
set -euo pipefail

SIM="$ROOT/scripts/cluster/sim-cluster.sh"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Skip (exit 77, with the reason) where this machine cannot build the cluster: not root, no iproute2, no
# veth, bridge or tbf.
require_cluster() {
  local why
  why=$("$SIM" check) || { echo "$why"; exit 77; }
}

# Runs sim-cluster.sh with the given arguments, in the background so that its pid is known, and waits.
# Sets SIM_PID and SIM_STATUS; never fails itself.
run_cluster() {
  SIM_STATUS=0
  "$SIM" "$@" &
  SIM_PID=$!
  wait "$SIM_PID" || SIM_STATUS=$?
}

# Nothing of the run whose owner was pid $1 is left: no namespace (and so no veth pair or bridge: every one of
# them lived inside the run's namespaces).
expect_nothing_left() {
  local left
  left=$(ip netns list | awk '{print $1}' | grep -E "^z3c$1-" || true)
  [ -z "$left" ] || fail "namespaces left behind by the run of pid $1: $left"
}

# counters.tsv of a run: node addr rx_bytes tx_bytes rx_packets tx_packets.
node_bytes() {  # node_bytes <workdir> <node> rx|tx
  awk -v n="$2" -v which="$3" '$1 == n { print (which == "rx") ? $3 : $4 }' "$1/counters.tsv"
}

# A TCP port that is free on loopback now (the loopback runs need one for their store).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
