#!/usr/bin/env bash
# The GPU test suite in one command: configures a CUDA + NCCL build (scripts/gpu-common.sh), builds the
# programs behind the tests labelled gpu, and runs them with ctest. On a machine without a GPU every test
# reports "skipped" with its reason. The log goes to $BUILD_DIR/gpu-tests.log (and to $OUT when set).
#
#   scripts/gpu-tests.sh [ctest arguments...]     e.g. scripts/gpu-tests.sh -R cuda_kernels
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
log="$BUILD_DIR/gpu-tests.log"
mkdir -p "$BUILD_DIR"
set +e
{
  set -e
  gpu_machine_report
  gpu_configure
  # The targets behind the gpu tests (a test gpu.NAME runs the program NAME), and the launcher.
  mapfile -t targets < <(ctest --test-dir "$BUILD_DIR" -L '^gpu$' -N | sed -n 's/.*Test *#[0-9]*: gpu\.\([A-Za-z0-9_]*\).*/\1/p')
  [ ${#targets[@]} -gt 0 ] || { gpu_log "no gpu tests registered"; exit 1; }
  gpu_log "building ${#targets[@]} test programs and zero3_cli"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target zero3_cli "${targets[@]}"
  set +e
  ctest --test-dir "$BUILD_DIR" -L '^gpu$' --output-on-failure "$@"
  rc=$?
  set -e
  echo "gpu-tests: ctest exit code $rc"
  exit $rc
} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
gpu_keep_log "$log"
exit "$rc"
