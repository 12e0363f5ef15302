#!/usr/bin/env bash
# The tiny Llama-3 (llama3_train) on the simulated cluster, NODES nodes x RANKS ranks, with the ZeRO layout of
# LAYOUT (a DeepSpeed config), against the same job on loopback: NODES `zero3 launch` on 127.0.0.1 with the
# same node layout, so only the network differs. Required:
#   - every row of the metrics (step, samples, tokens, loss, lr, grad norm, clip coefficient, loss scale,
#     skipped) is the same, digit for digit;
#   - every node's link carried at least what the forward all-gathers alone must bring in from the other nodes
#     (steps x grad-accum x (world - RANKS) / world x the model's fp32 bytes) and send out to them
#     (steps x grad-accum x RANKS / world x the same), from the interface counters;
#   - nothing of the cluster is left afterwards.
# usage: test_train_equal.sh ZERO3 LLAMA3_TRAIN ROOT WORK NODES RANKS LAYOUT
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4 NODES=$5 RANKS=$6 LAYOUT=$7
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive  # the same threads in both runs, whatever the node layout
steps=4 accum=2 world=$((NODES * RANKS))
train_args=(--model "$ROOT/configs/models/llama-3-tiny.json" --deepspeed "$LAYOUT" --data /usr/share/common-licenses
            --tokenizer bytes --seq-len 32 --micro-batch 2 --grad-accum "$accum" --steps "$steps" --lr 3e-3
            --precision fp32 --device cpu)

echo "== $(basename "$LAYOUT"): $NODES nodes x $RANKS ranks on loopback"
port=$(free_port)
pids=()
for ((i = 0; i < NODES; ++i)); do
  GLOO_SOCKET_IFNAME=lo timeout 300 "$ZERO3" launch -n "$RANKS" --nnodes "$NODES" --node-rank "$i" \
    --master-addr 127.0.0.1 --master-port "$port" -- "$TRAIN" "${train_args[@]}" --metrics "$WORK/loopback.csv" \
    > "$WORK/loopback-node$i.log" 2>&1 &
  pids+=($!)
done
for ((i = 0; i < NODES; ++i)); do
  wait "${pids[$i]}" || { cat "$WORK"/loopback-node*.log; fail "the loopback run failed (node $i)"; }
done

echo "== the same on the simulated cluster"
run_cluster launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate 1gbit --zero3 "$ZERO3" --workdir "$WORK/cluster" \
  --timeout 300 --quiet -- "$TRAIN" "${train_args[@]}" --metrics "$WORK/cluster.csv"
expect_nothing_left "$SIM_PID"
[ "$SIM_STATUS" = 0 ] || { cat "$WORK"/cluster/node*.log; fail "the cluster run exited with $SIM_STATUS"; }

cut -d, -f1-9 "$WORK/loopback.csv" > "$WORK/loopback.rows"
cut -d, -f1-9 "$WORK/cluster.csv" > "$WORK/cluster.rows"
[ "$(wc -l < "$WORK/cluster.rows")" = $((steps + 1)) ] || fail "expected $steps metrics rows in $WORK/cluster.csv"
diff "$WORK/loopback.rows" "$WORK/cluster.rows" || fail "the cluster run differs from the loopback run (above)"
echo "the $steps steps are the same on the cluster as on loopback:"
cat "$WORK/cluster.rows"

# mem_params is rank 0's fp32 parameter slice in bytes; the slices of all ranks hold the (padded) model.
mem_params=$(awk -F, 'NR == 1 { for (c = 1; c <= NF; ++c) if ($c == "mem_params") col = c } NR == 2 { print $col }' \
             "$WORK/cluster.csv")
model_bytes=$((mem_params * world))
need_rx=$((steps * accum * (world - RANKS) * model_bytes / world))
need_tx=$((steps * accum * RANKS * model_bytes / world))
for ((i = 0; i < NODES; ++i)); do
  rx=$(node_bytes "$WORK/cluster" "$i" rx)
  tx=$(node_bytes "$WORK/cluster" "$i" tx)
  echo "node $i: received $rx bytes (at least $need_rx), sent $tx bytes (at least $need_tx)"
  [ "$rx" -ge "$need_rx" ] && [ "$tx" -ge "$need_tx" ] || fail "node $i's link carried too little: the ranks did not talk across nodes"
done
echo PASS
