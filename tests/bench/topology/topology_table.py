#!/usr/bin/env python3
"""The tables of the topology benchmark (bench_topology.sh) from its results.tsv: one row per run and repeat,

    rate name kind repeat reduce_dtype bytes_per_step step_time_s note drops predicted_bytes predicted_s
    forward_s backward_s optimizer_s comm_wait_s boundary_step_s agreement_s schedule

For each rate: the bytes and the step time of every run as the median over its repeats with their min-max, the
ratios to plain ZeRO-3 with bf16 gradient reductions (plain-bf16-grads) and with fp32 ones (plain), each zero3
layout's speed-up over each FSDP2 peer with the same reduce dtype (the peer's median step time over the layout's;
in brackets the min-max of the per-repeat ratios, each repeat's layout against the peer run beside it), and the
step split into phases (rank 0's means over the timed steps, medians over the repeats). Where pipelined runs are
among them (a schedule in their row), a table of those against the targets of pipelining: their inter-node bytes
against zero3's MiCS/HSDP and hpZ + qwZ + qgZ, their speed-up over zero3's fastest unpipelined layout, and over
PyTorch's pipelining at the same schedule.
"""

import statistics
import sys

COLUMNS = ("rate", "name", "kind", "repeat", "dtype", "bytes", "step", "note", "drops", "pred_bytes", "pred_step",
           "forward", "backward", "optimizer", "comm_wait", "boundary_step", "agreement", "schedule")
PLAIN_BF16, PLAIN_FP32 = "plain-bf16-grads", "plain"
MICS_HSDP, ZEROPP = "mics-hsdp", "hpz-qwz-qgz"
# The pipelining targets: inter-node bytes per step at most this share of MiCS/HSDP's; step time at least these
# speed-ups over zero3's fastest unpipelined layout and over PyTorch's pipelining at the same schedule.
BYTES_SHARE, OVER_UNPIPELINED, OVER_PEER = 0.1, 2.0, 1.2


def num(v):
    return float(v) if v not in ("", None) else None


def read(path):
    rows = []
    for line in open(path):
        if line.strip():
            f = line.rstrip("\n").split("\t")
            rows.append(dict(zip(COLUMNS, f + [""] * (len(COLUMNS) - len(f)))))
    return rows


class Run:
    """One layout or peer at one rate: its repeats."""

    def __init__(self, rows):
        self.name, self.kind, self.dtype = rows[0]["name"], rows[0]["kind"], rows[0]["dtype"]
        self.schedule = rows[0]["schedule"]
        self.ok = [r for r in rows if r["step"]]
        self.failed = [r["note"] for r in rows if not r["step"]]
        self.pred_bytes, self.pred_step = num(rows[0]["pred_bytes"]), num(rows[0]["pred_step"])

    def values(self, key):
        return [num(r[key]) for r in self.ok if num(r[key]) is not None]

    def median(self, key):
        v = self.values(key)
        return statistics.median(v) if v else None

    def by_repeat(self, key):
        return {r["repeat"]: num(r[key]) for r in self.ok}

    def label(self):
        if self.kind == "zero3":
            return f"zero3 {self.name}"
        if self.schedule:
            return f"PyTorch pipelining {self.schedule}"
        mesh = "HSDP" if "-hsdp-" in self.name else "full shard"
        return f"PyTorch FSDP2 {mesh}"


def spread(values, fmt):
    if not values:
        return ""
    m = statistics.median(values)
    return fmt(m) if len(values) == 1 else f"{fmt(m)} ({fmt(min(values))}-{fmt(max(values))})"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def speedup(run, peer):
    """The peer's median step time over the run's, with the min-max of the per-repeat ratios."""
    if peer is None or not run.ok or not peer.ok:
        return "n/a"
    mine, theirs = run.by_repeat("step"), peer.by_repeat("step")
    pairs = [theirs[k] / mine[k] for k in mine if k in theirs]
    head = ratio(peer.median("step"), run.median("step"))
    return head if len(pairs) < 2 else f"{head} ({min(pairs):.2f}-{max(pairs):.2f})"


