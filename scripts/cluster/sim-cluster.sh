#!/usr/bin/env bash
# A simulated cluster on one machine: N "nodes", each a network namespace with one link (a veth pair) to a
# bridge that lives in a namespace of its own (the "switch"), each link shaped in both directions by a token
# bucket (tc tbf) at a given rate. A command runs once per node inside its namespace, as one launcher per
# node would on a real cluster; the bytes each node sent and received over its link are read from the
# interface counters. Everything is made inside namespaces this script creates: the root namespace gets no
# interface, address or route, and only the cluster's own addresses (198.18.0.0/24, the range RFC 2544 sets
# aside for network benchmarks) are ever used. See docs/cluster.md.
#
#   sim-cluster.sh check
#       exit 0 when namespaces, veth pairs, bridges and tbf work here; else print why and exit 77 (the
#       tests' skip code)
#   sim-cluster.sh launch --nodes N --ranks-per-node K [options] -- PROGRAM [ARGS...]
#       on node i: zero3 launch -n K --nnodes N --node-rank i --master-addr <node 0> --master-port P -- PROGRAM
#   sim-cluster.sh run --nodes N [options] -- COMMAND [ARGS...]
#       on node i: COMMAND with SIM_NODE_RANK=i, SIM_NNODES, SIM_NODE_ADDR, SIM_MASTER_ADDR (node 0),
#       SIM_MASTER_PORT in its environment (for other launchers: torchrun, ...)
#   sim-cluster.sh clean
#       remove what runs of this script left behind when they were killed with SIGKILL (namespaces whose
#       owning process is gone, and the processes still inside them)
#
# Options of launch and run:
#   --nodes N              nodes, 1..64
#   --ranks-per-node K     (launch) ranks per node
#   --rate RATE            shape every link to RATE each way (tc units: 100mbit, 1gbit, 500kbit); default none
#   --workdir DIR          logs (node<i>.log), exit codes and counters.tsv go here (default: a new temp dir)
#   --timeout SECONDS      stop everything after this long and exit 124 (default 900)
#   --master-port P        port of rank 0's store on node 0 (default 29500; every cluster has its own stack)
#   --zero3 PATH           (launch) the zero3 binary (default: zero3 on PATH)
#   --keep-going           (launch) pass --keep-going to zero3 launch: a failing rank does not stop the others
#   --link-down NODE       take NODE's link down (both ends) once a line of a node's log matches ...
#   --link-down-when ERE   ... this extended regular expression (default: right after the start)
#   --quiet                do not print the node logs at the end (they stay in the workdir)
#
# counters.tsv: one line per node, "node addr rx_bytes tx_bytes rx_packets tx_packets", what crossed the
# node's link while the commands ran (IP and TCP headers and retransmissions included; traffic between ranks
# of the same node stays on its loopback and is not counted). drops.tsv (with --rate): "node egress ingress",
# the packets each direction's token bucket dropped. The exit status is the first failing node's,
# 124 on the timeout, 130/143 when interrupted. Every namespace, link and process the run made is removed
# on every exit path, SIGINT, SIGTERM and SIGHUP included; only SIGKILL leaves them (then `clean`).
set -euo pipefail

readonly kPrefix=z3c             # namespaces: z3c<pid>-hub, z3c<pid>-n<i>
readonly kSubnet=198.18.0        # node i has 198.18.0.(10+i)/24
readonly kSkip=77

die() {
  echo "sim-cluster: $*" >&2
  exit 2
}
say() { echo "sim-cluster: $*" >&2; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

# The names of a run's namespaces all start with this (the owner's pid makes parallel runs distinct).
run_tag() { echo "${kPrefix}$1-"; }

# Kill every process inside namespace $1 (they were all started by the run that made it), then delete it.
remove_namespace() {
  local ns=$1 pids i
  for i in $(seq 1 50); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] && break
    # SIGTERM first (zero3 launch passes it to its ranks); after 2.5 s, SIGKILL. $pids is a list: split it.
    # shellcheck disable=SC2086
    if [ "$i" -le 25 ]; then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
    sleep 0.1
  done
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] && say "processes still in $ns after SIGKILL: $pids"
  ip netns del "$ns" 2>/dev/null || true
}

our_namespaces() {  # namespaces of the run whose owner has pid $1
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$(run_tag "$1")" || true
}

