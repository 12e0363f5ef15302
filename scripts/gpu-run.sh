#!/usr/bin/env bash
# The GPU window in one command: everything zero3 needs to learn from one GPU machine, in one device call, inside a
# hard deadline. Steps run in the order of what they tell us, each with its own time budget; a step that cannot fit
# in what is left is skipped with a note. Results and logs land in $OUT as they come (a run cut short still returns
# what it reached), the summary is rewritten after every step and printed last.
#
#   scripts/gpu-run.sh [--deadline SECONDS] [--out DIR] [--build-dir DIR]
#   scripts/gpu-run.sh --dry-run [--reuse-build DIR] [--out DIR] [--build-dir DIR]
#
# On the GPU machine (docs/gpu.md, "The first GPU window": the call, what it carries, the per-step budget):
#   env          driver, CUDA, cuDNN, NCCL, NVRTC, each with where it was found (the toolkit at /usr/local/cuda or
#                the image's Python nvidia-* wheels); a missing one stops the run here, named
#   configure    one configure for sm_90 (Release, CUDA + NCCL + cuDNN, optional backends off), nlohmann_json and
#                GoogleTest from the carried third_party/debs (scripts/gpu-prepare.sh)
#   build        exactly the programs the run needs; PyTorch FSDP2 eager (the peer) trains beside it on 2 cores
#                of its own, since it needs none of our build
#   tests        the GPU tests that run in one process, one program at a time with a short timeout each
#   model-1.5b   llama3_train on configs/models/llama-3-1b-untied.json: tokens/s, MFU, peak GPU memory, and
#                whether cuDNN's fused attention ran (the unfused path is a FAILURE)
#   model-8b     Llama-3-8B-shaped models of 2 and 6 layers at sequence 8192: per-layer time, hence the 32-layer
#                step time and MFU
#   bench        bench_cuda_kernels and bench_cuda_engine
#   tests-multi  the tests that start several NCCL processes on the one GPU (likeliest to hang: last of the tests)
#   fsdp2-eager  the peer, if it could not run beside the build
#   fsdp2-compiled  the peer with torch.compile, only if time is left
# Beside it all, nvidia-smi logs clocks, power and temperature every second (gpu-clocks.csv).
#
# --dry-run (no GPU needed; ctest -L gpu_dry_run) runs what needs none: the preparation check, the env report,
# the configure, the build of the same programs (in the --reuse-build tree when given: the test suite's, already
# built), the test programs (which report no device), llama3_train's memory plans of the runs (with the runs' own
# arguments), the peer's parse of its arguments, and the summary writer on the sample runs in scripts/gpu-fixtures/,
# whose content it asserts.
#
# Environment: OUT (where results go, unless --out; the device tool sets it; default <build dir>/gpu-run-out),
# JOBS (default: all cores), CUDA_HOME (default /usr/local/cuda), CUDNN_HOME and NCCL_HOME (searched first when set).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEADLINE=540
DRY_RUN=0
REUSE_BUILD=""
BUILD_DIR=""
OUT_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deadline) DEADLINE="${2:?--deadline needs seconds}"; shift 2 ;;
    --out) OUT_DIR="${2:?--out needs a directory}"; shift 2 ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a directory}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --reuse-build) REUSE_BUILD="${2:?--reuse-build needs a build directory}"; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-run: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEADLINE" in
  *m) DEADLINE=$((${DEADLINE%m} * 60)) ;;
esac
[[ "$DEADLINE" =~ ^[0-9]+$ ]] && [ "$DEADLINE" -ge 60 ] ||
  { echo "gpu-run: --deadline $DEADLINE: expected seconds (or Nm), at least 60" >&2; exit 2; }
[ -n "$REUSE_BUILD" ] && [ "$DRY_RUN" = 0 ] && { echo "gpu-run: --reuse-build is for --dry-run" >&2; exit 2; }
if [ -z "$BUILD_DIR" ]; then
  if [ "$DRY_RUN" = 1 ]; then BUILD_DIR="$ROOT/build-gpu-dry"; else BUILD_DIR="$ROOT/build-gpu"; fi
fi
OUT_DIR="${OUT_DIR:-${OUT:-$BUILD_DIR/gpu-run-out}}"  # inside the (git-ignored) build tree unless given
mkdir -p "$OUT_DIR" "$BUILD_DIR" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"
# The programs run from here: the GPU configuration's tree, or in a dry run the suite's own tree when reused.
RUN_TREE="${REUSE_BUILD:-$BUILD_DIR}"
JOBS="${JOBS:-$(nproc)}"
WORK="$BUILD_DIR/gpu-run-work"  # generated inputs: token file, model and DeepSpeed configs
readonly T0=$(date +%s) RESERVE=15  # seconds kept for the last summary
readonly SUMMARY="$ROOT/scripts/gpu-summary.py"

