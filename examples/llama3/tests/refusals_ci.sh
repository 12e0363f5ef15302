#!/usr/bin/env bash
# What llama3_train refuses, as a user meets it (ctest dist.llama3.refusals), 2 ranks under zero3 launch:
#   1. A checkpoint whose manifest was edited by hand: the ranges of the two shard files swapped (a resume used to
#      train on scrambled weights), world_size 3 with 2 files, the counters rewritten consistently, a value of the
#      program's extras that is not a number. The resume stops before any step, naming the manifest or the shard
#      file and the key.
#   2. A --save-dir that is a regular file, or on a read-only mount: the run stops before it loads data or
#      builds the model, naming the path (not at the first save).
#   3. --init-from weights holding a NaN: the run stops naming the tensor and the element. A tensor that is no
#      parameter of the model is named in a warning; with --init-from-strict it is an error.
# usage: refusals_ci.sh ZERO3_CLI LLAMA3_TRAIN REPO_ROOT WORK_DIR PYTHON
set -euo pipefail
zero3=$1 train=$2 root=$3 work=$4 python=$5
rm -rf "$work"
mkdir -p "$work"
cd "$root"

common=(--model configs/models/llama-3-tiny.json --deepspeed configs/zero-stage3.json
        --data /usr/share/common-licenses --tokenizer bytes --seq-len 64 --micro-batch 4 --grad-accum 4
        --precision bf16 --device cpu --metrics none)
failures=0

# expect_refusal NAME TEXT... -- ARGS: runs llama3_train on 2 ranks with ARGS; it must fail, print every TEXT, and
# stop before its first step.
expect_refusal() {
  local name=$1; shift
  local texts=()
  while [ "$1" != "--" ]; do texts+=("$1"); shift; done
  shift
  local log="$work/$name.log"
  if "$zero3" launch -n 2 -- "$train" "${common[@]}" "$@" > "$log" 2>&1; then
    echo "FAIL $name: the run succeeded"; failures=$((failures + 1)); return
  fi
  for t in "${texts[@]}"; do
    if ! grep -qF -- "$t" "$log"; then
      echo "FAIL $name: no '$t' in the output:"; cat "$log"; failures=$((failures + 1)); return
    fi
  done
  if grep -qE "step [0-9]+/" "$log"; then
    echo "FAIL $name: it trained before refusing:"; cat "$log"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(grep -m1 -E "ERROR" "$log" | sed 's/^\[rank [0-9]\] \[zero3 rank [0-9]\] //' | cut -c1-240)"
}

echo "== a checkpoint and safetensors to start from"
"$zero3" launch -n 2 -- "$train" "${common[@]}" --steps 2 --save-dir "$work/ckpt" --consolidate-to "$work/hf" \
  > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
manifest_of() { echo "$1/global_step2/manifest.json"; }

echo "== 1. edited manifests"
edit() {  # edit NAME PYTHON-STATEMENTS: a copy of the checkpoint whose manifest m is changed by the statements
  rm -rf "$work/$1"
  cp -r "$work/ckpt" "$work/$1"
  "$python" - "$(manifest_of "$work/$1")" "$2" <<'EOF'
import json, sys
path, code = sys.argv[1], sys.argv[2]
m = json.load(open(path))
exec(code)
json.dump(m, open(path, "w"), indent=2)
EOF
}
edit swapped 'f = m["files"]; f[0]["ranges"], f[1]["ranges"] = f[1]["ranges"], f[0]["ranges"]'
expect_refusal swapped_ranges "$(manifest_of "$work/swapped"): files[0] (rank-00000-of-00002.safetensors): ranges[0]" \
  "swapped between files" -- --steps 3 --save-dir "$work/swapped" --resume latest
edit world3 'm["world_size"] = 3'
expect_refusal world_size_3 "world_size 3 at stage 3 means 3 shard file(s), one per rank that holds a slice, but files lists 2" \
  -- --steps 3 --save-dir "$work/world3" --resume latest
edit counters 's = m["training_state"]; s["global_steps"] = 20; s["applied_steps"] = 20; s["micro_steps"] = 80'
expect_refusal counters "global_step2/rank-0000" "was saved at training_state.micro_steps 8" "the manifest says 80" \
  -- --steps 30 --save-dir "$work/counters" --resume latest
