#!/usr/bin/env bash
# The tiny Llama-3 (llama3_train) on the simulated cluster, NODES nodes x RANKS ranks, with the ZeRO layout of
# LAYOUT (a DeepSpeed config of layouts/, where @WORLD_SIZE@ and @RANKS_PER_NODE@ stand for the cluster's shape), in
# PRECISION (fp32 or bf16; the layouts sum gradients in fp32 either way). Required:
#   - the cluster run equals the same job on loopback (NODES `zero3 launch` on 127.0.0.1 with the same node
#     layout, so only the network differs): every metrics row (step, samples, tokens, loss, lr, grad norm, clip
#     coefficient, loss scale, skipped) the same, digit for digit;
#   - a layout other than plain equals plain ZeRO-3 (layouts/plain.json, on loopback): step, samples, tokens, lr,
#     loss scale and skipped the same, loss, grad norm and clip coefficient within the equivalence tests' relative
#     bound (fp32 1e-5: only the order of the reductions differs; bf16 5e-3, tests/dist/test_equivalence.cpp);
#   - every node's link carried, each way, the bytes of the layout's traffic plan times the steps, within the bounds
#     of expect_planned_link_bytes (cluster_common.sh: at least the plan, at most 1.2 times it plus 512 KiB);
#   - fp32, layouts other than plain: a checkpoint saved under the layout at step 2 resumes under plain ZeRO-3, and
#     one saved under plain ZeRO-3 resumes under the layout, on the cluster, and steps 3-4 equal those of the run
#     that never stopped within 1e-5;
#   - nothing of the cluster is left afterwards.
# usage: test_train_equal.sh ZERO3 LLAMA3_TRAIN ROOT WORK NODES RANKS LAYOUT [PRECISION]
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4 NODES=$5 RANKS=$6 LAYOUT=$7 PRECISION=${8:-fp32}
source "$(dirname "$0")/cluster_common.sh"
require_cluster
rm -rf "$WORK"
mkdir -p "$WORK"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive  # the same threads in every run, whatever the node layout
steps=4 accum=2 save_at=2 world=$((NODES * RANKS))
name=$(basename "$LAYOUT" .json)
case $PRECISION in
  fp32) tolerance=1e-5 ;;
  bf16) tolerance=5e-3 ;;
  *) fail "PRECISION '$PRECISION': expected fp32 or bf16" ;;
esac
model="$ROOT/configs/models/llama-3-tiny.json"
fill() { sed -e "s/@WORLD_SIZE@/$world/g" -e "s/@RANKS_PER_NODE@/$RANKS/g" "$1" > "$2"; }
fill "$LAYOUT" "$WORK/layout.json"
fill "$(dirname "$LAYOUT")/plain.json" "$WORK/plain.json"
train_args=(--model "$model" --data /usr/share/common-licenses --tokenizer bytes --seq-len 32 --micro-batch 2
            --grad-accum "$accum" --steps "$steps" --lr 3e-3 --precision "$PRECISION" --device cpu)

on_loopback() {  # on_loopback <tag> <config> [more llama3_train arguments]: NODES launchers on 127.0.0.1
  local tag=$1 config=$2 port i
  shift 2
  port=$(free_port)
  local -a pids=()
  for ((i = 0; i < NODES; ++i)); do
    GLOO_SOCKET_IFNAME=lo timeout 300 "$ZERO3" launch -n "$RANKS" --nnodes "$NODES" --node-rank "$i" \
      --master-addr 127.0.0.1 --master-port "$port" -- "$TRAIN" "${train_args[@]}" --deepspeed "$config" "$@" \
      > "$WORK/$tag-node$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < NODES; ++i)); do
    wait "${pids[$i]}" || { cat "$WORK/$tag"-node*.log; fail "the loopback run '$tag' failed (node $i)"; }
  done
}

on_cluster() {  # on_cluster <tag> <config> [more llama3_train arguments]
  local tag=$1 config=$2
  shift 2
  run_cluster launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate 1gbit --zero3 "$ZERO3" \
    --workdir "$WORK/$tag" --timeout 300 --quiet -- "$TRAIN" "${train_args[@]}" --deepspeed "$config" "$@"
  expect_nothing_left "$SIM_PID"
  [ "$SIM_STATUS" = 0 ] || { cat "$WORK/$tag"/node*.log; fail "the cluster run '$tag' exited with $SIM_STATUS"; }
}