rm -rf "$OUT_DIR"/{logs,tests,model,bench,peer} "$OUT_DIR"/{steps.tsv,env.txt,summary.txt,run.json,gpu-clocks.csv} 2>/dev/null
mkdir -p "$OUT_DIR"/{logs,tests,model,bench,peer} "$WORK"
printf 'step\tstatus\tseconds\texpected\tnote\n' >"$OUT_DIR/steps.tsv"
printf '{"mode": "%s", "deadline_s": %d, "started": "%s"}\n' "$([ "$DRY_RUN" = 1 ] && echo dry-run || echo gpu)" \
  "$DEADLINE" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" >"$OUT_DIR/run.json"

elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((T0 + DEADLINE - RESERVE - $(date +%s))); }
say() { echo "[gpu-run +$(elapsed)s] $*" | tee -a "$OUT_DIR/logs/run.log"; }
summarize() { python3 "$SUMMARY" "$OUT_DIR" >"$OUT_DIR/summary.txt" 2>"$OUT_DIR/logs/summary.err" || true; }
# A line for the summary's notes of the step running now.
note() { echo "$*" >>"$OUT_DIR/logs/$STEP.note"; }
record() {  # step status seconds expected note
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$OUT_DIR/steps.tsv"
  say "$1: $2 ($3 s of ~$4 s)${5:+: $5}"
  summarize
}

# run_step NAME EXPECTED CAP FUNCTION: runs FUNCTION (output to logs/NAME.log) when at least EXPECTED seconds are
# left, killed with all its processes after min(CAP, left) seconds. FUNCTION returns 0 (ok), 77 (skipped; its
# note says why) or anything else (FAILED); LAST_STATUS says which it was.
FAILED_REQUIRED=""
run_step() {
  local name=$1 expected=$2 cap=$3 func=$4 have limit start rc status
  STEP=$name
  : >"$OUT_DIR/logs/$name.note"
  LAST_STATUS=skipped
  if [ -n "$FAILED_REQUIRED" ]; then
    record "$name" skipped 0 "$expected" "needs the $FAILED_REQUIRED step, which failed"
    return 0
  fi
  have=$(left)
  if [ "$have" -lt "$expected" ]; then
    record "$name" skipped 0 "$expected" "needs ~$expected s, $have s left before the deadline"
    return 0
  fi
  limit=$((cap < have ? cap : have))
  export STEP_LIMIT=$limit
  start=$(date +%s)
  set -m  # the step in a process group of its own, so a timeout ends everything it started
  ("$func") >"$OUT_DIR/logs/$name.log" 2>&1 &
  local pid=$!
  STEP_PID=$pid
  set +m
  while kill -0 "$pid" 2>/dev/null; do
    if [ $(($(date +%s) - start)) -ge "$limit" ]; then
      kill -TERM -- "-$pid" 2>/dev/null
      sleep 3
      kill -KILL -- "-$pid" 2>/dev/null
      break
    fi
    sleep 0.2
  done
  wait "$pid" 2>/dev/null
  rc=$?
  STEP_PID=""
  local took=$(($(date +%s) - start)) why
  why=$(paste -sd '|' "$OUT_DIR/logs/$name.note" | sed 's/|/; /g')
  if [ "$took" -ge "$limit" ] && [ "$rc" -ne 0 ]; then
    status=TIMEOUT
    why="stopped after $limit s${why:+; $why}"
  elif [ "$rc" -eq 0 ]; then
    status=ok
  elif [ "$rc" -eq 77 ]; then
    status=skipped
  else
    status=FAILED
    why="exit $rc, see logs/$name.log${why:+; $why}"
  fi
  record "$name" "$status" "$took" "$expected" "$why"
  LAST_STATUS=$status
}

# ---- Where things are: the CUDA toolkit first, then the image's Python nvidia-* wheels. ----

