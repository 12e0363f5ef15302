#!/usr/bin/env bash
# The topology benchmark: a Llama-3-shaped model trained on a simulated cluster of 4 nodes x 2 ranks
# (scripts/cluster/sim-cluster.sh: network namespaces, every node's link shaped by tc tbf) at two link rates,
# an "EFA-like" one and a "TCP-like" one 2.2 times slower (the seed's 5409 s / 2441 s), with:
#   - zero3 (llama3_train) under every ZeRO layout of layouts/*.json (one DeepSpeed config per layout; a layout
#     this build refuses is listed as not measured, with zero3's reason);
#   - as the peer, PyTorch FSDP2 on gloo (fsdp2_llama.py, started by torchrun on each node): full shard, and HSDP
#     (fully_shard over a 2-D DeviceMesh: replicate across nodes, shard within a node), each with its gradients
#     reduced in bf16 or fp32 (MixedPrecisionPolicy reduce_dtype);
#   - for zero3's pipelined layouts (layouts/pipeline/*.json: pipeline.stages, ZeRO inside each stage), the peer
#     PyTorch's own pipelining (pipe_llama.py: torch.distributed.pipelining with the same schedule over the same
#     cut of the same model, FSDP2 inside each stage), its partition checked equal to llama3_train's;
# the same model file, micro-batch, sequence length, gradient accumulation and ranks for all. Every run is
# repeated REPEATS times, interleaved so that the machine's load drifts over all of them alike: each repeat runs
# the first layout, the first peer, the second layout, the second peer, and so on. For each run it prints, as the
# median over the repeats with their min-max, the inter-node bytes per optimizer step (the sum of what every
# node's link sent, from the interface counters: the run's total over its steps, start-up included) and the step
# time (the mean of the steps after the first WARMUP), their ratios to plain ZeRO-3 with bf16 gradient reductions
# (layouts/plain-bf16-grads.json) and with fp32 ones (layouts/plain.json), each zero3 layout's speed-up over each
# FSDP2 peer with the same reduce dtype, and rank 0's step split into forward, backward, optimizer and the time
# blocked on collectives (topology_table.py writes the tables). Beside each zero3 run
# it prints the step-time model's prediction for it (`zero3 plan --cluster configs/clusters/sim-NxR-RATE.json`,
# docs/performance-model.md, "Miniature check"): the bytes all node links carry per step and the step time, and
# measured / predicted for both (n/a where no cluster description matches the nodes, ranks and rate).
#
# Setup: torch for the peer goes into a virtual environment under the work directory (pip, from PyPI), made on
# the first run; the library and its tests never need it. Without it (no network, no python3-venv) the peer is
# reported as not measured and zero3's layouts still run.
#
# usage: bench_topology.sh ZERO3 LLAMA3_TRAIN ROOT WORK
# environment (defaults in brackets): RATES ["100mbit 45mbit": EFA-like, then TCP-like], NODES [4], RANKS [2],
#   MODEL [configs/models/llama-3-topology-bench.json], SEQ_LEN [64], MICRO_BATCH [1], GRAD_ACCUM [4], STEPS [6],
#   WARMUP [1] (fewer than 5 timed steps is a smoke run, said so in the output), REPEATS [3],
#   LAYOUTS [all of layouts/*.json, the HSDP ones and the plain ones first, to pair with the peers],
#   PEERS ["hsdp:bf16 hsdp:fp32 full:bf16 full:fp32": mesh:reduce-dtype, a bare mesh reduces in fp32; "" for none;
#     pipe:SCHEDULE[:DTYPE] (gpipe, 1f1b or interleaved_1f1b; bf16 unless :fp32): PyTorch's pipelining],
#   PIPE_STAGES [4] and PIPE_VIRTUAL_STAGES [2, interleaved_1f1b only]: the pipelining peer's shape, as the pipelined
#     layouts' pipeline.stages and zero3.pipeline_virtual_stages; PIPE_DP [fsdp2, or ddp]: its data parallelism
#     inside each stage; PIPE_GRAD_ACCUM [GRAD_ACCUM x PIPE_STAGES]: the micro-batches per step of the pipelined
#     layouts and the pipelining peer (the default gives them the unpipelined runs' global batch: their
#     data-parallel ranks are the world over the stages); PIPE_BOUNDARY_DTYPE [bf16, or fp32]: the dtype between
#     stages on both sides (llama3_train --pipeline-boundary-dtype, pipe_llama.py --boundary-dtype),
#   GLOO_PROBE [1; 0 skips the probe of what torch's gloo collectives send between nodes],
#   RUN_TIMEOUT [1800 s per run]
# Needs root (network namespaces); exits 77 with the reason where they cannot be made, 1 when a run failed.
set -euo pipefail
ZERO3=$1 TRAIN=$2 ROOT=$3 WORK=$4
here=$(cd "$(dirname "$0")" && pwd)
SIM="$ROOT/scripts/cluster/sim-cluster.sh"
RATES=${RATES:-100mbit 45mbit}
NODES=${NODES:-4}
RANKS=${RANKS:-2}
MODEL=${MODEL:-$ROOT/configs/models/llama-3-topology-bench.json}
SEQ_LEN=${SEQ_LEN:-64}
MICRO_BATCH=${MICRO_BATCH:-1}
GRAD_ACCUM=${GRAD_ACCUM:-4}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-1}
REPEATS=${REPEATS:-3}
if [ -z "${LAYOUTS:-}" ]; then  # in the peers' order (HSDP, then full shard, each bf16 then fp32), then the rest
  first="mics-hsdp mics-hsdp-fp32-grads plain-bf16-grads plain"
  LAYOUTS=""
  for n in $first; do LAYOUTS+=" $here/layouts/$n.json"; done
  for f in "$here"/layouts/*.json; do [[ " $first " == *" $(basename "$f" .json) "* ]] || LAYOUTS+=" $f"; done
fi
PEERS=${PEERS-hsdp:bf16 hsdp:fp32 full:bf16 full:fp32}
PIPE_STAGES=${PIPE_STAGES:-4}
PIPE_VIRTUAL_STAGES=${PIPE_VIRTUAL_STAGES:-2}
PIPE_DP=${PIPE_DP:-fsdp2}
PIPE_GRAD_ACCUM=${PIPE_GRAD_ACCUM:-$((GRAD_ACCUM * PIPE_STAGES))}
PIPE_BOUNDARY_DTYPE=${PIPE_BOUNDARY_DTYPE:-bf16}
GLOO_PROBE=${GLOO_PROBE:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
world=$((NODES * RANKS))
[ "$STEPS" -gt "$WARMUP" ] || { echo "bench_topology: STEPS ($STEPS) must exceed WARMUP ($WARMUP)" >&2; exit 2; }
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_topology: REPEATS ($REPEATS) must be a positive integer" >&2; exit 2; }
peers=()
for p in $PEERS; do
  if [[ "$p" == pipe:* ]]; then
    [[ "$p" =~ ^pipe:(gpipe|1f1b|interleaved_1f1b)(:(bf16|fp32))?$ ]] ||
      { echo "bench_topology: PEERS entry '$p': expected pipe:gpipe, pipe:1f1b or pipe:interleaved_1f1b, optionally :bf16 or :fp32" >&2; exit 2; }
    [[ "$p" == *:*:* ]] || p="$p:bf16"
  else
    [[ "$p" == *:* ]] || p="$p:fp32"
    [[ "$p" =~ ^(full|hsdp):(bf16|fp32)$ ]] ||
      { echo "bench_topology: PEERS entry '$p': expected full or hsdp, optionally :bf16 or :fp32, or pipe:SCHEDULE" >&2; exit 2; }
  fi
  peers+=("$p")
done
[[ "$PIPE_DP" =~ ^(fsdp2|ddp)$ ]] || { echo "bench_topology: PIPE_DP '$PIPE_DP': expected fsdp2 or ddp" >&2; exit 2; }
[[ "$PIPE_BOUNDARY_DTYPE" =~ ^(bf16|fp32)$ ]] ||
  { echo "bench_topology: PIPE_BOUNDARY_DTYPE '$PIPE_BOUNDARY_DTYPE': expected bf16 or fp32" >&2; exit 2; }

why=$("$SIM" check) || { echo "$why"; exit 77; }
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
# rate name kind repeat reduce_dtype bytes_per_step step_time_s note drops predicted_bytes predicted_s
# forward_s backward_s optimizer_s comm_wait_s boundary_step_s agreement_s (rank 0's, means over the timed steps; the
# last three zero3's only; empty where a run has none) schedule (a pipelined run's, zero3.pipeline_schedule's names)
results="$WORK/results.tsv"
: > "$results"
notes="$WORK/not-measured.txt"
: > "$notes"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive  # 8 ranks share this machine's cores

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "== bench_topology, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(getconf _NPROCESSORS_ONLN) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB," \
  "load average $(load) at the start"
echo "cluster: $NODES nodes x $RANKS ranks, every link shaped each way by tc tbf; rates: $RATES"
echo "model: $MODEL; micro-batch $MICRO_BATCH x seq $SEQ_LEN x grad-accum $GRAD_ACCUM x $world ranks; $STEPS steps," \
  "the first $WARMUP not timed; bf16 parameters, fp32 master weights and Adam; $REPEATS repeats, interleaved"
echo "pipelined runs: grad-accum (micro-batches per step) $PIPE_GRAD_ACCUM, boundaries in $PIPE_BOUNDARY_DTYPE"
[ $((STEPS - WARMUP)) -ge 5 ] || echo "only $((STEPS - WARMUP)) timed steps per run: a smoke run, not figures to quote"

# --- the peer's torch, in a venv of its own --------------------------------------------------------------------
venv="$WORK/venv"
peer_python=""
setup_peer() {
  [ -n "$PEERS" ] || return 0
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch" 2>/dev/null; then
    peer_python="$venv/bin/python"
    return 0
  fi
  echo "setting up the peer: python3 -m venv $venv && pip install torch numpy (from PyPI; several GB, once)"
  local err
  if ! err=$(python3 -m venv "$venv" 2>&1); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv > /dev/null 2>&1 || true
      err=$(python3 -m venv "$venv" 2>&1) || { echo "FSDP2 peer: not measured: python3 -m venv failed: $err" >> "$notes"; return 0; }
    else
      echo "FSDP2 peer: not measured: python3 -m venv failed (install python3-venv): $err" >> "$notes"
      return 0
    fi
  fi
  if ! "$venv/bin/pip" install --disable-pip-version-check -q torch numpy > "$WORK/pip.log" 2>&1; then
    echo "FSDP2 peer: not measured: pip install torch failed: $(tail -1 "$WORK/pip.log")" >> "$notes"
    return 0
  fi
  peer_python="$venv/bin/python"
}
setup_peer
probe=""
[ -z "$peer_python" ] || echo "peer: $("$peer_python" -c 'import torch; print("torch", torch.__version__)') on gloo"
if [ -n "$peer_python" ] && [ "$GLOO_PROBE" != 0 ]; then
  # What torch's gloo collectives send between nodes, per call (unshaped links; the same cluster shape).
  "$SIM" run --nodes "$NODES" --workdir "$WORK/gloo-probe" --timeout 600 --quiet -- \
    bash -c 'exec "$0" -m torch.distributed.run --nnodes "$SIM_NNODES" --nproc-per-node "$1" --node-rank "$SIM_NODE_RANK" \
               --master-addr "$SIM_MASTER_ADDR" --master-port "$SIM_MASTER_PORT" --max-restarts 0 "$2"' \
    "$peer_python" "$RANKS" "$here/gloo_bytes_probe.py" 2> /dev/null || true
  grep -m1 -h '^{' "$WORK/gloo-probe/node0.log" > "$WORK/gloo-probe/result.json" 2>/dev/null || true
  probe=$(python3 - "$WORK/gloo-probe/result.json" <<'EOF2' 2>/dev/null || echo "the gloo probe failed (logs in $WORK/gloo-probe)"
import json, sys
p = json.load(open(sys.argv[1]))
mb = lambda b: f"{b / 1e6:.1f} MB"
print(f"torch gloo between the nodes, per call on a {mb(p['buffer_bytes'])} fp32 buffer over {p['world']} ranks "
      f"(a ring over the ranks in node order: {mb(p['ring_bytes'])}): all_gather_into_tensor "
      f"{mb(p['all_gather_into_tensor'])}, reduce_scatter_tensor {mb(p['reduce_scatter_tensor'])}, "
      f"all_reduce {mb(p['all_reduce'])}")
EOF2
)
  echo "$probe"
fi

# --- one run -----------------------------------------------------------------------------------------------
bytes_per_step() {  # the sum over nodes of what each link sent, per optimizer step
  awk -v steps="$STEPS" '{ s += $4 } END { printf "%.0f\n", s / steps }' "$1/counters.tsv"
}
drops() {  # packets the token buckets dropped in the whole run (TCP sent them again)
  awk '{ s += $2 + $3 } END { print s + 0 }' "$1/drops.tsv" 2>/dev/null || echo 0
}

# The step-time model's prediction of a zero3 run: "bytes<TAB>seconds", the bytes every node's link carries per
# optimizer step summed (as the counters are) and the step time, from `zero3 plan --cluster` (its zero3 column);
# "<TAB>" where no cluster description matches this simulated cluster or the plan fails (its output in the dir).
# A pipelined layout's plan is the pipeline's (zero3 plan models the schedule, the stage boundaries and ZeRO inside
# the stages): its "sent to other nodes per step" line and its step.
predict() {  # predict <rate> <layout file> <dir> <schedule, for a pipelined layout>
  local cluster="$ROOT/configs/clusters/sim-${NODES}x${RANKS}-$1.json"
  if [ ! -f "$cluster" ] || ! "$ZERO3" plan --model "$MODEL" --config "$2" --cluster "$cluster" --seq-len "$SEQ_LEN" \
       --micro-batch "$MICRO_BATCH" --grad-accum "$([ -n "${4:-}" ] && echo "$PIPE_GRAD_ACCUM" || echo "$GRAD_ACCUM")" \
       --lr 1e-4 > "$3/plan.txt" 2>&1; then
    printf '\t\n'
    return 0
  fi
  if [ -n "${4:-}" ]; then
    # "step 1.74 s, 1 steps 1.74 s" (or a range "1.60-1.74 s": its high end) and
    # "sent to other nodes per step: 1.58 MB by the busiest node, 6.32 MB by all nodes together"
    awk '/^step / { t = $2; sub(/^.*-/, "", t) }
         /^sent to other nodes per step: / { b = $(NF - 5) * 1e6 }
         END { printf "%s\t%s\n", b == "" ? "" : sprintf("%.0f", b), t }' "$3/plan.txt"
    return 0
  fi
  # "  all nodes' links together   543.43 MB   238.67 MB" and "step: grad_accum x micro-step + boundary   13.59 s   5.97 s"
  awk 'function bytes(v, u) { return v * (u == "GB" ? 1e9 : u == "MB" ? 1e6 : 0) }
       /^  all nodes. links together / { b = bytes($7, $8) }
       /^step: grad_accum x micro-step/ { t = $9 }
       END { printf "%s\t%s\n", b == "" ? "" : sprintf("%.0f", b), t }' "$3/plan.txt"
}

# The dtype a layout reduces gradients in: communication_data_type, else bf16 (the default under bf16); qgZ's
# quantized reductions are named as such.
reduce_dtype() {
  python3 - "$1" <<'EOF'
import json, sys
c = json.loads("".join(l for l in open(sys.argv[1]) if not l.lstrip().startswith("//")))
z = c.get("zero_optimization", {})
print("qgZ" if z.get("zero_quantized_gradients") else c.get("communication_data_type", "bf16"))
EOF
}

# A pipelined layout's schedule (zero3.pipeline_schedule, default 1f1b) where its pipeline.stages is above 1, else "".
pipeline_schedule() {
  python3 - "$1" <<'EOF'
import json, sys
c = json.loads("".join(l for l in open(sys.argv[1]) if not l.lstrip().startswith("//")))
stages = c.get("pipeline", {}).get("stages", 1)
print(c.get("zero3", {}).get("pipeline_schedule", "1f1b") if isinstance(stages, int) and stages > 1 else "")
EOF
}

run_zero3() {  # run_zero3 <rate> <layout file> <repeat>
  local rate=$1 layout=$2 repeat=$3 name dir status=0 predicted dtype schedule
  name=$(basename "$layout" .json)
  dir="$WORK/$rate/$name/r$repeat"
  rm -rf "$dir"
  mkdir -p "$dir"
  dtype=$(reduce_dtype "$layout" 2>/dev/null) || dtype="unknown"
  schedule=$(pipeline_schedule "$layout" 2>/dev/null) || schedule=""
  echo "-- $rate, repeat $repeat, zero3 $name${schedule:+ (pipelined, $schedule)} ($(date -u +%H:%M), load average $(load))"
  local accum=$GRAD_ACCUM pipelined=()
  [ -z "$schedule" ] || { accum=$PIPE_GRAD_ACCUM; pipelined=(--pipeline-boundary-dtype "$PIPE_BOUNDARY_DTYPE"); }
  predicted=$(predict "$rate" "$layout" "$dir" "$schedule")
  "$SIM" launch --nodes "$NODES" --ranks-per-node "$RANKS" --rate "$rate" --zero3 "$ZERO3" --workdir "$dir" \
    --timeout "$RUN_TIMEOUT" --quiet -- "$TRAIN" --model "$MODEL" --deepspeed "$layout" \
    --data /usr/share/common-licenses --tokenizer bytes --seq-len "$SEQ_LEN" --micro-batch "$MICRO_BATCH" \
    --grad-accum "$accum" --steps "$STEPS" --lr 1e-4 --precision bf16 --device cpu --no-grad-checkpointing \
    --metrics "$dir/metrics.csv" "${pipelined[@]}" 2>> "$dir/sim.log" || status=$?
  if [ "$status" != 0 ]; then
    tail -20 "$dir"/node0.log
    printf '%s\t%s\tzero3\t%s\t%s\t\t\tfailed (status %s, logs in %s)\t\t%s\t\t\t\t\t\t\t%s\n' "$rate" "$name" "$repeat" \
      "$dtype" "$status" "$dir" "$predicted" "$schedule" >> "$results"
    return 0
  fi
  grep -m1 '^\[rank 0\]   model ' "$dir/node0.log" | sed 's/^\[rank 0\] *//' > "$dir/model.txt"
  # A pipelined run's cut ("stage 0: embedding .. layers.0 (2 layers, N parameters); ..."), for the peer's.
  grep -m1 '^\[rank 0\]   partition ' "$dir/node0.log" | sed 's/^\[rank 0\]   partition *//' > "$dir/partition.txt" || true
  # step_time_s, then forward_s backward_s optimizer_s comm_wait_s boundary_step_s agreement_s: means over the timed
  # steps; a column holding something other than a number (a pipelined run's optimizer_s and boundary_step_s are
  # nan: its step runs inside train_batch()) is left empty.
  local times
  times=$(awk -F, -v w="$WARMUP" -v keys="step_time_s forward_s backward_s optimizer_s comm_wait_s boundary_step_s agreement_s" '
    NR == 1 { for (c = 1; c <= NF; ++c) col[$c] = c; nk = split(keys, key, " "); next }
    $1 > w { for (k = 1; k <= nk; ++k) { v = $col[key[k]]; if (v ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) sum[k] += v; else bad[k] = 1 }
             ++n }
    END { for (k = 1; k <= nk; ++k) printf "%s%s", (k > 1 ? "\t" : ""), ((bad[k] || !n) ? "" : sprintf("%.3f", sum[k] / n))
          print "" }' "$dir/metrics.csv")
  printf '%s\t%s\tzero3\t%s\t%s\t%s\t%s\t\t%s\t%s\t%s\t%s\n' "$rate" "$name" "$repeat" "$dtype" "$(bytes_per_step "$dir")" \
    "$(cut -f1 <<< "$times")" "$(drops "$dir")" "$predicted" "$(cut -f2- <<< "$times")" "$schedule" >> "$results"
}

