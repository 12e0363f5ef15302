#!/usr/bin/env bash
# The user's config (configs/llama-3-8b-stage3.json: the seed's DeepSpeed config, bf16, optimizer and parameters
# offloaded to the CPU) pipelined on the seed's shape in miniature: NODES nodes x RANKS ranks at 1 Gbit/s, the tiny
# Llama cut into NODES pipeline stages, one per node (zero3.pipeline_stage_order "stages_across_nodes"), 1F1B over
# the step's micro-batches, the seed's ZeRO-3 inside each stage over the node's ranks.
# Required: the run trains (a finite loss every step, from the last stage, the partition printed), and every node's
# link carried the pipeline's traffic, each way, per optimizer step, as `zero3 plan` of the pipelined config predicts
# it: the activations of the stage boundaries and their gradients (micro-batches x micro-batch x seq x hidden in the
# compute dtype, bf16, llama3_train's default --pipeline-boundary-dtype, per boundary and direction for each of the
# stage's RANKS data-parallel ranks), and nothing of ZeRO's gathers and reductions, which stay inside the node. The
# plan gives what each node sends; a node of the chain receives as much as it sends (an activation from the stage
# before, a gradient from the stage after, of the same sizes), so both directions are held to it: at least it times
# the steps, at most 1.2 times it plus what the small collectives over the pipeline group (the step's agreed
# statistics and loss) and start-up send (a fixed allowance below).
# Prints, per node, the payload each way per optimizer step against the plan, the unpipelined plan of the same config
# beside it (ZeRO-3 over all NODES x RANKS ranks), and the mean step time.
# usage: test_train_pipeline.sh ZERO3 LLAMA3_TRAIN ROOT WORK NODES RANKS
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4 NODES=$5 RANKS=$6
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$ROOT" || fail "cannot enter the source tree $ROOT"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
world=$((NODES * RANKS)) stages=$NODES accum=$NODES micro=2 seq=32 steps=6
model="$ROOT/configs/models/llama-3-tiny.json"
hidden=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["hidden_size"])' "$model")
plan_args=(--model "$model" --micro-batch "$micro" --grad-accum "$accum" --lr 3e-3 --precision bf16)
train_args=("${plan_args[@]}" --data /usr/share/common-licenses --tokenizer bytes --seq-len "$seq" --steps "$steps"
            --device cpu)

# If the test is stopped (ctest's timeout sends SIGTERM), stop the cluster run: sim-cluster.sh removes its namespaces
# on SIGTERM; SIM_PID is set by run_cluster.
stop_cluster() {
  if [ -n "${SIM_PID:-}" ] && kill -0 "$SIM_PID" 2>/dev/null; then
    kill -TERM "$SIM_PID" 2>/dev/null || true
    wait "$SIM_PID" 2>/dev/null || true
  fi
}
trap 'stop_cluster; exit 143' TERM
trap 'stop_cluster; exit 130' INT
trap stop_cluster EXIT

# The seed's config with the pipeline section: the user's own keys, pipelined.
python3 - "$ROOT/configs/llama-3-8b-stage3.json" "$WORK/pipeline.json" "$stages" <<'PY' || fail "cannot write the config"
import json, sys
config = json.load(open(sys.argv[1]))
config["pipeline"] = {"stages": int(sys.argv[3]), "partition": "parameters"}
config["zero3"] = {"pipeline_schedule": "1f1b", "pipeline_stage_order": "stages_across_nodes"}
config["steps_per_print"] = 1
json.dump(config, open(sys.argv[2], "w"), indent=2)
PY

echo "== pipelined: $NODES nodes x $RANKS ranks at 1gbit, $stages stages x $RANKS data-parallel ranks, $WORK/pipeline.json"
run_cluster launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate 1gbit --zero3 "$ZERO3" \
  --workdir "$WORK/pipeline" --timeout 600 --quiet -- "$TRAIN" "${train_args[@]}" --deepspeed "$WORK/pipeline.json" \
  --metrics "$WORK/pipeline.csv"
expect_nothing_left "$SIM_PID"
[ "$SIM_STATUS" = 0 ] || { tail -n 30 "$WORK/pipeline"/node*.log; fail "the pipelined cluster run exited with $SIM_STATUS"; }
grep -m1 -E '^\[rank 0\] +pipeline ' "$WORK/pipeline/node0.log" ||
  fail "rank 0 did not print the pipeline's shape (node0.log): not a pipelined run?"
