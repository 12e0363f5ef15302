#!/usr/bin/env bash
# Sets everything up and runs the tests: packages, a warnings-as-errors build (CUDA sources included when
# the toolkit is present), then every test but the full-size benchmarks (their smoke runs included). GPU tests skip
# without a GPU.
#   BUILD_DIR (default build), JOBS (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO3_WERROR=ON
cmake --build "$build" -j "$jobs"
# The safetensors and config fuzz targets build with clang (libFuzzer) in its own tree; their tests replay the corpora.
if command -v clang++ >/dev/null; then
  cmake -S . -B "$build-fuzz" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DZERO3_CUDA=OFF -DZERO3_FUZZ=ON -DZERO3_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$build-fuzz" --target fuzz_safetensors fuzz_config -j "$jobs"
  ctest --test-dir "$build-fuzz" -L fuzz --output-on-failure
fi

# -LE is a regular expression: '^bench$' leaves out the full-size benchmarks and keeps their smoke runs (bench_smoke).
ctest --test-dir "$build" -LE '^bench$' --output-on-failure -j "$jobs" --timeout 600
