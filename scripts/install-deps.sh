#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages zero3 builds and tests with. Safe to run again: it installs only
# what is missing. Needs root or sudo. The CUDA toolkit is optional and not installed here: when it is at
# /usr/local/cuda (or nvcc is on PATH) the CUDA and NCCL backends are built too.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config git
  libgtest-dev nlohmann-json3-dev        # tests, config reader
  libgloo-dev                            # CPU communicator
  libfabric-dev libfabric-bin            # EFA probe (fi_info)
  liburing-dev libaio-dev fio            # NVMe offload engines, and fio as their yardstick
  libopenblas-dev                        # CPU GEMMs of the Llama-3 example
  openmpi-bin                            # mpirun, to test that launcher
  python3 python3-yaml                   # manifest validation in tests
  iproute2 procps                        # the simulated cluster (ip netns, tc) and its tests (pgrep)
  clang libclang-rt-14-dev libomp-14-dev # libFuzzer target (clang build)
)

# Optional: installed where the distribution has them. libtorch-dev (libtorch 1.13.1 on Debian 12, CPU; 157 packages,
# 486 MiB, about 40 s) builds the libtorch adapter, its example and its tests (ctest -L libtorch).
optional=(libtorch-dev)

# Never `cmd | grep -q` under pipefail: grep exits at its first match, the command dies of SIGPIPE writing the rest,
# and the pipeline fails although the text matched. The command's output is taken whole first.
installed() { grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"; }
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
optional_missing=()
for p in "${optional[@]}"; do installed "$p" || optional_missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ] && [ ${#optional_missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present (and ${optional[*]})"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
for p in "${optional_missing[@]}"; do
  if grep -q "Candidate: [0-9]" <<<"$(apt-cache policy "$p" 2>/dev/null || true)"; then
    missing+=("$p")
  else
    echo "install-deps: $p is not packaged here; what needs it is not built"
  fi
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install-deps: installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
