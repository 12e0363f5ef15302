#!/usr/bin/env python3
"""The peer that llama3_train's GPU figures are compared with: the same Llama-3 model trained with PyTorch
FSDP2 (torch.distributed.fsdp.fully_shard) on the same GPU, batch and sequence length.

The model is Hugging Face transformers' LlamaForCausalLM built from a config.json (random init, as
llama3_train does without --init-from), float32 master weights, bf16 compute through FSDP2's
MixedPrecisionPolicy (param_dtype bf16, reduce_dtype fp32), one fully_shard per decoder layer and one at the
root (what DeepSpeed ZeRO-3 and zero3 gather: one unit per layer), AdamW, gradient clipping at 1.0,
optional activation checkpointing per layer. Attention is transformers' "sdpa" by default (PyTorch's
scaled_dot_product_attention, a fused flash kernel on H100/H200), or "eager" (two batched GEMMs and a
softmax, the plan llama3_train's cuBLAS attention follows) with --attention eager.

Two ways to run it, both in the same run of scripts/gpu-run.sh (compiled when time is left):
  eager (the default): the model as transformers writes it, AdamW's for-each implementation, the loss over the
      whole micro-batch's logits (transformers' own);
  what a PyTorch expert runs (--compile --fused-adamw, as torchtitan does): every decoder layer compiled with
      torch.compile before fully_shard (torchtitan's per-block compile), AdamW's fused CUDA kernel; with
      --loss-chunks N also the loss in N chunks of rows, each chunk's logits recomputed in backward
      (torch.utils.checkpoint) so the (tokens, vocab) logits never exist, as llama3_train's LM head does.

Batches are random token ids (seeded), micro-batch x seq-len, every position a target; each optimizer step
runs grad-accum micro-batches. The first --warmup steps are not timed (they include compilation). Prints one
JSON object:

  {"tokens_per_s": ..., "step_time_s": ..., "peak_gpu_bytes": ..., "mfu": ..., "params": ..., "losses": [...]}

with peak_gpu_bytes = torch.cuda.max_memory_allocated() (what the caching allocator handed out, like
zero3's peak) and MFU as llama3_train computes it (examples/llama3/mfu.hpp, PaLM's and torchtitan's
convention): (6 * N + 12 * layers * hidden * seq) FLOPs per token, N the parameters without the input
embedding (a tied model's one matrix counted once, as the LM head), times tokens/s over the GPU's peak dense
bf16 FLOP/s (--peak-flops, or known from the device name).

Runs as one process (world size 1; torchrun sets the variables for more). On a machine without a GPU it runs
on the CPU with gloo (for checking the script; its figures mean nothing there). torch and transformers are
imported after the arguments are read, so --help works without them; where they cannot be imported it prints
"skipped: ..." and exits 77. The JSON also names the versions of torch, CUDA, cuDNN, NCCL and transformers it ran
with (the image's own wheels: scripts/gpu-run.sh starts it with the image's library path).

Usage: python3 examples/llama3/tools/fsdp2_reference.py --model configs/models/llama-3-1b-untied.json \
           --micro-batch 4 --seq-len 1024 --steps 20 --warmup 3 [--grad-checkpointing] \
           [--compile --fused-adamw [--loss-chunks 8]] [--out result.json]
"""

import argparse
import json
import os
import sys
import time

# Dense bf16 peak FLOP/s by device name (the figures llama3_train uses).
PEAK_BF16 = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("L40S", 362e12),
             ("A100", 312e12)]


