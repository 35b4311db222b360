"""One job after another through a server: submit to result, next to the same command run
by hand, in the same run.

    python bench/server_latency.py [--jobs 100]

One ``gpulayer server start`` on 127.0.0.1 (SQLite, a temporary home) and one ``gpulayer
worker start --url`` joined to it; the HTTP client submits a CommandJob ``true`` and waits
for its result (``gl.submit(...).result()`` against a server), ``--jobs`` times in a row,
each right after the last one ended (so the worker's poll made as it reported the last
task is the one that is given the next). The floor: ``subprocess.run(["true"])``. Prints the
table of bench/_stats.py and the median of each step from the job's record (submitted ->
its task started -> ended -> the result in the client's hands).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

from gpulayer.client import http_client
from gpulayer.specs import CommandJob, Placement
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    server = ServerProc(tmp / "server").start()
    admin = Api(server.url, server.admin_token)
    worker = start_remote_worker(server.url, admin.token_for("join")["token"], tmp / "worker", cpu_slots=2)
    try:
        wait_workers(admin, 1)
        client = http_client(server.url, token=server.admin_token)
        spec = CommandJob(command=["true"], placement=Placement(target="remote"))
        for _ in range(5):  # the worker's first tasks, the client's connection
            client.wait(client.submit(spec).id, timeout=120)
        got, floor, steps = [], [], []
        for _ in range(args.jobs):
            t0 = time.time()
            job = client.submit(spec)
            done = client.wait(job.id, timeout=120)
            t1 = time.time()
            got.append(t1 - t0)
            task = done.tasks[-1]
            if task.started_at is not None and task.ended_at is not None:
                steps.append((done.created_at - t0, task.started_at - done.created_at, task.ended_at - task.started_at,
                              t1 - task.ended_at))
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            floor.append(time.perf_counter() - t)
        print(table(f"one job after another through a server (HTTP, SQLite, one remote worker), {args.jobs} jobs",
                    [("submit -> result, CommandJob true", got, "subprocess.run(true)", floor)]))
        for i, name in enumerate(("submitted -> stored", "stored -> task started", "task started -> ended",
                                  "ended -> result in the client")):
            print(f"  {name}: {statistics.median(s[i] for s in steps) * 1e3:.1f} ms")
    finally:
        stop_proc(worker)
        server.stop()


if __name__ == "__main__":
    main()
