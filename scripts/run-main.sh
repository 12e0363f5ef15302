#!/usr/bin/env bash
# The main job: installs the packages zero3 needs, builds zero3 and the Llama-3 example, then trains the tiny
# Llama-3 (configs/models/llama-3-tiny.json, byte-level, on the license texts every Debian/Ubuntu machine has)
# on 2 ranks with ZeRO stage 3 (configs/zero-stage3.json), saves a checkpoint, writes the final weights as
# Hugging Face safetensors, and prints where everything went.
#
#   BUILD_DIR   build directory (default build)
#   JOBS        parallel build jobs (default: number of cores)
#   OUT_DIR     where the run writes (default runs/llama3-tiny-<date>-<time>)
#   STEPS       optimizer steps (default 300: a few minutes on 2 cores; the loss falls from 5.6 to about 1.4)
#   RANKS       ranks (default 2)
#   DEVICE      cpu, cuda or auto (default): cuda when the build has CUDA and nvidia-smi lists a GPU, with one
#               rank per GPU (at most RANKS); otherwise RANKS CPU ranks
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target zero3_cli llama3_train

out=${OUT_DIR:-runs/llama3-tiny-$(date +%Y%m%d-%H%M%S)}
steps=${STEPS:-300}
ranks=${RANKS:-2}
mkdir -p "$out"

device=${DEVICE:-auto}
if [ "$device" = auto ]; then
  device=cpu
  if grep -q "ZERO3_HAVE_CUDA 1" "$build/include/zero3/build_config.hpp" && command -v nvidia-smi >/dev/null 2>&1 &&
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') && [ "$gpus" -gt 0 ]; then
    device=cuda
    [ "$ranks" -gt "$gpus" ] && ranks=$gpus
  fi
fi

echo "== training the tiny Llama-3: $ranks ranks on $device, ZeRO-3, $steps steps (log: $out/train.log)"
start=$(date +%s)
"$build/bin/zero3" launch -n "$ranks" -- "$build/bin/llama3_train" \
  --model configs/models/llama-3-tiny.json \
  --deepspeed configs/zero-stage3.json \
  --data /usr/share/common-licenses --tokenizer bytes \
  --seq-len 128 --micro-batch 4 --grad-accum 4 \
  --steps "$steps" --lr 3e-3 --warmup-steps 20 \
  --precision bf16 --device "$device" \
  --save-dir "$out/checkpoints" --save-interval 100 \
  --metrics "$out/metrics.csv" \
  --consolidate-to "$out/hf" 2>&1 | tee "$out/train.log"
end=$(date +%s)

echo
echo "== done in $((end - start)) s; everything is under $out"
echo "  training log        $out/train.log"
echo "  metrics (CSV)       $out/metrics.csv   (one row per step: loss, lr, grad norm, tokens/s, times, memory)"
echo "  checkpoints         $out/checkpoints   ($(tr -d '\n' < "$out/checkpoints/latest" 2>/dev/null || echo none) is the latest)"
echo "  Hugging Face model  $out/hf            ($(ls "$out/hf" | tr '\n' ' '))"
echo "  continue training:  $build/bin/zero3 launch -n $ranks -- $build/bin/llama3_train --seq-len 128 --lr 3e-3 \\"
echo "                        --warmup-steps 20 --precision bf16 --device $device --save-dir $out/checkpoints --resume latest --steps $((steps + 100))"
