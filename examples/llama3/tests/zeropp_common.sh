# shellcheck shell=bash
# The ZeRO++ training job on the tiny Llama and its loss bound, shared (sourced) by dist.llama3.zeropp
# (zeropp_ci.sh: local ranks and `zero3 launch --simulate-nodes`) and the cluster tests cluster.llama3.zeropp.*
# (tests/cluster/test_train_zeropp.sh: network namespaces), so that both train the same job and hold it to one bound.
#
# The job: 50 steps of the license texts, byte tokens, sequence 64, micro-batch 4 x gradient accumulation 2 per rank,
# lr 3e-3 with 5 warmup steps then linear decay, bf16, ZeRO-3 with no persistent units (every gather is quantized),
# blocks of 2048 elements (the defaults).
#
# The bound: a quantized run's mean loss over its last 10 steps lies within 9% of the unquantized run's on the same
# layout, and it converges at least half as far from the first step's loss. 9% is twice the largest difference
# measured (4.5%, docs/benchmarks.md, "ZeRO++ on the tiny Llama"): int4 gradients with one scale per 2048 elements,
# rounded twice (inside the node, then across), slow the first steps down by a few percent.

# The llama3_train arguments of the job, run from the source tree (the caller adds --deepspeed and --metrics); the
# first ones are also `zero3 plan`'s for the job's traffic plan.
# shellcheck disable=SC2034  # used by the scripts that source this one
ZEROPP_PLAN_ARGS=(--model configs/models/llama-3-tiny.json --micro-batch 4 --grad-accum 2 --lr 3e-3 --precision bf16)
# shellcheck disable=SC2034
ZEROPP_TRAIN_ARGS=("${ZEROPP_PLAN_ARGS[@]}" --data /usr/share/common-licenses --tokenizer bytes --seq-len 64
                   --steps 50 --warmup-steps 5 --device cpu)
ZEROPP_STEPS=50

# zeropp_config FILE QWZ QGZ [KEYS]: configs/zero-stage3.json's training keys, every unit gathered (no persistent
# units, so that every gather is quantized), zero_quantized_weights QWZ and zero_quantized_gradients QGZ, and KEYS
# (more zero_optimization members, e.g. '"zero_hpz_partition_size": 2,') for the layout.
zeropp_config() {
  cat > "$1" <<JSON
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
    "stage3_param_persistence_threshold": 0,${4:-}
    "zero_quantized_weights": $2,
    "zero_quantized_gradients": $3
  },
  "steps_per_print": 10
}
JSON
}

# zeropp_first_and_last CSV: the first step's loss and the mean loss of the last 10 steps (the CSV's loss: the mean
# over every target of the step, all ranks and micro-batches); "short" when the CSV has fewer than the job's steps.
zeropp_first_and_last() {
  awk -F, -v steps="$ZEROPP_STEPS" \
      'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "loss") c = i; next }
       { l[NR - 1] = $c; n = NR - 1 }
       END { if (n < steps) { print "short"; exit } s = 0; for (i = n - 9; i <= n; i++) s += l[i]; print l[1], s / 10 }' \
      "$1"
}

# zeropp_verdict UNQUANTIZED_CSV QUANTIZED_CSV: "ok: ..." when the quantized run holds the bound above, else why not.
zeropp_verdict() {
  local ref_first ref_last q_first q_last
  read -r ref_first ref_last <<< "$(zeropp_first_and_last "$1")"
  read -r q_first q_last <<< "$(zeropp_first_and_last "$2")"
  if [ "$ref_first" = short ] || [ "$q_first" = short ]; then
    echo "fewer than $ZEROPP_STEPS steps in $1 or $2"
    return
  fi
  awk -v rf="$ref_first" -v rl="$ref_last" -v qf="$q_first" -v ql="$q_last" 'BEGIN {
    d = (ql - rl) / rl; if (d < 0) d = -d
    if (d > 0.09) { printf "loss %.4f is %.1f%% from the unquantized %.4f (bound 9%%)", ql, 100 * d, rl; exit }
    if (qf - ql < 0.5 * (rf - rl)) { printf "converged %.4f -> %.4f, less than half of %.4f -> %.4f", qf, ql, rf, rl; exit }
    printf "ok: mean loss of the last 10 steps %.4f against %.4f unquantized (%+.2f%%, bound 9%%)", ql, rl, 100 * (ql - rl) / rl }'
}
