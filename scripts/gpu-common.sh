# Sourced by gpu-tests.sh and gpu-bench.sh: configures a CUDA + NCCL build of zero3 on a GPU machine that has
# CUDA, CMake, ninja and a compiler but maybe none of our Debian -dev packages and no network.
#
# Dependencies, in order of preference:
#   nlohmann_json  the system's, else third_party/debs/root/usr (scripts/gpu-deps.sh brings it)
#   GoogleTest     the system's, else built here from third_party/debs/root/usr/src/googletest
#   NCCL           $NCCL_HOME, else next to CUDA (/usr/local/cuda), else the nvidia-nccl wheel that PyTorch
#                  installs (python3 -c 'import nvidia.nccl')
#   cuDNN 9        $CUDNN_HOME, else next to CUDA, else the nvidia-cudnn wheel that PyTorch installs
#                  (python3 -c 'import nvidia.cudnn'); optional: without it attention runs on cuBLAS
# Optional backends (Gloo, libfabric, io_uring/libaio, OpenBLAS) are OFF unless ZERO3_OPTIONAL=AUTO.
# Environment: BUILD_DIR (default build-gpu), CUDA_ARCHS (default: CMake's choice in Zero3Dependencies),
# JOBS (default: all cores), ZERO3_USE_CARRIED_DEPS=1 (take nlohmann_json and GoogleTest from
# third_party/debs even where the system has them: how this path is tested on a machine that has both).

ZERO3_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ZERO3_ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
DEBS_ROOT="$ZERO3_ROOT/third_party/debs/root"

gpu_log() { echo "[gpu] $*" >&2; }

have_cmake_package() {  # name: a <name>Config.cmake in the usual system places
  local name=$1
  compgen -G "/usr/lib/*/cmake/$name/*onfig.cmake" >/dev/null || compgen -G "/usr/lib/cmake/$name/*onfig.cmake" >/dev/null ||
    compgen -G "/usr/share/cmake/$name/*onfig.cmake" >/dev/null || compgen -G "/usr/local/lib*/cmake/$name/*onfig.cmake" >/dev/null ||
    compgen -G "/usr/local/share/cmake/$name/*onfig.cmake" >/dev/null
}

gpu_machine_report() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /'
  else
    echo "gpu: nvidia-smi not found"
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1 | sed 's/^/nvcc: /'
  echo "cmake: $(cmake --version | head -1)"
  echo "compiler: $(${CXX:-c++} --version | head -1)"
}

gpu_configure() {
  local prefix=() extra=()
  if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then export PATH="/usr/local/cuda/bin:$PATH"; fi

  local carried="${ZERO3_USE_CARRIED_DEPS:-0}"
  if [ "$carried" = 1 ] || ! have_cmake_package nlohmann_json; then
    [ -d "$DEBS_ROOT/usr/share/cmake/nlohmann_json" ] ||
      { gpu_log "nlohmann_json missing: run scripts/gpu-deps.sh where there is network and carry third_party/debs"; return 1; }
    prefix+=("$DEBS_ROOT/usr")
    gpu_log "nlohmann_json from $DEBS_ROOT/usr"
  fi

  if [ "$carried" = 1 ] || ! have_cmake_package GTest; then
    local gtest_src="$DEBS_ROOT/usr/src/googletest" gtest_prefix="$BUILD_DIR/_deps/gtest"
    [ -f "$gtest_src/CMakeLists.txt" ] ||
      { gpu_log "GoogleTest missing: run scripts/gpu-deps.sh where there is network and carry third_party/debs"; return 1; }
    if [ ! -f "$gtest_prefix/.built" ]; then
      gpu_log "building GoogleTest from $gtest_src"
      cmake -S "$gtest_src" -B "$BUILD_DIR/_deps/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
        -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$gtest_prefix" >/dev/null
      cmake --build "$BUILD_DIR/_deps/gtest-build" -j "$JOBS" >/dev/null
      cmake --install "$BUILD_DIR/_deps/gtest-build" >/dev/null
      touch "$gtest_prefix/.built"
    fi
    prefix+=("$gtest_prefix")
  fi

  local nccl_home="${NCCL_HOME:-}"
  if [ -z "$nccl_home" ] && [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
    nccl_home="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  fi
  if [ -n "$nccl_home" ]; then
    local lib
    lib="$(ls "$nccl_home"/lib/libnccl.so "$nccl_home"/lib/libnccl.so.* 2>/dev/null | head -1 || true)"
    [ -f "$nccl_home/include/nccl.h" ] && [ -n "$lib" ] ||
      { gpu_log "NCCL at $nccl_home has no include/nccl.h or lib/libnccl.so*"; return 1; }
    extra+=("-DNCCL_INCLUDE_DIR=$nccl_home/include" "-DNCCL_LIBRARY=$lib")
    export LD_LIBRARY_PATH="$nccl_home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    gpu_log "NCCL from $nccl_home ($lib)"
  fi

  local cudnn_home="${CUDNN_HOME:-}"
  if [ -z "$cudnn_home" ] && [ ! -f /usr/local/cuda/include/cudnn_graph.h ] && [ ! -f /usr/include/cudnn_graph.h ]; then
    cudnn_home="$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)"
  fi
  if [ -n "$cudnn_home" ]; then
    local cudnn_lib
    cudnn_lib="$(ls "$cudnn_home"/lib/libcudnn.so "$cudnn_home"/lib/libcudnn.so.9 2>/dev/null | head -1 || true)"
    if [ -f "$cudnn_home/include/cudnn_graph.h" ] && [ -n "$cudnn_lib" ]; then
      extra+=("-DCUDNN_INCLUDE_DIR=$cudnn_home/include" "-DCUDNN_LIBRARY=$cudnn_lib")
      export LD_LIBRARY_PATH="$cudnn_home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      gpu_log "cuDNN from $cudnn_home ($cudnn_lib)"
    else
      gpu_log "cuDNN at $cudnn_home has no include/cudnn_graph.h or lib/libcudnn.so*: attention runs on cuBLAS"
    fi
  fi

  local optional="${ZERO3_OPTIONAL:-OFF}"
  [ -n "${CUDA_ARCHS:-}" ] && extra+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
  local prefix_path
  prefix_path="$(IFS=';'; echo "${prefix[*]:-}")"
  cmake -S "$ZERO3_ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DZERO3_CUDA=ON -DZERO3_NCCL=ON -DZERO3_GLOO="$optional" -DZERO3_LIBFABRIC="$optional" -DZERO3_AIO="$optional" \
    -DZERO3_BLAS="$optional" ${prefix_path:+"-DCMAKE_PREFIX_PATH=$prefix_path"} "${extra[@]}" |
    grep -E "^  [A-Z]+:|zero3 .* configuration|Error|error" || true
  [ -f "$BUILD_DIR/build.ninja" ] || { gpu_log "configure failed"; return 1; }
}

# Copies a log into $OUT when the caller runs under a harness that collects $OUT.
gpu_keep_log() {
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$1" "$OUT/"; fi
}
