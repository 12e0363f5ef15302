#!/usr/bin/env bash
# llama3_train --pipeline-stages on the tiny Llama (ctest dist.llama3.pipeline, labels dist and pipeline): the
# pipelined runs print the same per-step losses and gradient norms as the unpipelined run over the same global batch
# (the same data-parallel ranks, micro-batch, accumulation and data order), in fp32, 6 steps:
#   2 ranks: 2 stages x 1 against 1 rank, with gpipe, 1f1b and interleaved_1f1b (2 virtual stages), ZeRO-1 and ZeRO-3
#   4 ranks: 2 stages x 2 against 2 ranks (1f1b, ZeRO-3) and 4 stages x 1 against 1 rank (1f1b and gpipe, ZeRO-3)
# Bound: every step's loss and gradient norm, and the evaluation loss after the last step (--eval-data: 5 micro-batches
# per data-parallel rank, padded to whole pipeline batches when pipelined), within 1e-5 relative (the CSV's 9
# significant digits), the worst printed. At bf16: 2 stages x 1 against 1 rank with the boundaries in bf16 (the
# default) near it, and with --pipeline-boundary-dtype activation (fp32) equal.
# Checkpoints: saved pipelined, resumed pipelined and unpipelined, consolidated on both (below).
# Then what the program refuses, each by name: tied embeddings across stages, --consolidate-to without --save-dir, a
# stage count that does not divide the ranks and an activation checkpoint interval above 1; and --dry-run's partition
# and per-stage memory.
# usage: pipeline_ci.sh ZERO3_CLI LLAMA3_TRAIN REPO_ROOT WORK_DIR
set -euo pipefail
zero3=$1 train=$2 root=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$root"

ARGS=(--model configs/models/llama-3-tiny.json --data /usr/share/common-licenses --tokenizer bytes --seq-len 32
      --micro-batch 2 --grad-accum 4 --steps 6 --lr 3e-3 --precision fp32 --device cpu
      --eval-data /usr/share/common-licenses/Apache-2.0 --eval-batches 5)

# config FILE ZERO_STAGE SCHEDULE VIRTUAL_STAGES
config() {
  cat > "$1" <<JSON
{
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": 1.0,
  "optimizer": { "type": "AdamW", "params": { "lr": "auto", "betas": [0.9, 0.999], "eps": 1e-4, "weight_decay": 0.01 } },
  "zero_optimization": { "stage": $2, "stage3_param_persistence_threshold": 0 },
  "zero3": { "pipeline_schedule": "$3", "pipeline_virtual_stages": $4 },
  "steps_per_print": 1
}
JSON
}

# run NAME RANKS CONFIG [ARGS...]: the metrics CSV is $work/NAME.csv, the output $work/NAME.log.
run() {
  local name=$1 ranks=$2 cfg=$3; shift 3
  if ! "$zero3" launch -n "$ranks" -- "$train" "${ARGS[@]}" --deepspeed "$cfg" --metrics "$work/$name.csv" "$@" \
      > "$work/$name.log" 2>&1; then
    echo "FAIL $name: the run failed:"; cat "$work/$name.log"; exit 1
  fi
}

