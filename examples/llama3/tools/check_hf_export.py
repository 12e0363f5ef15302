#!/usr/bin/env python3
"""Checks llama3_train's Hugging Face export against transformers, and the way back.

For fp32 and bf16: trains a Llama (default configs/models/llama-3-tiny-tied.json, tied embeddings) for a few
steps on 2 ranks with llama3_train on the license texts, evaluating held-out tokens after the last step, and
exports it (--consolidate-to). Then:
  1. transformers loads the export (LlamaForCausalLM.from_pretrained): no missing, unexpected or mismatched
     tensor; with tied embeddings the LM head is the embedding's very tensor; config.json's dtype is the
     exported tensors'; its loss on the held-out tokens is the one llama3_train printed (within 1e-5 relative;
     transformers computes in float32 on the exported weights, bf16 ones widened, as llama3_train does on CPU).
  2. llama3_train --steps 0 --init-from the export, on 3 ranks, evaluates the held-out tokens to the same loss
     (as printed, 4 decimals).
The held-out tokens are a license text's bytes written as a token file (raw uint32), so both sides read the same
ids; llama3_train packs them into sequences of seq_len + 1 tokens overlapping by one, as this script does.

Needs the build (llama3_train, zero3) and the Python environment of tools/hf_venv.sh:
  python=$(bash examples/llama3/tools/hf_venv.sh)
  $python examples/llama3/tools/check_hf_export.py --build build
Prints one JSON line per precision and exits 1 when a check fails.
"""

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoConfig, LlamaForCausalLM

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
SEQ = 64


def run(cmd, log):
    with open(log, "w") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    text = open(log).read()
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{text}")
    return text


def hf_loss(export_dir, tokens):
    model, info = LlamaForCausalLM.from_pretrained(export_dir, dtype=torch.float32, output_loading_info=True)
    problems = {k: sorted(v) for k, v in info.items() if v}
    n = (len(tokens) - 1) // SEQ
    ids = torch.tensor(np.stack([tokens[i * SEQ:i * SEQ + SEQ + 1] for i in range(n)]).astype(np.int64))
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()  # mean over n * SEQ targets, float32
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return loss, problems, tied


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory (bin/llama3_train)")
    parser.add_argument("--model", default="configs/models/llama-3-tiny-tied.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work", default=None, help="where the runs write (default: a temporary directory)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="check-hf-export-")
    os.makedirs(work, exist_ok=True)
    train = os.path.join(os.path.abspath(args.build), "bin", "llama3_train")
    zero3 = os.path.join(os.path.abspath(args.build), "bin", "zero3")

    text = open("/usr/share/common-licenses/Apache-2.0", "rb").read()
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint32)
    eval_file = os.path.join(work, "eval.u32")
    tokens.astype("<u4").tofile(eval_file)
    model_config = json.load(open(os.path.join(ROOT, args.model)))
    # ZeRO-3 with the precision and batch left to the flags, as Hugging Face's integration runs it.
    deepspeed = os.path.join(work, "ds_config.json")
    json.dump({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
               "bf16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
               "zero_optimization": {"stage": 3}}, open(deepspeed, "w"))

    failed = False
    for precision in ("fp32", "bf16"):
        out = os.path.join(work, precision)
        common = ["--model", args.model, "--deepspeed", deepspeed, "--seq-len", str(SEQ), "--micro-batch", "4", "--grad-accum", "2",
                  "--precision", precision, "--device", "cpu", "--lr", "3e-3", "--eval-data", eval_file]
        run([zero3, "launch", "-n", "2", "--", train, *common, "--data", "/usr/share/common-licenses",
             "--steps", str(args.steps), "--warmup-steps", "5", "--consolidate-to", out + "/hf",
             "--metrics", out + "/metrics.csv"], out + ".train.log")
        rows = list(csv.DictReader(open(out + "/metrics.csv")))
        zero3_loss = float(rows[-1]["eval_loss"])

        loss, problems, tied = hf_loss(out + "/hf", tokens)
        dtype = str(AutoConfig.from_pretrained(out + "/hf").dtype)
        want_dtype = "torch.bfloat16" if precision == "bf16" else "torch.float32"

        reload_log = run([zero3, "launch", "-n", "3", "--", train, *common, "--model", out + "/hf/config.json",
                          "--init-from", out + "/hf", "--steps", "0", "--metrics", "none"], out + ".reload.log")
        m = re.search(r"eval after step 0 \| loss ([0-9.]+)", reload_log)
        reload_loss = float(m.group(1)) if m else float("nan")

        rel = abs(loss - zero3_loss) / zero3_loss
        ok = (not problems and tied == bool(model_config.get("tie_word_embeddings")) and dtype == want_dtype
              and rel <= 1e-5 and abs(reload_loss - zero3_loss) <= 0.5e-4 + 1e-9)
        failed |= not ok
        print(json.dumps({
            "precision": precision, "ok": ok, "llama3_train_eval_loss": zero3_loss, "transformers_loss": loss,
            "relative_difference": rel, "reloaded_in_zero3_3_ranks": reload_loss, "loading_problems": problems,
            "lm_head_is_embedding": tied, "config_dtype": dtype, "steps": args.steps, "work": work,
            "torch": torch.__version__, "transformers": transformers.__version__}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
