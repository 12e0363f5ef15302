#!/usr/bin/env bash
# ZeRO++ on the simulated cluster: the tiny Llama job of examples/llama3/tests/zeropp_common.sh (50 steps, bf16, the
# same job dist.llama3.zeropp runs on local ranks) on NODES nodes x RANKS ranks at 1 Gbit/s, with LAYOUT
#   hpz    hpZ (a secondary partition per node) + qwZ + qgZ
#   plain  ZeRO-3 + qwZ + qgZ
#   mics   MiCS over every node with the hierarchical gather + qwZ
# and the same layout unquantized, on the same cluster. Required:
#   - the quantized run holds zeropp_common.sh's bound against the unquantized one (the mean loss of the last 10
#     steps within 9%, converged at least half as far);
#   - each run's links carried the bytes of its traffic plan (expect_planned_link_bytes, cluster_common.sh): the
#     quantized messages crossed between the nodes, and nothing unquantized in their place;
#   - nothing of the cluster is left afterwards.
# usage: test_train_zeropp.sh ZERO3 LLAMA3_TRAIN ROOT WORK NODES RANKS LAYOUT
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4 NODES=$5 RANKS=$6 LAYOUT=$7
source "$(dirname "$0")/cluster_common.sh"
source "$ROOT/examples/llama3/tests/zeropp_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$ROOT" || fail "cannot enter the source tree $ROOT"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
world=$((NODES * RANKS))
case $LAYOUT in
  hpz) keys=$'\n    "zero_hpz_partition_size": '"$RANKS," qwz=true qgz=true ;;
  plain) keys='' qwz=true qgz=true ;;
  mics) keys=$'\n    "mics_shard_size": '"$world"$',\n    "mics_hierarchical_params_gather": true,' qwz=true qgz=false ;;
  *) fail "LAYOUT '$LAYOUT': expected hpz, plain or mics" ;;
esac

# run NAME QWZ QGZ: the job on the cluster with the layout's config and these ZeRO++ switches (NAME.json); its metrics
# in NAME.csv, its counters in NAME/; then its link bytes against the plan of NAME.json.
run() {
  local name=$1
  zeropp_config "$WORK/$name.json" "$2" "$3" "$keys"
  echo "== $LAYOUT, qwZ $2, qgZ $3: $NODES nodes x $RANKS ranks, links at 1gbit"
  run_cluster launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate 1gbit --zero3 "$ZERO3" \
    --workdir "$WORK/$name" --timeout 300 --quiet -- "$TRAIN" "${ZEROPP_TRAIN_ARGS[@]}" \
    --deepspeed "$WORK/$name.json" --metrics "$WORK/$name.csv"
  expect_nothing_left "$SIM_PID"
  [ "$SIM_STATUS" = 0 ] || { cat "$WORK/$name"/node*.log; fail "the cluster run '$name' exited with $SIM_STATUS"; }
  grep -h 'trained steps' "$WORK/$name"/node0.log || true
  "$ZERO3" plan "${ZEROPP_PLAN_ARGS[@]}" --config "$WORK/$name.json" --world-size "$world" --ranks-per-node "$RANKS" \
    > "$WORK/$name-plan.txt" 2>&1 ||
    { cat "$WORK/$name-plan.txt"; fail "zero3 plan failed"; }
  expect_planned_link_bytes "$WORK/$name-plan.txt" "$WORK/$name" "$ZEROPP_STEPS"
}
run unquantized false false
run quantized "$qwz" "$qgz"

verdict=$(zeropp_verdict "$WORK/unquantized.csv" "$WORK/quantized.csv")
[ "${verdict%%:*}" = ok ] || fail "$LAYOUT with qwZ $qwz, qgZ $qgz: $verdict"
echo "$LAYOUT with qwZ $qwz, qgZ $qgz: ${verdict#ok: }"
echo PASS