def table(rate, runs):
    by_name = {r.name: r for r in runs}
    bf16, fp32 = by_name.get(PLAIN_BF16), by_name.get(PLAIN_FP32)
    peer = {(m, d): by_name.get(f"fsdp2-{m}-{d}") for m in ("hsdp", "full") for d in ("bf16", "fp32")}
    n = max((len(r.ok) for r in runs), default=0)
    print(f"\n**link {rate} each way per node: medians over {n} interleaved repeats (min-max)**\n")
    print("| run | reduce dtype | inter-node bytes / step | predicted | measured / predicted | vs plain bf16 "
          "| vs plain fp32 | step time (s) | predicted | measured / predicted | vs plain bf16 | vs plain fp32 "
          "| FSDP2 HSDP / this (same dtype) | FSDP2 full / this (same dtype) | packets dropped by tbf |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        zero3 = r.kind == "zero3"
        pbs = f"{r.pred_bytes / 1e6:.1f} MB" if r.pred_bytes else ("n/a" if zero3 else "")
        pts = f"{r.pred_step:.2f}" if r.pred_step else ("n/a" if zero3 else "")
        if not r.ok:
            print(f"| {r.label()} | {r.dtype} | {'; '.join(r.failed)} | {pbs} | | | | | {pts} | | | | | | |")
            continue
        b, t = r.median("bytes"), r.median("step")
        mb = ratio(b, r.pred_bytes) if r.pred_bytes else ""
        mt = ratio(t, r.pred_step) if r.pred_step else ""
        base = lambda run, key: run.median(key) if run else None
        same = lambda mesh: speedup(r, peer.get((mesh, r.dtype))) if zero3 else ""
        failed = f" ({len(r.failed)} failed)" if r.failed else ""
        print(f"| {r.label()}{failed} | {r.dtype} | {spread(r.values('bytes'), lambda v: f'{v / 1e6:.1f}')} MB | {pbs} "
              f"| {mb} | {ratio(b, base(bf16, 'bytes'))} | {ratio(b, base(fp32, 'bytes'))} "
              f"| {spread(r.values('step'), lambda v: f'{v:.2f}')} | {pts} | {mt} | {ratio(t, base(bf16, 'step'))} "
              f"| {ratio(t, base(fp32, 'step'))} | {same('hsdp')} | {same('full')} | {sum(r.values('drops')):.0f} |")
    print("\nWhere the step goes (rank 0, seconds per optimizer step; medians over the repeats): forward and backward"
          " include the collectives each waits for; zero3's comm wait is the part of them (and of the optimizer)"
          " blocked on collectives, of which agreement is the comparisons of the ranks' scope events; boundary step is the"
          " window's last step() of zero3's optimizer time (the boundary's reductions, MiCS/HSDP's all-reduce across the"
          " replicas among them, and the optimizer step); the peer's backward includes its gradient reductions.\n")
    print("| run | reduce dtype | step | forward | backward | optimizer | boundary step | comm wait | agreement |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        if r.ok:
            keys = ("step", "forward", "backward", "optimizer", "boundary_step", "comm_wait", "agreement")
            cells = [r.median(k) for k in keys]
            print(f"| {r.label()} | {r.dtype} | " + " | ".join("" if v is None else f"{v:.2f}" for v in cells) + " |")


def pipeline_table(rate, runs):
    """The pipelined runs against the targets of pipelining."""
    pipelined = [r for r in runs if r.schedule and r.ok]
    failed = [r for r in runs if r.schedule and not r.ok]
    if not pipelined and not failed:
        return
    by_name = {r.name: r for r in runs}
    mics, zeropp = by_name.get(MICS_HSDP), by_name.get(ZEROPP)
    unpipelined = [r for r in runs if r.kind == "zero3" and not r.schedule and r.ok]
    best = min(unpipelined, key=lambda r: r.median("step"), default=None)
    peers = {r.schedule: r for r in runs if r.kind == "peer" and r.schedule}
    best_label = f"zero3 {best.name}" if best else "none measured"
    print(f"\n**Pipelined runs at link {rate}: medians over the repeats; the targets: inter-node bytes at most "
          f"{BYTES_SHARE:g} of MiCS/HSDP's, step time at least {OVER_UNPIPELINED:g}x faster than zero3's fastest "
          f"unpipelined layout here ({best_label}), at least {OVER_PEER:g}x PyTorch's pipelining at the same "
          f"schedule**\n")
    print("| run | schedule | inter-node bytes / step | predicted | / MiCS-HSDP's | / hpZ+qwZ+qgZ's | step time (s) "
          "| predicted | fastest unpipelined / this | PyTorch pipelining (same schedule) / this |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for r in pipelined:
        zero3 = r.kind == "zero3"
        b, t = r.median("bytes"), r.median("step")
        pbs = (f"{r.pred_bytes / 1e6:.1f} MB" if r.pred_bytes else "n/a") if zero3 else ""
        pts = (f"{r.pred_step:.2f}" if r.pred_step else "n/a") if zero3 else ""
        over_best = speedup(r, best) if best else "n/a"
        peer = peers.get(r.schedule) if zero3 else None
        over_peer = speedup(r, peer) if zero3 else ""
        share = lambda other: f"{b / other.median('bytes'):.3f}" if other and other.ok else "n/a"
        print(f"| {r.label()} | {r.schedule} | {spread(r.values('bytes'), lambda v: f'{v / 1e6:.2f}')} MB | {pbs} "
              f"| {share(mics)} | {share(zeropp)} "
              f"| {spread(r.values('step'), lambda v: f'{v:.2f}')} | {pts} | {over_best} | {over_peer} |")
        if not zero3:
            continue
        checks = []
        if mics and mics.ok:
            limit = BYTES_SHARE * mics.median("bytes")
            checks.append(f"bytes {b / 1e6:.2f} MB {'<=' if b <= limit else '>'} {limit / 1e6:.2f} MB "
                          f"({'met' if b <= limit else 'NOT met'})")
        if best:
            x = best.median("step") / t
            checks.append(f"{x:.2f}x over {best.name} ({'met' if x >= OVER_UNPIPELINED else 'NOT met'})")
        if peer and peer.ok:
            x = peer.median("step") / t
            checks.append(f"{x:.2f}x over PyTorch's {r.schedule} ({'met' if x >= OVER_PEER else 'NOT met'})")
        else:
            checks.append(f"no PyTorch pipelining run at {r.schedule}")
        verdicts.append(f"- zero3 {r.name}: " + "; ".join(checks))
    verdicts += [f"- {r.label()}: not measured ({'; '.join(r.failed)})" for r in failed]
    print("\nTargets, of the medians:\n")
    print("\n".join(verdicts))


def main():
    rows = read(sys.argv[1])
    for rate in dict.fromkeys(r["rate"] for r in rows):
        names = dict.fromkeys(r["name"] for r in rows if r["rate"] == rate)
        runs = [Run([r for r in rows if r["rate"] == rate and r["name"] == n]) for n in names]
        table(rate, runs)
        pipeline_table(rate, runs)
    print("\npredicted: zero3 plan --cluster configs/clusters/sim-<nodes>x<ranks>-<rate>.json"
          " (docs/performance-model.md); payload bytes, where the counters include the headers (about +4.7% at these"
          " rates, docs/cluster.md). Ratios to plain and speed-ups are of the medians.")


if __name__ == "__main__":
    main()
