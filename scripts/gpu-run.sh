#!/usr/bin/env bash
# The GPU window: everything zero3 needs to learn from one GPU machine, in two device calls of one 15-minute window,
# each inside a hard deadline of its own. Steps run in the order of what they tell us, each with its own time budget;
# a step that cannot fit in what is left is skipped with a note. Every step's files go to a scratch folder; what the
# device call returns ($OUT, at most 8 files) is summary.txt, steps.tsv, env.txt and files.tar.gz (the scratch
# folder, scripts/gpu-pack.py), all rewritten after every step, so a run cut short still returns what it reached.
# A failing step prints its log's last lines and its tests' failure messages; the summary is printed last.
#
#   scripts/gpu-run.sh [--deadline SECONDS] [--only STEP[,STEP...] | --only rest] [--out DIR] [--build-dir DIR]
#   scripts/gpu-run.sh --dry-run [--reuse-build DIR] [--out DIR] [--build-dir DIR]
#
# The first call (docs/gpu.md, "The first GPU window": the calls, what they carry, the per-step budget) runs from
# the top with a 400 s deadline; the second, on the still-warm machine, reruns or finishes chosen steps with
# --only, reusing the first call's build (in the order given; env always runs first, it takes a second); --only rest
# takes the steps the first call did not reach.
#   env          driver, CUDA, cuBLAS, cudart, cuDNN, NCCL, NVRTC, nvcc, each with where it was found (the toolkit at
#                /usr/local/cuda or the image's Python nvidia-* wheels); a missing one stops the run here, named
#   configure    one configure for sm_90 (Release, CUDA + NCCL + cuDNN, optional backends off), nlohmann_json and
#                GoogleTest from the carried third_party/debs (scripts/gpu-prepare.sh)
#   build        exactly the programs the run needs
#   gemm         bench_cuda_gemm: the bf16 GEMM ceiling (8192^3, cuBLAS) that MFU is also read against
#   model-1.5b   llama3_train on configs/models/llama-3-1b-untied.json: tokens/s, MFU, peak GPU memory, and
#                whether cuDNN's fused attention ran (the unfused path is a FAILURE; cuDNN's log says why)
#   tests        the GPU tests that run in one process, one program at a time with a short timeout each
#   tests-multi  the tests that start several NCCL processes on the one GPU, NCCL's collectives first
#   model-8b     Llama-3-8B-shaped models of 2 and 6 layers at sequence 8192: per-layer time, hence the 32-layer
#                step time and MFU
#   fsdp2-eager  the peer, PyTorch FSDP2 on the 1.5B run's model, alone on the machine, in the image's environment
#   pipeline-p2p the pipeline's NCCL point-to-point test, where the build has one (else "not built")
#   libtorch     the libtorch adapter's CUDA tests (labels libtorch and gpu), built in a tree of their own against
#                the image's torch, where the sources have them (else "not built")
#   bench        bench_cuda_kernels and bench_cuda_engine
#   fsdp2-compiled  the peer with torch.compile, only if time is left
# Beside it all, nvidia-smi logs clocks, power and temperature every second (gpu-clocks.csv).
#
# --dry-run (no GPU needed; ctest -L gpu_dry_run) runs what needs none: the summary writer and the packer on the
# sample runs in scripts/gpu-fixtures/ (each summary's expected lines; what comes back: files, depth, sizes), the
# preparation check, the env report, the configure, the build of the same programs (in the --reuse-build tree when
# given: the test suite's, already built), the test programs (which report no device), llama3_train's memory plans
# of the runs (with the runs' own arguments), the peer's parse of its arguments, the search for the libtorch and
# pipeline tests, and at the end what its own $OUT would return.
#
# Environment: OUT (where results go, unless --out; the device tool sets it; default <build dir>/gpu-run-out),
# JOBS (default: all cores), CUDA_HOME (default /usr/local/cuda), CUDNN_HOME and NCCL_HOME (searched first when set).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEADLINE=400
DEADLINE_GIVEN=0
DRY_RUN=0
ONLY=""
REUSE_BUILD=""
BUILD_DIR=""
OUT_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --deadline) DEADLINE="${2:?--deadline needs seconds}"; DEADLINE_GIVEN=1; shift 2 ;;
    --out) OUT_DIR="${2:?--out needs a directory}"; shift 2 ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a directory}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --only) ONLY="${2:?--only needs STEP[,STEP...]}"; shift 2 ;;
    --reuse-build) REUSE_BUILD="${2:?--reuse-build needs a build directory}"; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-run: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# A dry run checks what runs, not how fast: on a 2-core machine shared with other builds its caps are 4 times the