grep -m1 -E '^\[rank 0\] +partition ' "$WORK/pipeline/node0.log" || fail "rank 0 did not print the partition"

# Every step has a finite loss (the last stage's, shared with every rank).
awk -F, -v steps="$steps" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "loss") c = i; next }
     { ++n; if ($c !~ /^[0-9.]+([eE][-+]?[0-9]+)?$/) { print "step " $1 ": loss " $c; bad = 1 } }
     END { if (n != steps) { print n " metrics rows, expected " steps; bad = 1 }; exit bad }' "$WORK/pipeline.csv" ||
  fail "the pipelined run's losses (above; $WORK/pipeline.csv)"

# The unpipelined plan of the same config, for comparison: ZeRO-3 over all ranks, its bytes per node link.
"$ZERO3" plan "${plan_args[@]}" --config "$ROOT/configs/llama-3-8b-stage3.json" --world-size "$world" \
  --ranks-per-node "$RANKS" > "$WORK/unpipelined-plan.txt" 2>&1 ||
  { cat "$WORK/unpipelined-plan.txt"; fail "zero3 plan failed for the unpipelined config"; }
unpipelined=$(awk '/^zero3 traffic plan/ { on = 1; next } on && $1 == 0 { gsub(",", "", $4); b += $4 } END { print b + 0 }' \
  "$WORK/unpipelined-plan.txt")

# The pipelined plan: what each node sends to other nodes per optimizer step ("node 1: 262,144 to other nodes per
# step (262,144 of it stage boundaries)").
"$ZERO3" plan "${plan_args[@]}" --config "$WORK/pipeline.json" --world-size "$world" --ranks-per-node "$RANKS" \
  --seq-len "$seq" > "$WORK/pipelined-plan.txt" 2>&1 ||
  { cat "$WORK/pipelined-plan.txt"; fail "zero3 plan failed for the pipelined config"; }
mapfile -t planned < <(awk '/^node [0-9]+: .* to other nodes per step/ { gsub(",", "", $3); print $3 }' \
  "$WORK/pipelined-plan.txt")
[ "${#planned[@]}" = "$NODES" ] ||
  { cat "$WORK/pipelined-plan.txt"; fail "the pipelined plan has ${#planned[@]} node lines, expected $NODES"; }
# Small collectives over the pipeline group and the world (the step's statistics, the loss, the schedule's
# agreement) and start-up: per step, 16 of them at 640 bytes per rank off the node (call_comparison_bytes' figure),
# and 512 KiB for the whole run.
small=$((16 * 640 * (world - RANKS)))
echo "== per optimizer step, each way: the pipelined plan's bytes per node ($accum micro-batches x $micro x seq" \
  "$seq x hidden $hidden in bf16 per boundary, $RANKS ranks per stage); the unpipelined plan of the same config:" \
  "$unpipelined bytes per node link"
for ((i = 0; i < NODES; ++i)); do
  boundaries=$(( (i > 0) + (i < NODES - 1) ))
  per_step=${planned[$i]}
  low=$((steps * per_step))
  high=$((steps * (per_step * 12 / 10 + small) + 512 * 1024))
  for way in tx rx; do
    got=$(node_payload "$WORK/pipeline" "$i" "$way")
    printf 'node %d (stage %d, %d boundar%s): %s %d payload bytes/step (%.3f of the plan), %d with headers;' \
      "$i" "$i" "$boundaries" "$([ "$boundaries" = 1 ] && echo y || echo ies)" "$way" $((got / steps)) \
      "$(awk -v g="$got" -v p="$low" 'BEGIN { print p ? g / p : 0 }')" $(( $(node_bytes "$WORK/pipeline" "$i" "$way") / steps ))
    echo " allowed $low..$high over $steps steps"
    [ "$got" -ge "$low" ] || fail "node $i's link carried less ($way $got) than the plan's stage boundaries ($low)"
    [ "$got" -le "$high" ] || fail "node $i's link carried more ($way $got) than the stage boundaries and small collectives allow ($high)"
  done
done
printf 'pipelined step time: %s s (mean of the steps after the first)\n' "$(awk -F, '
  NR == 1 { for (i = 1; i <= NF; i++) if ($i == "step_time_s") c = i; next }
  NR > 2 { s += $c; n++ } END { printf "%.3f", n ? s / n : 0 }' "$WORK/pipeline.csv")"
echo PASS
