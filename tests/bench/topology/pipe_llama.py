#!/usr/bin/env python3
"""The PyTorch pipelining peer of the topology benchmark (tests/bench/topology/bench_topology.sh): the Llama-3 model
of fsdp2_llama.py (the same modules, initial weights and parameter names) cut into pipeline stages as
llama3_train --pipeline-stages cuts it, trained with torch.distributed.pipelining on gloo, one process per rank,
started by torchrun on each node of the simulated cluster.

What it does, to match a pipelined llama3_train run on the CPU with a bf16 DeepSpeed config:
  - the layers "embedding", "layers.0" .. "layers.<L-1>", "head" (final norm + lm_head; the loss after it) cut into
    --stages x --virtual-stages stages by zero3's pipeline.partition methods ("parameters": the cut whose largest
    stage has the fewest parameters, each stage taking as many layers as fit; "uniform"), printed as zero3 prints it;
  - the ranks as zero3's default zero3.pipeline_stage_order "stages_across_nodes": a 2-D DeviceMesh ("pp", "dp") of
    --stages x (world / --stages), rank = stage x dp + dp index, so with a node's ranks per stage the data-parallel
    groups stay within a node and only the stage boundaries cross between nodes; stage s on pipeline rank s % stages
    (Megatron's interleaving, as zero3's);
  - the schedule of zero3.pipeline_schedule: gpipe -> ScheduleGPipe, 1f1b -> Schedule1F1B, interleaved_1f1b ->
    ScheduleInterleaved1F1B; the micro-batches of a step are --grad-accum, the schedule's gradient scaling
    (scale_grads) averages over them;
  - inside each stage, over its data-parallel ranks: --dp fsdp2 (fully_shard per layer and per stage module,
    parameters gathered in bf16 and widened to fp32 inside each op, gradients reduced in --reduce-dtype, fp32
    master weights and AdamW state sharded; the schedule keeps parameters and gradients unsharded over the
    micro-batches and reduces once at the step's end) or --dp ddp (replicated, DistributedDataParallel's all-reduce
    on the last micro-batch; fp32 weights gathered nowhere);
  - activations and their gradients between stages in --boundary-dtype (llama3_train --pipeline-boundary-dtype:
    bf16, the compute dtype, by default; fp32 the CPU backend's activation dtype): each stage widens what it
    receives to fp32 and rounds what it sends, as zero3's CPU stages do;
  - gradient clipping at 1.0 on the global norm over all stages (each stage's norm over its data-parallel shards,
    then summed in squares over the pipeline group, as torchtitan does), AdamW, no activation checkpointing;
  - micro-batch x seq-len random token ids per data-parallel rank (seeded by the data-parallel index, so the first
    and the last stage draw the same ids and targets).

Prints one JSON line on rank 0 with fsdp2_llama.py's fields ("step_time_s": the mean over the steps after --warmup,
"step_times_s", "losses": the mean loss of each step's global batch, "params", "shape", ...) and "partition",
"schedule", "stages"; rank 0's time per step in forward (inside its stage modules' forward calls, the FSDP2 gathers
within them included), backward (the rest of the schedule's step: its backwards, the waits for the transfers between
stages, the gradient reductions) and the optimizer (clipping with the norm's all-reduce over the stages, AdamW,
zero_grad) as "forward_s", "backward_s" and "optimizer_s".
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from fsdp2_llama import Llama, read_config, rope_tables

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


# ---- the cut: zero3's pipeline.partition (src/pipeline/layer_partition.cpp) -------------------------------------

def _fits(weight, stages, limit):
    """The cut where each stage takes as many layers as fit under `limit` (one left for every later stage), or None."""
    n, bounds, at = len(weight), [0], 0
    for s in range(stages):
        must_leave, total, end = stages - s - 1, 0, at
        while end < n - must_leave and (end == at or total + weight[end] <= limit):
            if weight[end] > limit:
                return None
            total += weight[end]
            end += 1
        bounds.append(end)
        at = end
    return bounds if at == n else None


def partition_layers(weights, stages, method):
    """Stage bounds over the layers: stage s holds layers [bounds[s], bounds[s + 1])."""
    n = len(weights)
    if not 1 <= stages <= n:
        raise SystemExit(f"pipeline.stages: {stages} stages for {n} layers; every stage needs at least one layer")
    if method == "uniform":
        base, extra = divmod(n, stages)
        bounds = [0]
        for s in range(stages):
            bounds.append(bounds[-1] + base + (s < extra))
        return bounds
    if method != "parameters":
        raise SystemExit(f"--partition {method}: this peer cuts by \"parameters\" or \"uniform\"")
    lo, hi = max(weights), sum(weights)
    while lo < hi:  # the smallest largest stage, by bisection over the limit
        mid = lo + (hi - lo) // 2
        if _fits(weights, stages, mid):
            hi = mid
        else:
            lo = mid + 1
    return _fits(weights, stages, lo)


def describe_partition(names, weights, bounds):
    """As zero3's describe_partition(): "stage 0: embedding .. layers.0 (2 layers, 1835520 parameters); ..."."""
    parts = []
    for s in range(len(bounds) - 1):
        a, b = bounds[s], bounds[s + 1]
        span = names[a] + (f" .. {names[b - 1]}" if b - a > 1 else "")
        parts.append(f"stage {s}: {span} ({b - a} layer{'' if b - a == 1 else 's'}, {sum(weights[a:b])} parameters)")
    return "; ".join(parts)


