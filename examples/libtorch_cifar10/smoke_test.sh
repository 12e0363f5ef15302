#!/usr/bin/env bash
# The CIFAR-10 example's test (ctest libtorch.example_cifar10): writes a small learnable data set in the CIFAR-10
# binary format (make_cifar10_sample), trains the example on it for 3 epochs on 1 rank (the config's stage 2), on
# 2 ranks (stage 2) and on 3 ranks (stage 3, every unit partitioned), and checks
#   - the reader's channel means are the generator's (the planes read in CHW order, red first),
#   - the test accuracy of every run ends above 50% (chance: 10%),
#   - every step's global loss of the 2- and 3-rank runs equals the 1-rank run's within round-off: the same global
#     batch of 24 images, split 24, 12+12 and 8+8+8, gives the same mean loss and averaged gradient.
#
#   smoke_test.sh ZERO3_CLI TRAIN_PROGRAM SAMPLE_PROGRAM CONFIG WORK_DIR
set -euo pipefail
[[ $# -eq 5 ]] || { echo "usage: $0 ZERO3_CLI TRAIN_PROGRAM SAMPLE_PROGRAM CONFIG WORK_DIR" >&2; exit 2; }
zero3=$1 train=$2 sample=$3 config=$4 work=$5
tolerance=2e-5  # largest step-loss difference allowed between the runs

rm -rf "$work"
mkdir -p "$work"
"$sample" "$work/data" 600 200 7
# Stage 3 with every unit partitioned (this network's units are below the default persistence threshold).
sed 's/"stage": *[0-9]/"stage": 3, "stage3_param_persistence_threshold": 0/' "$config" > "$work/ds_config_stage3.json"
grep -q '"stage": 3' "$work/ds_config_stage3.json" || { echo "FAIL: no \"stage\" key in $config to change" >&2; exit 1; }

flags=(--data "$work/data" --epochs 3 --log-every 1 --eval-batch 64 --threads 1)
"$zero3" launch -n 1 -- "$train" "${flags[@]}" > "$work/np1.log"
"$zero3" launch -n 2 -- "$train" "${flags[@]}" > "$work/np2.log"
"$zero3" launch -n 3 -- "$train" "${flags[@]}" --deepspeed "$work/ds_config_stage3.json" > "$work/np3.log"
cat "$work/np1.log"
grep -h "ZeRO stage\|test accuracy" "$work/np2.log" "$work/np3.log"

fail=0
# Channel means of the generator's images: noise on 160/96/32 (+0-63) with a 64-pixel square near 251.
read -r r g b < <(sed -n 's/.*channel means \([0-9.]*\) \([0-9.]*\) \([0-9.]*\).*/\1 \2 \3/p' "$work/np1.log")
if ! awk -v r="$r" -v g="$g" -v b="$b" 'function off(x, e) { return x - e > 0.02 || e - x > 0.02 }
     BEGIN { exit (off(r, 0.766) || off(g, 0.530) || off(b, 0.295)) }'; then
  echo "FAIL: channel means $r $g $b; expected about 0.766 0.530 0.295 (red, green, blue planes)" >&2
  fail=1
fi
for run in np1 np2 np3; do
  accuracy=$(sed -n 's/^\[rank 0\] epoch 3 .*test accuracy \([0-9.]*\)%.*/\1/p' "$work/$run.log")
  if [[ -z $accuracy ]] || ! awk -v a="$accuracy" 'BEGIN { exit !(a > 50) }'; then
    echo "FAIL: $run's test accuracy after 3 epochs is '${accuracy}'%; expected above 50% (chance 10%)" >&2
    fail=1
  fi
done
losses() { sed -n 's/^\[rank 0\] epoch [0-9]*  step *\([0-9]*\)  loss \([0-9.]*\) .*/\1 \2/p' "$1"; }
losses "$work/np1.log" > "$work/np1.loss"
for run in np2 np3; do
  losses "$work/$run.log" > "$work/$run.loss"
  if ! awk -v tol="$tolerance" -v run="$run" '
      NR == FNR { ref[$1] = $2; n++; next }
      { m++; d = $2 - ref[$1]; if (d < 0) d = -d; if (!($1 in ref)) bad = 1; if (d > max) max = d }
      END { printf "%s against 1 rank: %d steps, largest loss difference %.1e (allowed %s)\n", run, m, max, tol
            exit (bad || n != 75 || m != n || max > tol) }' "$work/np1.loss" "$work/$run.loss"; then
    echo "FAIL: $run's step losses differ from the 1-rank run's (or the runs have not 75 steps each)" >&2
    fail=1
  fi
done
[[ $fail -eq 0 ]] && echo "PASS: CIFAR-10 example on 1, 2 and 3 ranks"
exit $fail
