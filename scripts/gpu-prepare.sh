#!/usr/bin/env bash
# Prepares, on a machine with network, what the GPU run (scripts/gpu-run.sh) needs beyond the GPU machine's image,
# checks that everything travels within the device call's 64 MiB, and prints the exact call.
#
#   scripts/gpu-prepare.sh            fetch what is missing, check, print the call
#   scripts/gpu-prepare.sh --check    only check (exit 1 naming what is missing or too large; fetches nothing)
#
# The GPU machine has its CUDA 13 toolkit, CMake, a compiler and PyTorch with NVIDIA's wheels (cuDNN, NCCL, NVRTC),
# but none of our Debian -dev packages and no network. Two packages travel, unpacked with dpkg -x (no install, no
# root) into third_party/debs/root/, which git ignores and the call carries:
#   nlohmann-json3-dev  the config reader's JSON library (headers and CMake package)
#   googletest          GoogleTest's sources; gpu-run.sh builds them there with the machine's own compiler
# Every other dependency (Gloo, libfabric, liburing/libaio, OpenBLAS) is optional and off in the GPU run.
#
# What travels: the files git tracks, the untracked files it does not ignore, and the carried third_party/debs.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly DEST=third_party/debs
readonly PACKAGES=(nlohmann-json3-dev googletest)
readonly LIMIT_BYTES=$((64 * 1024 * 1024))
check_only=0
case "${1:-}" in
  "") ;;
  --check) check_only=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

have_debs() {
  [ -f "$DEST/root/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" ] &&
    [ -f "$DEST/root/usr/src/googletest/CMakeLists.txt" ]
}

if ! have_debs; then
  if [ "$check_only" = 1 ]; then
    echo "gpu-prepare: $DEST/root lacks nlohmann_json or GoogleTest: run scripts/gpu-prepare.sh where there is network" >&2
    exit 1
  fi
  mkdir -p "$DEST/root"
  (
    cd "$DEST"
    rm -f ./*.deb
    if ! apt-get download "${PACKAGES[@]}" 2>/dev/null; then
      echo "gpu-prepare: apt-get download failed; updating the package lists and trying again" >&2
      sudo_cmd=""
      if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
      $sudo_cmd apt-get update -qq
      apt-get download "${PACKAGES[@]}"
    fi
    for deb in ./*.deb; do dpkg -x "$deb" root; done
    rm -f ./*.deb  # unpacked; the archives need not travel
  )
  have_debs || { echo "gpu-prepare: the packages unpacked without the expected files" >&2; exit 1; }
fi

# Bytes that travel: the working tree as git sees it (tracked, and untracked but not ignored) plus the carried path.
tree_bytes=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true) |
  awk '{s += $1} END {print s + 0}')
carried_bytes=$(find "$DEST" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
total=$((tree_bytes + carried_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu-prepare: travels $(mib "$total") of 64 MiB: the tree $(mib "$tree_bytes"), $DEST $(mib "$carried_bytes")"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "gpu-prepare: over the 64 MiB the device call carries; the largest files that travel:" >&2
  git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -b -- 2>/dev/null | sort -rn | head -10 >&2
  exit 1
fi

cat <<EOF
gpu-prepare: ready. The two device calls (docs/gpu.md, "The first GPU window"):
  first:   command: bash scripts/gpu-run.sh                   carry: ["$DEST"]  timeout_s: 440
  second, at once on the warm machine, if status shows ~270 s left (else give_back):
           command: bash scripts/gpu-run.sh --deadline 240 --only rest   carry: ["$DEST"]  timeout_s: 270
EOF
