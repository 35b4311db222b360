"""How long the control plane's incremental placement passes take with a long queue that waits.

    .venv/bin/python bench/placement_incremental.py [--runs 30] [--jobs 10000] [--workers 1000]

The embedded control plane (:class:`gpulayer.control.ControlPlane` over a real SQLite
database in a temporary directory) with ``--workers`` one-GPU workers, every one of them
running a task, and ``--jobs`` one-GPU jobs queued behind them (decided once by a whole
pass, as a server would have). Then, ``--runs`` times each:

* **submit**: one more job arrives (``submit`` places it in its own transaction with an
  incremental pass: the fleet is full, so only the new job is decided);
* **task ends**: a worker reports its task done (``finish_task``; the pass after it stops
  once the fleet is full again: the freed GPU goes to the first job of the queue).

For each: the pass alone (``_place``, inside the operation's transaction) and the whole
operation, next to floors measured in the same run: one empty write transaction, and one
read of the queue's keys (``queries.queue_keys``: what a pass that reads every queued job
reads); in CPU time also the plain reads of the online workers' rows and of what the active
tasks hold, which a pass made every time before the change marks (``gpulayer/store/marks.py``)
and makes now only when the fleet changed. The table is bench/_stats.py's: median, p95, the floor's, the difference, the ratio;
a second table gives the passes' CPU time, which a loaded machine disturbs less.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

from gpulayer.control import ControlPlane
from gpulayer.records import JobState, TaskState, new_id
from gpulayer.scheduling import PlacementResult
from gpulayer.specs import CommandJob, Requirements
from gpulayer.store import JobRow, Store, mapping, marks, queries
from tests.factories import make_capabilities, make_cuda_devices


class TimedControlPlane(ControlPlane):
    """Records how long each placement pass takes, inside its transaction."""

    pass_times: list[float]
    pass_cpu: list[float]

    def _place(self, s: Any, *, new_job: str | None = None, until_full: bool = False) -> PlacementResult | None:
        t, c = time.perf_counter(), time.process_time()
        try:
            return super()._place(s, new_job=new_job, until_full=until_full)
        finally:
            self.pass_times.append(time.perf_counter() - t)
            self.pass_cpu.append(time.process_time() - c)


def gpu_job() -> CommandJob:
    return CommandJob(command=["train"], requirements=Requirements(accelerator="cuda", gpus=1))


def build(root: Path, n_workers: int, n_jobs: int) -> tuple[TimedControlPlane, Store, dict[str, str]]:
    """The control plane with a full fleet and a queue; returns worker id -> its running task."""
    store = Store(f"sqlite:///{root / 'gpulayer.db'}")
    cp = TimedControlPlane(store, heartbeat_timeout=1e9)
    cp.pass_times, cp.pass_cpu = [], []
    caps = make_capabilities(devices=make_cuda_devices(1, memory_gb=80, cc="9.0"),
                             frameworks={"torch": "2.3.0", "torch.cuda": "2.3.0"})
    workers = [cp.register_worker(caps, name=f"gpu-{i}", cpu_slots=0).id
               for i in range(n_workers)]
    spec = gpu_job()
    for _ in workers:  # one task on each: the fleet is full
        cp.submit(spec)
    running: dict[str, str] = {}
    for w in workers:
        for a in cp.poll_tasks(w):
            cp.start_task(a.task_id, worker_id=w)
            running[w] = a.task_id
    spec_json, args_json = mapping.stored_spec(spec, None), None  # (a command job: no arguments)
    now = time.time()
    with store.write() as s:  # the queue behind them, as many submits would have left it
        for i in range(n_jobs):
            s.add(JobRow(id=new_id("job"), kind=spec.kind, spec=spec_json, args=args_json,
                         state=JobState.QUEUED.value, priority=0, created_at=now + i * 1e-6,
                         updated_at=now + i * 1e-6, attempt=0, max_attempts=1))
    cp.schedule()  # a whole pass decides them (and warms the pass's cache, as a server's would be)
    return cp, store, running


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        cp, store, running = build(Path(tmp), args.workers, args.jobs)
        print(f"set up {args.workers} busy workers and {args.jobs} queued jobs in {time.perf_counter() - t:.0f} s")
        submit_pass, submit_op, end_pass, end_op, empty, keys = [], [], [], [], [], []
        submit_cpu, end_cpu, empty_cpu, fleet_reads = [], [], [], []
        spec = gpu_job()
        ids = list(running)
        for i in range(args.runs):
            cp.pass_times.clear()
            cp.pass_cpu.clear()
            t = time.perf_counter()
            job = cp.submit(spec)
            submit_op.append(time.perf_counter() - t)
            submit_pass.append(sum(cp.pass_times))
            submit_cpu.append(sum(cp.pass_cpu))
            assert job.state is JobState.QUEUED, job.state

            w = ids[i % len(ids)]
            cp.pass_times.clear()
            cp.pass_cpu.clear()
            t = time.perf_counter()
            cp.finish_task(running[w], worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
            end_op.append(time.perf_counter() - t)
            end_pass.append(sum(cp.pass_times))
            end_cpu.append(sum(cp.pass_cpu))
            [a] = cp.poll_tasks(w)  # the freed GPU went to the head of the queue
            cp.start_task(a.task_id, worker_id=w)
            running[w] = a.task_id

            t, c = time.perf_counter(), time.process_time()
            with store.write():
                pass
            empty.append(time.perf_counter() - t)
            empty_cpu.append(time.process_time() - c)
            with store.read() as s:
                c = time.process_time()
                queries.online_worker_rows(s)
                marks.active_holdings(s)
                fleet_reads.append(time.process_time() - c)
                t = time.perf_counter()
                queries.queue_keys(s)
                keys.append(time.perf_counter() - t)
        queued = len(cp.list_jobs(state=JobState.QUEUED, limit=args.jobs * 2))
        store.dispose()
    print(table(f"incremental passes: {args.workers} busy workers, {queued} jobs queued, SQLite, "
                f"{args.runs} runs each (ms)", [
        ("pass after a submit", submit_pass, "empty write transaction", empty),
        ("pass after a task ended", end_pass, "empty write transaction", empty),
        ("submit (whole operation)", submit_op, "empty write transaction", empty),
        ("finish_task (whole operation)", end_op, "empty write transaction", empty),
        ("pass after a task ended", end_pass, "read the queue's keys", keys),
    ]))
    print()
    print(table("the same passes in CPU time (this process; the machine may be loaded)", [
        ("pass after a submit, CPU", submit_cpu, "empty write transaction, CPU", empty_cpu),
        ("pass after a task ended, CPU", end_cpu, "empty write transaction, CPU", empty_cpu),
        ("pass after a submit, CPU", submit_cpu, "read the fleet's rows, CPU", fleet_reads),
        ("pass after a task ended, CPU", end_cpu, "read the fleet's rows, CPU", fleet_reads),
    ]))


if __name__ == "__main__":
    main()
