#!/usr/bin/env python3
"""The PyTorch FSDP2 peer of the topology benchmark (tests/bench/topology/bench_topology.sh): the Llama-3 model of
examples/llama3 (the shapes and parameter names of llama_layout.cpp, read from the same Hugging Face config.json)
trained with torch.distributed.fsdp.fully_shard on gloo, one process per rank, started by torchrun on each node of
the simulated cluster.

What it does, to match what llama3_train does on the CPU with a bf16 DeepSpeed config:
  - fp32 master weights and AdamW state, sharded; parameters all-gathered in bf16 (MixedPrecisionPolicy
    param_dtype=bf16) and widened to fp32 inside each op, so the arithmetic is fp32 on bf16-rounded weights, as
    llama3_train's CPU kernels do; gradients reduced in --reduce-dtype (MixedPrecisionPolicy reduce_dtype): bf16,
    as zero3 and DeepSpeed reduce them by default under bf16, or fp32 (communication_data_type fp32);
  - one fully_shard per unit zero3 gathers: the embedding, each decoder layer, the head (final norm + lm_head),
    then the root; parameters resharded after forward (gathered again in backward), as ZeRO-3 does;
  - --mesh full: a 1-D mesh over every rank (FULL_SHARD, ZeRO-3's data flow): reduce-scatter every micro-step;
    --mesh hsdp: a 2-D DeviceMesh (replicate across nodes, shard within a node): reduce-scatter within the node
    every micro-step, all-reduce across nodes only on the last micro-step of the optimizer step
    (set_requires_all_reduce(False) before the others: what an FSDP2 user does with gradient accumulation);
  - gradient clipping at 1.0, no activation checkpointing, micro-batch x seq-len random token ids per rank.

Prints one JSON line on rank 0: {"step_time_s": mean over the steps after --warmup, "step_times_s": [...],
"reduce_dtype": ..., "losses": [...], "params": ..., ...}, with rank 0's time per step in forward, backward (the
gradient reductions FSDP2 issues in it included) and the optimizer (the boundary: clipping, AdamW, zero_grad) as
"forward_s", "backward_s" and "optimizer_s", the same phases as llama3_train's metrics.
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


def normal_(shape, std):
    w = torch.empty(shape)
    nn.init.normal_(w, mean=0.0, std=std)
    return nn.Parameter(w)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def linear(x, w):
    return F.linear(x, w.float())  # the gathered bf16 weight, widened: fp32 arithmetic


def rope_tables(c, seq):
    head_dim = c["head_dim"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, hd = c["hidden_size"], c["head_dim"]
        self.n_heads, self.n_kv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        std = c["initializer_range"]
        self.q_proj = nn.Module()
        self.q_proj.weight = normal_((self.n_heads * hd, h), std)
        self.k_proj = nn.Module()
        self.k_proj.weight = normal_((self.n_kv * hd, h), std)
        self.v_proj = nn.Module()
        self.v_proj.weight = normal_((self.n_kv * hd, h), std)
        self.o_proj = nn.Module()
        self.o_proj.weight = normal_((h, self.n_heads * hd), std)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = linear(x, self.q_proj.weight).view(b, s, self.n_heads, self.hd).transpose(1, 2)
        k = linear(x, self.k_proj.weight).view(b, s, self.n_kv, self.hd).transpose(1, 2)
        v = linear(x, self.v_proj.weight).view(b, s, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return linear(o.transpose(1, 2).reshape(b, s, -1), self.o_proj.weight)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i, std = c["hidden_size"], c["intermediate_size"], c["initializer_range"]
        self.gate_proj = nn.Module()
        self.gate_proj.weight = normal_((i, h), std)
        self.up_proj = nn.Module()
        self.up_proj.weight = normal_((i, h), std)
        self.down_proj = nn.Module()
        self.down_proj.weight = normal_((h, i), std)

    def forward(self, x):
        return linear(F.silu(linear(x, self.gate_proj.weight)) * linear(x, self.up_proj.weight),
                      self.down_proj.weight)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = Mlp(c)

    def forward(self, x, cos, sin):
        a = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return a + self.mlp(self.post_attention_layernorm(a))


class Embedding(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = normal_((c["vocab_size"], c["hidden_size"]), c["initializer_range"])

    def forward(self, ids):
        return F.embedding(ids, self.weight.float())


class Head(nn.Module):  # zero3's "head" unit: model.norm + lm_head
    def __init__(self, c):
        super().__init__()
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Module()
        self.lm_head.weight = normal_((c["vocab_size"], c["hidden_size"]), c["initializer_range"])

    def forward(self, x):
        return linear(self.norm(x), self.lm_head.weight)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = Embedding(c)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.head = Head(c)

    def forward(self, ids, cos, sin):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(x)


def read_config(path):
    with open(path) as f:
        raw = json.load(f)
    c = {k: raw[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "vocab_size")}
    c["head_dim"] = raw.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    c["rms_norm_eps"] = raw.get("rms_norm_eps", 1e-5)
    c["rope_theta"] = raw.get("rope_theta", 500000.0)
    c["initializer_range"] = raw.get("initializer_range", 0.02)
    if raw.get("tie_word_embeddings"):
        raise SystemExit(f"{path}: tie_word_embeddings is true; the zero3 example (and so this peer) is untied")
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face config.json")
    ap.add_argument("--mesh", choices=["full", "hsdp"], required=True)
    ap.add_argument("--reduce-dtype", choices=["bf16", "fp32"], default="fp32",
                    help="the gradient reductions' dtype (MixedPrecisionPolicy reduce_dtype; default fp32)")
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--grad-accum", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1, help="first steps not timed")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for every collective")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", help="also write the JSON line here")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    if world % local:
        raise SystemExit(f"world size {world} is not a multiple of LOCAL_WORLD_SIZE {local}")
    if args.mesh == "full":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (world // local, local), mesh_dim_names=("replicate", "shard"))

    c = read_config(args.model)
    torch.manual_seed(args.seed)  # the same initial weights on every rank: fully_shard keeps each rank's shard
    model = Llama(c)
    n_params = sum(p.numel() for p in model.parameters())
    reduce_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.reduce_dtype]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    for unit in [model.embed_tokens, *model.layers, model.head]:
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    cos, sin = rope_tables(c, args.seq_len)

    gen = torch.Generator().manual_seed(args.seed + rank)
    losses, times = [], []
    phases = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    for _ in range(args.steps):
        t0 = time.perf_counter()
        total, fwd, bwd = 0.0, 0.0, 0.0
        for micro in range(args.grad_accum):
            if args.mesh == "hsdp":
                model.set_requires_all_reduce(micro == args.grad_accum - 1)
            ids = torch.randint(0, c["vocab_size"], (args.micro_batch, args.seq_len + 1), generator=gen)
            t_fwd = time.perf_counter()
            logits = model(ids[:, :-1], cos, sin)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            t_bwd = time.perf_counter()
            (loss / args.grad_accum).backward()
            total += loss.item() / args.grad_accum
            fwd += t_bwd - t_fwd
            bwd += time.perf_counter() - t_bwd
        t_opt = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        phases["forward_s"].append(fwd)
        phases["backward_s"].append(bwd)
        phases["optimizer_s"].append(time.perf_counter() - t_opt)
        losses.append(total)

    timed = times[args.warmup:]
    result = {
        "framework": f"torch {torch.__version__} FSDP2 ({'HSDP' if args.mesh == 'hsdp' else 'full shard'}, gloo)",
        "mesh": list(mesh.shape),
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
        **phases,
        "losses": losses,
    }
    if rank == 0:
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(line + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