# GPU machine's and its deadline 840 s (ctest gives it 900), unless --deadline says otherwise.
[ "$DRY_RUN" = 1 ] && [ "$DEADLINE_GIVEN" = 0 ] && DEADLINE=840
case "$DEADLINE" in
  *m) DEADLINE=$((${DEADLINE%m} * 60)) ;;
esac
[[ "$DEADLINE" =~ ^[0-9]+$ ]] && [ "$DEADLINE" -ge 60 ] ||
  { echo "gpu-run: --deadline $DEADLINE: expected seconds (or Nm), at least 60" >&2; exit 2; }
[ -n "$REUSE_BUILD" ] && [ "$DRY_RUN" = 0 ] && { echo "gpu-run: --reuse-build is for --dry-run" >&2; exit 2; }
[ -n "$ONLY" ] && [ "$DRY_RUN" = 1 ] && { echo "gpu-run: --only is for a GPU run" >&2; exit 2; }
readonly STEPS=(configure build gemm model-1.5b tests tests-multi model-8b fsdp2-eager pipeline-p2p libtorch bench
  fsdp2-compiled)
ONLY_STEPS=()
if [ -n "$ONLY" ] && [ "$ONLY" != rest ]; then
  IFS=, read -r -a ONLY_STEPS <<<"$ONLY"
  for s in "${ONLY_STEPS[@]}"; do
    grep -qx -- "$s" <<<"$(printf '%s\n' "${STEPS[@]}" env)" ||
      { echo "gpu-run: --only $s: no such step; the steps: env ${STEPS[*]}, or rest" >&2; exit 2; }
  done