# compare REF RUN [TOLERANCE]: every step's loss and grad_norm (columns found by name) within 1e-5 (or TOLERANCE)
# relative.
failures=0
compare() {
  local verdict
  verdict=$(awk -F, -v tol="${3:-1e-5}" '
    FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    FILENAME == ARGV[1] { loss[$1] = $col["loss"]; norm[$1] = $col["grad_norm"]; ev[$1] = $col["eval_loss"]; next }
    {
      n++
      if (!($1 in loss)) { bad = bad " step " $1 " missing in the reference"; next }
      dl = $col["loss"] - loss[$1]; if (dl < 0) dl = -dl; dl /= (loss[$1] < 0 ? -loss[$1] : loss[$1])
      dn = $col["grad_norm"] - norm[$1]; if (dn < 0) dn = -dn; dn /= norm[$1]
      if (dl > ml) ml = dl; if (dn > mn) mn = dn
      if (ev[$1] != "" || $col["eval_loss"] != "") {
        evals++
        if (ev[$1] == "" || $col["eval_loss"] == "") { bad = bad " step " $1 ": an evaluation on one side only"; next }
        de = $col["eval_loss"] - ev[$1]; if (de < 0) de = -de; de /= ev[$1]
        if (de > me) me = de
        if (de > tol) bad = bad sprintf(" step %s: eval loss %s vs %s", $1, $col["eval_loss"], ev[$1])
      }
      if (dl > tol || dn > tol) bad = bad sprintf(" step %s: loss %s vs %s, grad norm %s vs %s", $1, $col["loss"], loss[$1], $col["grad_norm"], norm[$1])
      last = $col["loss"]; if (n == 1) first = last
    }
    END {
      if (n == 0) { print "FAIL: no steps"; exit }
      if (!(last < first)) bad = bad sprintf(" the loss did not fall (%s -> %s)", first, last)
      if (evals != 1) bad = bad sprintf(" %d evaluations, expected 1", evals)
      printf "%s %d steps, max loss diff %.3g, max grad norm diff %.3g, eval loss diff %.3g (relative)%s\n", bad == "" ? "ok" : "FAIL", n, ml, mn, me, bad
    }' "$work/$1.csv" "$work/$2.csv")
  echo "${verdict%% *} $2 against $1: ${verdict#* }"
  [ "${verdict%% *}" = ok ] || failures=$((failures + 1))
}

config "$work/z1_1f1b.json" 1 1f1b 1
config "$work/z3_1f1b.json" 3 1f1b 1
config "$work/z1_gpipe.json" 1 gpipe 1
config "$work/z3_gpipe.json" 3 gpipe 1
config "$work/z1_inter.json" 1 interleaved_1f1b 2
config "$work/z3_inter.json" 3 interleaved_1f1b 2

run ref1_z1 1 "$work/z1_1f1b.json"
run ref1_z3 1 "$work/z3_1f1b.json"
run ref2_z3 2 "$work/z3_1f1b.json"
for z in z1 z3; do
  for s in 1f1b gpipe inter; do
    run "p2x1_${z}_$s" 2 "$work/${z}_$s.json" --pipeline-stages 2
    compare "ref1_$z" "p2x1_${z}_$s"
  done
done
run p2x2_z3_1f1b 4 "$work/z3_1f1b.json" --pipeline-stages 2
compare ref2_z3 p2x2_z3_1f1b
run p4x1_z3_1f1b 4 "$work/z3_1f1b.json" --pipeline-stages 4
compare ref1_z3 p4x1_z3_1f1b
run p4x1_z3_gpipe 4 "$work/z3_gpipe.json" --pipeline-stages 4
compare ref1_z3 p4x1_z3_gpipe

# bf16: the boundaries carry the compute dtype by default (as DeepSpeed's pipeline sends a bf16 model's
# activations), which rounds the CPU backend's fp32 residual stream at each boundary: near the unpipelined run
# (2e-3 relative; 1.9e-5 in the loss and 1.8e-4 in the gradient norm when written), not equal;
# --pipeline-boundary-dtype activation sends fp32 and is equal again (1e-5).
run ref1_z1_bf16 1 "$work/z1_1f1b.json" --precision bf16
run p2x1_z1_bf16 2 "$work/z1_1f1b.json" --pipeline-stages 2 --precision bf16
compare ref1_z1_bf16 p2x1_z1_bf16 2e-3
run p2x1_z1_bf16_act 2 "$work/z1_1f1b.json" --pipeline-stages 2 --precision bf16 --pipeline-boundary-dtype activation
compare ref1_z1_bf16 p2x1_z1_bf16_act
grep -q "boundaries in bf16" "$work/p2x1_z1_bf16.log" ||
  { echo "FAIL the bf16 run does not say its boundaries are bf16"; failures=$((failures + 1)); }

# Checkpoints: 2 stages x 1 (ZeRO-3) saves at step 3; resumed on 2 stages and on 1 rank without a pipeline, each
# continues as the uninterrupted runs do (steps 4-6 within 1e-5); both consolidate their final weights
# (--consolidate-to, the pipelined one from its final checkpoint), which agree within 1e-5 of the largest weight.
run ck_p2_first 2 "$work/z3_1f1b.json" --pipeline-stages 2 --steps 3 --save-dir "$work/ck"
cp -r "$work/ck" "$work/ck_plain"
run ck_p2_resumed 2 "$work/z3_1f1b.json" --pipeline-stages 2 --save-dir "$work/ck" --resume latest \
  --consolidate-to "$work/hf_p2"
compare p2x1_z3_1f1b ck_p2_resumed
run ck_p1_resumed 1 "$work/z3_1f1b.json" --save-dir "$work/ck_plain" --resume latest --consolidate-to "$work/hf_p1"
compare ref1_z3 ck_p1_resumed
verdict=$(python3 - "$work/hf_p2" "$work/hf_p1" <<'PY'
import json, os, struct, sys
def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        raw = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        for name, t in json.loads(raw[8:8 + n]).items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            if t["dtype"] != "F32":
                sys.exit(f"FAIL {f}: {name} is {t['dtype']}, expected F32 at --precision fp32")
            out[name] = struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b])
    return out
