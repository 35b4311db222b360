"""Cancelling a long queue: many jobs at once, next to submitting them.

    python bench/cancel_many.py [--jobs 1000] [--runs 3]

The embedded control plane (:class:`gpulayer.control.ControlPlane` over a real SQLite
database in a temporary directory), one busy one-GPU worker, and ``--jobs`` one-GPU jobs
queued behind it (stored by one ``submit_many``: one transaction, one placement pass,
which is the floor). Then all of them are cancelled, in turn each run:

* with ``cancel_many`` (what ``gl.cancel``, ``gpulayer jobs cancel`` with many ids and a
  script's Ctrl-C at exit send): one transaction and one placement pass a batch of 1,000;
* with one ``cancel`` each, as all of them did before ``cancel_many`` (each cancel runs a
  pass over the queue that is left: quadratic in the queue's length).

The table is bench/_stats.py's: median, p95, the floor's, the difference, the ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

from gpulayer.api import MAX_BATCH
from gpulayer.control import ControlPlane
from gpulayer.records import JobState
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.store import Store
from tests.factories import cuda_caps

SPEC = CommandJob(command=["train"], requirements=Requirements(accelerator="cuda", gpus=1),
                  placement=Placement(on_unschedulable="wait"))


def queue(cp: ControlPlane, n: int) -> tuple[list[str], float]:
    """``n`` queued jobs, and the seconds their ``submit_many`` calls took."""
    t = time.perf_counter()
    ids = [j.id for i in range(0, n, MAX_BATCH) for j in cp.submit_many([SPEC] * min(MAX_BATCH, n - i))]
    return ids, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    floor: list[float] = []
    batch: list[float] = []
    single: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-") as tmp:
        cp = ControlPlane(Store(f"sqlite:///{Path(tmp) / 'gpulayer.db'}"), heartbeat_timeout=1e9)
        w = cp.register_worker(cuda_caps(1), cpu_slots=0)
        cp.submit(SPEC)
        assert cp.poll_tasks(w.id), "the worker's one GPU is busy, so the queue waits"
        for _ in range(args.runs):
            for how, samples in (("batch", batch), ("single", single)):
                ids, took = queue(cp, args.jobs)
                floor.append(took)
                t = time.perf_counter()
                if how == "batch":
                    for i in range(0, len(ids), MAX_BATCH):
                        cp.cancel_many(ids[i:i + MAX_BATCH])
                else:
                    for job_id in ids:
                        cp.cancel(job_id)
                samples.append(time.perf_counter() - t)
                assert {j.state for j in cp.list_jobs(state="queued", limit=1)} == set(), "all cancelled"
        assert cp.list_jobs(limit=1)[0].state is JobState.CANCELLED
    print(table(f"cancel {args.jobs} queued jobs, embedded SQLite ({args.runs} runs of each)", [
        ("cancel_many, 1,000 a call", batch, f"submit_many of the {args.jobs}", floor),
        ("cancel() of each", single, f"submit_many of the {args.jobs}", floor),
    ]))


if __name__ == "__main__":
    main()
