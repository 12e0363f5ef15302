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

# What the collectives carried over node $2's link, direction $3 (rx or tx), in the run of workdir $1: the interface's
# bytes less 66 bytes per packet (the Ethernet, IP and TCP headers with timestamps that every frame carries; a pure
# acknowledgement is nothing else). The plans count payload, and headers go per packet: the qwZ + qgZ runs of
# test_train_zeropp.sh (50 steps of small messages) spend 12-13% of their interface bytes on them, which with the
# small collectives is more than the upper bound below leaves over the plan (docs/benchmarks.md).
node_payload() {  # node_payload <workdir> <node> rx|tx
  awk -v n="$2" -v which="$3" '$1 == n { print (which == "rx") ? $3 - 66 * $5 : $4 - 66 * $6 }' "$1/counters.tsv"
}

# expect_planned_link_bytes PLAN RUN STEPS [EXTRA]: PLAN is the output of `zero3 plan` for the run's config and shape, RUN the
# workdir of a cluster run of STEPS optimizer steps on NODES nodes (the caller's). Every node's link carried, each
# way, at least the bytes the plan says the node's ranks send to other nodes per optimizer step times the steps
# (plan_traffic(): the parameter gathers and gradient reductions of the layout, include/zero3/traffic_plan.hpp), and
# at most 1.2 times that plus 512 KiB (the small collectives that agree on orders, overflow and norms, start-up and
# checkpoints), payload counted (node_payload). The plan must send the same to and from every node (the layouts here
# do), so both directions compare with the node's figure. A layout that moved its traffic between nodes that the
# plan keeps inside one (HSDP's per-micro-step reduce-scatter, hpZ's backward gathers), or collectives that left out
# their quantization, break the upper bound. EXTRA (bytes per optimizer step, default 0) widens the upper bound by
# what the caller knows crosses besides the plan's collectives (call_comparison_bytes below).
expect_planned_link_bytes() {
  local plan=$1 run=$2 steps=$3 extra=${4:-0} i way per_step low high got
  awk '/^zero3 traffic plan/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { gsub(",", "", $4); b[$1] += $4 }
       END { for (n in b) print n, b[n] }' "$plan" | sort -n > "$plan.tsv"
  [ "$(wc -l < "$plan.tsv")" = "$NODES" ] || { cat "$plan"; fail "no traffic plan for $NODES nodes in $plan"; }
  [ "$(awk '{ print $2 }' "$plan.tsv" | sort -u | wc -l)" = 1 ] ||
    { cat "$plan.tsv"; fail "the plan sends different bytes from different nodes; the bounds assume the same"; }
  grep -A 20 '^zero3 traffic plan' "$plan"
  for ((i = 0; i < NODES; ++i)); do
    per_step=$(awk -v n="$i" '$1 == n { print $2 }' "$plan.tsv")
    low=$((steps * per_step))
    high=$((steps * (per_step * 12 / 10 + extra) + 512 * 1024))
    for way in tx rx; do
      got=$(node_payload "$run" "$i" "$way")
      echo "node $i: $way $got payload bytes ($(node_bytes "$run" "$i" "$way") with headers) over $steps steps;" \
           "the plan: $per_step per step, so $low..$high"
      [ "$got" -ge "$low" ] || fail "node $i's link carried less ($way $got) than the layout's collectives must send ($low)"
      [ "$got" -le "$high" ] || fail "node $i's link carried more ($way $got) than the layout's plan allows ($high)"
    done
  done
}

# call_comparison_bytes PLAN WORLD RANKS: at most what the Gloo communicator's call comparison sends over a node's link
# per optimizer step, beside the plan's data: before each collective every rank sends its 32-byte description to
# every other rank of the collective's group (src/comm/gloo/gloo_communicator.cpp), each its own small gloo message.
# Measured on 4 nodes x 4 ranks with the seed's 4096-element reduce buckets: about 530 payload bytes per description
# to a rank on another node, gloo's framing and TCP's options included (docs/benchmarks.md); 640 bytes are counted
# here for each of the WORLD - RANKS ranks off the node (the most a group can have), per collective that crosses
# nodes (the plan's count, summed over the node's ranks). Negligible beside real buckets, it dominates a miniature
# whose buckets are a few KiB, as the seed's "auto" reduce_bucket_size (hidden_size^2) gives the tiny model.
call_comparison_bytes() {
  awk -v off=$(($2 - $3)) '/^zero3 traffic plan/ { on = 1; next }
       on && $1 == 0 { split($5, c, "/"); n += c[1] } END { print n * off * 640 }' "$1"
}

# A TCP port that is free on loopback now (the loopback runs need one for their store).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
