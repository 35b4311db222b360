"""How long one placement pass takes: 10,000 queued jobs on 1,000 workers, reasons recorded.

    .venv/bin/python bench/placement.py [--runs 7] [--jobs 10000] [--workers 1000]

Prints, for each scenario, the median and minimum of ``place()`` over several runs (and the
median of its CPU time, which a loaded machine disturbs less) next to
two floors measured in the same process on the same inputs:

* ``floor: pairs`` -- merely visiting every (job, worker class) pair once (what any
  scheduler that looks at each job against each kind of worker must at least do);
* ``floor: sort`` -- sorting the queue by (priority, seq), the least any pass does;
* ``floor: output`` -- building one (empty) ``PlacementDecision`` per job into a dict, as
  a pass that kept no decision shared would at least do (with garbage collection paused,
  as ``place()`` has it: see :mod:`gpulayer.scheduling.collector`).

``gc after`` is a full garbage collection run right after each pass: the most that the
collections ``place()`` defers (it pauses automatic collection while it runs) can cost
later, when collection resumes. Without the pause they ran during the pass, several times.

Scenarios: ``fresh`` (an idle fleet: the pass fills it), ``busy`` (most devices already
in use: most jobs wait), ``noisy`` (every worker reports a slightly different RAM size,
so no two workers share a class: the worst case for the class cache).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulayer.records import PlacementDecision
from gpulayer.scheduling import QueuedJob, WorkerState, place
from gpulayer.scheduling.collector import collection_paused
from gpulayer.scheduling.shapes import class_key
from tests.factories import (
    make_cuda_devices,
    make_distributed_job,
    make_job,
    make_mps_device,
    make_worker,
)


def build_fleet(n: int, rng: random.Random, *, busy: float, noisy: bool) -> list[WorkerState]:
    fleet: list[WorkerState] = []
    for i in range(n):
        wid = f"wkr-{i:012x}"
        extra = (i * 0.001) if noisy else 0.0
        r = i % 100
        if r < 30:  # 8 x H100, current torch
            rec = make_worker(wid, devices=make_cuda_devices(8, memory_gb=80, cc="9.0"),
                              frameworks={"torch": "2.3.1+cu121", "torch.cuda": "2.3.1+cu121", "jax": "0.4.30"},
                              cpu_count=96, memory_gb=1024 + extra, cpu_slots=4, origin="existing")
        elif r < 55:  # 1 x A10, older torch
            rec = make_worker(wid, devices=make_cuda_devices(1, memory_gb=24, cc="8.6"),
                              frameworks={"torch": "2.1.0", "torch.cuda": "2.1.0"},
                              cpu_count=16, memory_gb=64 + extra, python_version="3.10.12", origin="existing")
        elif r < 65:  # 4 x A100 40GB, local
            rec = make_worker(wid, devices=make_cuda_devices(4, memory_gb=40, cc="8.0"),
                              frameworks={"torch": "2.2.2", "torch.cuda": "2.2.2", "cupy": "13.1.0"},
                              cpu_count=64, memory_gb=512 + extra, cpu_slots=2)
        elif r < 97:  # CPU boxes
            rec = make_worker(wid, frameworks={"numpy": "1.26.4", "torch": "2.3.1+cpu"},
                              cpu_count=32, memory_gb=128 + extra, cpu_slots=8, origin="existing")
        else:  # Apple laptops
            rec = make_worker(wid, devices=[make_mps_device(32)], frameworks={"mlx": "0.16.0", "torch": "2.3.1"},
                              os="darwin", arch="arm64", cpu_count=12, memory_gb=32 + extra)
        ws = WorkerState(record=rec)
        for d in rec.capabilities.devices:
            if rng.random() < busy:
                ws.busy_devices.add((d.kind, d.index))
        ws.busy_cpu_slots = sum(1 for _ in range(rec.cpu_slots) if rng.random() < busy)
        fleet.append(ws)
    return fleet


def build_queue(n: int, rng: random.Random) -> list[QueuedJob]:
    shapes = [
        (30, make_job(target="remote", cpus=4)),                                        # cpu
        (10, make_job(target="remote", fallback=["local"], memory_gb=64)),             # cpu, big RAM
        (25, make_job(target="remote", accelerator="cuda", frameworks={"torch": ">=2.2"})),   # 1 GPU
        (10, make_job(target="remote", accelerator="cuda")),                           # 1 GPU, any
        (6, make_job(target="remote", fallback=["local"], accelerator="cuda", gpus=8,
                     frameworks={"torch": ">=2.2", "torch.cuda": ""})),                 # 8 GPU
        (4, make_job(target="local", fallback=["remote"], accelerator="cuda", gpus=4,
                     min_gpu_memory_gb=40, compute_capability=">=8.0")),
        (3, make_distributed_job(2, target="remote", accelerator="cuda", gpus=8)),     # 2-node gang
        (3, make_job(target="local", accelerator="mps", frameworks={"mlx": ">=0.10"})),
        (3, make_job(target="remote", accelerator="cuda", frameworks={"jax": ">=0.5"})),   # unschedulable
        (3, make_job(target="cloud", accelerator="cuda")),                              # unschedulable
        (3, make_job(target="local", accelerator="rocm")),                              # unschedulable
    ]
    weights = [w for w, _ in shapes]
    specs = [s for _, s in shapes]
    out = []
    for i in range(n):
        spec = rng.choices(specs, weights)[0]
        if rng.random() < 0.05:
            spec = spec.model_copy(update={"priority": 10})
        out.append(QueuedJob(id=f"job-{i:06d}", spec=spec, seq=i, queued_at=rng.uniform(0, 1000)))
    return out


def floor_pairs(queue: list[QueuedJob], fleet: list[WorkerState]) -> float:
    t = time.perf_counter()
    classes = {class_key(ws.record) for ws in fleet}
    n = 0
    for _ in queue:
        for _ in classes:
            n += 1
    return time.perf_counter() - t


def floor_sort(queue: list[QueuedJob], fleet: list[WorkerState]) -> float:
    t = time.perf_counter()
    sorted(queue, key=lambda q: (-q.spec.priority, q.seq))
    return time.perf_counter() - t


def floor_output(queue: list[QueuedJob], fleet: list[WorkerState]) -> float:
    with collection_paused():
        t = time.perf_counter()
        {q.id: PlacementDecision(outcome="waiting", summary="waiting", at=1000.0) for q in queue}
        return time.perf_counter() - t


def timed_place(queue: list[QueuedJob], fleet: list[WorkerState]) -> tuple[float, float, float, object]:
    """The pass (wall and CPU time), then a full collection with its result alive (what the
    pass left to collect)."""
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    result = place(queue, fleet, now=1000.0, reserve_after=600.0)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    t = time.perf_counter()
    gc.collect()
    return dt, dc, time.perf_counter() - t, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1_000)
    args = ap.parse_args()

    print(f"place(): {args.jobs} queued jobs, {args.workers} workers, reasons recorded, "
          f"{args.runs} runs, one core (Python {sys.version.split()[0]})\n")
    header = (f"{'scenario':8} {'classes':>7} {'assigned':>8} {'waiting':>7} {'unsched':>7} "
              f"{'place med':>10} {'place min':>10} {'place cpu':>10} {'gc after':>9} "
              f"{'floor: pairs':>13} {'floor: sort':>12} {'floor: output':>14} "
              f"{'place/pairs':>11} {'place/output':>12}")
    print(header)
    print("-" * len(header))
    for name, busy, noisy in (("fresh", 0.0, False), ("busy", 0.7, False), ("noisy", 0.3, True)):
        rng = random.Random(42)
        fleet = build_fleet(args.workers, rng, busy=busy, noisy=noisy)
        queue = build_queue(args.jobs, rng)
        times, cpus, gcs, pairs, sorts, outs = [], [], [], [], [], []
        result = None
        for _ in range(args.runs):
            result = None
            dt, dc, dgc, result = timed_place(queue, fleet)
            times.append(dt)
            cpus.append(dc)
            gcs.append(dgc)
            pairs.append(floor_pairs(queue, fleet))
            sorts.append(floor_sort(queue, fleet))
            outs.append(floor_output(queue, fleet))
        outcomes = {"assigned": 0, "waiting": 0, "unschedulable": 0}
        for d in result.decisions.values():  # type: ignore[attr-defined]
            outcomes[d.outcome] += 1
        n_classes = len({class_key(ws.record) for ws in fleet})
        med, pmed, omed = statistics.median(times), statistics.median(pairs), statistics.median(outs)
        print(f"{name:8} {n_classes:>7} {outcomes['assigned']:>8} {outcomes['waiting']:>7} "
              f"{outcomes['unschedulable']:>7} {med * 1e3:>8.1f}ms {min(times) * 1e3:>8.1f}ms "
              f"{statistics.median(cpus) * 1e3:>8.1f}ms "
              f"{statistics.median(gcs) * 1e3:>7.1f}ms "
              f"{pmed * 1e3:>11.1f}ms {statistics.median(sorts) * 1e3:>10.1f}ms {omed * 1e3:>12.1f}ms "
              f"{med / pmed:>10.1f}x {med / omed:>11.1f}x")


if __name__ == "__main__":
    main()
