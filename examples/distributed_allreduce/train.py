"""All-reduce across every rank of a distributed job (gloo on the CPU, NCCL on NVIDIA GPUs).

Each rank contributes ``rank + 1``; with 2 nodes x 2 processes every rank prints a sum of
10.0 and a world size of 4. Run it from this folder::

    gpulayer worker start --cpu-slots 1 &      # two workers (or two machines)
    gpulayer worker start --cpu-slots 1 &
    gpulayer submit --nodes 2 --nproc-per-node 2 --framework torch --bundle . -- train.py

or from Python: ``gpulayer.torch.launch("train.py", nodes=2, nproc_per_node=2).result()``.
torchrun gives each rank RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    use_cuda = torch.cuda.is_available() and os.environ.get("GPULAYER_ACCELERATOR") == "cuda"
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    print(json.dumps({"rank": rank, "world_size": world, "sum": value.item(),
                      "node": int(os.environ.get("GPULAYER_NODE_RANK", "0")),
                      "backend": dist.get_backend()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
