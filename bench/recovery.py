"""How fast GPUlayer recovers from a worker killed with -9, against the floor it cannot beat.

    python bench/recovery.py [--runs 5] [--timeout 10]

One `gpulayer server start` on loopback and two remote workers. Each run submits a job that
sleeps, kills the worker running it with SIGKILL as soon as it runs, and measures the time
from the kill to the retry starting on the other worker. The floor is the heartbeat timeout
(GPULAYER_HEARTBEAT_TIMEOUT): a silent worker cannot be told from a slow one sooner. Printed:
median, p95 and the ratio to the floor. The killed worker is started again between runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpulayer.client import http_client  # noqa: E402
from gpulayer.records import JobState  # noqa: E402
from gpulayer.specs import CommandJob, Placement  # noqa: E402
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=10.0, help="GPULAYER_HEARTBEAT_TIMEOUT of the server")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-recovery-"))
    srv = ServerProc(tmp / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": str(args.timeout)}).start()
    admin = Api(srv.url, srv.admin_token)
    join = admin.token_for("join")["token"]
    workers = {i: start_remote_worker(srv.url, join, tmp / f"w{i}", cpu_slots=1) for i in range(2)}
    c = http_client(srv.url, token=srv.admin_token, retry_for=30)
    times: list[float] = []
    try:
        wait_workers(admin, 2)
        for run in range(args.runs):
            job = c.submit(CommandJob(command=["sleep", "60"], retries=1, placement=Placement(target="remote")))
            while (j := c.api.get_job(job.id)).state is not JobState.RUNNING:
                time.sleep(0.05)
            pids = {w["id"]: w["pid"] for w in admin("GET", "/v1/workers").json()}
            victim = next(i for i, p in workers.items() if p.pid == pids[j.tasks[-1].worker_id])
            workers[victim].send_signal(signal.SIGKILL)
            killed = time.time()
            workers[victim].wait(10)
            while len((j := c.api.get_job(job.id)).tasks) < 2 or j.tasks[-1].started_at is None:
                time.sleep(0.05)
            times.append((j.tasks[-1].started_at or 0) - killed)
            c.api.cancel(job.id)
            workers[victim] = start_remote_worker(srv.url, join, tmp / f"w{victim}-{run}", cpu_slots=1)
            wait_workers(admin, 2)
            print(f"run {run + 1}: retry started {times[-1]:.2f} s after the kill", file=sys.stderr)
    finally:
        for w in workers.values():
            stop_proc(w, signal.SIGKILL)
        srv.stop()
    med = statistics.median(times)
    p95 = sorted(times)[max(0, round(0.95 * len(times)) - 1)]
    print(f"\n{'measure':<38}{'median':>9}{'p95':>9}{'floor':>9}{'ratio':>8}")
    print(f"{'worker kill -9 -> retry started':<38}{med:>8.2f}s{p95:>8.2f}s{args.timeout:>8.2f}s"
          f"{med / args.timeout:>7.2f}x")
    print(f"(floor: the heartbeat timeout; {args.runs} runs; load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
