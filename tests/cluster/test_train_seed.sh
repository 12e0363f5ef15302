#!/usr/bin/env bash
# The user's own config (configs/llama-3-8b-stage3.json: the seed's DeepSpeed config, bf16, optimizer and parameters
# offloaded to the CPU) driving the tiny Llama on the simulated cluster, NODES nodes x RANKS ranks at 1 Gbit/s, against
# a layout for slow links applied on top of it. MODE picks the pair:
#   hpz      the seed's config + zero_hpz_partition_size RANKS against the seed's config, both with
#            stage3_max_reuse_distance 0. The 8B job releases a layer after its forward and gathers it again in
#            backward (the distance to its backward is more than the config's 1e9 elements for all but the last
#            layers); the 2-layer miniature does the same only with a reuse distance of 0. hpZ's backward gathers and
#            the second micro-step's gathers then read the secondary partition inside the node (steady state).
#   advised  the seed's config verbatim against the layout that `zero3 plan --advise` ranks first for the seed's
#            cluster (configs/clusters/g6e-12xlarge-efa.json, Llama-3-8B), with its config edits applied.
# Required: every node's link carried its run's traffic plan (expect_planned_link_bytes); the layout's plan and its
# measured payload are below the seed's plan; and the two train the same job (hpz: every metrics row equal digit for
# digit, since the secondary partition holds the primary's values; advised: the ZeRO++ job's loss bound of
# examples/llama3/tests/zeropp_common.sh, since the advised layout may quantize).
# Prints, per run, the payload each node's link carried per optimizer step against the plan, and the mean step time.
# usage: test_train_seed.sh ZERO3 LLAMA3_TRAIN ROOT WORK NODES RANKS MODE
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4 NODES=$5 RANKS=$6 MODE=$7
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$ROOT" || fail "cannot enter the source tree $ROOT"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
world=$((NODES * RANKS)) accum=2
case $MODE in hpz) steps=6 ;; *) steps=12 ;; esac
seed="$ROOT/configs/llama-3-8b-stage3.json"
plan_args=(--model "$ROOT/configs/models/llama-3-tiny.json" --micro-batch 2 --grad-accum "$accum" --lr 3e-3
           --precision bf16)
train_args=("${plan_args[@]}" --data /usr/share/common-licenses --tokenizer bytes --seq-len 32 --steps "$steps"
            --device cpu)

# edit IN OUT JSON: IN with the zero_optimization members of JSON (an object; null removes a member) set, to OUT.
edit() {
  python3 - "$1" "$2" "$3" <<'PY' || fail "cannot edit $1"
import json, sys
config = json.load(open(sys.argv[1]))
for key, value in json.loads(sys.argv[3]).items():
    if value is None:
        config["zero_optimization"].pop(key, None)
    else:
        config["zero_optimization"][key] = value
json.dump(config, open(sys.argv[2], "w"), indent=2)
PY
}

# run NAME CONFIG: the job on the cluster; its metrics in NAME.csv, its plan in NAME-plan.txt, checked by the plan.
run() {
  local name=$1 config=$2
  echo "== $name: $NODES nodes x $RANKS ranks, links at 1gbit, $config"
  run_cluster launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate 1gbit --zero3 "$ZERO3" \
    --workdir "$WORK/$name" --timeout 600 --quiet -- "$TRAIN" "${train_args[@]}" --deepspeed "$config" \
    --metrics "$WORK/$name.csv"
  expect_nothing_left "$SIM_PID"
  [ "$SIM_STATUS" = 0 ] || { tail -n 30 "$WORK/$name"/node*.log; fail "the cluster run '$name' exited with $SIM_STATUS"; }
  "$ZERO3" plan "${plan_args[@]}" --config "$config" --world-size "$world" --ranks-per-node "$RANKS" \
    > "$WORK/$name-plan.txt" 2>&1 || { cat "$WORK/$name-plan.txt"; fail "zero3 plan failed for $config"; }
  expect_planned_link_bytes "$WORK/$name-plan.txt" "$WORK/$name" "$steps" \
    "$(call_comparison_bytes "$WORK/$name-plan.txt" "$world" "$RANKS")"
}

# planned NAME: the bytes node 0 sends to other nodes per optimizer step by NAME's plan (the same for every node).
planned() { awk '$1 == 0 { print $2 }' "$WORK/$1-plan.txt.tsv"; }
# measured NAME: node 0's payload sent per optimizer step (the run's total over its steps).
measured() { echo $(( $(node_payload "$WORK/$1" 0 tx) / steps )); }
# mean_step_time NAME: the mean step_time_s of the steps after the first.
mean_step_time() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "step_time_s") c = i; next }
           NR > 2 { s += $c; n++ } END { printf "%.3f", n ? s / n : 0 }' "$WORK/$1.csv"
}
report() {
  printf '%-8s plan %10d B/step per node link, measured %10d B/step (%.3f of plan), step %s s\n' "$1" \
    "$(planned "$1")" "$(measured "$1")" "$(awk -v m="$(measured "$1")" -v p="$(planned "$1")" 'BEGIN { print m / p }')" \
    "$(mean_step_time "$1")"
}
rows() { cut -d, -f1-9 "$1"; }

case $MODE in
  hpz)
    edit "$seed" "$WORK/seed.json" '{"stage3_max_reuse_distance": 0}'
    edit "$WORK/seed.json" "$WORK/layout.json" "{\"zero_hpz_partition_size\": $RANKS}"
    ;;
  advised)
    cp "$seed" "$WORK/seed.json"
    # The seed's job on its cluster, as docs/performance-model.md ("The advised layout") asks the advisor.
    "$ZERO3" plan --advise --no-pipelines --config "$seed" --model "$ROOT/configs/models/llama-3-8b.json" \
      --cluster "$ROOT/configs/clusters/g6e-12xlarge-efa.json" --seq-len 512 --micro-batch 4 --grad-accum 4 \
      --no-grad-checkpointing --top 3 --write-config "$WORK/layout.json" \
      > "$WORK/advice.txt" 2>&1 || { cat "$WORK/advice.txt"; fail "zero3 plan --advise failed"; }
    grep -E '^ +[0-9]+  |edits:|^wrote ' "$WORK/advice.txt"
    ;;
  *) fail "MODE '$MODE': expected hpz or advised" ;;
esac

run seed "$WORK/seed.json"
run layout "$WORK/layout.json"
echo "== per optimizer step, node 0's link (every node's is the same by the plans):"
report seed
report layout

[ "$(planned layout)" -lt "$(planned seed)" ] ||
  fail "the layout's plan ($(planned layout) B/step) is not below the seed's ($(planned seed))"
[ "$(measured layout)" -lt "$(planned seed)" ] ||
  fail "the layout's link carried $(measured layout) B/step, not below the seed's plan ($(planned seed))"
case $MODE in
  hpz)
    diff <(rows "$WORK/seed.csv") <(rows "$WORK/layout.csv") || fail "hpZ trained differently from the seed's layout (above)"
    echo "hpZ's $steps steps equal the seed's digit for digit"
    ;;
  advised)
    # The ZeRO++ job's bound (zeropp_common.sh: the mean loss of the last 10 steps within 9%, converged at least half
    # as far), for the advised layout's qwZ.
    source "$ROOT/examples/llama3/tests/zeropp_common.sh"
    ZEROPP_STEPS=$steps
    verdict=$(zeropp_verdict "$WORK/seed.csv" "$WORK/layout.csv")
    [ "${verdict%%:*}" = ok ] || fail "the advised layout against the seed's: $verdict"
    echo "the advised layout against the seed's: ${verdict#ok: }"
    ;;
esac
echo PASS