# --- check -------------------------------------------------------------------------------------------------
check() {
  command -v ip >/dev/null && command -v tc >/dev/null ||
    { echo "sim-cluster: skipped: iproute2 (ip, tc) is not installed (scripts/install-deps.sh installs it)"; return $kSkip; }
  local ns a b err
  ns="$(run_tag $$)probe"
  a="${ns}a"
  b="${ns}b"
  if ! err=$(ip netns add "$a" 2>&1); then
    echo "sim-cluster: skipped: cannot create a network namespace here (ip netns add: $err); it needs root" \
      "(CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    return $kSkip
  fi
  local why=""
  if ! err=$(ip netns add "$b" 2>&1); then
    why="ip netns add: $err"
  elif ! err=$(ip -n "$a" link add p0 type veth peer name p1 netns "$b" 2>&1); then
    why="no veth pairs (ip link add type veth: $err)"
  elif ! err=$(ip -n "$a" link add br0 type bridge 2>&1); then
    why="no bridges (ip link add type bridge: $err)"
  elif ! err=$(tc -n "$a" qdisc add dev p0 root tbf rate 10mbit burst 32kb limit 64kb 2>&1); then
    why="no tbf queueing discipline (tc qdisc add ... tbf: $err)"
  fi
  remove_namespace "$a"
  remove_namespace "$b"
  if [ -n "$why" ]; then
    echo "sim-cluster: skipped: this kernel or container cannot build the cluster: $why"
    return $kSkip
  fi
  return 0
}

# --- clean -------------------------------------------------------------------------------------------------
clean_stale() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${kPrefix}[0-9]+-" || true); do
    owner=${ns#"$kPrefix"}
    owner=${owner%%-*}
    if ! kill -0 "$owner" 2>/dev/null; then
      say "removing $ns (left by pid $owner, which is gone)"
      remove_namespace "$ns"
    fi
  done
}

# --- the cluster -------------------------------------------------------------------------------------------
nodes=0 ranks_per_node=0 rate="" workdir="" timeout_s=900 master_port=29500 zero3="zero3" keep_going=0
link_down_node="" link_down_when="" quiet=0
hub="" node_ns=() launcher_pids=() cleaned=0

# tc rate -> bytes per second ("100mbit" -> 12500000), for the bucket and queue sizes.
rate_bytes_per_s() {
  local r=${1,,} n unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] || die "--rate '$1': expected a number with bit, kbit, mbit or gbit (e.g. 100mbit)"
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[3]}
  awk -v n="$n" -v u="$unit" 'BEGIN { m = (u == "bit") ? 1 : (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : 1e9
                                      printf "%d\n", n * m / 8 }'
}

node_addr() { echo "$kSubnet.$((10 + $1))"; }

cleanup() {
  [ "$cleaned" = 1 ] && return 0
  cleaned=1
  trap - EXIT INT TERM HUP
  local ns
  for ns in "${node_ns[@]}" $hub; do remove_namespace "$ns"; done
  # Anything of ours that a failed setup did not record.
  for ns in $(our_namespaces $$); do remove_namespace "$ns"; done
  local pid
  for pid in "${launcher_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}

on_signal() {
  say "interrupted by SIG$1: stopping the nodes and removing the cluster"
  cleanup
  case $1 in INT) exit 130 ;; TERM) exit 143 ;; *) exit 129 ;; esac
}

shape() {  # shape <namespace> <device>: a token bucket at $rate on the device's egress
  local bps burst limit
  bps=$(rate_bytes_per_s "$rate")
  burst=$((bps / 250))                  # 4 ms of traffic, at least 32 KiB (a few full TSO segments)
  [ "$burst" -lt 32768 ] && burst=32768
  limit=$((bps / 10))                   # up to 100 ms queued before the bucket drops, at least 4 buckets
  [ "$limit" -lt $((4 * burst)) ] && limit=$((4 * burst))
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" limit "$limit"
}