rows() { cut -d, -f1-9 "$1"; }

# Compares the metrics rows of $1 and $2 (the rows of steps $3..$steps of each): the counts, lr, loss scale and
# skipped equal, loss (4), grad norm (6) and clip coefficient (7) within $tolerance relative.
within_tolerance() {
  local what=$1 got=$2 want=$3 from=$4
  awk -F, -v tol="$tolerance" -v from="$from" -v what="$what" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = (b < 0) ? -b : b; return m > 0 ? d / m : d }
    FNR == 1 { next }
    NR == FNR { if ($1 >= from) { want[$1] = $0; ++wanted }; next }
    $1 >= from {
      ++seen
      if (!($1 in want)) { printf "%s: step %s is not in the reference\n", what, $1; bad = 1; next }
      split(want[$1], w, ",")
      for (c = 1; c <= 9; ++c) {
        if (c == 4 || c == 6 || c == 7) {
          if (rel($c, w[c]) > tol) { printf "%s: step %s column %d: %s vs %s (relative %.3g > %g)\n", what, $1, c, $c, w[c], rel($c, w[c]), tol; bad = 1 }
        } else if ($c != w[c]) { printf "%s: step %s column %d: %s vs %s\n", what, $1, c, $c, w[c]; bad = 1 }
        if (c == 4 || c == 6) worst = (rel($c, w[c]) > worst) ? rel($c, w[c]) : worst
      }
    }
    END {
      if (seen != wanted) { printf "%s: %d rows against %d in the reference\n", what, seen, wanted; bad = 1 }
      printf "%s: %d steps, largest relative difference of loss and grad norm %.3g (bound %g)\n", what, seen, worst, tol
      exit bad
    }' "$want" "$got" || fail "$what: outside the bound (above)"
}

echo "== $name, $PRECISION: $NODES nodes x $RANKS ranks on loopback"
on_loopback loopback "$WORK/layout.json" --metrics "$WORK/loopback.csv"
if [ "$name" != plain ]; then
  echo "== plain ZeRO-3, $PRECISION, on loopback: the reference"
  on_loopback plain "$WORK/plain.json" --metrics "$WORK/plain.csv" --save-dir "$WORK/ckpt-plain" --save-interval "$save_at"
fi

echo "== $name on the simulated cluster"
on_cluster cluster "$WORK/layout.json" --metrics "$WORK/cluster.csv" --save-dir "$WORK/ckpt-layout" --save-interval "$save_at"
[ "$(rows "$WORK/cluster.csv" | wc -l)" = $((steps + 1)) ] || fail "expected $steps metrics rows in $WORK/cluster.csv"
diff <(rows "$WORK/loopback.csv") <(rows "$WORK/cluster.csv") || fail "the cluster run differs from the loopback run (above)"
echo "the $steps steps are the same on the cluster as on loopback:"
rows "$WORK/cluster.csv"
[ "$name" = plain ] || within_tolerance "$name against plain ZeRO-3" "$WORK/cluster.csv" "$WORK/plain.csv" 1

"$ZERO3" plan --model "$model" --config "$WORK/layout.json" --world-size "$world" --ranks-per-node "$RANKS" \
  --micro-batch 2 --grad-accum "$accum" --lr 3e-3 --precision "$PRECISION" > "$WORK/plan.txt" 2>&1 ||
  { cat "$WORK/plan.txt"; fail "zero3 plan failed"; }
expect_planned_link_bytes "$WORK/plan.txt" "$WORK/cluster" "$steps"

if [ "$name" != plain ] && [ "$PRECISION" = fp32 ]; then
  echo "== resume across layouts on the cluster: plain ZeRO-3 from $name's step $save_at, and the reverse"
  on_cluster resume-plain "$WORK/plain.json" --metrics "$WORK/resume-plain.csv" --save-dir "$WORK/ckpt-layout" \
    --resume "global_step$save_at"
  within_tolerance "plain ZeRO-3 resumed from $name's checkpoint" "$WORK/resume-plain.csv" "$WORK/cluster.csv" $((save_at + 1))
  on_cluster resume-layout "$WORK/layout.json" --metrics "$WORK/resume-layout.csv" --save-dir "$WORK/ckpt-plain" \
    --resume "global_step$save_at"
  within_tolerance "$name resumed from plain ZeRO-3's checkpoint" "$WORK/resume-layout.csv" "$WORK/plain.csv" $((save_at + 1))
fi
echo PASS
