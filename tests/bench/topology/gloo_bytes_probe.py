#!/usr/bin/env python3
"""How many bytes torch's gloo collectives send between the nodes of the simulated cluster: one process per rank,
started by torchrun on each node (bench_topology.sh runs it once, on unshaped links). For all_gather_into_tensor,
reduce_scatter_tensor and all_reduce of a --mib MiB fp32 buffer (the gathered output, the scattered input, the
reduced buffer), each node's first rank reads its link's tx counter (/sys/class/net/eth0/statistics, the node's
namespace) before and after --repeat calls between barriers; rank 0 prints one JSON line with the bytes per call
summed over every node's link, and what a ring over the ranks in node order would send (world-1)/world of the
buffer over each of the nodes' links."""

import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist


def tx_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    world = dist.get_world_size()
    nodes = world // int(os.environ["LOCAL_WORLD_SIZE"])
    counts = int(os.environ["LOCAL_RANK"]) == 0
    n = args.mib * (1 << 20) // 4 // world  # elements per rank
    ops = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(n * world), torch.ones(n)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * world)),
        "all_reduce": lambda: dist.all_reduce(torch.ones(n * world)),
    }
    sent = {}
    for name, op in ops.items():
        dist.barrier()
        before = tx_bytes()
        for _ in range(args.repeat):
            op()
        dist.barrier()
        sent[name] = (tx_bytes() - before) if counts else 0
    totals = torch.tensor([sent[name] for name in ops], dtype=torch.float64)
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        buffer = n * world * 4
        result = {"torch": torch.__version__, "world": world, "nodes": nodes, "buffer_bytes": buffer,
                  "ring_bytes": nodes * buffer * (world - 1) // world}
        result.update({name: int(totals[i]) // args.repeat for i, name in enumerate(ops)})
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
