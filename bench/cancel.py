"""Cancel to process-tree-gone, embedded, next to killing the same tree by hand.

    python bench/cancel.py [--jobs 20]

Each job runs a Python that starts a child and sleeps; once both run, ``handle.cancel()``
is timed until neither process exists (zombies count as gone). The floor: the same tree
started with ``subprocess.Popen(start_new_session=True)`` and ended with ``os.killpg``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import table

TREE = [sys.executable, "-c", "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tree_of(job_id: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("GPULAYER_JOB_ID") == job_id:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def gone_after(pids: list[int], t0: float) -> float:
    while any(alive(p) for p in pids):
        time.sleep(0.0005)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    os.environ["GPULAYER_HOME"] = tempfile.mkdtemp(prefix="gpulayer-bench-")
    import gpulayer as gl
    from gpulayer.client import connect

    connect().ensure_local_worker()
    got = []
    for _ in range(args.jobs):
        h = gl.submit(gl.CommandJob(command=TREE))
        pids: list[int] = []
        while len(pids) < 2:
            time.sleep(0.01)
            pids = tree_of(h.id)
        t0 = time.perf_counter()
        h.cancel()
        got.append(gone_after(pids, t0))
        h.wait(timeout=60)
    floor = []
    for _ in range(args.jobs):
        proc = subprocess.Popen(TREE, start_new_session=True)
        pids = []
        while len(pids) < 2:
            time.sleep(0.01)
            try:
                pids = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
            except psutil.Error:
                pids = []
        t0 = time.perf_counter()
        os.killpg(proc.pid, signal.SIGTERM)
        floor.append(gone_after(pids, t0))
        proc.wait()
    print(table(f"cancel to process tree gone, embedded, {args.jobs} jobs",
                [("handle.cancel() -> tree gone", got, "os.killpg(SIGTERM) -> tree gone", floor)]))
    connect().close()


if __name__ == "__main__":
    main()