build_cluster() {
  local tag i ns
  tag=$(run_tag $$)
  hub="${tag}hub"
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for ((i = 0; i < nodes; ++i)); do
    ns="${tag}n$i"
    ip netns add "$ns"
    node_ns+=("$ns")
    ip -n "$hub" link add "n$i" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "n$i" master br0
    ip -n "$hub" link set "n$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$rate" ]; then
      shape "$ns" eth0      # what node i sends
      shape "$hub" "n$i"    # what node i receives
    fi
  done
  # Bounded wait until every link is up (a veth's carrier follows both ends at once; the bridge has no STP).
  for ((i = 0; i < nodes; ++i)); do
    local n
    for n in $(seq 1 100); do
      grep -q "LOWER_UP" <<<"$(ip -n "${node_ns[$i]}" link show eth0 2>/dev/null)" && break
      [ "$n" = 100 ] && die "the link of node $i did not come up within 10 s"
      sleep 0.1
    done
  done
}

counters() {  # counters <node>: rx_bytes tx_bytes rx_packets tx_packets of the node's link
  local s=/sys/class/net/eth0/statistics
  ip netns exec "${node_ns[$1]}" cat $s/rx_bytes $s/tx_bytes $s/rx_packets $s/tx_packets | tr '\n' ' '
}

qdisc_drops() {  # qdisc_drops <namespace> <device>: packets dropped by the device's root qdisc so far
  tc -n "$1" -s qdisc show dev "$2" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1
}

take_link_down() {
  ip -n "${node_ns[$link_down_node]}" link set eth0 down || true
  ip -n "$hub" link set "n$link_down_node" down || true
  say "link of node $link_down_node ($(node_addr "$link_down_node")) is down ($(($(date +%s) - start_s)) s into the run)"
  date +%s.%N > "$workdir/link_down_at"
}