run_peer() {  # run_peer <rate> full|hsdp|pipe bf16|fp32 <repeat> [schedule, for pipe]
  local rate=$1 mesh=$2 dtype=$3 repeat=$4 schedule=${5:-} name dir status=0 script what
  local args=(--model "$MODEL" --reduce-dtype "$dtype" --micro-batch "$MICRO_BATCH" --seq-len "$SEQ_LEN"
              --grad-accum "$([ "$mesh" = pipe ] && echo "$PIPE_GRAD_ACCUM" || echo "$GRAD_ACCUM")" --steps "$STEPS"
              --warmup "$WARMUP")
  if [ "$mesh" = pipe ]; then
    name="pipe-$schedule-$dtype" script="$here/pipe_llama.py"
    what="PyTorch pipelining $schedule, $PIPE_STAGES stages, $PIPE_DP inside, reduce_dtype $dtype"
    args+=(--stages "$PIPE_STAGES" --schedule "$schedule" --dp "$PIPE_DP" --boundary-dtype "$PIPE_BOUNDARY_DTYPE" --virtual-stages
           "$([ "$schedule" = interleaved_1f1b ] && echo "$PIPE_VIRTUAL_STAGES" || echo 1)")
  else
    name="fsdp2-$mesh-$dtype" script="$here/fsdp2_llama.py" what="PyTorch FSDP2 $mesh, reduce_dtype $dtype"
    args+=(--mesh "$mesh")
  fi
  dir="$WORK/$rate/$name/r$repeat"
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "-- $rate, repeat $repeat, $what ($(date -u +%H:%M), load average $(load))"
  # torchrun on each node, as on a real cluster: static rendezvous at node 0's address.
  "$SIM" run --nodes "$NODES" --rate "$rate" --workdir "$dir" --timeout "$RUN_TIMEOUT" --quiet -- \
    bash -c 'exec "$0" -m torch.distributed.run --nnodes "$SIM_NNODES" --nproc-per-node "$1" --node-rank "$SIM_NODE_RANK" \
               --master-addr "$SIM_MASTER_ADDR" --master-port "$SIM_MASTER_PORT" --max-restarts 0 "${@:2}"' \
    "$peer_python" "$RANKS" "$script" "${args[@]}" --out "$dir/result.json" 2>> "$dir/sim.log" || status=$?
  if [ "$status" != 0 ] || [ ! -s "$dir/result.json" ]; then
    tail -20 "$dir"/node0.log
    printf '%s\t%s\tpeer\t%s\t%s\t\t\tfailed (status %s, logs in %s)\t\t\t\t\t\t\t\t\t\t%s\n' "$rate" "$name" "$repeat" \
      "$dtype" "$status" "$dir" "$schedule" >> "$results"
    return 0
  fi
  local times  # step_time_s, then forward_s backward_s optimizer_s: means over the timed steps
  times=$(python3 - "$dir/result.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
w = r["warmup"]
print("\t".join("%.3f" % (sum(r[k][w:]) / len(r[k][w:])) for k in ("step_times_s", "forward_s", "backward_s", "optimizer_s")))
EOF
)
  printf '%s\t%s\tpeer\t%s\t%s\t%s\t%s\t\t%s\t\t\t%s\t\t\t\t%s\n' "$rate" "$name" "$repeat" "$dtype" \
    "$(bytes_per_step "$dir")" "$(cut -f1 <<< "$times")" "$(drops "$dir")" "$(cut -f2- <<< "$times")" "$schedule" >> "$results"
}