TOOLKIT="${CUDA_HOME:-/usr/local/cuda}"
toolkit_lib_dirs() {
  local d
  for d in "$TOOLKIT/lib64" "$TOOLKIT/lib" "$TOOLKIT/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu; do
    [ -d "$d" ] && echo "$d"
  done
}
wheel_dirs() {  # the nvidia namespace package's directories (nvidia/cudnn, nvidia/nccl, nvidia/cu13, ...)
  python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null
}
first_file() {  # NAME-PATTERN DIR...: the first file (or link) matching in the directories, searched a few levels
  local pattern=$1 d f
  shift
  for d in "$@"; do
    [ -d "$d" ] || continue
    f=$(find -L "$d" -maxdepth 4 -name "$pattern" \( -type f -o -type l \) 2>/dev/null | sort | head -1)
    [ -n "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}
# find_component NAME LIB-PATTERN [HEADER] [HOME]: sets FOUND_LIB, FOUND_INC (the header's directory) and
# FOUND_WHERE ("toolkit", "wheel" or "$HOME"); returns 1 when it is in neither place.
find_component() {
  local name=$1 lib=$2 header=${3:-} home=${4:-} place dirs inc
  FOUND_LIB="" FOUND_INC="" FOUND_WHERE=""
  for place in home toolkit wheel; do
    case $place in
      home) [ -n "$home" ] || continue; dirs="$home/lib $home/lib64" ;;
      toolkit) dirs="$(toolkit_lib_dirs)" ;;
      wheel) dirs="$(wheel_dirs)" ;;
    esac
    # shellcheck disable=SC2086
    FOUND_LIB=$(first_file "$lib" $dirs) || continue
    if [ -n "$header" ]; then
      case $place in
        home) inc=$(first_file "$header" "$home/include") ;;
        toolkit) inc=$(first_file "$header" "$TOOLKIT/include" /usr/include) ;;
        wheel) inc=$(first_file "$header" "$(dirname "$(dirname "$FOUND_LIB")")/include") ;;
      esac || { FOUND_LIB=""; continue; }
      FOUND_INC=$(dirname "$inc")
    fi
    FOUND_WHERE=$([ "$place" = home ] && echo "$home" || echo "$place")
    return 0
  done
  return 1
}
header_version() {  # FILE MAJOR-MACRO MINOR-MACRO PATCH-MACRO
  awk -v a="$2" -v b="$3" -v c="$4" '$1 == "#define" && $2 == a {x = $3} $1 == "#define" && $2 == b {y = $3}
    $1 == "#define" && $2 == c {z = $3} END {if (x != "") print x "." y "." z}' "$1"
}

# ---- Steps. Each prints what it does to its log; note adds a line to the summary. ----

ENV_FILE="$OUT_DIR/env.txt"
envline() { echo "$1: $2" >>"$ENV_FILE"; }

