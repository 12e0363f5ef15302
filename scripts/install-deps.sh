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

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
