#!/usr/bin/env bash
# Llama-3 training on one GPU in one command: llama3_train (zero3, ZeRO stage 3, bf16) against PyTorch FSDP2
# (examples/llama3/tools/fsdp2_reference.py) twice, on the same GPU, model, micro-batch and sequence length, in
# the same run: FSDP2 eager (transformers' model as written, for-each AdamW, the loss over the whole logits) and
# FSDP2 as a PyTorch expert runs it (torch.compile per decoder layer, fused AdamW, and with LOSS_CHUNKS the
# chunked loss). Prints each side's tokens/s, step time, MFU and peak GPU memory, then the ratios zero3 / each
# peer. Needs a CUDA build (scripts/gpu-common.sh) and, for the peers, python3 with torch and transformers (the
# GPU machines' image has both). Log: $BUILD_DIR/gpu-llama3-bench.log (and $OUT).
#
# Environment: MODEL (default configs/models/llama-3-1b-untied.json, a Llama-3-shaped model that fits one
# GPU without offload), MICRO_BATCH (4), SEQ_LEN (1024), STEPS (20), WARMUP (3; the compiled peer compiles in
# them), CHECKPOINTING (1: every side recomputes each layer in backward; 0: none does), LOSS_CHUNKS (0: the
# compiled peer keeps transformers' loss; N > 0: its loss in N chunks of rows, the logits never whole).
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
log="$BUILD_DIR/gpu-llama3-bench.log"
mkdir -p "$BUILD_DIR"
MODEL="${MODEL:-$ZERO3_ROOT/configs/models/llama-3-1b-untied.json}"
MICRO_BATCH="${MICRO_BATCH:-4}"
SEQ_LEN="${SEQ_LEN:-1024}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-3}"
CHECKPOINTING="${CHECKPOINTING:-1}"
LOSS_CHUNKS="${LOSS_CHUNKS:-0}"
work="$BUILD_DIR/llama3-bench"
set +e
{
  set -e
  gpu_machine_report
  gpu_configure
  cmake --build "$BUILD_DIR" -j "$JOBS" --target zero3_cli llama3_train
  rm -rf "$work" && mkdir -p "$work"
  ckpt_flag=(--no-grad-checkpointing)
  py_ckpt=()
  if [ "$CHECKPOINTING" = 1 ]; then
    ckpt_flag=(--grad-checkpointing)
    py_ckpt=(--grad-checkpointing)
  fi

  echo
  echo "=== zero3 llama3_train: $(basename "$MODEL"), micro-batch $MICRO_BATCH, seq $SEQ_LEN, $STEPS steps"
  "$BUILD_DIR/bin/llama3_train" --device cuda --model "$MODEL" --deepspeed "$ZERO3_ROOT/configs/zero-stage3.json" \
    --precision bf16 --micro-batch "$MICRO_BATCH" --grad-accum 1 --seq-len "$SEQ_LEN" --steps "$STEPS" \
    --warmup-steps 0 --lr 1e-4 "${ckpt_flag[@]}" --metrics "$work/zero3.csv"

  peer=(python3 "$ZERO3_ROOT/examples/llama3/tools/fsdp2_reference.py" --model "$MODEL" --micro-batch "$MICRO_BATCH"
    --seq-len "$SEQ_LEN" --steps "$STEPS" --warmup "$WARMUP" "${py_ckpt[@]}")
  echo
  echo "=== PyTorch FSDP2 eager: the same model, batch and sequence length"
  "${peer[@]}" --out "$work/fsdp2_eager.json"
  echo
  echo "=== PyTorch FSDP2 compiled: torch.compile per layer, fused AdamW, loss chunks $LOSS_CHUNKS"
  "${peer[@]}" --compile --fused-adamw --loss-chunks "$LOSS_CHUNKS" --out "$work/fsdp2_compiled.json"

  echo
  python3 - "$work/zero3.csv" "$WARMUP" "$work/fsdp2_eager.json" "$work/fsdp2_compiled.json" <<'EOF'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))[int(sys.argv[2]):]
peers = [json.load(open(path)) for path in sys.argv[3:]]
if not rows:
    sys.exit("no timed zero3 steps in " + sys.argv[1])
def mean(key):
    return sum(float(r[key]) for r in rows) / len(rows)
z_tps, z_step = mean("tokens_per_s"), mean("step_time_s")
peak_key = "mem_device_peak" if "mem_device_peak" in rows[0] else "mem_engine_peak"
z_peak = max(int(r[peak_key]) for r in rows)
z_mfu = mean("mfu") if "mfu" in rows[0] and rows[0]["mfu"] not in ("", "n/a") else None
fmt = lambda v: "n/a" if v is None else f"{v:.3f}"
print(f"zero3  tokens/s {z_tps:10.0f}  step {z_step:7.3f} s  MFU {fmt(z_mfu)}  peak GPU {z_peak / 2**30:6.2f} GiB ({peak_key})")
for peer in peers:
    p_peak = peer["peak_gpu_bytes"] or 0
    print(f"FSDP2  tokens/s {peer['tokens_per_s']:10.0f}  step {peer['step_time_s']:7.3f} s  MFU {fmt(peer['mfu'])}  "
          f"peak GPU {p_peak / 2**30:6.2f} GiB  ({peer['framework']})")
for peer in peers:
    p_peak = peer["peak_gpu_bytes"] or 0
    kind = "compiled" if peer.get("compile") else "eager"
    print(f"ratio zero3 / FSDP2 {kind}: tokens/s {z_tps / peer['tokens_per_s']:.3f}, "
          f"peak memory {z_peak / p_peak if p_peak else float('nan'):.3f}")
EOF
} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
gpu_keep_log "$log"
exit "$rc"
