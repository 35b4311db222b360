"""The CPU of one control-plane transaction on SQLite, next to the driver's own.

    .venv/bin/python bench/transactions.py [--rounds 7] [--n 2000]

A job's cycle runs six or seven transactions in the process that submits and runs it (the
submit, the worker's poll, the task's start and its report, the caller's wait), so what a
transaction costs beyond its statements is paid six or seven times a job. Each measure runs
``--n`` transactions that each read ``SELECT 1``, ``--rounds`` times, and prints the median
and p95 of the rounds' CPU per transaction (``time.process_time``), next to a floor measured
in the same run: the same transaction on the ``sqlite3`` module's own connection.

* ``Store.write`` / ``Store.read``: a thread's transactions on the connection and session it
  keeps (``gpulayer.store._Kept``);
* ``Store.read`` inside another: a transaction begun inside another on the same thread,
  which takes a connection from SQLAlchemy's pool and a new session, as every transaction
  did before the kept connections.

A ``SELECT 1`` changes nothing, so no commit here waits for the disk: the figures are what a
transaction costs the processor (a commit's sync is the disk's time, see docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import pct


def per_call(fn: Callable[[], object], n: int, rounds: int) -> list[float]:
    """CPU seconds per call of ``fn``, one figure per round of ``n`` calls."""
    for _ in range(min(n, 200)):  # warm: the first transactions open and prepare
        fn()
    out = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            fn()
        out.append((time.process_time() - start) / n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    if args.rounds < 1 or args.n < 1:
        parser.error("--rounds and --n: at least 1")

    home = Path(tempfile.mkdtemp(prefix="gpulayer-bench-txn-"))
    os.environ["GPULAYER_HOME"] = str(home)
    from gpulayer.store import Store, plain

    db = home / "bench.db"
    store = Store(f"sqlite:///{db}")
    raw = sqlite3.connect(db, isolation_level=None, check_same_thread=False)

    def write() -> None:
        with store.write() as s:
            plain.fetch(s, "SELECT 1")

    def read() -> None:
        with store.read() as s:
            plain.fetch(s, "SELECT 1")

    def raw_write() -> None:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("SELECT 1").fetchall()
        raw.execute("COMMIT")

    def raw_read() -> None:
        raw.execute("BEGIN")
        raw.execute("SELECT 1").fetchall()
        raw.execute("COMMIT")

    rows = []
    floor_write = per_call(raw_write, args.n, args.rounds)
    floor_read = per_call(raw_read, args.n, args.rounds)
    rows.append(("Store.write", per_call(write, args.n, args.rounds), "sqlite3 BEGIN IMMEDIATE", floor_write))
    rows.append(("Store.read", per_call(read, args.n, args.rounds), "sqlite3 BEGIN", floor_read))
    with store.read():  # every read below begins inside this one: the pool's way
        rows.append(("Store.read inside another", per_call(read, args.n, args.rounds), "sqlite3 BEGIN", floor_read))
    raw.close()
    store.dispose()

    print(f"CPU per transaction (SELECT 1), SQLite; {args.rounds} rounds of {args.n}: "
          "median and p95 of the rounds")
    head = f"{'measure':<28}{'median':>10}{'p95':>10}   {'floor':<24}{'median':>10}{'p95':>10}{'ratio':>8}"
    print(head)
    print("-" * len(head))
    for name, got, floor_name, floor in rows:
        gm, fm = statistics.median(got), statistics.median(floor)
        print(f"{name:<28}{gm * 1e6:>8.1f}us{pct(got, 95) * 1e6:>8.1f}us   {floor_name:<24}"
              f"{fm * 1e6:>8.1f}us{pct(floor, 95) * 1e6:>8.1f}us{gm / fm:>7.1f}x")


if __name__ == "__main__":
    main()