p, q = tensors(sys.argv[1]), tensors(sys.argv[2])
if not p or sorted(p) != sorted(q):
    sys.exit(f"FAIL tensor names differ: {sorted(set(p) ^ set(q))[:5]}")
scale = max(abs(x) for v in q.values() for x in v)
worst = max(abs(x - y) for k in p for x, y in zip(p[k], q[k]))
ok = worst <= 1e-5 * scale and os.path.exists(os.path.join(sys.argv[1], "config.json"))
print(f"{'ok' if ok else 'FAIL'} {len(p)} tensors, largest difference {worst:.3g} (largest weight {scale:.3g})")
PY
) || true
echo "${verdict:-FAIL no verdict} (consolidated: pipelined resumed against unpipelined resumed)"
[ "${verdict%% *}" = ok ] || failures=$((failures + 1))

# The pipelined run names its layout and partition.
if ! grep -q "pipeline   2 stages x 2 data-parallel ranks" "$work/p2x2_z3_1f1b.log" ||
   ! grep -q "partition  stage 0: embedding" "$work/p2x2_z3_1f1b.log"; then
  echo "FAIL the pipelined run's header lacks the pipeline line or the partition:"; head -30 "$work/p2x2_z3_1f1b.log"
  failures=$((failures + 1))
fi

# refuse NAME TEXT RANKS ARGS...: the run fails and its output holds TEXT.
refuse() {
  local name=$1 text=$2 ranks=$3; shift 3
  if "$zero3" launch -n "$ranks" -- "$train" "${ARGS[@]}" --metrics none "$@" > "$work/$name.log" 2>&1; then
    echo "FAIL $name: the run was accepted"; failures=$((failures + 1))
  elif ! grep -qF -- "$text" "$work/$name.log"; then
    echo "FAIL $name: the error does not say '$text':"; tail -5 "$work/$name.log"; failures=$((failures + 1))
  else
    echo "ok refused $name: $(grep -F -- "$text" "$work/$name.log" | head -1)"
  fi
}
sed 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' configs/models/llama-3-tiny.json > "$work/tied.json"
refuse tied "tie_word_embeddings with pipeline stages > 1" 2 --deepspeed "$work/z3_1f1b.json" \
  --pipeline-stages 2 --model "$work/tied.json"
refuse consolidate_alone "--consolidate-to with 2 pipeline stages (pipeline.stages or --pipeline-stages) needs --save-dir" \
  2 --deepspeed "$work/z3_1f1b.json" --pipeline-stages 2 --consolidate-to "$work/hf_refused"
refuse indivisible "pipeline.stages" 3 --deepspeed "$work/z3_1f1b.json" --pipeline-stages 2
sed 's/"steps_per_print": 1/"steps_per_print": 1, "pipeline": { "activation_checkpoint_interval": 2 }/' \
  "$work/z3_1f1b.json" > "$work/interval2.json"
refuse checkpoint_interval "pipeline.activation_checkpoint_interval: 2" 2 --deepspeed "$work/interval2.json" \
  --pipeline-stages 2

# --dry-run: the partition and one memory line per pipeline rank.
if ! "$train" "${ARGS[@]}" --deepspeed "$work/z3_1f1b.json" --pipeline-stages 2 --dry-run --world-size 4 \
    > "$work/dry_run.log" 2>&1; then
  echo "FAIL dry run:"; cat "$work/dry_run.log"; failures=$((failures + 1))
elif ! grep -q "partition (parameters): stage 0: embedding" "$work/dry_run.log" ||
     [ "$(grep -c '^    rank [0-9] (stage' "$work/dry_run.log")" != 2 ]; then
  echo "FAIL dry run: no partition or not 2 per-stage memory lines:"; cat "$work/dry_run.log"; failures=$((failures + 1))
else
  echo "ok dry run:"; grep -A3 "^pipeline:" "$work/dry_run.log"
fi
exit $failures
