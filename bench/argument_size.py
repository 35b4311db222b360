"""A function called with large arguments: submit to result, and a read of its record,
next to what handing the arguments to another process costs at least, in the same run.

    python bench/argument_size.py [--mb 0.9] [--runs 7] [--no-server]

Embedded (a temporary home, the SDK's own worker): ``.remote(xs).result()`` of a function
that returns ``len(xs)``, where ``xs`` is a list of small dicts that is about ``--mb`` MB of
JSON (under ``GPULAYER_MAX_ARGS_MB``, 1 MB by default), ``--runs`` times; next to its floor,
``xs`` written with ``json.dumps`` and read back with ``json.loads`` (once: the least any way
of giving them to another process costs), and to the same call with one small argument.
Then ``handle.record()`` of such a job (a read of the whole record, arguments included).
The same through a ``gpulayer server start`` (HTTP, SQLite) and a ``gpulayer worker start``
joined to it, in turn with the rest (``--no-server``: not), with the SDK's ``result()`` and
``record()`` against it. Prints the table of bench/_stats.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _served import function_home, on_remote, served_function
from _stats import table

#: about this many bytes of JSON an item (see items)
ITEM_BYTES = 71
COUNT = "def count(xs):\n    return len(xs)\n"


def items(n: int) -> list[dict[str, Any]]:
    return [{"i": i, "name": f"item-{i}", "score": i * 0.5, "tags": ["a", "b"]} for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, default=0.9, help="MB of arguments (default 0.9)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--server", action=argparse.BooleanOptionalAction, default=True,
                        help="through a server too (default)")
    args = parser.parse_args()
    tmp, code, bench_count = function_home("bench_count", COUNT)

    import gpulayer as gl

    xs = items(int(args.mb * 1_000_000 / ITEM_BYTES))
    size = len(json.dumps(xs))
    remote = gl.remote(bench_count.count)
    remote.remote([]).result(timeout=120)  # the worker, its fork server
    served = _served(tmp, code, remote) if args.server else None
    ways: list[tuple[str, Callable[[Any], Any]]] = [("embedded", remote.remote)]
    if served is not None:
        ways.append(("through a server", served[0]))
    calls: dict[str, list[float]] = {}
    reads: dict[str, list[float]] = {}
    small: dict[str, list[float]] = {}
    floor: list[float] = []
    try:
        for _ in range(args.runs):  # (in turn, so that a change of load weighs on all)
            for way, submit in ways:
                t0 = time.perf_counter()
                handle = submit(xs)
                got = handle.result(timeout=600)
                calls.setdefault(way, []).append(time.perf_counter() - t0)
                if got != len(xs):
                    raise SystemExit(f"{way}: the function saw {got} items, not {len(xs)}")
                t0 = time.perf_counter()
                record = handle.record()
                reads.setdefault(way, []).append(time.perf_counter() - t0)
                if len(record.spec.args[0]) != len(xs):
                    raise SystemExit(f"{way}: the record's arguments did not come back whole")
                del record
                t0 = time.perf_counter()
                submit([1]).result(timeout=600)
                small.setdefault(way, []).append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            json.loads(json.dumps(xs))
            floor.append(time.perf_counter() - t0)
    finally:
        if served is not None:
            served[1]()
    mb = f"{size / 1e6:.2f} MB"
    rows = []
    for way, _ in ways:
        rows.append((f"{mb} of arguments, {way}", calls[way], "the same with [1]", small[way]))
        rows.append((f"  .record() of it, {way}", reads[way], "dumps + loads of them", floor))
    print(table(f"a function called with {mb} of arguments, {args.runs} runs each", rows))


def _served(tmp: Path, code: Path, remote: Any) -> tuple[Callable[[Any], Any], Callable[[], None]]:
    """A ``gpulayer server start`` and a worker joined to it (bench/_served.py): what submits
    ``count(xs)`` to it through the SDK (a handle), and what stops them."""
    import gpulayer as gl

    client, stop = served_function(tmp, code, remote, [])
    return (lambda xs: gl.submit(on_remote(remote.spec(xs)), client=client)), stop


if __name__ == "__main__":
    main()
