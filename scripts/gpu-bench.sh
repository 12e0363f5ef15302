#!/usr/bin/env bash
# The GPU benchmarks in one command: configures a CUDA + NCCL build (scripts/gpu-common.sh), builds every
# tests/bench/bench_cuda_* program and runs each, printing its figures. A program that finds no GPU says
# "skipped: ..." and exits 77. The log goes to $BUILD_DIR/gpu-bench.log (and to $OUT when set).
#
#   scripts/gpu-bench.sh [NAME...]      e.g. scripts/gpu-bench.sh bench_cuda_kernels
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
log="$BUILD_DIR/gpu-bench.log"
mkdir -p "$BUILD_DIR"
set +e
{
  set -e
  gpu_machine_report
  gpu_configure
  if [ $# -gt 0 ]; then
    benches=("$@")
  else
    mapfile -t benches < <(cd "$ZERO3_ROOT/tests/bench" && ls bench_cuda_*.cpp bench_cuda_*.cu 2>/dev/null | sed 's/\.[a-z]*$//' | sort -u)
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS" --target zero3_cli "${benches[@]}"
  status=0
  for b in "${benches[@]}"; do
    echo
    echo "=== $b"
    set +e
    "$BUILD_DIR/bin/$b"
    rc=$?
    set -e
    if [ $rc -eq 77 ]; then
      echo "=== $b: skipped"
    elif [ $rc -ne 0 ]; then
      echo "=== $b: FAILED (exit $rc)"
      status=1
    fi
  done
  exit $status
} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
gpu_keep_log "$log"
exit "$rc"
