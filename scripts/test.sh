#!/usr/bin/env bash
# Sets everything up and runs the tests: packages, a warnings-as-errors build (CUDA sources included when
# the toolkit is present), then every test but the full-size benchmarks (their smoke runs included). GPU tests skip
# without a GPU.
#   BUILD_DIR (default build), JOBS (default: number of cores), CUDA_ARCHS (default 90: CMAKE_CUDA_ARCHITECTURES)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
# Where the distribution packages libtorch-dev (install-deps.sh installs it), the libtorch adapter and its tests are
# part of the run: ZERO3_LIBTORCH=ON makes a configure that does not find libtorch fail instead of skipping them.
libtorch=()
if command -v apt-cache >/dev/null && grep -q "Candidate: [0-9]" <<<"$(apt-cache policy libtorch-dev 2>/dev/null || true)"; then
  libtorch=(-DZERO3_LIBTORCH=ON)
fi
# Debug information at level 1 (-g1: functions and line tables, what a backtrace needs; no local variables): the
# same code as -g, and a C++ compile takes a tenth to a half less CPU (docs/testing.md, "How long the test command
# takes"). A build of your own for a debugger: RelWithDebInfo's default -g.
debug_info=(-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")
# CUDA code for one architecture (sm_90, as the GPU run's): every CUDA source still compiles and links, once instead of
# three times (the library's default, cmake/Zero3Dependencies.cmake, is unchanged). The source has no
# architecture-dependent code, so one architecture checks all of it. CUDA_ARCHS overrides it.
cuda_archs=(-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}")
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${debug_info[@]}" "${cuda_archs[@]}" \
  -DZERO3_WERROR=ON "${libtorch[@]}"; then
  if [ ${#libtorch[@]} -gt 0 ]; then
    echo "test.sh: the distribution packages libtorch-dev, but the libtorch adapter could not be configured (see" \
      "the LIBTORCH line above): install libtorch-dev (scripts/install-deps.sh) or fix what CMake reports" >&2
  fi
  exit 1
fi
cmake --build "$build" -j "$jobs"
if [ ${#libtorch[@]} -gt 0 ]; then
  n=$(ctest --test-dir "$build" -N -L libtorch | sed -n 's/^Total Tests: //p')
  if [ "${n:-0}" -eq 0 ]; then
    echo "test.sh: the distribution packages libtorch-dev, but $build has no libtorch test (ctest -L libtorch)" >&2
    exit 1
  fi
  echo "test.sh: libtorch-dev is packaged here: the adapter is built, $n tests in the libtorch label"
fi
# The safetensors and config fuzz targets build with clang (libFuzzer) in its own tree; their tests replay the corpora.
if command -v clang++ >/dev/null; then
  cmake -S . -B "$build-fuzz" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${debug_info[@]}" \
    -DZERO3_CUDA=OFF -DZERO3_FUZZ=ON -DZERO3_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$build-fuzz" --target fuzz_safetensors fuzz_config -j "$jobs"
  ctest --test-dir "$build-fuzz" -L fuzz --output-on-failure
fi

# -LE is a regular expression: '^(bench|extended)$' leaves out the full-size benchmarks (keeping their smoke runs,
# bench_smoke) and the runs of label extended (docs/testing.md).
ctest --test-dir "$build" -LE '^(bench|extended)$' --output-on-failure -j "$jobs" --timeout 600