fi
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
# --only rest: the steps after the build that the latest earlier call in this build tree did not run (skipped, or
# not reached before its deadline), in the usual order.
if [ "$ONLY" = rest ]; then
  previous=$(find "$BUILD_DIR/gpu-run-files" -mindepth 2 -maxdepth 2 -name steps.tsv 2>/dev/null | sort | tail -1)
  [ -n "$previous" ] || { echo "gpu-run: --only rest: no earlier call in $BUILD_DIR/gpu-run-files" >&2; exit 2; }
  for s in "${STEPS[@]:2}"; do
    awk -F'\t' -v s="$s" '$1 == s && $2 != "skipped" {found = 1} END {exit !found}' "$previous" || ONLY_STEPS+=("$s")
  done
  [ ${#ONLY_STEPS[@]} -gt 0 ] || { echo "gpu-run: --only rest: $previous ran every step" >&2; exit 2; }
  ONLY=$(IFS=,; echo "${ONLY_STEPS[*]}")
fi
WORK="$BUILD_DIR/gpu-run-work"  # generated inputs and what the configure found, kept for a later --only call
# Every file a step writes goes under RUN_DIR (one per call); OUT_DIR gets summary.txt, steps.tsv, env.txt and
# files.tar.gz, the whole of RUN_DIR, after every step (scripts/gpu-pack.py).
RUN_DIR="$BUILD_DIR/gpu-run-files/$(date -u +%Y%m%d-%H%M%S)-$$"
readonly T0=$(date +%s) RESERVE=15  # seconds kept for the last summary and archive
readonly SUMMARY="$ROOT/scripts/gpu-summary.py" PACK="$ROOT/scripts/gpu-pack.py"
readonly IMAGE_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"  # the image's own, for the peer
exec 3>&1  # the call's standard output, for what a failing step prints from inside its log's redirection

# What an earlier run left in OUT_DIR (a dry run's is in the build tree), this layout's and the one before it.
rm -rf "$OUT_DIR"/{summary.txt,steps.tsv,env.txt,files.tar.gz,logs,tests,model,bench,peer,run.json,gpu-clocks.csv}
# The scratch folders of the three calls before this one stay (a second call reads the first's steps).
find "$BUILD_DIR/gpu-run-files" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort | head -n -3 | xargs -r rm -rf
mkdir -p "$RUN_DIR"/{logs,tests,model,bench,peer,ctest} "$WORK" || exit 2
printf 'step\tstatus\tseconds\texpected\tnote\n' >"$RUN_DIR/steps.tsv"
printf '{"mode": "%s", "deadline_s": %d, "only": "%s", "started": "%s"}\n' \
  "$([ "$DRY_RUN" = 1 ] && echo dry-run || echo gpu)" "$DEADLINE" "$ONLY" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" \
  >"$RUN_DIR/run.json"

elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((T0 + DEADLINE - RESERVE - $(date +%s))); }
say() { echo "[gpu-run +$(elapsed)s] $*" | tee -a "$RUN_DIR/logs/run.log" >&3; }
# The summary, then what comes back: both never fail the run (a summary that cannot be written says so itself).
publish() {
  python3 "$SUMMARY" "$RUN_DIR" >"$RUN_DIR/summary.txt.part" 2>"$RUN_DIR/logs/summary.err"
  mv -f "$RUN_DIR/summary.txt.part" "$RUN_DIR/summary.txt"
  python3 "$PACK" "$RUN_DIR" "$OUT_DIR" 2>"$RUN_DIR/logs/pack.err" || say "packing the results failed: $(tail -1 "$RUN_DIR/logs/pack.err")"
}
# A line for the summary's notes of the step running now.
note() { echo "$*" >>"$RUN_DIR/logs/$STEP.note"; }
# Up to MAX characters of the end of stdin, to the call's output (which returns its last 12,000 characters).
show() {  # title [max]
  local text
  text=$(tail -c "${2:-1500}")
  [ -n "$text" ] && printf -- '--- %s\n%s\n' "$1" "$text" >&3
}
# The gtest failure reports and errors in a test program's output (what the summary shows too).
failure_lines() { grep -E 'Failure$|: error|[Ee]rror:|\[  FAILED  \]|terminate called|what\(\):|CUDNN_STATUS|NCCL WARN|CudaError|CommError' "$@" 2>/dev/null; }
record() {  # step status seconds expected note
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RUN_DIR/steps.tsv"
  say "$1: $2 ($3 s of ~$4 s)${5:+: $5}"
  if [ "$2" = FAILED ] || [ "$2" = TIMEOUT ]; then
    { failure_lines "$RUN_DIR/logs/$1.log" | tail -8; tail -n 12 "$RUN_DIR/logs/$1.log"; } | show "$1: the end of logs/$1.log"
  fi
  publish
}

# run_step NAME EXPECTED CAP FUNCTION: runs FUNCTION (output to logs/NAME.log) when at least EXPECTED seconds are
# left, killed with all its processes after min(CAP, left) seconds. FUNCTION returns 0 (ok), 77 (skipped; its
# note says why) or anything else (FAILED); LAST_STATUS says which it was.
FAILED_REQUIRED=""
run_step() {
  local name=$1 expected=$2 cap=$3 func=$4 have limit start rc status
  STEP=$name
  : >"$RUN_DIR/logs/$name.note"
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
  [ "$DRY_RUN" = 1 ] && cap=$((cap * 4))
  limit=$((cap < have ? cap : have))
  export STEP_LIMIT=$limit
  start=$(date +%s)
  set -m  # the step in a process group of its own, so a timeout ends everything it started
  ("$func") >"$RUN_DIR/logs/$name.log" 2>&1 &
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
  why=$(paste -sd '|' "$RUN_DIR/logs/$name.note" | sed 's/|/; /g')
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

ENV_FILE="$RUN_DIR/env.txt"
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
  envline nvcc_on_path "$(command -v nvcc || echo "none (the run uses $TOOLKIT/bin/nvcc)")"
  local ld=() lib
  for lib in 'cudart:libcudart.so.13*' 'cublas:libcublas.so.13*' 'cublasLt:libcublasLt.so.13*'; do
    if find_component "${lib%%:*}" "${lib#*:}"; then
      envline "${lib%%:*}" "$(basename "$(readlink -f "$FOUND_LIB")") ($FOUND_WHERE: $FOUND_LIB)"
    else
      missing+=("${lib%%:*} (${lib#*:}: the model's GEMMs and every CUDA program need it)")
    fi
  done
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
  envline python "$(python3 --version 2>&1)"  # torch and transformers: the peer's step says (importing them is slow)
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

# The GPU configuration's CMake arguments (in CMAKE_ARGS), but for ZERO3_CUDNN: Release, sm_90, CUDA and NCCL on,
# the optional CPU backends off, nlohmann_json and GoogleTest from the carried packages, cuDNN and NCCL where the
# env step found them.
set_cmake_args() {
  local debs="$ROOT/third_party/debs/root" found=()
  mapfile -t found < <(sed 's/^/-D/' "$WORK/found.env")
  CMAKE_ARGS=(-G Ninja)
  command -v ninja >/dev/null || CMAKE_ARGS=(-G "Unix Makefiles")
  CMAKE_ARGS+=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$TOOLKIT/bin/nvcc"
    -DZERO3_CUDA=ON -DZERO3_NCCL=ON -DZERO3_GLOO=OFF -DZERO3_LIBFABRIC=OFF -DZERO3_AIO=OFF -DZERO3_BLAS=OFF
    "-DCMAKE_PREFIX_PATH=$debs/usr;$BUILD_DIR/_deps/gtest" "${found[@]}")
  command -v ccache >/dev/null &&
    CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
}

step_configure() {
  local debs="$ROOT/third_party/debs/root" gtest_prefix="$BUILD_DIR/_deps/gtest"
  set_cmake_args
  if [ ! -f "$gtest_prefix/.built" ]; then
    echo "== GoogleTest from $debs/usr/src/googletest"
    cmake -S "$debs/usr/src/googletest" -B "$BUILD_DIR/_deps/gtest-build" "${CMAKE_ARGS[@]:0:2}" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" &&
      cmake --build "$BUILD_DIR/_deps/gtest-build" -j "$JOBS" && cmake --install "$BUILD_DIR/_deps/gtest-build" &&
      touch "$gtest_prefix/.built" || return 1
  fi
  echo "== zero3 for sm_90"
  cmake -S "$ROOT" -B "$BUILD_DIR" "${CMAKE_ARGS[@]}" -DZERO3_CUDNN=ON || return 1
  # The run's programs: the gpu-labelled tests' (a test gpu.NAME runs the program NAME), the training program
  # and the GPU benchmarks.
  ctest --test-dir "$BUILD_DIR" -N -L '^gpu$' | sed -n 's/.*Test *#[0-9]*: gpu\.\([A-Za-z0-9_]*\).*/\1/p' \
    >"$WORK/test_programs"
  [ -s "$WORK/test_programs" ] || { note "no gpu-labelled tests in the configured tree"; return 1; }
  { cat "$WORK/test_programs"; echo llama3_train; echo bench_cuda_gemm; echo bench_cuda_kernels; echo bench_cuda_engine
  } >"$WORK/targets"
  note "$(wc -l <"$WORK/targets") programs to build: $(paste -sd' ' "$WORK/targets")"
}

step_build() {
  local targets=() jobs=$JOBS
  mapfile -t targets <"$WORK/targets"
  if [ -n "$REUSE_BUILD" ]; then
    # Every program exists in the GPU configuration; they are built (or found up to date) in the suite's tree.
    local t
    cmake --build "$BUILD_DIR" --target help >"$WORK/target_help"
    for t in "${targets[@]}"; do
      grep -qE "^($t: |\.\.\. $t\$)" "$WORK/target_help" || { note "no target $t in the GPU configuration"; return 1; }
    done
    note "dry run: the $(wc -l <"$WORK/targets") programs built in $REUSE_BUILD (the test suite's tree)"
    cmake --build "$REUSE_BUILD" -j "$jobs" --target "${targets[@]}"
  else
    cmake --build "$BUILD_DIR" -j "$jobs" --target "${targets[@]}" || {
      grep -E 'error|FAILED:' "$RUN_DIR/logs/build.log" | head -20 | show "build: the first errors" 2500
      return 1
    }
  fi
}

# Runs one GPU test program with a gtest filter and a timeout; the result in tests/NAME[.TAG].{json,log,status}.
run_test_program() {  # program filter tag limit
  local prog=$1 filter=$2 tag=$3 limit=$4 exe="$RUN_TREE/bin/$1" base="$RUN_DIR/tests/$1$3" start rc
  [ -x "$exe" ] || { echo "missing $exe" >"$base.log"; echo "rc=127 seconds=0" >"$base.status"; return; }
  if ! grep -q '^  ' <<<"$("$exe" --gtest_list_tests --gtest_filter="$filter" 2>/dev/null)"; then
    echo "rc=none seconds=0 (no test matches $filter)" >"$base.status"
    return
  fi
  start=$(date +%s)
  ZERO3_SOURCE_DIR="$ROOT" ZERO3_BIN_DIR="$RUN_TREE/bin" LLAMA3_GOLDEN_DIR="$ROOT/examples/llama3/tests/golden" \
    CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$base.cudnn.log" \
    timeout -k 5 "$limit" "$exe" --gtest_filter="$filter" --gtest_output="json:$base.json" >"$base.log" 2>&1
  rc=$?
  echo "rc=$rc seconds=$(($(date +%s) - start)) limit=$limit" >"$base.status"
  echo "$prog$tag: exit $rc in $(($(date +%s) - start)) s"
  [ -s "$base.cudnn.log" ] || rm -f "$base.cudnn.log"
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    { failure_lines "$base.log" | tail -6; [ "$rc" -gt 128 ] && tail -n 4 "$base.log"; } |
      show "$prog$tag: exit $rc (tests/$prog$tag.log)" 1200
  fi
}

# The order tells the most first: the model's kernels, cuDNN's attention, the model, then the library's. Among the
# several-process tests NCCL's collectives come first: the engine's 2- and 3-rank tests take longer.
# shellcheck disable=SC2034  # read through ordered_test_programs' name reference
TEST_ORDER=(llama3_gpu_test_cuda_ops llama3_gpu_test_cudnn_attention llama3_gpu_test_cuda_model test_cuda_kernels
  test_cuda_engine test_cuda_allocator test_cuda_streams test_cuda_quantize test_nccl_collectives)
# shellcheck disable=SC2034
MULTI_ORDER=(test_nccl_collectives test_cuda_engine)
readonly MULTI_PROCESS='*RanksOnOneGpu*'
# The pipeline's NCCL point-to-point test, by name among the gpu-labelled tests: its own step, not the tests step's.
readonly PIPELINE_P2P='[Pp]2[Pp]|point_to_point|PointToPoint'
ordered_test_programs() {  # [ORDER-ARRAY-NAME]
  local -n order=${1:-TEST_ORDER}
  local p
  grep -vE "$PIPELINE_P2P" "$WORK/test_programs" >"$WORK/test_programs.general"
  for p in "${order[@]}"; do grep -qx "$p" "$WORK/test_programs.general" && echo "$p"; done
  grep -vxF -f <(printf '%s\n' "${order[@]}") "$WORK/test_programs.general"
}

test_step() {  # filter tag per-program-limit [ORDER-ARRAY-NAME]
  local filter=$1 tag=$2 per=$3 order=${4:-TEST_ORDER} budget=$((STEP_LIMIT - 5)) start p spent
  start=$(date +%s)
  while read -r p; do
    spent=$(($(date +%s) - start))
    if [ $((budget - spent)) -lt 10 ]; then
      echo "rc=skipped seconds=0 (step budget spent)" >"$RUN_DIR/tests/$p$tag.status"
      continue
    fi
    run_test_program "$p" "$filter" "$tag" $((per < budget - spent ? per : budget - spent))
  done < <(ordered_test_programs "$order")
  # A run without a device: the programs say so and exit 77 (what a dry run must see).
  if [ "$DRY_RUN" = 1 ]; then
    local bad
    bad=$(grep -L 'rc=77\|rc=none' "$RUN_DIR"/tests/*"$tag".status 2>/dev/null | xargs -r -n1 basename | paste -sd' ')
    [ -z "$bad" ] || { note "without a GPU these did not report 'no device' (exit 77): $bad"; return 1; }
    note "dry run: every program started and reported no CUDA device (exit 77)"
    return 77
  fi
  # The step ran; each program's result is its own line in the summary (a failing one a FAILURE).
  local ran failed
  ran=$(grep -l 'rc=[0-9]' "$RUN_DIR"/tests/*"$tag".status 2>/dev/null | wc -l)
  failed=$(grep -L 'rc=0 \|rc=none\|rc=skipped' "$RUN_DIR"/tests/*"$tag".status 2>/dev/null | wc -l)
  note "$ran programs ran, $failed of them failed or timed out"
}
# 90 s a program: cuDNN's attention test builds a plan (NVRTC compiles its kernels) for each of its many shapes.
# The engine's several-process tests take turns on the GPU: 60 s each.
step_tests() { test_step "-$MULTI_PROCESS" "" 90; }
step_tests_multi() {
  # The several-process tests must exist where the run looks for them (checked without a GPU too).
  local p n=0
  while read -r p; do
    grep -q '^  ' <<<"$("$RUN_TREE/bin/$p" --gtest_list_tests --gtest_filter="$MULTI_PROCESS" 2>/dev/null)" && n=$((n + 1))
  done < <(ordered_test_programs MULTI_ORDER)
  [ "$n" -ge 2 ] || { note "expected the several-process tests of test_cuda_engine and test_nccl_collectives, found $n programs"; return 1; }
  test_step "$MULTI_PROCESS" ".multi" 60 MULTI_ORDER
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
    "$warmup" >"$RUN_DIR/model/$run.meta"
  local args=(--device cuda --model "$model" --deepspeed "$WORK/zero-stage3-auto.json" --precision bf16
    --micro-batch "$micro" --grad-accum 1 --seq-len "$seq" --grad-checkpointing --steps "$steps" --warmup-steps 0
    --lr 1e-4 --data "$WORK/tokens.u32" --metrics "$RUN_DIR/model/$run.csv")
  echo "== $run: memory plan (the run's own arguments)"
  "$exe" --dry-run --world-size 1 "${args[@]}" >"$RUN_DIR/model/$run.plan" 2>&1 ||
    { note "$run: llama3_train --dry-run failed (model/$run.plan)"; return 1; }
  plan_bytes=$(awk '$1 == "device" && NF >= 4 {gsub(",", "", $2); v = $2} END {print v + 0}' "$RUN_DIR/model/$run.plan")
  gpu_bytes=$(sed -n 's/^gpu_memory_mib: \([0-9]*\).*/\1/p' "$ENV_FILE" | head -1)
  gpu_bytes=$((${gpu_bytes:-0} * 1048576))
  note "$run: planned $(awk -v b="$plan_bytes" 'BEGIN {printf "%.1f", b / 2^30}') GiB per GPU"
  if [ "$DRY_RUN" = 1 ]; then return 0; fi
  if [ "$gpu_bytes" -gt 0 ] && [ "$plan_bytes" -gt $((gpu_bytes * 95 / 100)) ]; then
    note "$run: skipped: its plan exceeds 95% of the GPU's $((gpu_bytes >> 30)) GiB"
    return 77
  fi
  echo "== $run: $steps steps"
  # cuDNN's own log at level 2 (warnings and errors): why it refuses a graph, if it does (cuDNN 9's variables).
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$RUN_DIR/model/$run.cudnn.log" "$exe" "${args[@]}" >"$RUN_DIR/model/$run.log" 2>&1
  local rc=$?
  tail -5 "$RUN_DIR/model/$run.log"
  [ -s "$RUN_DIR/model/$run.cudnn.log" ] || rm -f "$RUN_DIR/model/$run.cudnn.log"
  grep -q "falls back to the cuBLAS path\|cuDNN attention unavailable" "$RUN_DIR/model/$run.log" &&
    { grep "falls back to the cuBLAS path\|cuDNN attention unavailable" "$RUN_DIR/model/$run.log" | head -3
      tail -n 6 "$RUN_DIR/model/$run.cudnn.log" 2>/dev/null; } | show "$run: cuDNN's fused attention refused a graph" 1500
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
    timeout -k 5 $((STEP_LIMIT / 2)) "$RUN_TREE/bin/$b" >"$RUN_DIR/bench/$b.log" 2>&1
    rc=$?
    echo "$b: exit $rc"
    echo "rc=$rc" >"$RUN_DIR/bench/$b.status"
    if [ "$rc" -eq 77 ] && [ "$DRY_RUN" = 1 ]; then continue; fi
    [ "$rc" -ne 0 ] && worst=$rc
  done
  [ "$DRY_RUN" = 1 ] && [ "$worst" = 0 ] && { note "dry run: both benches reported no CUDA device (exit 77)"; return 77; }
  return $worst
}

# The bf16 GEMM ceiling: what cuBLAS reaches on this GPU at its clocks, for MFU beside the datasheet's 989 TFLOP/s.
step_gemm() {
  timeout -k 5 $((STEP_LIMIT - 5)) "$RUN_TREE/bin/bench_cuda_gemm" --n 8192 --reps 20 \
    >"$RUN_DIR/bench/bench_cuda_gemm.log" 2>&1
  local rc=$?
  cat "$RUN_DIR/bench/bench_cuda_gemm.log"
  if [ "$rc" = 77 ] && [ "$DRY_RUN" = 1 ]; then note "dry run: no CUDA device (exit 77)"; return 77; fi
  [ "$rc" = 0 ] && note "$(grep -o '[0-9.]* TFLOP/s' "$RUN_DIR/bench/bench_cuda_gemm.log")"
  return $rc
}

# ---- The PyTorch FSDP2 peer on the 1.5B run's model, batch and sequence (examples/llama3/tools/fsdp2_reference.py).
# Alone on the machine, after the build, with the image's own library path: torch loads its own wheels' cuDNN and
# NCCL, not the ones the run found for zero3. Its timed steps are zero3's: 15 steps, the first 5 not timed.

image_env() {  # COMMAND...: run it with the image's LD_LIBRARY_PATH
  if [ -n "$IMAGE_LD_LIBRARY_PATH" ]; then env LD_LIBRARY_PATH="$IMAGE_LD_LIBRARY_PATH" "$@"; else env -u LD_LIBRARY_PATH "$@"; fi
}

peer_run() {  # eager | compiled
  local kind=$1 tools="$ROOT/examples/llama3/tools" rc
  local args=(--model "$ROOT/configs/models/llama-3-1b-untied.json" --micro-batch 4 --seq-len 1024 --steps 15 --warmup 5
    --grad-checkpointing --out "$RUN_DIR/peer/fsdp2_$kind.json")
  [ "$kind" = compiled ] && args+=(--compile --fused-adamw)
  if [ "$DRY_RUN" = 1 ]; then
    # The peer reads its arguments before importing torch: these exact ones must parse.
    python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import fsdp2_reference as f; f.parse_args(sys.argv[2:])' \
      "$tools" "${args[@]}" || { note "fsdp2_reference.py refuses the run's arguments"; return 1; }
    note "dry run: the peer takes the run's arguments; no training without a GPU"
    return 77
  fi
  # torch and transformers are imported here, in this step's time (cold, they take seconds); without them the
  # script says so and exits 77.
  image_env python3 "$tools/fsdp2_reference.py" "${args[@]}"
  rc=$?
  [ "$rc" = 77 ] && note "torch or transformers not importable in the image: no FSDP2 peer"
  return $rc
}
step_peer_eager() { peer_run eager; }
step_peer_compiled() { peer_run compiled; }

# ---- Steps run through ctest, for tests this run finds by label or name: ctest/STEP.{log,status}. ----

ctest_names() {  # TREE CTEST-ARGS...: the names of the tests they select, one a line
  local tree=$1
  shift
  ctest --test-dir "$tree" -N "$@" 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p'
}
not_built() {  # STEP WHY
  echo "rc=none why=${2// /_}" >"$RUN_DIR/ctest/$1.status"
  note "not built: $2"
  return 77
}
run_ctest() {  # STEP TREE CTEST-ARGS...
  local step=$1 tree=$2 start rc
  shift 2
  start=$(date +%s)
  ctest --test-dir "$tree" "$@" --timeout 90 --output-on-failure >"$RUN_DIR/ctest/$step.log" 2>&1
  rc=$?
  echo "rc=$rc seconds=$(($(date +%s) - start))" >"$RUN_DIR/ctest/$step.status"
  tail -n 5 "$RUN_DIR/ctest/$step.log"
  [ "$rc" = 0 ] ||
    { sed -n '/The following tests FAILED/,$p' "$RUN_DIR/ctest/$step.log"; failure_lines "$RUN_DIR/ctest/$step.log" |
      tail -6; } | show "$step: ctest exit $rc (ctest/$step.log)" 1200
  return $rc
}

# The pipeline's NCCL point-to-point test: a gpu-labelled test (gpu.<program>, built with the others) whose name
# matches $PIPELINE_P2P. Where the sources have none yet, "not built".
step_pipeline_p2p() {
  local names
  names=$(ctest_names "$RUN_TREE" -L '^gpu$' -R "$PIPELINE_P2P")
  [ -n "$names" ] || { not_built pipeline-p2p "no gpu-labelled test named p2p or point_to_point in this build"; return; }
  note "$(echo "$names" | paste -sd' ')"
  run_ctest pipeline-p2p "$RUN_TREE" -L '^gpu$' -R "$PIPELINE_P2P" || return
  [ "$DRY_RUN" = 1 ] && { note "dry run: the test reports no CUDA device (skipped)"; return 77; }
  return 0
}

# The libtorch adapter on the CUDA device: its tests labelled both libtorch and gpu, in a tree of their own
# (<build>/libtorch) configured like the run's with the adapter on, against the image's torch (its wheel ships
# libtorch's headers, libraries and CMake package: Torch_DIR from torch.utils.cmake_prefix_path). Its CPU tests
# need Gloo, which the GPU configuration leaves off. Where the sources have no such test, "not built".
readonly LIBTORCH_LABELS=(-L libtorch -L '^gpu$')
step_libtorch() {
  local tree="$BUILD_DIR/libtorch" torch_dir names targets=()
  if [ "$DRY_RUN" = 1 ]; then
    names=$(ctest_names "$RUN_TREE" "${LIBTORCH_LABELS[@]}")
    [ -n "$names" ] || { not_built libtorch "no test has the labels libtorch and gpu in these sources"; return; }
    run_ctest libtorch "$RUN_TREE" "${LIBTORCH_LABELS[@]}" || return
    note "dry run: $(echo "$names" | wc -l) tests in the suite's tree, no CUDA device"
    return 77
  fi
  torch_dir=$(image_env python3 -c 'import os, torch; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))') ||
    { not_built libtorch "python3 cannot import torch in the image"; return; }
  echo "== the adapter against $torch_dir"
  set_cmake_args
  cmake -S "$ROOT" -B "$tree" "${CMAKE_ARGS[@]}" -DZERO3_CUDNN=OFF -DZERO3_LIBTORCH=ON -DTorch_DIR="$torch_dir" ||
    { note "the configure with libtorch failed (logs/libtorch.log)"; return 1; }
  names=$(ctest_names "$tree" "${LIBTORCH_LABELS[@]}")
  [ -n "$names" ] || { not_built libtorch "no test has the labels libtorch and gpu in these sources"; return; }
  # Each test's program (and zero3_cli, which launches the several-rank ones) is a target of the same name.
  mapfile -t targets < <(ctest --test-dir "$tree" --show-only=json-v1 "${LIBTORCH_LABELS[@]}" | python3 -c '
import json, os, sys
names = {os.path.basename(t["command"][0]) for t in json.load(sys.stdin).get("tests", []) if t.get("command")}
print("\n".join(sorted("zero3_cli" if n == "zero3" else n for n in names)))')
  cmake --build "$tree" -j "$JOBS" --target "${targets[@]}" || { note "the libtorch build failed (logs/libtorch.log)"; return 1; }
  run_ctest libtorch "$tree" "${LIBTORCH_LABELS[@]}"
}

# ---- The sample runs (scripts/gpu-fixtures/*: a run dir and expected.txt): their summaries and what comes back. ----

step_summary_fixtures() {
  python3 "$SUMMARY" --check-fixtures "$ROOT/scripts/gpu-fixtures"
}
step_pack_fixtures() {
  python3 "$PACK" --check-fixtures "$ROOT/scripts/gpu-fixtures"
}

# --only without configure and build: the first call's build must be here.
step_reuse_build() {
  local t missing=()
  [ -s "$WORK/targets" ] && [ -s "$WORK/test_programs" ] ||
    { note "no build from an earlier call in $BUILD_DIR: run without --only first, or add configure,build"; return 1; }
  while read -r t; do [ -x "$BUILD_DIR/bin/$t" ] || missing+=("$t"); done <"$WORK/targets"
  [ ${#missing[@]} = 0 ] || { note "not built in $BUILD_DIR: ${missing[*]} (add build to --only)"; return 1; }
  note "the $(wc -l <"$WORK/targets") programs built by an earlier call"
}

# ---- The run. ----

CLOCKS_PID=""
start_clock_log() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || return
  local fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used
  local reasons=clocks_event_reasons.active
  nvidia-smi --query-gpu="$reasons" --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  nvidia-smi --query-gpu="$fields,$reasons" --format=csv -l 1 >"$RUN_DIR/gpu-clocks.csv" 2>/dev/null &
  CLOCKS_PID=$!
}
stop_clock_log() { [ -n "$CLOCKS_PID" ] && kill "$CLOCKS_PID" 2>/dev/null && wait "$CLOCKS_PID" 2>/dev/null; }
# Stopped from outside (the device tool's own timeout, ^C): the running step's process group goes too.
STEP_PID=""
stop_all() {
  [ -n "$STEP_PID" ] && kill -TERM -- "-$STEP_PID" 2>/dev/null
  stop_clock_log
}
trap 'stop_all' EXIT
trap 'stop_all; exit 143' INT TERM

say "$([ "$DRY_RUN" = 1 ] && echo "dry run" || echo "GPU run")${ONLY:+ of $ONLY}: deadline ${DEADLINE} s, out $OUT_DIR, files $RUN_DIR"
start_clock_log

step_prepare() { bash "$ROOT/scripts/gpu-prepare.sh"; }

LAST_STATUS=""
required() {  # run_step's arguments; a step the rest cannot do without
  run_step "$@"
  [ "$LAST_STATUS" = ok ] || FAILED_REQUIRED=${FAILED_REQUIRED:-$1}
}

# Each step with its expected seconds and its cap (docs/gpu.md, "The steps and their budget").
run_named() {
  local build_cap
  case $1 in
    configure) required configure 40 150 step_configure ;;
    build)  # the build may use what the later steps would have had: without it none of them can run
      build_cap=$(($(left) - 60))
      required build 150 $((build_cap > 150 ? build_cap : 150)) step_build ;;
    gemm) run_step gemm 10 40 step_gemm ;;
    model-1.5b) run_step model-1.5b 45 90 step_model_small ;;
    tests) run_step tests 90 150 step_tests ;;
    tests-multi) run_step tests-multi 45 130 step_tests_multi ;;
    model-8b) run_step model-8b 75 120 step_model_8b ;;
    pipeline-p2p) run_step pipeline-p2p 30 100 step_pipeline_p2p ;;
    fsdp2-eager) run_step fsdp2-eager 60 120 step_peer_eager ;;
    bench) run_step bench 30 60 step_bench ;;
    libtorch) run_step libtorch 120 200 step_libtorch ;;
    fsdp2-compiled) run_step fsdp2-compiled 150 240 step_peer_compiled ;;
  esac
}

if [ "$DRY_RUN" = 1 ]; then
  run_step summary-fixtures 3 60 step_summary_fixtures
  run_step pack-fixtures 3 60 step_pack_fixtures
  required prepare 5 120 step_prepare
fi
required env 5 20 step_env
with_found_libraries
if [ -z "$ONLY" ]; then
  for step in "${STEPS[@]}"; do run_named "$step"; done
else
  grep -qxE 'configure|build' <<<"$(printf '%s\n' "${ONLY_STEPS[@]}")" || required reuse-build 1 10 step_reuse_build
  for step in "${ONLY_STEPS[@]}"; do [ "$step" = env ] || run_named "$step"; done
fi

stop_clock_log
publish
echo
cat "$RUN_DIR/summary.txt"
# What comes back must fit the device call's limits (a dry run checks its own).
if [ "$DRY_RUN" = 1 ] && ! python3 "$PACK" --check "$OUT_DIR"; then
  echo "FAILURE: what $OUT_DIR would return exceeds the device call's limits"
  exit 1
fi
# The run's verdict is the summary's: any FAILURE line fails it (a dry run's skipped GPU steps are not failures).
! grep -q '^FAILURE' "$RUN_DIR/summary.txt" && [ -s "$RUN_DIR/summary.txt" ]
