"""Deleting old jobs while the control plane works: what a prune costs the other writers.

    python bench/prune.py [--jobs 20000] [--chunks 20] [--runs 3] [--kept 0] [--bundles 1000]

An embedded control plane's SQLite database (a temporary directory) holds ``--jobs`` ended
jobs with ``--chunks`` log chunks each (copies of one real job's rows, written directly).
Another control plane on the same database is a busy fleet's writer: a heartbeat and a
submit, again and again. Its latency is measured while ``gpulayer jobs prune --older-than
0`` deletes every ended job (``ControlPlane.prune_jobs``), and, as the floor, for as long
again with no prune. A prune deletes in batches so that no writer waits long; the table says
how long they did wait, and the last lines how long each prune and its longest transaction
took. The table is bench/_stats.py's: median, p95, the floor from the same run, the ratio.

``--kept N`` keeps N more jobs (ended after the prune's cut), each naming one of ``--bundles``
bundles stored before it: the prune's last transaction, its search for the bundles no stored
job names, then has jobs to look through. A second row gives the writer's calls during that
transaction, and the last lines how long it took.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import pct, table

from gpulayer.control import ControlPlane
from gpulayer.records import TaskState
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store
from tests.factories import make_capabilities

JOB = CommandJob(command=["train"], placement=Placement(on_unschedulable="wait"))


def fill(db: Path, jobs: int, chunks: int, kept: int = 0, bundles: int = 0) -> None:
    """``jobs`` ended jobs with ``chunks`` log chunks each: one real job's rows, copied; and
    ``kept`` jobs that ended after any cut (copies of the job alone), each naming one of
    ``bundles`` bundles stored before any."""
    store = Store(f"sqlite:///{db}")
    cp = ControlPlane(store, heartbeat_timeout=1e9)
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    job = cp.submit(JOB)
    (a,) = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)
    cp.append_logs(a.task_id, worker_id=w, chunks=[("stdout", "epoch 1 loss 0.1234 " * 4 + "\n")])
    cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    cp.deregister_worker(w)
    store.dispose()
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row

    def rows(table: str) -> list[dict[str, object]]:
        return [dict(r) for r in con.execute(f"SELECT * FROM {table} WHERE job_id = ?", (job.id,))]

    template = dict(con.execute("SELECT * FROM gl_jobs WHERE id = ?", (job.id,)).fetchone())
    tasks, logs, events = rows("gl_tasks"), rows("gl_logs"), rows("gl_events")
    con.execute("DELETE FROM gl_jobs")  # (the template goes: every job is a copy)
    for name in ("gl_tasks", "gl_logs", "gl_events"):
        con.execute(f"DELETE FROM {name}")
    with con:
        for i in range(jobs):
            jid, tid = f"job-{i:012x}", f"tsk-{i:012x}"
            con.execute(f"INSERT INTO gl_jobs ({', '.join(template)}) VALUES ({', '.join('?' * len(template))})",
                        [*({**template, "id": jid, "idempotency_key": None}.values())])
            for name, copies, n in (("gl_tasks", tasks, 1), ("gl_logs", logs, chunks), ("gl_events", events, 1)):
                for r in copies:
                    cols = [c for c in r if c != "id" or name == "gl_tasks"]
                    values = {**r, "job_id": jid, "task_id": tid, "id": tid}
                    con.executemany(f"INSERT INTO {name} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                    [[values[c] for c in cols]] * n)
        digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(bundles if kept else 0)]
        con.executemany("INSERT INTO gl_bundles (digest, size, data, created_at) VALUES (?, 0, ?, 0)",
                        [(d, b"") for d in digests])
        spec = json.loads(str(template["spec"]))
        for i in range(kept if digests else 0):  # (each bundle named, where there are enough jobs)
            row = {**template, "id": f"job-k{i:011x}", "idempotency_key": None, "created_at": 1e12, "updated_at": 1e12,
                   "spec": json.dumps({**spec, "bundle_digest": digests[i % len(digests)]})}
            if "bundle_digest" in row:  # (schema 11: the spec's, in a column of its own)
                row["bundle_digest"] = digests[i % len(digests)]
            con.execute(f"INSERT INTO gl_jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", [*row.values()])
    con.close()


@contextlib.contextmanager
def writer(db: Path) -> Iterator[list[tuple[float, float]]]:
    """A second control plane on ``db`` that heartbeats and submits until the block ends:
    each call's start (``time.perf_counter``) and seconds."""
    store = Store(f"sqlite:///{db}")
    cp = ControlPlane(store, heartbeat_timeout=1e9)
    w = cp.register_worker(make_capabilities(), cpu_slots=0).id
    took: list[tuple[float, float]] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            cp.heartbeat(w)
            cp.submit(JOB)
            took.append((t, time.perf_counter() - t))
            stop.wait(0.02)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield took
    finally:
        stop.set()
        thread.join()
        cp.deregister_worker(w)
        store.dispose()


