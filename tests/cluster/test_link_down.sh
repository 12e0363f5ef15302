#!/usr/bin/env bash
# A node drops out: llama3_train on 2 nodes x 2 ranks with the layout of CONFIG (default link-down.json, plain
# ZeRO-3; link-down-hsdp.json is HSDP), and once rank 0 has printed step 3, node 1's link goes down (ip link set
# down, both ends). Required: every one of the 4 ranks fails with a CommError that names the collective and its
# group ("all_gather of unit 'layers.0' (...) over the MiCS shard group of ranks 0, 1 on rank 0 failed: gloo
# all_gather_into(...) on rank 0 of 2 timed out after 15000 ms ..."); the job ends on its own (zero3.comm_timeout_s
# is 15 s; sim-cluster's hard limit of 240 s is never reached: no hang); nothing of the cluster is left afterwards.
# usage: test_link_down.sh ZERO3 LLAMA3_TRAIN ROOT WORK [CONFIG]
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4 CONFIG=${5:-$(dirname "$0")/link-down.json}
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
config=$CONFIG
timeout_ms=$(($(sed -n 's/.*"comm_timeout_s": *\([0-9]*\).*/\1/p' "$config") * 1000))
start=$(date +%s)
# --keep-going: a rank that fails does not get its node's other rank killed, so each rank's own error shows.
run_cluster launch --nodes 2 --ranks-per-node 2 --zero3 "$ZERO3" --workdir "$WORK" --timeout 240 --quiet --keep-going \
  --link-down 1 --link-down-when '^\[rank 0\] step 3/' -- \
  "$TRAIN" --model "$ROOT/configs/models/llama-3-tiny.json" --deepspeed "$config" --data /usr/share/common-licenses \
  --tokenizer bytes --seq-len 32 --micro-batch 2 --grad-accum 2 --steps 100000 --lr 1e-3 --precision fp32 \
  --device cpu --metrics none
took=$(($(date +%s) - start))
expect_nothing_left "$SIM_PID"
cat "$WORK"/node*.log | grep -E "ERROR|zero3 launch" || true
[ -f "$WORK/link_down_at" ] || { cat "$WORK"/node*.log; fail "the link never went down (rank 0 did not reach step 3)"; }
[ "$SIM_STATUS" != 124 ] || fail "the job hung: still running when sim-cluster's limit of 240 s ran out"
[ "$SIM_STATUS" != 0 ] || fail "the job succeeded although node 1 was cut off"
for rank in 0 1 2 3; do
  line=$(cat "$WORK"/node*.log | grep -E "^\[rank $rank\] .*ERROR" | head -1)
  [ -n "$line" ] || fail "rank $rank reported no error"
  grep -qE "(all_gather|reduce_scatter|all_reduce|broadcast|barrier)[a-z_]*\(.*\) on rank [0-9]+ of [0-9]+" <<<"$line" ||
    fail "rank $rank's error does not name the collective: $line"
  grep -qE " over (all [0-9]+ ranks|the [A-Za-z' -]+ group of ranks [0-9]+(, [0-9.]+)*)" <<<"$line" ||
    fail "rank $rank's error does not name the group of the collective: $line"
  grep -qE "timed out after $timeout_ms ms|failed" <<<"$line" || fail "rank $rank's error is not a communication failure: $line"
done
echo "every rank failed with a communication error naming its collective; the job ended $took s after it started"
echo PASS