# ---- a stage: a contiguous run of the model's layers --------------------------------------------------------------

class StageModule(nn.Module):
    """Layers [first, end) of (embedding, layers.0 .., head): token ids or the previous stage's activation in, the
    next stage's activation or (last stage) the logits out. The loss is the schedule's loss_fn."""

    def __init__(self, model, first, end, cos, sin, boundary_dtype):
        super().__init__()
        self.boundary_dtype = boundary_dtype
        n_layers = len(model.layers)
        self.embed_tokens = model.embed_tokens if first == 0 else None
        # Keep the layers' own indices as names ("layers.3"), as the unpipelined model's.
        self.layers = nn.ModuleDict({str(i): model.layers[i]
                                     for i in range(max(first - 1, 0), min(end - 1, n_layers))})
        self.head = model.head if end == n_layers + 2 else None
        self.cos, self.sin = cos, sin  # plain attributes: not parameters, not buffers

    def units(self):
        """What fully_shard wraps one by one, as fsdp2_llama.py does: the embedding, each layer, the head."""
        return [m for m in (self.embed_tokens, *self.layers.values(), self.head) if m is not None]

    def forward(self, x):
        x = self.embed_tokens(x) if self.embed_tokens is not None else x.float()
        for layer in self.layers.values():
            x = layer(x, self.cos, self.sin)
        return self.head(x) if self.head is not None else x.to(self.boundary_dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face config.json")
    ap.add_argument("--stages", type=int, required=True, help="pipeline ranks (pipeline.stages)")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b", help="zero3.pipeline_schedule")
    ap.add_argument("--virtual-stages", type=int, default=1,
                    help="stages per pipeline rank (zero3.pipeline_virtual_stages; 2 or more for interleaved_1f1b)")
    ap.add_argument("--partition", choices=["parameters", "uniform"], default="parameters", help="pipeline.partition")
    ap.add_argument("--dp", choices=["fsdp2", "ddp"], default="fsdp2",
                    help="data parallelism inside each stage: FSDP2 (sharded) or DDP (replicated)")
    ap.add_argument("--reduce-dtype", choices=["bf16", "fp32"], default="bf16",
                    help="FSDP2's gradient reductions' dtype (MixedPrecisionPolicy reduce_dtype; default bf16)")
    ap.add_argument("--boundary-dtype", choices=["bf16", "fp32"], default="bf16",
                    help="dtype of the activations and their gradients between stages (default bf16)")
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--grad-accum", type=int, required=True, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1, help="first steps not timed")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for every collective and transfer")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", help="also write the JSON line here")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    interleaved = args.schedule == "interleaved_1f1b"
    if interleaved != (args.virtual_stages > 1):
        ap.error(f"--schedule {args.schedule} with --virtual-stages {args.virtual_stages}: interleaved_1f1b needs 2 "
                 "or more, gpipe and 1f1b exactly 1 (as zero3.pipeline_virtual_stages)")
    if args.dp == "ddp" and args.reduce_dtype != "fp32":
        ap.error("--dp ddp reduces the fp32 gradients in fp32: pass --reduce-dtype fp32")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    P, V = args.stages, args.virtual_stages
    if world % P:
        raise SystemExit(f"--stages {P} does not divide the world size {world}")
    D = world // P
    mesh = init_device_mesh("cpu", (P, D), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    pp_group = mesh["pp"].get_group()

    c = read_config(args.model)
    torch.manual_seed(args.seed)  # fsdp2_llama.py's initial weights: the whole model, then this rank's stages
    model = Llama(c)
    n_params = sum(p.numel() for p in model.parameters())
    units = [model.embed_tokens, *model.layers, model.head]
    names = ["embedding"] + [f"layers.{i}" for i in range(len(model.layers))] + ["head"]
    weights = [sum(p.numel() for p in u.parameters()) for u in units]
    bounds = partition_layers(weights, P * V, args.partition)
    partition = describe_partition(names, weights, bounds)
    cos, sin = rope_tables(c, args.seq_len)

    reduce_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.reduce_dtype]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    mine = [s for s in range(P * V) if s % P == pp_rank]  # this rank's (virtual) stages
    modules, stages = [], []
    forward_time, started = [0.0], {}
    for s in mine:
        module = StageModule(model, bounds[s], bounds[s + 1], cos, sin,
                             {"bf16": torch.bfloat16, "fp32": torch.float32}[args.boundary_dtype])
        if args.dp == "fsdp2":  # also over one rank: its mixed precision is the bf16 weights' arithmetic
            for unit in module.units():
                fully_shard(unit, mesh=mesh["dp"], mp_policy=mp)
            fully_shard(module, mesh=mesh["dp"], mp_policy=mp)
        else:
            module = nn.parallel.DistributedDataParallel(module, process_group=mesh["dp"].get_group())
        module.register_forward_pre_hook(lambda m, a: started.__setitem__(m, time.perf_counter()))
        module.register_forward_hook(
            lambda m, a, out: forward_time.__setitem__(0, forward_time[0] + time.perf_counter() - started.pop(m)))
        modules.append(module)
        stages.append(PipelineStage(module, s, P * V, torch.device("cpu"), group=pp_group))
    del model, units  # this rank keeps its stages' layers only

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    schedule = (SCHEDULES[args.schedule](stages, args.grad_accum, loss_fn=loss_fn) if interleaved
                else SCHEDULES[args.schedule](stages[0], args.grad_accum, loss_fn=loss_fn))
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    holds_first, holds_last = 0 in mine, P * V - 1 in mine

    def clip_global_norm(max_norm):
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # over the stage's data-parallel shards
        squares = norm.float() ** 2
        dist.all_reduce(squares, group=pp_group)  # over the stages
        total = squares.sqrt()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total.item()

    gen = torch.Generator().manual_seed(args.seed + dp_rank)
    losses, times, norms = [], [], []
    phases = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    for _ in range(args.steps):
        ids = torch.randint(0, c["vocab_size"], (args.grad_accum * args.micro_batch, args.seq_len + 1), generator=gen)
        t0 = time.perf_counter()
        forward_time[0] = 0.0
        micro_losses = []
        inputs = (ids[:, :-1],) if holds_first else ()
        schedule.step(*inputs, target=ids[:, 1:] if holds_last else None,
                      losses=micro_losses if holds_last else None, return_outputs=False)
        t_opt = time.perf_counter()
        norms.append(clip_global_norm(1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        phases["forward_s"].append(forward_time[0])
        phases["backward_s"].append(t_opt - t0 - forward_time[0])
        phases["optimizer_s"].append(time.perf_counter() - t_opt)
        # The global batch's mean loss: the last stage's micro-batch means, averaged over its data-parallel ranks.
        loss = torch.tensor([sum(l.item() for l in micro_losses) / args.grad_accum / D if holds_last else 0.0])
        dist.all_reduce(loss)
        losses.append(loss.item())

    timed = times[args.warmup:]
    dp_name = {"fsdp2": "FSDP2", "ddp": "DDP"}[args.dp]
    result = {
        "framework": f"torch {torch.__version__} pipelining ({type(schedule).__name__}, {P} stages"
                     f"{f' x {V} virtual' if V > 1 else ''}) + {dp_name} inside the stages, gloo",
        "mesh": [P, D],
        "stages": P,
        "virtual_stages": V,
        "schedule": args.schedule,
        "dp": args.dp,
        "partition_method": args.partition,
        "partition": partition,
        "params": n_params,
        "shape": {k: c[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                    "head_dim", "intermediate_size", "vocab_size")},
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "grad_accum": args.grad_accum,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_time_s": sum(timed) / len(timed),
        "step_times_s": times,
        "reduce_dtype": args.reduce_dtype,
        "boundary_dtype": args.boundary_dtype,
        **phases,
        "losses": losses,
        "grad_norms": norms,
    }
    if rank == 0:
        print(f"partition ({args.partition}): {partition}", flush=True)
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(line + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
