"""A DistributedJob's round trip (torchrun on every node), next to the same torchrun commands
started by hand, in the same run.

    python bench/distributed_launch.py [--runs 5] [--nodes 2] [--nproc 1]

Embedded (a temporary home), ``--nodes`` ``gpulayer worker start`` processes of one CPU slot
each, so that every node of the gang goes to its own worker as on a cluster. The job runs
``allreduce.py``: ``torch.distributed`` on gloo, one ``all_reduce`` over the world, each rank
printing the sum. Measured: ``gl.submit(DistributedJob(...)).result()``, submit to result,
``--runs`` times. The floor, in turn with it: the torchrun commands GPUlayer's launcher
gives each node (``python -m torch.distributed.run --nnodes N --node-rank R --rdzv-backend
static --master-addr 127.0.0.1 ...``), started together by hand, until all have exited.
Both pay torch's import in every process (a second or more here); what is left is
GPUlayer's: placing the gang, its start on each worker, the output's storing, the report.
Needs torch; prints the table of bench/_stats.py.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

ALLREDUCE = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(dist.get_rank(), t.item(), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def by_hand(project: Path, nodes: int, nproc: int) -> float:
    """The launcher's torchrun commands, one per node, started together: seconds until all exited."""
    port = free_port()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(rank),
         "--nproc-per-node", str(nproc), "--rdzv-backend", "static", "--rdzv-id", f"bench-{port}",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0", "allreduce.py"],
        cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for rank in range(nodes)]
    codes = [p.wait(timeout=300) for p in procs]
    elapsed = time.perf_counter() - t0
    if any(codes):
        raise SystemExit(f"torchrun by hand exited {codes}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=1, help="processes per node")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    os.environ["GPULAYER_HOME"] = str(tmp / "home")
    project = tmp / "project"
    project.mkdir()
    (project / "allreduce.py").write_text(ALLREDUCE)

    import gpulayer as gl
    from gpulayer.specs import DistributedJob

    workers = [subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--name", f"node-{i}",
                                 "--cpu-slots", "1", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for i in range(args.nodes)]
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline(), "a bench worker did not start"
        job = DistributedJob(nodes=args.nodes, nproc_per_node=args.nproc, entry="allreduce.py",
                             bundle=str(project), timeout=300)
        gl.submit(job).result(timeout=300)  # (the bundle stored and extracted, torch's files cached)
        by_hand(project, args.nodes, args.nproc)
        got, floor = [], []
        for _ in range(args.runs):  # (in turn, so that a change of load weighs on both)
            t0 = time.perf_counter()
            gl.submit(job).result(timeout=300)
            got.append(time.perf_counter() - t0)
            floor.append(by_hand(project, args.nodes, args.nproc))
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    world = f"{args.nodes} node(s) x {args.nproc}"
    print(table(f"a DistributedJob of {world} process(es), gloo all_reduce, {args.runs} runs each", [
        (f"DistributedJob {world}, submit -> result", got, "its torchrun commands by hand", floor)]))


if __name__ == "__main__":
    main()