# Layouts this build accepts; the others are listed with zero3's own reason.
measured_layouts=()
for layout in $LAYOUTS; do
  accum=$GRAD_ACCUM
  [ -z "$(pipeline_schedule "$layout" 2>/dev/null)" ] || accum=$PIPE_GRAD_ACCUM
  if err=$("$ZERO3" config check "$layout" --world-size "$world" --micro-batch "$MICRO_BATCH" --grad-accum "$accum" \
           --precision bf16 --lr 1e-4 2>&1 >/dev/null); then
    measured_layouts+=("$layout")
  else
    echo "zero3 $(basename "$layout" .json): not measured: $(echo "$err" | grep -v ' INFO ' | head -1)" >> "$notes"
  fi
done

[ -n "$peer_python" ] || peers=()
n_layouts=${#measured_layouts[@]} n_peers=${#peers[@]}
for rate in $RATES; do
  for ((repeat = 1; repeat <= REPEATS; ++repeat)); do
    for ((i = 0; i < (n_layouts > n_peers ? n_layouts : n_peers); ++i)); do
      [ "$i" -ge "$n_layouts" ] || run_zero3 "$rate" "${measured_layouts[$i]}" "$repeat"
      if [ "$i" -lt "$n_peers" ]; then
        IFS=: read -r -a peer <<< "${peers[$i]}"  # mesh:dtype, or pipe:schedule:dtype
        if [ "${peer[0]}" = pipe ]; then
          run_peer "$rate" pipe "${peer[2]}" "$repeat" "${peer[1]}"
        else
          run_peer "$rate" "${peer[0]}" "${peer[1]}" "$repeat"
        fi
      fi
    done
  done
done

# The model must be the same on both sides: the FSDP2 peer's shape, written as llama3_train's header writes it.
shape_check=""
first_zero3=$(ls "$WORK"/*/*/r*/model.txt 2>/dev/null | head -1 || true)
first_peer=$(ls "$WORK"/*/fsdp2-*/r*/result.json "$WORK"/*/pipe-*/r*/result.json 2>/dev/null | head -1 || true)
if [ -n "$first_zero3" ] && [ -n "$first_peer" ]; then
  shape_check=$(python3 - "$first_zero3" "$first_peer" <<'EOF'
import json, re, sys
z = open(sys.argv[1]).read()
p = json.load(open(sys.argv[2]))
s = p["shape"]
want = (f"hidden {s['hidden_size']}, {s['num_hidden_layers']} layers, {s['num_attention_heads']} heads "
        f"({s['num_key_value_heads']} kv, head_dim {s['head_dim']}), ffn {s['intermediate_size']}, vocab {s['vocab_size']}")
m = re.search(r"([\d.]+)M params", z)
same = want in z and m and abs(float(m.group(1)) * 1e6 - p["params"]) < 0.006e6
print(("same model: " if same else "MODEL MISMATCH: zero3 has ") + z.strip() + "; the peer " + want + f", {p['params']} params")
EOF
)
fi
# A pipelined zero3 run and the pipelining peer must cut the model the same way.
partition_check=""
first_cut=$(find "$WORK" -name partition.txt -size +0 2>/dev/null | sort | head -1 || true)
first_pipe=$(ls "$WORK"/*/pipe-*/r*/result.json 2>/dev/null | head -1 || true)
if [ -n "$first_cut" ] && [ -n "$first_pipe" ]; then
  partition_check=$(python3 - "$first_cut" "$first_pipe" <<'EOF'
import json, sys
z = open(sys.argv[1]).read().strip()
p = json.load(open(sys.argv[2]))["partition"]
print(("same partition: " if z == p else f"PARTITION MISMATCH: the peer cuts {p}; zero3 cuts ") + z)
EOF
)
fi

# --- the table ---------------------------------------------------------------------------------------------
echo
echo "== results ($(date -u '+%Y-%m-%d %H:%M UTC'), load average $(load) at the end)"
[ -n "$shape_check" ] && echo "$shape_check"
[ -n "$partition_check" ] && echo "$partition_check"
[ -n "$probe" ] && echo "$probe"
python3 "$here/topology_table.py" "$results" | tee "$WORK/results.md"
if [ -s "$notes" ]; then
  echo
  echo "not measured:"
  sed 's/^/  /' "$notes"
fi
echo
echo "logs, counters and metrics of every run: $WORK/<rate>/<run>/r<repeat>/"
# A run that failed is in the table; the status says so too, so that a benchmark that no longer runs is seen.
if grep -q $'\tfailed (status' "$results"; then
  echo "bench_topology: some runs failed (see the table)" >&2
  exit 1
fi