edit extras 'm["extras"]["seq_len"] = "sixty-four"'
expect_refusal extras "$(manifest_of "$work/extras"): extras.seq_len is 'sixty-four', expected a decimal integer" \
  -- --steps 3 --save-dir "$work/extras" --resume latest

echo "== 2. --save-dir checked at start"
touch "$work/a-file"
expect_refusal save_dir_is_a_file "--save-dir $work/a-file: is a regular file, not a directory" -- \
  --steps 3 --save-dir "$work/a-file"
if grep -q "model:" "$work/save_dir_is_a_file.log"; then echo "FAIL: the model was built before the check"; failures=$((failures + 1)); fi
mkdir -p "$work/read-only"
if unshare -m true 2> /dev/null; then
  log="$work/save_dir_read_only.log"
  if unshare -m sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"' sh \
       "$work/read-only" "$zero3" launch -n 2 -- "$train" "${common[@]}" --steps 3 --save-dir "$work/read-only" \
       > "$log" 2>&1; then
    echo "FAIL save_dir_read_only: the run succeeded"; failures=$((failures + 1))
  elif ! grep -qF -- "--save-dir $work/read-only: cannot create a file in it: Read-only file system" "$log" ||
       grep -qE "step [0-9]+/|model:" "$log"; then
    echo "FAIL save_dir_read_only:"; cat "$log"; failures=$((failures + 1))
  else
    echo "ok   save_dir_read_only: $(grep -m1 ERROR "$log" | sed 's/^\[rank [0-9]\] \[zero3 rank [0-9]\] //')"
  fi
else
  echo "skip save_dir_read_only: no mount namespace here"
fi

echo "== 3. --init-from weights checked"
"$python" - "$work/hf" "$work" <<'EOF'
import json, os, shutil, struct, sys
src, work = sys.argv[1], sys.argv[2]
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]
def save(path, header, data):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)
header, data = load(os.path.join(src, "model.safetensors"))
# A NaN at element 5 of the first layer's q_proj.
t = header["model.layers.0.self_attn.q_proj.weight"]
size = {"BF16": 2, "F16": 2, "F32": 4}[t["dtype"]]
nan = {"BF16": b"\xc0\x7f", "F16": b"\x00\x7e", "F32": b"\x00\x00\xc0\x7f"}[t["dtype"]]
at = t["data_offsets"][0] + 5 * size
shutil.copytree(src, os.path.join(work, "hf-nan"))
save(os.path.join(work, "hf-nan", "model.safetensors"), header, data[:at] + nan + data[at + size:])
# A tensor the model does not have, as old checkpoints carry rotary buffers.
extra = struct.pack("<4f", 1.0, 0.5, 0.25, 0.125)
header["model.layers.0.self_attn.rotary_emb.inv_freq"] = {"dtype": "F32", "shape": [4],
                                                          "data_offsets": [len(data), len(data) + len(extra)]}
shutil.copytree(src, os.path.join(work, "hf-extra"))
save(os.path.join(work, "hf-extra", "model.safetensors"), header, data + extra)
EOF
expect_refusal init_from_nan "tensor 'model.layers.0.self_attn.q_proj.weight' of $work/hf-nan/model.safetensors" \
  "holds 1 non-finite value(s)" "the first at element 5 (NaN)" -- --steps 1 --init-from "$work/hf-nan"
log="$work/init_from_extra.log"
if ! "$zero3" launch -n 2 -- "$train" "${common[@]}" --steps 1 --init-from "$work/hf-extra" > "$log" 2>&1 ||
   ! grep -qF "holds 1 tensor(s) that are not parameters of the model" "$log" ||
   ! grep -qF "'model.layers.0.self_attn.rotary_emb.inv_freq'; they are not loaded" "$log"; then
  echo "FAIL init_from_extra: expected a warning naming the tensor and a run that trains:"; cat "$log"
  failures=$((failures + 1))
else
  echo "ok   init_from_extra: $(grep -m1 WARN "$log" | sed 's/^\[rank [0-9]\] \[zero3 rank [0-9]\] //' | cut -c1-200)"
fi
expect_refusal init_from_strict "'model.layers.0.self_attn.rotary_emb.inv_freq' (--init-from-strict)" -- \
  --steps 1 --init-from "$work/hf-extra" --init-from-strict

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "PASS"
