"""Reading one job's output from a database that holds many other jobs' output, next to the
same read of a database that holds only that job's.

    python bench/log_reads.py [--rows 400000] [--chunks 2000] [--jobs 50] [--runs 5]
        [--database sqlite] [--database postgresql://postgres@127.0.0.1:5432/test] [--plans]

One job's ``--chunks`` log chunks (a line each) lie among ``--rows`` chunks of ``--jobs``
other jobs, spread evenly over the first half of the table; the other half is output the
other jobs wrote after the job's last line (a job that ended while others went on). The
floor: a database with the same job's chunks alone. Both are filled once, with the store's
own append (jobs submitted through the control plane, their chunks written in batches), and
ANALYZEd (as autovacuum would have, by the time anyone reads). Then, through the
:class:`~gpulayer.control.ControlPlane`, ``--runs`` times in turn on each: a page from the
start (what ``gpulayer jobs logs`` reads first; the whole output here), a page from the
middle, the page of node 0 from the start (``--node 0``), ``--tail 10``, and a follower's
read after the last chunk (``--follow``'s look: nothing new). The table is bench/_stats.py's:
median, p95, the floor from the same run, the ratio. Each read runs 12 times before it is
timed: a server runs the same statements again and again, and PostgreSQL may plan a statement
psycopg prepared once for every job that reads it (its generic plan), not for this job.

Each ``--database``: ``sqlite`` (a file in a temporary directory) or a PostgreSQL URL, which
gets a fresh schema for the run, dropped afterwards (as the tests do). ``--plans`` prints each
database's plan of the forward page's query (EXPLAIN QUERY PLAN on SQLite, EXPLAIN (ANALYZE,
BUFFERS) on PostgreSQL).
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

from gpulayer.control import ControlPlane
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, plain

JOB = CommandJob(command=["train"], placement=Placement(on_unschedulable="wait"))
#: chunks appended in one transaction while filling
BATCH = 20_000
#: how many times each read runs before it is timed: as in a server that has been up a while,
#: whose statements psycopg prepared (on their 6th run) and PostgreSQL then may plan once for
#: every job (a generic plan, from a prepared statement's 6th run)
WARM = 12


@contextlib.contextmanager
def database(spec: str, tmp: Path, name: str) -> Iterator[str]:
    """A store URL for ``spec``: a fresh SQLite file, or a fresh schema of the PostgreSQL
    server, dropped at the end."""
    if spec == "sqlite":
        yield f"sqlite:///{tmp / f'{name}.db'}"
        return
    import sqlalchemy as sa

    engine = sa.create_engine(spec.replace("postgresql://", "postgresql+psycopg://", 1))
    schema = f"gl_bench_{secrets.token_hex(6)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{spec}{'&' if '?' in spec else '?'}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


def fill(cp: ControlPlane, rows: int, chunks: int, jobs: int) -> str:
    """The job whose output is read, with ``chunks`` chunks among ``rows`` of ``jobs``
    other jobs (none when ``rows`` is 0)."""
    job = cp.submit(JOB).id
    others = [cp.submit(JOB).id for _ in range(jobs if rows else 0)]
    before = rows // 2  # the other jobs' chunks before the job's last one
    batch: list[tuple[str, str, int, str, str, float]] = []
    n = 0

    def add(row: tuple[str, str, int, str, str, float]) -> None:
        batch.append(row)
        if len(batch) >= BATCH:
            flush()

    def flush() -> None:
        with cp.store.write(lock=False) as s:
            plain.add_logs(s, batch)
        batch.clear()

    def other() -> None:
        nonlocal n
        jid = others[n % len(others)]
        add((jid, "tsk-" + jid[4:], 0, "stdout", f"other job step {n} loss 0.{n % 9973:04d} lr 3e-4\n", 1.0))
        n += 1

    for k in range(chunks):
        while n < before * (k + 1) // chunks:
            other()
        add((job, "tsk-" + job[4:], 0, "stdout", f"step {k} loss 0.{k % 9973:04d} lr 3e-4 tokens/s 51234\n", 1.0))
    while n < rows:
        other()
    flush()
    with cp.store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    return job


def plans(cp: ControlPlane, job: str) -> str:
    """The database's plan of the forward page's query (as :func:`queries.logs` runs it)."""
    from sqlalchemy.dialects import postgresql, sqlite

    from gpulayer.api import MAX_LOG_CHUNKS
    from gpulayer.store import queries

    q = queries.log_page_query(job, after=0, node=None, limit=MAX_LOG_CHUNKS)
    engine = cp.store.engine
    if engine.dialect.name == "sqlite":
        sql, how = str(q.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})), "EXPLAIN QUERY PLAN"
    else:
        sql = str(q.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        how = "EXPLAIN (ANALYZE, BUFFERS)"
    with engine.connect() as conn:
        out = [" ".join(str(v) for v in r) for r in conn.exec_driver_sql(f"{how} {sql}")]
    return "\n".join(f"    {line}" for line in out)


def reads(cp: ControlPlane, job: str) -> dict[str, Callable[[], Any]]:
    """What is timed, by name: each a read through the control plane, checked once."""
    all_of = cp.logs(job)
    ids = [c.id for c in all_of]
    middle, last = ids[len(ids) // 2], ids[-1]
    checks = {"page from the start": len(ids), "page from the middle": len(ids) - len(ids) // 2 - 1,
              "page of node 0 from the start": len(ids), "--tail 10": 10, "--follow's read after the last": 0}
    timed: dict[str, Callable[[], Any]] = {
        "page from the start": lambda: cp.logs(job),
        "page from the middle": lambda: cp.logs(job, after=middle),
        "page of node 0 from the start": lambda: cp.logs(job, node=0),
        "--tail 10": lambda: cp.logs(job, tail=10),
        "--follow's read after the last": lambda: cp.logs(job, after=last),
    }
    for name, read in timed.items():
        if len(read()) != checks[name]:
            raise SystemExit(f"{name}: {len(read())} chunks, expected {checks[name]}")
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--database", action="append")
    parser.add_argument("--plans", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    for spec in args.database or ["sqlite"]:
        kind = "SQLite" if spec == "sqlite" else "PostgreSQL"
        with database(spec, tmp, "many") as many_url, database(spec, tmp, "alone") as alone_url:
            many, alone = Store(many_url), Store(alone_url)
            try:
                cp, floor_cp = ControlPlane(many), ControlPlane(alone)
                t0 = time.perf_counter()
                job = fill(cp, args.rows, args.chunks, args.jobs)
                filled = time.perf_counter() - t0
                floor_job = fill(floor_cp, 0, args.chunks, 0)
                got, floor = reads(cp, job), reads(floor_cp, floor_job)
                for _ in range(WARM):
                    for name in got:
                        got[name]()
                        floor[name]()
                samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in got}
                for _ in range(args.runs):  # in turn, so that a change of load weighs on both
                    for name in got:
                        for read, into in ((got[name], samples[name][0]), (floor[name], samples[name][1])):
                            t0 = time.perf_counter()
                            read()
                            into.append(time.perf_counter() - t0)
                print(table(f"{kind}: one job's {args.chunks} chunks among {args.rows} of {args.jobs} other jobs "
                            f"(filled in {filled:.0f} s), {args.runs} runs",
                            [(name, g, "the job's chunks alone", f) for name, (g, f) in samples.items()]))
                if args.plans:
                    print(f"  the forward page's plan, {kind}, among the others:\n{plans(cp, job)}")
            finally:
                many.dispose()
                alone.dispose()


if __name__ == "__main__":
    main()
