#!/usr/bin/env bash
# Brings what a CUDA + NCCL build of zero3 needs beyond the GPU machine's own CUDA, CMake, ninja and
# compiler, for a GPU machine without network: run this on a Debian/Ubuntu machine that reaches its package
# mirror, then carry third_party/debs/ with the tree (it is git-ignored; about 2 MiB).
#
#   nlohmann-json3-dev  the config reader's JSON library (header-only, with its CMake package)
#   googletest          GoogleTest's sources: gpu-tests.sh builds them there with the machine's own compiler,
#                       so no library compiled against another libstdc++ is linked in
#
# Every other dependency (Gloo, libfabric, liburing/libaio, OpenBLAS) is optional and left off there.
# The .debs are unpacked with dpkg -x (no install, no root needed) into third_party/debs/root/.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=third_party/debs
packages=(nlohmann-json3-dev googletest)
mkdir -p "$dest/root"
(
  cd "$dest"
  rm -f ./*.deb
  if ! apt-get download "${packages[@]}" 2>/dev/null; then
    echo "gpu-deps: apt-get download failed; updating the package lists and trying again" >&2
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    apt-get download "${packages[@]}"
  fi
  for deb in ./*.deb; do dpkg -x "$deb" root; done
)
test -f "$dest/root/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake"
test -f "$dest/root/usr/src/googletest/CMakeLists.txt"
echo "gpu-deps: unpacked into $dest/root:"
ls -1 "$dest"/*.deb
du -sh "$dest"
