#!/usr/bin/env bash
# The smoke run of a Python benchmark program (ctest label bench_smoke): NPROC ranks (default 1) under torchrun on
# this machine, at the size its arguments give. Skipped (exit 77, with the reason) where CHECK fails, e.g. on a
# machine without torch: the library and its tests never need Python packages.
#
#   smoke_python.sh CHECK SCRIPT [ARGS...]    CHECK: Python code that must run first, e.g. "import torch"
#
# PYTHON (default python3) is the interpreter.
set -euo pipefail
check=${1:?usage: smoke_python.sh CHECK SCRIPT [ARGS...]}
script=${2:?usage: smoke_python.sh CHECK SCRIPT [ARGS...]}
shift 2
python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "skipped: no $python"; exit 77; }
if ! why=$("$python" -c "$check" 2>&1); then
  echo "skipped: $python cannot run '$check': $(echo "$why" | tail -1)"
  exit 77
fi
exec "$python" -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-1}" "$script" "$@"