run_cluster() {  # run_cluster <mode> -- command...
  local mode=$1
  shift
  [ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] || die "--nodes '$nodes': expected 1..64"
  if [ "$mode" = launch ]; then
    [ "$ranks_per_node" -ge 1 ] 2>/dev/null || die "launch needs --ranks-per-node K (K >= 1)"
    command -v "$zero3" >/dev/null || die "--zero3 '$zero3': no such program"
  fi
  [ $# -ge 1 ] || die "no command to run (put it after --)"
  [ -n "$rate" ] && rate_bytes_per_s "$rate" >/dev/null
  if [ -n "$link_down_node" ]; then
    [ "$link_down_node" -ge 0 ] 2>/dev/null && [ "$link_down_node" -lt "$nodes" ] ||
      die "--link-down '$link_down_node': expected a node in 0..$((nodes - 1))"
  fi
  [[ $timeout_s =~ ^[0-9]+$ ]] && [ "$timeout_s" -ge 1 ] || die "--timeout '$timeout_s': expected whole seconds >= 1"
  local msg
  msg=$(check) || { echo "$msg" >&2; exit $kSkip; }
  clean_stale
  if [ -z "$workdir" ]; then workdir=$(mktemp -d /tmp/sim-cluster.XXXXXX); fi
  mkdir -p "$workdir"
  workdir=$(cd "$workdir" && pwd)
  rm -f "$workdir"/node*.log "$workdir"/node*.status "$workdir/counters.tsv" "$workdir/drops.tsv" "$workdir/link_down_at"

  trap cleanup EXIT
  trap 'on_signal INT' INT
  trap 'on_signal TERM' TERM
  trap 'on_signal HUP' HUP
  build_cluster
  local master
  master=$(node_addr 0)
  say "$nodes node(s) in namespaces $(run_tag $$)n0..n$((nodes - 1)), master $master:$master_port," \
    "links ${rate:-unshaped}; logs in $workdir"

  local -a before=()
  local i
  for ((i = 0; i < nodes; ++i)); do before[i]=$(counters "$i"); done
  start_s=$(date +%s)
  for ((i = 0; i < nodes; ++i)); do
    local -a cmd=("$@")
    if [ "$mode" = launch ]; then
      cmd=("$zero3" launch -n "$ranks_per_node" --nnodes "$nodes" --node-rank "$i" --master-addr "$master"
           --master-port "$master_port")
      [ "$keep_going" = 1 ] && cmd+=(--keep-going)
      cmd+=(-- "$@")
    fi
    ip netns exec "${node_ns[$i]}" env SIM_NODE_RANK="$i" SIM_NNODES="$nodes" SIM_NODE_ADDR="$(node_addr "$i")" \
      SIM_MASTER_ADDR="$master" SIM_MASTER_PORT="$master_port" GLOO_SOCKET_IFNAME=eth0 \
      "${cmd[@]}" < /dev/null > "$workdir/node$i.log" 2>&1 &
    launcher_pids[i]=$!
  done

  # Wait for every node, bounded by the timeout; take the link down when asked.
  local deadline=$((start_s + timeout_s)) running down_done=0 timed_out=0
  [ -z "$link_down_node" ] && down_done=1
  while true; do
    running=0
    for ((i = 0; i < nodes; ++i)); do kill -0 "${launcher_pids[$i]}" 2>/dev/null && running=$((running + 1)); done
    [ "$running" = 0 ] && break
    if [ "$down_done" = 0 ] && { [ -z "$link_down_when" ] || grep -qE -- "$link_down_when" "$workdir"/node*.log 2>/dev/null; }; then
      take_link_down
      down_done=1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "timed out after $timeout_s s with $running node(s) still running: stopping them"
      timed_out=1
      break
    fi
    sleep 0.2
  done
  local elapsed=$(($(date +%s) - start_s))

  local status=0 rc
  : > "$workdir/counters.tsv"
  for ((i = 0; i < nodes; ++i)); do
    local -a b a
    read -r -a b <<< "${before[$i]}"
    read -r -a a <<< "$(counters "$i")"
    printf '%d\t%s\t%d\t%d\t%d\t%d\n' "$i" "$(node_addr "$i")" $((a[0] - b[0])) $((a[1] - b[1])) \
      $((a[2] - b[2])) $((a[3] - b[3])) >> "$workdir/counters.tsv"
  done
  local -a still_running=()
  for ((i = 0; i < nodes; ++i)); do
    still_running[i]=0
    kill -0 "${launcher_pids[$i]}" 2>/dev/null && still_running[i]=1
  done
  if [ "$timed_out" = 1 ]; then
    cleanup
    status=124
  fi
  for ((i = 0; i < nodes; ++i)); do
    rc=0
    wait "${launcher_pids[$i]}" || rc=$?
    [ "${still_running[$i]}" = 1 ] && rc=124  # stopped by the timeout: its own status is the signal's
    echo "$rc" > "$workdir/node$i.status"
    [ "$status" = 0 ] && [ "$rc" != 0 ] && status=$rc
  done
  if [ "$quiet" = 0 ]; then
    for ((i = 0; i < nodes; ++i)); do sed "s/^/[node $i] /" "$workdir/node$i.log"; done
  fi
  if [ -n "$rate" ]; then  # packets the token buckets dropped (TCP sent them again: the counters hold both)
    : > "$workdir/drops.tsv"
    for ((i = 0; i < nodes; ++i)); do
      printf '%d\t%d\t%d\n' "$i" "$(qdisc_drops "${node_ns[$i]}" eth0)" "$(qdisc_drops "$hub" "n$i")" >> "$workdir/drops.tsv"
    done
  fi
  while read -r i addr rx tx _ _; do
    say "node $i ($addr): exit $(cat "$workdir/node$i.status"), sent $tx bytes, received $rx bytes"
  done < "$workdir/counters.tsv"
  say "finished in $elapsed s with status $status"
  cleanup
  exit "$status"
}

main() {
  [ $# -ge 1 ] || usage 2
  local sub=$1
  shift
  case $sub in
    -h | --help) usage 0 ;;
    check)
      check
      exit $?
      ;;
    clean)
      clean_stale
      exit 0
      ;;
    run | launch) ;;
    *) die "unknown command '$sub' (check, launch, run, clean; --help)" ;;
  esac
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
      --ranks-per-node) ranks_per_node=${2:?--ranks-per-node needs a value}; shift 2 ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
      --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
      --master-port) master_port=${2:?--master-port needs a value}; shift 2 ;;
      --zero3) zero3=${2:?--zero3 needs a value}; shift 2 ;;
      --keep-going) keep_going=1; shift ;;
      --link-down) link_down_node=${2:?--link-down needs a node}; shift 2 ;;
      --link-down-when) link_down_when=${2:?--link-down-when needs a regular expression}; shift 2 ;;
      --quiet) quiet=1; shift ;;
      --) shift; break ;;
      *) die "unknown option '$1' ($sub --help)" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] || die "--nodes '$nodes': expected a number"
  [[ $master_port =~ ^[0-9]+$ ]] && [ "$master_port" -ge 1 ] && [ "$master_port" -le 65535 ] ||
    die "--master-port '$master_port': expected 1..65535"
  run_cluster "$sub" "$@"
}

main "$@"
