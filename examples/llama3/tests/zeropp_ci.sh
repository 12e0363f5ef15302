#!/usr/bin/env bash
# ZeRO++'s qwZ and qgZ on the tiny Llama (ctest dist.llama3.zeropp): the job of zeropp_common.sh (50 steps, bf16) on 4
# ranks (plain ZeRO-3, unquantized and with qwZ + qgZ) and on 2 simulated nodes x 2 ranks (hpZ within the node,
# unquantized and with qwZ + qgZ), each quantized run held to zeropp_common.sh's bound (the mean loss of the last 10
# steps within 9% of the unquantized run's on the same layout; converged at least half as far). The same job on the
# namespace cluster: tests/cluster/test_train_zeropp.sh.
# usage: zeropp_ci.sh ZERO3_CLI LLAMA3_TRAIN REPO_ROOT WORK_DIR
set -euo pipefail
zero3=$1 train=$2 root=$3 work=$4
source "$(dirname "$0")/zeropp_common.sh"
rm -rf "$work"
mkdir -p "$work"
cd "$root"

zeropp_config "$work/plain.json" false false
zeropp_config "$work/plain_zeropp.json" true true
zeropp_config "$work/hpz.json" false false $'\n    "zero_hpz_partition_size": 2,'
zeropp_config "$work/hpz_zeropp.json" true true $'\n    "zero_hpz_partition_size": 2,'

# train NAME LAUNCH_ARGS...: the job with config NAME; the metrics CSV is $work/NAME.csv.
train() {
  local name=$1; shift
  if ! "$zero3" launch "$@" -- "$train" "${ZEROPP_TRAIN_ARGS[@]}" --deepspeed "$work/$name.json" \
      --metrics "$work/$name.csv" > "$work/$name.log" 2>&1; then
    echo "FAIL $name: the run failed:"; cat "$work/$name.log"; exit 1
  fi
}
train plain -n 4
train plain_zeropp -n 4
train hpz -n 2 --simulate-nodes 2
train hpz_zeropp -n 2 --simulate-nodes 2

failures=0
for pair in plain:plain_zeropp hpz:hpz_zeropp; do
  ref=${pair%%:*} q=${pair##*:}
  verdict=$(zeropp_verdict "$work/$ref.csv" "$work/$q.csv")
  if [ "${verdict%%:*}" = ok ]; then
    echo "ok $q: ${verdict#ok: }"
  else
    echo "FAIL $q: $verdict"; failures=$((failures + 1))
  fi
done
exit $failures
