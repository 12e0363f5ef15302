#!/usr/bin/env bash
# Sets everything up and runs the tests: packages, a warnings-as-errors build (CUDA sources included when
# the toolkit is present), then every test but the benchmarks. GPU tests skip without a GPU.
#   BUILD_DIR (default build), JOBS (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO3_WERROR=ON
cmake --build "$build" -j "$jobs"
cd "$build"
ctest -LE bench --output-on-failure -j "$jobs" --timeout 600
