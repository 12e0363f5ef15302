#!/usr/bin/env python3
"""Validates every YAML manifest under configs/k8s (ctest: unit.llama3.k8s_manifests).

Each file is filled in the way docs/llama3-8b-on-eks.md says (envsubst of its ${VARS} with sample values) and
parsed with PyYAML. A TrainJob must be Kubeflow Trainer v2's (trainer.kubeflow.org/v1alpha1) with the fields the
controller requires, request GPUs and EFA interfaces, mount /dev/shm, add IPC_LOCK, and start llama3_train through
torchrun --no-python; every flag in its args must be one that `llama3_train --help` lists, the config files it
names must be files of this repository (installed under share/zero3), and the args must resolve: the program's
own --dry-run runs with them (world size = numNodes x numProcPerNode), which reads the model and DeepSpeed configs.
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

SAMPLE_ENV = {"IMAGE": "registry.example.com/zero3:test", "NODE_NUM": "4", "GPU_PER_NODE": "4", "EFA_PER_NODE": "1"}
INSTALL_SHARE = "/opt/zero3/share/zero3/"

failures = []


def fail(path, message):
    failures.append(f"{path}: {message}")


def get(doc, dotted):
    node = doc
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def substitute(text, path):
    def repl(m):
        name = m.group(1) or m.group(2)
        if name not in SAMPLE_ENV:
            fail(path, f"${{{name}}} is not one of the variables the docs tell envsubst to fill: {sorted(SAMPLE_ENV)}")
            return "x"
        return SAMPLE_ENV[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, text)


def help_flags(train):
    out = subprocess.run([train, "--help"], check=True, capture_output=True, text=True).stdout
    flags = set(re.findall(r"^\s+--([a-z0-9-]+)", out, flags=re.M))
    if "model" not in flags or "deepspeed" not in flags:
        raise SystemExit(f"{train} --help lists no --model/--deepspeed: {out[:400]}")
    return flags


def check_trainjob(path, doc, flags, train, root):
    if doc.get("apiVersion") != "trainer.kubeflow.org/v1alpha1":
        fail(path, f"apiVersion {doc.get('apiVersion')!r}, expected trainer.kubeflow.org/v1alpha1 (Trainer v2)")
    for field in ["metadata.name", "spec.runtimeRef.name", "spec.trainer.image", "spec.trainer.numNodes",
                  "spec.trainer.numProcPerNode", "spec.trainer.command", "spec.trainer.args"]:
        if get(doc, field) in (None, "", []):
            fail(path, f"{field} is missing")
    name = get(doc, "metadata.name") or ""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63:
        fail(path, f"metadata.name {name!r} is not a DNS-1035 label")
    nodes, procs = get(doc, "spec.trainer.numNodes"), get(doc, "spec.trainer.numProcPerNode")
    if not isinstance(nodes, int) or nodes < 1:
        fail(path, f"spec.trainer.numNodes {nodes!r} is not a positive integer after envsubst")
    if not isinstance(procs, (int, str)):
        fail(path, f"spec.trainer.numProcPerNode {procs!r} must be an integer or a string")
    limits = get(doc, "spec.trainer.resourcesPerNode.limits") or {}
    for res in ["nvidia.com/gpu", "vpc.amazonaws.com/efa"]:
        if res not in limits:
            fail(path, f"spec.trainer.resourcesPerNode.limits has no {res}")
    if str(limits.get("nvidia.com/gpu")) != str(procs):
        fail(path, f"nvidia.com/gpu {limits.get('nvidia.com/gpu')!r} differs from numProcPerNode {procs!r}")

    command = get(doc, "spec.trainer.command") or []
    if command[:2] != ["torchrun", "--no-python"] or not str(command[-1]).endswith("/llama3_train"):
        fail(path, f"command {command!r}: expected torchrun --no-python .../llama3_train")
    args = [str(a) for a in get(doc, "spec.trainer.args") or []]
    local_args = []
    for a in args:
        m = re.fullmatch(r"--([a-z0-9-]+)(=(.*))?", a)
        if not m:
            fail(path, f"argument {a!r} is not of the form --flag or --flag=value")
            continue
        flag = m.group(1)
        known = flag in flags or (flag.startswith("no-") and flag[3:] in flags)
        if not known:
            fail(path, f"argument {a!r}: llama3_train --help has no --{flag}")
        value = m.group(3)
        if value and value.startswith(INSTALL_SHARE):
            repo_file = os.path.join(root, value[len(INSTALL_SHARE):])
            if not os.path.isfile(repo_file):
                fail(path, f"argument {a!r}: {repo_file} does not exist in the repository")
            a = f"--{flag}={repo_file}"
        local_args.append(a)

    # The pod spec the runtime patch adds: /dev/shm in memory and IPC_LOCK for pinned memory.
    text = yaml.safe_dump(doc)
    if "mountPath: /dev/shm" not in text or "medium: Memory" not in text:
        fail(path, "no in-memory volume mounted at /dev/shm")
    if "IPC_LOCK" not in text:
        fail(path, "the container does not add the IPC_LOCK capability (pinned host memory)")

    # The args resolve: the program's dry run with them, for the job's world size.
    if isinstance(nodes, int) and str(procs).isdigit():
        world, per_node = nodes * int(procs), int(procs)
        cmd = [train] + local_args + ["--dry-run", f"--world-size={world}", f"--ranks-per-node={per_node}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or "per node" not in r.stdout:
            fail(path, f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-800:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    flags = help_flags(a.train)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.configs) for f in fs if f.endswith((".yaml", ".yml")))
    if not files:
        raise SystemExit(f"no YAML files under {a.configs}")
    trainjobs = 0
    for path in files:
        with open(path) as f:
            text = substitute(f.read(), path)
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            fail(path, f"not valid YAML: {e}")
            continue
        for doc in docs:
            if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
                fail(path, "a document without apiVersion and kind")
                continue
            if doc["kind"] == "TrainJob":
                trainjobs += 1
                check_trainjob(path, doc, flags, a.train, a.root)
        print(f"{path}: {len(docs)} document(s) parsed")
    if trainjobs == 0:
        fail(a.configs, "no TrainJob manifest")
    for f in failures:
        print("FAIL", f)
    print(f"{len(files)} file(s), {trainjobs} TrainJob(s), {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
