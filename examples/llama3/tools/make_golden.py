#!/usr/bin/env python3
"""Writes the golden fixtures the C++ Llama-3 model is checked against (tests/golden/).

Builds small Llama-3 configurations in Hugging Face transformers' LlamaForCausalLM (float32, eager attention),
with weights drawn from a fixed seed, runs one fixed batch forward and backward, and stores, per fixture:

  config.json          the model's Hugging Face config
  model.safetensors    every parameter (float32), Hugging Face names (as save_pretrained names them: a model
                       with tied embeddings has model.embed_tokens.weight and no lm_head.weight)
  grads.safetensors    every parameter's gradient of the mean loss (float32), same names (tied: the embedding's
                       gradient is the sum of its two uses)
  batch.safetensors    input_ids (I32, [2, 16]), labels (I32, [2, 16], -100 = ignored, unshifted as
                       LlamaForCausalLM takes them), loss (F64, [1]), and per fixture:
                       logits (F32, [2, 16, vocab]) (untied, tied),
                       tiny_inv_freq (F32): the model's rotary inverse frequencies, and
                       llama31_inv_freq (F32, [64]): the inverse frequencies transformers computes for
                       Meta-Llama-3.1-8B's rope_scaling (head_dim 128), to check the C++ rope scaling bit-wise
                       (untied),
                       loss_f64 (F64, [1]): the cross-entropy of transformers' float32 logits computed in
                       float64 (vocab32k)

The fixtures (directory under tests/golden):
  untied    (.)         hidden 64, ffn 176, 2 layers, 4 heads (2 kv), vocab 256: configs/models/llama-3-tiny.json
  tied      (tied)      the same with tie_word_embeddings (Llama-3.2-1B/3B, SmolLM2)
  vocab32k  (vocab32k)  hidden 16, ffn 40, 2 layers, 4 heads (2 kv), vocab 32768, tied; the final norm's weights
                        scaled by 15 and the labels drawn from the model's own next-token distribution, so the
                        rows are peaked and the loss is low, as a trained model's (about 2.8 nats): the rows where
                        a float sum of exponentials taken one term after another loses its small terms

Only this script needs Python; tools/hf_venv.sh installs what it needs (torch, transformers, safetensors from
PyPI) into a virtual environment. The tests read its files.
Usage: python3 examples/llama3/tools/make_golden.py [--out DIR] [--fixture untied|tied|vocab32k|all]
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

FIXTURES = {
    "untied": dict(subdir="", config=TINY, logits=True, rope=True),
    "tied": dict(subdir="tied", config=dict(TINY, tie_word_embeddings=True), logits=True),
    "vocab32k": dict(subdir="vocab32k",
                     config=dict(TINY, hidden_size=16, intermediate_size=40, vocab_size=32768,
                                 tie_word_embeddings=True),
                     final_norm_scale=15.0, sample_labels=True, loss_f64=True),
}


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


def make_fixture(name, spec, out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    config = LlamaConfig(**spec["config"])
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        # RMSNorm weights start at 1; move them so their gradients and the weight multiply are exercised.
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
        if "final_norm_scale" in spec:
            model.model.norm.weight.mul_(spec["final_norm_scale"])
    model.train()  # dropout is 0 in Llama; train() only matters for the loss path

    vocab = config.vocab_size
    gen = torch.Generator().manual_seed(SEED + 1)
    input_ids = torch.randint(0, vocab, (BATCH, SEQ), generator=gen)
    labels = input_ids.clone()
    if spec.get("sample_labels"):
        # Position t's label is drawn from the model's distribution after ids[..t-1] (labels are unshifted).
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=input_ids).logits.double(), dim=-1)
        drawn = torch.multinomial(probs.reshape(-1, vocab), 1, generator=gen).reshape(BATCH, SEQ)
        labels[:, 1:] = drawn[:, :-1]
    labels[0, :3] = -100   # a masked prompt
    labels[1, 9:12] = -100  # a hole in the middle
    labels[1, -1] = -100

    result = model(input_ids=input_ids, labels=labels)
    result.loss.backward()

    # named_parameters() lists a tied weight once, under model.embed_tokens.weight, as save_pretrained stores it.
    params = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters()}
    assert ("lm_head.weight" in params) != config.tie_word_embeddings, sorted(params)

    batch = {
        "input_ids": input_ids.to(torch.int32).contiguous(),
        "labels": labels.to(torch.int32).contiguous(),
        "loss": result.loss.detach().to(torch.float64).reshape(1),
    }
    if spec.get("logits"):
        batch["logits"] = result.logits.detach().to(torch.float32).contiguous()
    if spec.get("rope"):
        batch["tiny_inv_freq"] = model.model.rotary_emb.inv_freq.detach().to(torch.float32).contiguous()
        batch["llama31_inv_freq"] = llama31_inv_freq()
    if spec.get("loss_f64"):
        # transformers' loss is float32 whatever the model's dtype (it upcasts the logits to float32 for it, and
        # its norms, softmax and rotary tables compute in float32 in a float64 model too), so the reference of the
        # cross-entropy's reductions is taken here: float64 arithmetic on transformers' float32 logits.
        batch["loss_f64"] = torch.nn.functional.cross_entropy(
            result.logits.detach().to(torch.float64)[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1),
            ignore_index=-100).reshape(1)

    config.save_pretrained(out)
    save_file(params, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(grads, os.path.join(out, "grads.safetensors"), metadata={"format": "pt"})
    save_file(batch, os.path.join(out, "batch.safetensors"), metadata={
        "torch": torch.__version__, "transformers": transformers.__version__, "seed": str(SEED),
    })
    summary = {"fixture": name, "loss": result.loss.item(), "out": out}
    if "loss_f64" in batch:
        summary["loss_f64"] = batch["loss_f64"].item()
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"),
                        help="the golden directory; each fixture goes to its subdirectory of it")
    parser.add_argument("--fixture", default="all", choices=sorted(FIXTURES) + ["all"])
    args = parser.parse_args()
    names = sorted(FIXTURES) if args.fixture == "all" else [args.fixture]
    for name in names:
        spec = FIXTURES[name]
        summary = make_fixture(name, spec, os.path.abspath(os.path.join(args.out, spec["subdir"])))
        summary.update(torch=torch.__version__, transformers=transformers.__version__)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