step_env() {
  local missing=() v
  : >"$ENV_FILE"
  envline date "$(date -u '+%Y-%m-%d %H:%M UTC')"
  envline host "$(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) memory"
  envline cpu "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    envline gpu "$(nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader | head -1)"
    envline driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1), CUDA $(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1) (nvidia-smi)"
    envline gpu_memory_mib "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)"
  elif [ "$DRY_RUN" = 1 ]; then
    envline gpu "none (dry run)"
  else
    envline gpu "none: nvidia-smi finds no GPU"
    missing+=("a GPU (nvidia-smi)")
  fi
  if [ -x "$TOOLKIT/bin/nvcc" ]; then
    envline cuda "$("$TOOLKIT/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p') (toolkit: $TOOLKIT/bin/nvcc)"
  else
    missing+=("nvcc ($TOOLKIT/bin/nvcc; set CUDA_HOME)")
  fi
  local ld=()
  if find_component NVRTC 'libnvrtc.so.13*'; then
    local builtins
    builtins=$(first_file 'libnvrtc-builtins.so.13*' "$(dirname "$FOUND_LIB")") ||
      missing+=("NVRTC's libnvrtc-builtins.so.13 beside $FOUND_LIB")
    envline nvrtc "$(basename "$(readlink -f "$FOUND_LIB")") ($FOUND_WHERE: $FOUND_LIB)"
    ld+=("$(dirname "$FOUND_LIB")")
  else
    missing+=("NVRTC (libnvrtc.so.13: cuDNN's fused attention compiles its kernels with it at run time)")
  fi
  if find_component cuDNN 'libcudnn.so.9*' cudnn_graph.h "${CUDNN_HOME:-}"; then
    v=$(header_version "$FOUND_INC/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)
    envline cudnn "${v:-unknown version} ($FOUND_WHERE: $FOUND_LIB, headers $FOUND_INC)"
    first_file 'libcudnn_engines_runtime_compiled.so.9*' "$(dirname "$FOUND_LIB")" >/dev/null ||
      missing+=("cuDNN's libcudnn_engines_runtime_compiled.so.9 beside $FOUND_LIB")
    echo "CUDNN_INCLUDE_DIR=$FOUND_INC" >"$WORK/found.env"
    echo "CUDNN_LIBRARY=$FOUND_LIB" >>"$WORK/found.env"
    ld+=("$(dirname "$FOUND_LIB")")
  else
    missing+=("cuDNN 9 (libcudnn.so.9 with cudnn_graph.h)")
  fi
  if find_component NCCL 'libnccl.so.2*' nccl.h "${NCCL_HOME:-}"; then
    v=$(header_version "$FOUND_INC/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)
    envline nccl "${v:-unknown version} ($FOUND_WHERE: $FOUND_LIB, headers $FOUND_INC)"
    echo "NCCL_INCLUDE_DIR=$FOUND_INC" >>"$WORK/found.env"
    echo "NCCL_LIBRARY=$FOUND_LIB" >>"$WORK/found.env"
    ld+=("$(dirname "$FOUND_LIB")")
  else
    missing+=("NCCL 2 (libnccl.so.2 with nccl.h)")
  fi
  printf '%s\n' "${ld[@]}" | awk '!seen[$0]++' | paste -sd: >"$WORK/ld_library_path"
  local cmake_v
  cmake_v=$(cmake --version 2>/dev/null | sed -n '1s/cmake version //p')
  if [ -z "$cmake_v" ]; then
    missing+=("cmake")
  elif ! printf '3.25\n%s\n' "$cmake_v" | sort -V -C; then
    missing+=("cmake >= 3.25 (found $cmake_v)")
  fi
  envline cmake "${cmake_v:-none} ($(command -v cmake || echo missing))"
  envline generator "$(command -v ninja >/dev/null && echo "ninja $(ninja --version)" || echo "Unix Makefiles (no ninja)")"
  envline compiler "$(${CXX:-c++} --version 2>/dev/null | head -1 || echo missing)"
  command -v "${CXX:-c++}" >/dev/null || missing+=("a C++ compiler (c++)")
  envline python "$(python3 --version 2>&1)"
  envline torch "$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null || echo 'not importable: the FSDP2 peer will not run')"
  envline transformers "$(python3 -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 'not importable: the FSDP2 peer will not run')"
  envline carried "$([ -f "$ROOT/third_party/debs/root/usr/src/googletest/CMakeLists.txt" ] && echo "third_party/debs (nlohmann_json, GoogleTest)" || echo 'third_party/debs MISSING')"
  [ -f "$ROOT/third_party/debs/root/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" ] &&
    [ -f "$ROOT/third_party/debs/root/usr/src/googletest/CMakeLists.txt" ] ||
    missing+=("third_party/debs (run scripts/gpu-prepare.sh here and carry third_party/debs)")
  cat "$ENV_FILE"
  if [ ${#missing[@]} -gt 0 ]; then
    local m
    for m in "${missing[@]}"; do note "missing: $m"; done
    return 1
  fi
}

with_found_libraries() {  # puts the directories of NVRTC, cuDNN and NCCL on LD_LIBRARY_PATH
  local dirs
  dirs=$(cat "$WORK/ld_library_path" 2>/dev/null)
  [ -n "$dirs" ] && export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

step_configure() {
  local debs="$ROOT/third_party/debs/root" gtest_prefix="$BUILD_DIR/_deps/gtest" gen=(-G Ninja) launcher=()
  command -v ninja >/dev/null || gen=(-G "Unix Makefiles")
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  if [ ! -f "$gtest_prefix/.built" ]; then
    echo "== GoogleTest from $debs/usr/src/googletest"
    cmake -S "$debs/usr/src/googletest" -B "$BUILD_DIR/_deps/gtest-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" "${launcher[@]:0:1}" &&
      cmake --build "$BUILD_DIR/_deps/gtest-build" -j "$JOBS" && cmake --install "$BUILD_DIR/_deps/gtest-build" &&
      touch "$gtest_prefix/.built" || return 1
  fi
  local found=()
  mapfile -t found < <(sed 's/^/-D/' "$WORK/found.env")
  echo "== zero3 for sm_90"
  cmake -S "$ROOT" -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_CUDA_COMPILER="$TOOLKIT/bin/nvcc" -DZERO3_CUDA=ON -DZERO3_NCCL=ON -DZERO3_CUDNN=ON -DZERO3_GLOO=OFF \
    -DZERO3_LIBFABRIC=OFF -DZERO3_AIO=OFF -DZERO3_BLAS=OFF "-DCMAKE_PREFIX_PATH=$debs/usr;$gtest_prefix" \
    "${found[@]}" "${launcher[@]}" || return 1
  # The run's programs: the gpu-labelled tests' (a test gpu.NAME runs the program NAME), the training program
  # and the GPU benchmarks.
  ctest --test-dir "$BUILD_DIR" -N -L '^gpu$' | sed -n 's/.*Test *#[0-9]*: gpu\.\([A-Za-z0-9_]*\).*/\1/p' \
    >"$WORK/test_programs"
  [ -s "$WORK/test_programs" ] || { note "no gpu-labelled tests in the configured tree"; return 1; }
  { cat "$WORK/test_programs"; echo llama3_train; echo bench_cuda_kernels; echo bench_cuda_engine; } >"$WORK/targets"
  note "$(wc -l <"$WORK/targets") programs to build: $(paste -sd' ' "$WORK/targets")"
}

# FSDP2 eager beside the build: it needs none of our programs, and the GPU is idle while we compile. It gets the
# last 2 cores, the build the others (taskset), so neither slows the other's host side.
PEER_PID=""
PEER_CORES=""
start_peer_beside_build() {
  [ -n "$FAILED_REQUIRED" ] && return
  local cores
  cores=$(nproc)
  if ! command -v taskset >/dev/null || [ "$cores" -lt 8 ]; then
    echo "no taskset or fewer than 8 cores: FSDP2 eager runs after the tests instead" >"$OUT_DIR/peer/beside_build.note"
    return
  fi
  PEER_CORES="$((cores - 2))-$((cores - 1))"
  STEP=fsdp2-eager
  set -m  # a process group of its own, as a step's
  (peer_run eager) >"$OUT_DIR/logs/fsdp2-eager.log" 2>&1 &
  PEER_PID=$!
  set +m
  PEER_START=$(date +%s)
  say "fsdp2-eager: started beside the build on cores $PEER_CORES"
}
finish_peer_beside_build() {
  [ -z "$PEER_PID" ] && return
  local cap=240 rc
  while kill -0 "$PEER_PID" 2>/dev/null && [ $(($(date +%s) - PEER_START)) -lt "$cap" ] && [ "$(left)" -gt 60 ]; do
    sleep 1
  done
  if kill -0 "$PEER_PID" 2>/dev/null; then
    kill -TERM -- "-$PEER_PID" 2>/dev/null
    wait "$PEER_PID" 2>/dev/null
    PEER_PID=""
    record fsdp2-eager TIMEOUT $(($(date +%s) - PEER_START)) 60 "beside the build on cores $PEER_CORES; stopped before the GPU tests"
  else
    wait "$PEER_PID"
    rc=$?
    PEER_PID=""
    local status=ok
    [ "$rc" -eq 77 ] && status=skipped
    [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && status=FAILED
    record fsdp2-eager "$status" $(($(date +%s) - PEER_START)) 60 \
      "beside the build on cores $PEER_CORES$([ -s "$OUT_DIR/logs/fsdp2-eager.note" ] && echo "; $(paste -sd'|' "$OUT_DIR/logs/fsdp2-eager.note" | sed 's/|/; /g')")"
  fi
  PEER_DONE=1
}

step_build() {
  local targets=() pin=() jobs=$JOBS
  mapfile -t targets <"$WORK/targets"
  if [ -n "$PEER_CORES" ]; then
    pin=(taskset -c "0-$(($(nproc) - 3))")
    jobs=$((JOBS > $(nproc) - 2 ? $(nproc) - 2 : JOBS))
  fi
  if [ -n "$REUSE_BUILD" ]; then
    # Every program exists in the GPU configuration; they are built (or found up to date) in the suite's tree.
    local t
    cmake --build "$BUILD_DIR" --target help >"$WORK/target_help"
    for t in "${targets[@]}"; do
      grep -qE "^($t: |\.\.\. $t\$)" "$WORK/target_help" || { note "no target $t in the GPU configuration"; return 1; }
    done
    note "dry run: the $(wc -l <"$WORK/targets") programs built in $REUSE_BUILD (the test suite's tree)"
    "${pin[@]}" cmake --build "$REUSE_BUILD" -j "$jobs" --target "${targets[@]}"
  else
    "${pin[@]}" cmake --build "$BUILD_DIR" -j "$jobs" --target "${targets[@]}"
  fi
}

# Runs one GPU test program with a gtest filter and a timeout; the result in tests/NAME[.TAG].{json,log,status}.
run_test_program() {  # program filter tag limit
  local prog=$1 filter=$2 tag=$3 limit=$4 exe="$RUN_TREE/bin/$1" base="$OUT_DIR/tests/$1$3" start rc
  [ -x "$exe" ] || { echo "missing $exe" >"$base.log"; echo "rc=127 seconds=0" >"$base.status"; return; }
  if ! grep -q '^  ' <<<"$("$exe" --gtest_list_tests --gtest_filter="$filter" 2>/dev/null)"; then
    echo "rc=none seconds=0 (no test matches $filter)" >"$base.status"
    return
  fi
  start=$(date +%s)
  ZERO3_SOURCE_DIR="$ROOT" ZERO3_BIN_DIR="$RUN_TREE/bin" LLAMA3_GOLDEN_DIR="$ROOT/examples/llama3/tests/golden" \
    timeout -k 5 "$limit" "$exe" --gtest_filter="$filter" --gtest_output="json:$base.json" >"$base.log" 2>&1
  rc=$?
  echo "rc=$rc seconds=$(($(date +%s) - start)) limit=$limit" >"$base.status"
  echo "$prog$tag: exit $rc in $(($(date +%s) - start)) s"
}

# The order tells the most first: the model's kernels, cuDNN's attention, the model, then the library's.
TEST_ORDER=(llama3_gpu_test_cuda_ops llama3_gpu_test_cudnn_attention llama3_gpu_test_cuda_model test_cuda_kernels
  test_cuda_engine test_cuda_allocator test_cuda_streams test_cuda_quantize test_nccl_collectives)
readonly MULTI_PROCESS='*RanksOnOneGpu*'
ordered_test_programs() {
  local p
  for p in "${TEST_ORDER[@]}"; do grep -qx "$p" "$WORK/test_programs" && echo "$p"; done
  grep -vxF -f <(printf '%s\n' "${TEST_ORDER[@]}") "$WORK/test_programs"
}

test_step() {  # filter tag per-program-limit
  local filter=$1 tag=$2 per=$3 budget=$((STEP_LIMIT - 5)) start p spent
  start=$(date +%s)
  while read -r p; do
    spent=$(($(date +%s) - start))
    if [ $((budget - spent)) -lt 10 ]; then
      echo "rc=skipped seconds=0 (step budget spent)" >"$OUT_DIR/tests/$p$tag.status"
      continue
    fi
    run_test_program "$p" "$filter" "$tag" $((per < budget - spent ? per : budget - spent))
  done < <(ordered_test_programs)
  # A run without a device: the programs say so and exit 77 (what a dry run must see).
  if [ "$DRY_RUN" = 1 ]; then
    local bad
    bad=$(grep -L 'rc=77\|rc=none' "$OUT_DIR"/tests/*"$tag".status 2>/dev/null | xargs -r -n1 basename | paste -sd' ')
    [ -z "$bad" ] || { note "without a GPU these did not report 'no device' (exit 77): $bad"; return 1; }
    note "dry run: every program started and reported no CUDA device (exit 77)"
    return 77
  fi
  # The step ran; each program's result is its own line in the summary (a failing one a FAILURE).
  local ran failed
  ran=$(grep -l 'rc=[0-9]' "$OUT_DIR"/tests/*"$tag".status 2>/dev/null | wc -l)
  failed=$(grep -L 'rc=0 \|rc=none\|rc=skipped' "$OUT_DIR"/tests/*"$tag".status 2>/dev/null | wc -l)
  note "$ran programs ran, $failed of them failed or timed out"
}
# 90 s a program: cuDNN's attention test builds a plan (NVRTC compiles its kernels) for each of its many shapes.
step_tests() { test_step "-$MULTI_PROCESS" "" 90; }
step_tests_multi() {
  # The several-process tests must exist where the run looks for them (checked without a GPU too).
  local p n=0
  while read -r p; do
    grep -q '^  ' <<<"$("$RUN_TREE/bin/$p" --gtest_list_tests --gtest_filter="$MULTI_PROCESS" 2>/dev/null)" && n=$((n + 1))
  done < <(ordered_test_programs)
  [ "$n" -ge 2 ] || { note "expected the several-process tests of test_cuda_engine and test_nccl_collectives, found $n programs"; return 1; }
  test_step "$MULTI_PROCESS" ".multi" 45
}

# ---- The model runs. ----

make_inputs() {
  [ -s "$WORK/tokens.u32" ] && [ -s "$WORK/llama-3-8b-6l.json" ] && return 0
  python3 - "$ROOT" "$WORK" <<'EOF'
import array, json, random, sys
root, work = sys.argv[1], sys.argv[2]
# Random token ids below Llama-3's vocabulary: the runs measure speed, not learning.
rng = random.Random(1234)
array.array("I", (rng.randrange(128256) for _ in range(300_000))).tofile(open(work + "/tokens.u32", "wb"))
for layers in (2, 6):
    c = json.load(open(root + "/configs/models/llama-3-8b.json"))
    c["num_hidden_layers"] = layers
    json.dump(c, open(f"{work}/llama-3-8b-{layers}l.json", "w"), indent=2)
# configs/zero-stage3.json with the batch left to the program's flags.
d = json.load(open(root + "/configs/zero-stage3.json"))
d["train_micro_batch_size_per_gpu"] = "auto"
d["gradient_accumulation_steps"] = "auto"
json.dump(d, open(work + "/zero-stage3-auto.json", "w"), indent=2)
EOF
}

# llama3_train: the memory plan first (--dry-run: allocates nothing); a run the GPU cannot
# hold is skipped, named. Then the training, its metrics in model/RUN.csv.
train() {  # RUN MODEL MICRO SEQ STEPS WARMUP (the first WARMUP steps are not timed)
  local run=$1 model=$2 micro=$3 seq=$4 steps=$5 warmup=$6 exe="$RUN_TREE/bin/llama3_train" plan_bytes gpu_bytes
  printf 'model=%s\nmicro_batch=%s\nseq_len=%s\nsteps=%s\nwarmup=%s\n' "$(basename "$model")" "$micro" "$seq" "$steps" \
    "$warmup" >"$OUT_DIR/model/$run.meta"
  local args=(--device cuda --model "$model" --deepspeed "$WORK/zero-stage3-auto.json" --precision bf16
    --micro-batch "$micro" --grad-accum 1 --seq-len "$seq" --grad-checkpointing --steps "$steps" --warmup-steps 0
    --lr 1e-4 --data "$WORK/tokens.u32" --metrics "$OUT_DIR/model/$run.csv")
  echo "== $run: memory plan (the run's own arguments)"
  "$exe" --dry-run --world-size 1 "${args[@]}" >"$OUT_DIR/model/$run.plan" 2>&1 ||
    { note "$run: llama3_train --dry-run failed (model/$run.plan)"; return 1; }
  plan_bytes=$(awk '$1 == "device" && NF >= 4 {gsub(",", "", $2); v = $2} END {print v + 0}' "$OUT_DIR/model/$run.plan")
  gpu_bytes=$(sed -n 's/^gpu_memory_mib: \([0-9]*\).*/\1/p' "$ENV_FILE" | head -1)
  gpu_bytes=$((${gpu_bytes:-0} * 1048576))
  note "$run: planned $(awk -v b="$plan_bytes" 'BEGIN {printf "%.1f", b / 2^30}') GiB per GPU"
  if [ "$DRY_RUN" = 1 ]; then return 0; fi
  if [ "$gpu_bytes" -gt 0 ] && [ "$plan_bytes" -gt $((gpu_bytes * 95 / 100)) ]; then
    note "$run: skipped: its plan exceeds 95% of the GPU's $((gpu_bytes >> 30)) GiB"
    return 77
  fi
  echo "== $run: $steps steps"
  "$exe" "${args[@]}" >"$OUT_DIR/model/$run.log" 2>&1
  local rc=$?
  tail -5 "$OUT_DIR/model/$run.log"
  return $rc
}

step_model_small() {
  make_inputs || return 1
  train llama-1.5b "$ROOT/configs/models/llama-3-1b-untied.json" 4 1024 15 5 || return $?
  [ "$DRY_RUN" = 1 ] && { note "dry run: plans only, no training without a GPU"; return 77; }
  return 0
}
step_model_8b() {
  make_inputs || return 1
  train llama-8b-2l "$WORK/llama-3-8b-2l.json" 1 8192 8 3 || return $?
  train llama-8b-6l "$WORK/llama-3-8b-6l.json" 1 8192 8 3 || return $?
  [ "$DRY_RUN" = 1 ] && { note "dry run: plans only, no training without a GPU"; return 77; }
  return 0
}

step_bench() {
  local b rc worst=0
  for b in bench_cuda_kernels bench_cuda_engine; do
    echo "== $b"
    timeout -k 5 $((STEP_LIMIT / 2)) "$RUN_TREE/bin/$b" >"$OUT_DIR/bench/$b.log" 2>&1
    rc=$?
    echo "$b: exit $rc"
    echo "rc=$rc" >"$OUT_DIR/bench/$b.status"
    if [ "$rc" -eq 77 ] && [ "$DRY_RUN" = 1 ]; then continue; fi
    [ "$rc" -ne 0 ] && worst=$rc
  done
  [ "$DRY_RUN" = 1 ] && [ "$worst" = 0 ] && { note "dry run: both benches reported no CUDA device (exit 77)"; return 77; }
  return $worst
}

# ---- The PyTorch FSDP2 peer on the 1.5B run's model, batch and sequence (examples/llama3/tools/fsdp2_reference.py).

peer_run() {  # eager | compiled
  local kind=$1 pin=() tools="$ROOT/examples/llama3/tools"
  local args=(--model "$ROOT/configs/models/llama-3-1b-untied.json" --micro-batch 4 --seq-len 1024 --steps 15 --warmup 5
    --grad-checkpointing --out "$OUT_DIR/peer/fsdp2_$kind.json")
  [ "$kind" = compiled ] && args+=(--compile --fused-adamw)
  [ -n "$PEER_CORES" ] && [ "$kind" = eager ] && pin=(taskset -c "$PEER_CORES")
  if [ "$DRY_RUN" = 1 ]; then
    # The peer reads its arguments before importing torch: these exact ones must parse.
    python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import fsdp2_reference as f; f.parse_args(sys.argv[2:])' \
      "$tools" "${args[@]}" || { note "fsdp2_reference.py refuses the run's arguments"; return 1; }
    note "dry run: the peer takes the run's arguments; no training without a GPU"
    return 77
  fi
  python3 -c 'import torch, transformers' 2>/dev/null ||
    { note "torch or transformers not importable in the image: no FSDP2 peer"; return 77; }
  "${pin[@]}" python3 "$tools/fsdp2_reference.py" "${args[@]}"
}
step_peer_eager() { peer_run eager; }
step_peer_compiled() { peer_run compiled; }

# ---- The summary writer on the sample runs (scripts/gpu-fixtures/*: a run dir and expected.txt). ----

step_summary_fixtures() {
  python3 "$SUMMARY" --check-fixtures "$ROOT/scripts/gpu-fixtures"
}

# ---- The run. ----

CLOCKS_PID=""
start_clock_log() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || return
  local fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used
  local reasons=clocks_event_reasons.active
  nvidia-smi --query-gpu="$reasons" --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  nvidia-smi --query-gpu="$fields,$reasons" --format=csv -l 1 >"$OUT_DIR/gpu-clocks.csv" 2>/dev/null &
  CLOCKS_PID=$!
}
stop_clock_log() { [ -n "$CLOCKS_PID" ] && kill "$CLOCKS_PID" 2>/dev/null && wait "$CLOCKS_PID" 2>/dev/null; }
# Stopped from outside (the device tool's own timeout, ^C): the running step's process group and the peer go too.
STEP_PID=""
stop_all() {
  [ -n "$STEP_PID" ] && kill -TERM -- "-$STEP_PID" 2>/dev/null
  [ -n "$PEER_PID" ] && kill -TERM -- "-$PEER_PID" 2>/dev/null
  stop_clock_log
}
trap 'stop_all' EXIT
trap 'stop_all; exit 143' INT TERM

say "$([ "$DRY_RUN" = 1 ] && echo "dry run" || echo "GPU run"): deadline ${DEADLINE} s, out $OUT_DIR, build $BUILD_DIR"
start_clock_log
PEER_DONE=0

step_prepare() { bash "$ROOT/scripts/gpu-prepare.sh"; }

LAST_STATUS=""
required() {  # run_step's arguments; a step the rest cannot do without
  run_step "$@"
  [ "$LAST_STATUS" = ok ] || FAILED_REQUIRED=${FAILED_REQUIRED:-$1}
}

[ "$DRY_RUN" = 1 ] && run_step summary-fixtures 3 60 step_summary_fixtures
[ "$DRY_RUN" = 1 ] && required prepare 5 120 step_prepare
required env 10 30 step_env
with_found_libraries
required configure 40 150 step_configure
start_peer_beside_build
# The build may use what the later steps would have had: without it none of them can run.
build_cap=$(($(left) - 60))
required build 150 $((build_cap > 150 ? build_cap : 150)) step_build
finish_peer_beside_build
run_step tests 90 150 step_tests
run_step model-1.5b 45 90 step_model_small
run_step model-8b 75 120 step_model_8b
run_step bench 30 60 step_bench
run_step tests-multi 45 70 step_tests_multi
[ "$PEER_DONE" = 1 ] || run_step fsdp2-eager 40 120 step_peer_eager
run_step fsdp2-compiled 150 240 step_peer_compiled

stop_clock_log
summarize
echo
cat "$OUT_DIR/summary.txt"
# The run's verdict is the summary's: any FAILURE line fails it (a dry run's skipped GPU steps are not failures).
! grep -q '^FAILURE' "$OUT_DIR/summary.txt" && [ -s "$OUT_DIR/summary.txt" ]
