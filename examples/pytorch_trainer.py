"""Train a tiny model with DistributedDataParallel through ``gpulayer.torch.Trainer``.

``python examples/pytorch_trainer.py`` (with workers started, see
examples/distributed_allreduce/README.md) submits this same file as the entry on
``--nodes`` x ``--nproc-per-node`` processes, streams every rank's output here and exits
non-zero if the job fails. On the workers the file runs as a script (``--worker``): a
linear regression on random data, gloo on the CPU, NCCL when granted CUDA devices.

Add ``--accelerator cuda --gpus-per-node 8`` to ask for GPUs: the job then also needs
``torch.cuda`` on the worker, and a worker that lacks it is turned down with a reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def train(epochs: int) -> None:
    """What each rank runs (torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    use_cuda = torch.cuda.is_available() and os.environ.get("GPULAYER_ACCELERATOR") == "cuda"
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    true_w = torch.tensor([[1.0, -2.0, 3.0, 0.5]], device=device)
    for epoch in range(epochs):
        x = torch.randn(64, 4, device=device)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ true_w.T)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    # tear down in order: DDP's communication hooks before the process group, and every rank
    # past the last collective first (torch can abort at exit if gloo threads are still up)
    del ddp, opt
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=None)
    parser.add_argument("--accelerator", default=None)
    parser.add_argument("--gpus-per-node", type=int, default=None)
    opts = parser.parse_args()
    if opts.worker:
        train(opts.epochs)
        return 0

    from gpulayer.errors import JobFailed
    from gpulayer.torch import Trainer

    here = Path(__file__).resolve().parent
    trainer = Trainer(
        Path(__file__).name, bundle=here, nodes=opts.nodes, nproc_per_node=opts.nproc_per_node,
        accelerator=opts.accelerator, gpus_per_node=opts.gpus_per_node,
        args=["--worker", "--epochs", str(opts.epochs)], timeout=600,
    )
    try:
        record = trainer.fit()
    except JobFailed as exc:
        print(f"training failed: {exc}", file=sys.stderr)
        return 1
    print(f"job {record.id} {record.state.value} after {record.attempt} attempt(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
