#!/usr/bin/env bash
# A Python virtual environment with what the Hugging Face tools of the Llama-3 example need (make_golden.py,
# check_hf_export.py): torch, transformers and safetensors from PyPI, at the versions the committed fixtures
# were made with. Only these tools use it: neither the library nor its tests need Python packages.
#
# PyPI's torch wheel runs on the CPU; on Linux it also pulls NVIDIA's CUDA runtime wheels (5.6 GB installed in
# all, measured), which the tools do not use. Safe to run again: an environment that already has the pinned
# versions is left as it is.
#
# usage: hf_venv.sh [DIR]      (default: $HOME/.cache/zero3/hf-venv); prints DIR/bin/python on its last line
set -euo pipefail

dir=${1:-${HOME}/.cache/zero3/hf-venv}
pins=(torch==2.15.0 transformers==5.23.0 safetensors==0.8.0)

if [ ! -x "$dir/bin/python" ]; then
  python3 -m venv "$dir"
fi
if ! "$dir/bin/python" - "${pins[@]}" > /dev/null 2>&1 <<'PY'
import importlib.metadata as md, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if md.version(name) != version:
        sys.exit(1)
PY
then
  "$dir/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$dir/bin/python"
