#!/usr/bin/env bash
# Sets everything up and runs the main job. Today that is zero3's view of the seed's Llama-3-8B run:
# the environment report and the seed's DeepSpeed config resolved for 16 ranks (4 nodes x 4 GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}"

echo "== zero3 env"
"$build/bin/zero3" env
echo "== zero3 config check configs/llama-3-8b-stage3.json (16 ranks, hidden 4096, micro-batch 4, grad-accum 4, bf16)"
"$build/bin/zero3" config check configs/llama-3-8b-stage3.json --world-size 16 --hidden-size 4096 \
  --micro-batch 4 --grad-accum 4 --precision bf16