def timed_writes(store: Store) -> list[tuple[float, float]]:
    """When each of ``store``'s write transactions takes the writers' lock, from now on
    (``time.perf_counter``), and for how many seconds it holds it."""
    held: list[tuple[float, float]] = []
    real = store.write

    @contextlib.contextmanager
    def timed(*a: object, **kw: object) -> Iterator[object]:
        with real(*a, **kw) as s:  # type: ignore[arg-type]
            t = time.perf_counter()
            yield s
        held.append((t, time.perf_counter() - t))

    store.write = timed  # type: ignore[method-assign,assignment]
    return held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kept", type=int, default=0)
    ap.add_argument("--bundles", type=int, default=1000)
    args = ap.parse_args()
    during: list[float] = []
    during_bundles: list[float] = []
    floor: list[float] = []
    lines = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpulayer-bench-") as tmp:
            db = Path(tmp) / "gpulayer.db"
            fill(db, args.jobs, args.chunks, args.kept, args.bundles)
            cp = ControlPlane(Store(f"sqlite:///{db}"), heartbeat_timeout=1e9)
            held = timed_writes(cp.store)
            with writer(db) as took:
                time.sleep(0.2)
                t = time.perf_counter()
                pruned = cp.prune_jobs(older_than=0)
                seconds = time.perf_counter() - t
                time.sleep(0.1)
            # the writer's calls that overlapped the prune (at least the first after its start)
            overlapped = [d for start, d in took if start < t + seconds and start + d > t]
            overlapped = overlapped or [next(d for start, d in took if start >= t)]
            during += overlapped
            b_start, b_held = held[-1]  # (the bundle pass: a prune's last transaction)
            during_bundles += [d for start, d in took if start < b_start + b_held and start + d > b_start] or [
                next(d for start, d in took if start >= b_start)]
            with writer(db) as took:
                time.sleep(max(0.5, min(seconds, 5.0)))
            floor += [d for _, d in took[1:]]
            assert pruned.jobs == args.jobs and pruned.bundles == max(0, args.bundles - args.kept) * (args.kept > 0), pruned
            cp.store.dispose()
            lines.append(f"run {run + 1}: pruned {pruned.jobs} jobs ({args.jobs * args.chunks} log chunks) in "
                         f"{seconds:.2f} s, {len(held)} write transactions, the longest {max(d for _, d in held) * 1e3:.0f} ms, "
                         f"the writer's longest call {max(overlapped) * 1e3:.0f} ms (p95 {pct(overlapped, 95) * 1e3:.1f} ms); "
                         f"the bundle pass ({args.bundles if args.kept else 0} bundles, {args.kept} jobs kept) {b_held * 1e3:.1f} ms")
    print(table(f"a writer beside a prune of {args.jobs} ended jobs, embedded SQLite ({args.runs} runs)", [
        ("heartbeat + submit, during a prune", during, "the same, no prune", floor),
        ("the same, during its bundle pass", during_bundles, "the same, no prune", floor)]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
