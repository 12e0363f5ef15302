#!/usr/bin/env bash
# ZeRO++'s qwZ and qgZ on the tiny Llama (ctest dist.llama3.zeropp): 50 steps of the license texts, bf16, on 4 ranks
# (plain ZeRO-3, unquantized and with qwZ + qgZ) and on 2 simulated nodes x 2 ranks (hpZ within the node, unquantized
# and with qwZ + qgZ). Each quantized run's mean loss over its last 10 steps must lie within 9% of the unquantized
# run's on the same layout, and it must converge at least half as far from the first step's loss. The bound is twice
# the largest difference measured (4.5%, docs/benchmarks.md, "ZeRO++ on the tiny Llama"): int4 gradients with one
# scale per 2048 elements, rounded twice (inside the node, then across), slow the first steps down by a few percent.
# usage: zeropp_ci.sh ZERO3_CLI LLAMA3_TRAIN REPO_ROOT WORK_DIR
set -euo pipefail
zero3=$1 train=$2 root=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$root"

# config NAME QWZ QGZ HPZ: configs/zero-stage3.json's training keys, every unit gathered (no persistent units, so that
# every gather is quantized), the ZeRO++ keys as given.
config() {
  cat > "$work/$1.json" <<JSON
{
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": 1.0,
  "bf16": { "enabled": true },
  "optimizer": { "type": "AdamW", "params": { "lr": "auto", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0 } },
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "stage3_param_persistence_threshold": 0,
    "zero_hpz_partition_size": $4,
    "zero_quantized_weights": $2,
    "zero_quantized_gradients": $3
  },
  "steps_per_print": 10
}
JSON
}
config plain false false 1
config plain_zeropp true true 1
config hpz false false 2
config hpz_zeropp true true 2

# train NAME LAUNCH_ARGS...: 50 steps with config NAME; the metrics CSV is $work/NAME.csv.
train() {
  local name=$1; shift
  if ! "$zero3" launch "$@" -- "$train" --model configs/models/llama-3-tiny.json --deepspeed "$work/$name.json" \
      --data /usr/share/common-licenses --tokenizer bytes --seq-len 64 --micro-batch 4 --grad-accum 2 --steps 50 \
      --lr 3e-3 --warmup-steps 5 --precision bf16 --device cpu --metrics "$work/$name.csv" > "$work/$name.log" 2>&1; then
    echo "FAIL $name: the run failed:"; cat "$work/$name.log"; exit 1
  fi
}
train plain -n 4
train plain_zeropp -n 4
train hpz -n 2 --simulate-nodes 2
train hpz_zeropp -n 2 --simulate-nodes 2

# first_and_last NAME: the first step's loss and the mean loss of the last 10 steps (the CSV's loss: the mean over
# every target of the step, all ranks and micro-batches).
first_and_last() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "loss") c = i; next }
           { l[NR - 1] = $c; n = NR - 1 }
           END { if (n < 50) { print "short"; exit } s = 0; for (i = n - 9; i <= n; i++) s += l[i]; print l[1], s / 10 }' \
      "$work/$1.csv"
}
failures=0
for pair in plain:plain_zeropp hpz:hpz_zeropp; do
  ref=${pair%%:*} q=${pair##*:}
  read -r ref_first ref_last <<< "$(first_and_last "$ref")"
  read -r q_first q_last <<< "$(first_and_last "$q")"
  verdict=$(awk -v rf="$ref_first" -v rl="$ref_last" -v qf="$q_first" -v ql="$q_last" 'BEGIN {
    d = (ql - rl) / rl; if (d < 0) d = -d
    if (d > 0.09) { printf "loss %.4f is %.1f%% from the unquantized %.4f (bound 9%%)", ql, 100 * d, rl; exit }
    if (qf - ql < 0.5 * (rf - rl)) { printf "converged %.4f -> %.4f, less than half of %.4f -> %.4f", qf, ql, rf, rl; exit }
    printf "ok" }')
  if [ "$verdict" = ok ]; then
    echo "ok $q: mean loss of the last 10 steps $q_last against $ref_last unquantized"
  else
    echo "FAIL $q: $verdict"; failures=$((failures + 1))
  fi
done
exit $failures