def peak_flops(name, given):
    if given > 0:
        return given
    for key, value in PEAK_BF16:
        if all(part in name for part in key.split()):
            return value
    return 0.0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face config.json of the model")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps, warmup included")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--grad-checkpointing", action="store_true")
    ap.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile every decoder layer before fully_shard (torchtitan's per-block compile)")
    ap.add_argument("--fused-adamw", action="store_true", help="AdamW's fused kernel (fused=True)")
    ap.add_argument("--loss-chunks", type=int, default=0,
                    help="N > 0: the loss in N chunks of rows, logits recomputed in backward, never held whole; "
                         "0: transformers' loss over the whole micro-batch's logits")
    ap.add_argument("--peak-flops", type=float, default=0.0, help="peak dense bf16 FLOP/s; 0: from the device name")
    ap.add_argument("--out", help="also write the JSON result here")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    if args.loss_chunks < 0:
        ap.error(f"--loss-chunks {args.loss_chunks} must be >= 0")
    return args


def flop_parameters(model, config):
    """The parameters that multiply, as examples/llama3/mfu.hpp counts them: all (a tied matrix once) less the
    input embedding table of an untied model."""
    n = sum(p.numel() for p in model.parameters())  # parameters() yields a tied matrix once
    if not config.tie_word_embeddings:
        n -= model.get_input_embeddings().weight.numel()
    return n


def chunked_loss_model(lm, chunks):
    """LlamaForCausalLM's loss without the (tokens, vocab) logits: the final states of the shifted positions are
    split into `chunks` chunks of rows; each chunk's logits are computed, reduced to the chunk's summed
    cross-entropy in float32 (as transformers' loss upcasts) and dropped, then recomputed in backward."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def chunk_loss(h, w, t):
        return F.cross_entropy(F.linear(h, w).float(), t, ignore_index=-100, reduction="sum")

    class ChunkedLossCausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, labels):
            hidden = self.lm.model(input_ids=input_ids).last_hidden_state
            h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
            t = labels[:, 1:].reshape(-1)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            for hc, tc in zip(h.chunk(chunks), t.chunk(chunks)):
                total = total + checkpoint(chunk_loss, hc, self.lm.lm_head.weight, tc, use_reentrant=False)
            return total / (t != -100).sum().clamp(min=1)

    return ChunkedLossCausalLM()


def build_model(LlamaForCausalLM, config, attention, dtype):
    """LlamaForCausalLM from a config with random weights: transformers 4.56 and later take dtype=, earlier releases
    torch_dtype= (the image's release is whatever PyTorch's image ships)."""
    try:
        return LlamaForCausalLM._from_config(config, attn_implementation=attention, dtype=dtype)
    except TypeError:
        return LlamaForCausalLM._from_config(config, attn_implementation=attention, torch_dtype=dtype)


def versions(torch, transformers):
    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "nccl": nccl, "transformers": transformers.__version__}


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
        import transformers
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"skipped: cannot import what the peer needs: {e}", flush=True)
        return 77

    cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    with open(args.model) as f:
        config = LlamaConfig.from_dict(json.load(f))
    config.use_cache = False
    torch.manual_seed(args.seed)
    with torch.device(device):
        lm = build_model(LlamaForCausalLM, config, args.attention, torch.float32)
    if args.grad_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_params = sum(p.numel() for p in lm.parameters())
    n_flop_params = flop_parameters(lm, config)

    # torchtitan's order: activation checkpointing, then compile per block, then fully_shard per block and root.
    # Module.compile() compiles in place (the layer stays the module FSDP2 and checkpointing see).
    if args.compile:
        for layer in lm.model.layers:
            layer.compile()
    model = chunked_loss_model(lm, args.loss_chunks) if args.loss_chunks > 0 else lm
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in lm.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt_kwargs = {"fused": True} if args.fused_adamw else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            **opt_kwargs)

    def micro_loss(ids):
        if args.loss_chunks > 0:
            return model(ids, ids)
        return model(input_ids=ids, labels=ids).loss

    gen = torch.Generator(device="cpu").manual_seed(args.seed + rank)
    tokens_per_step = args.micro_batch * args.seq_len * args.grad_accum * dist.get_world_size()
    losses, times = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(args.grad_accum):
            ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len), generator=gen).to(device)
            loss = micro_loss(ids)
            (loss / args.grad_accum).backward()
            total += loss.detach().float().item() / args.grad_accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(total)

    timed = times[args.warmup:]
    step_time = sum(timed) / len(timed)
    tokens_per_s = tokens_per_step / step_time
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = peak_flops(name, args.peak_flops)
    flops_per_token = 6 * n_flop_params + 12 * config.num_hidden_layers * config.hidden_size * args.seq_len
    per_gpu = tokens_per_s / dist.get_world_size()
    setup = [args.attention + " attention", "compiled" if args.compile else "eager",
             "fused AdamW" if args.fused_adamw else "for-each AdamW"]
    if args.loss_chunks > 0:
        setup.append(f"loss in {args.loss_chunks} chunks")
    result = {
        "framework": f"torch {torch.__version__} FSDP2 ({', '.join(setup)})",
        "device": name,
        "params": n_params,
        "flop_params": n_flop_params,
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "grad_accum": args.grad_accum,
        "grad_checkpointing": args.grad_checkpointing,
        "compile": args.compile,
        "fused_adamw": args.fused_adamw,
        "loss_chunks": args.loss_chunks,
        "steps_timed": len(timed),
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "mfu": flops_per_token * per_gpu / peak if peak > 0 else None,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "losses": losses,
        "versions": versions(torch, transformers),
    }
    if rank == 0:
        text = json.dumps(result)
        print(text, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
