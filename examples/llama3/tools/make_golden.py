#!/usr/bin/env python3
"""Writes the golden fixtures the C++ Llama-3 model is checked against (tests/golden/).

Builds the tiny Llama-3 configuration in Hugging Face transformers' LlamaForCausalLM (float32, eager
attention), with weights drawn from a fixed seed, runs one fixed batch forward and backward, and stores:

  config.json          the model's Hugging Face config
  model.safetensors    every parameter (float32), Hugging Face names
  grads.safetensors    every parameter's gradient of the mean loss (float32), same names
  batch.safetensors    input_ids (I32, [2, 16]), labels (I32, [2, 16], -100 = ignored, unshifted as
                       LlamaForCausalLM takes them), logits (F32, [2, 16, 256]), loss (F64, [1]),
                       tiny_inv_freq (F32): the model's rotary inverse frequencies,
                       llama31_inv_freq (F32, [64]): the inverse frequencies transformers computes for
                       Meta-Llama-3.1-8B's rope_scaling (head_dim 128), to check the C++ rope scaling bit-wise

Only this script needs Python (pip install torch transformers safetensors); the tests read its files.
Usage: python3 examples/llama3/tools/make_golden.py [--out DIR]
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
import transformers

SEED = 1234
BATCH, SEQ = 2, 16

TINY = dict(
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    # Wider than Llama's 0.02 so attention is far from uniform and every path carries signal.
    initializer_range=0.1,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
)


def llama31_inv_freq():
    """transformers' own llama3 rope parameters for Meta-Llama-3.1-8B's head (128) and scaling."""
    cfg = LlamaConfig(
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
        max_position_embeddings=131072)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    return inv_freq.to(torch.float32).contiguous()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    config = LlamaConfig(**TINY)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        # RMSNorm weights start at 1; move them so their gradients and the weight multiply are exercised.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    model.train()  # dropout is 0 in Llama; train() only matters for the loss path

    gen = torch.Generator().manual_seed(SEED + 1)
    input_ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen)
    labels = input_ids.clone()
    labels[0, :3] = -100   # a masked prompt
    labels[1, 9:12] = -100  # a hole in the middle
    labels[1, -1] = -100

    result = model(input_ids=input_ids, labels=labels)
    result.loss.backward()

    params = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters()}
    assert "lm_head.weight" in params and not config.tie_word_embeddings

    config.save_pretrained(out)
    save_file(params, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(grads, os.path.join(out, "grads.safetensors"), metadata={"format": "pt"})
    save_file({
        "input_ids": input_ids.to(torch.int32).contiguous(),
        "labels": labels.to(torch.int32).contiguous(),
        "logits": result.logits.detach().to(torch.float32).contiguous(),
        "loss": result.loss.detach().to(torch.float64).reshape(1),
        "tiny_inv_freq": model.model.rotary_emb.inv_freq.detach().to(torch.float32).contiguous(),
        "llama31_inv_freq": llama31_inv_freq(),
    }, os.path.join(out, "batch.safetensors"), metadata={
        "torch": torch.__version__, "transformers": transformers.__version__, "seed": str(SEED),
    })
    print(json.dumps({"loss": result.loss.item(), "out": out, "torch": torch.__version__,
                      "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
