"""A function that returns a large result: submit to result, next to the same function and
its result's JSON round trip in one process, in the same run.

    python bench/result_size.py [--mb 7 1] [--runs 5] [--list 10] [--no-server]

Embedded (a temporary home, the SDK's own worker): a ``@gl.remote`` function returns a list
of small dicts that is about ``--mb`` MB of JSON, ``--runs`` times, each size in turn with its
floor: the same function called here, its result written with ``json.dumps`` and read back
with ``json.loads`` (what any way of handing a result from one process to another costs at
least). The first size also through a ``gpulayer server start`` (HTTP, SQLite) and a
``gpulayer worker start`` joined to it, in turn with the rest (``--no-server``: not). Then
the list of jobs (``list_jobs(state="succeeded", limit=N)``, what ``jobs list`` and the dashboard
read) with ``--list`` N jobs of the first size stored, next to the same list of as many
jobs that have no result (failed ones: ``state="failed"``). Prints the table of
bench/_stats.py.
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

#: about this many bytes of JSON an item (see ITEMS)
ITEM_BYTES = 73
ITEMS = '''
def items(n):
    return [{"i": i, "name": f"item-{i}", "score": i * 0.5, "tags": ["a", "b"]} for i in range(n)]


def fails(n):
    raise ValueError("no result")
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[7.0, 1.0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--list", type=int, default=10, help="jobs of the first size in the listed (0 skips)")
    parser.add_argument("--server", action=argparse.BooleanOptionalAction, default=True,
                        help="the first size through a server too (default)")
    args = parser.parse_args()
    tmp, code, bench_items = function_home("bench_items", ITEMS)

    import gpulayer as gl

    remote = gl.remote(bench_items.items)
    remote.remote(10).result(timeout=120)  # the worker, its fork server
    served = _served(tmp, code, remote) if args.server else None
    rows = []
    try:
        for mb in args.mb:
            n = int(mb * 1_000_000 / ITEM_BYTES)
            size = len(json.dumps(bench_items.items(n)))
            got, floor, through = [], [], []
            for _ in range(args.runs):  # (in turn, so that a change of load weighs on all)
                t0 = time.perf_counter()
                value = remote.remote(n).result(timeout=600)
                got.append(time.perf_counter() - t0)
                if len(value) != n:
                    raise SystemExit(f"{mb:g} MB: the result did not come back whole")
                del value
                if served is not None and mb == args.mb[0]:
                    client, spec_of = served[0]
                    t0 = time.perf_counter()
                    done = client.wait(client.submit(spec_of(n)).id, timeout=600)
                    through.append(time.perf_counter() - t0)
                    if not isinstance(done.result, list) or len(done.result) != n:
                        raise SystemExit(f"{mb:g} MB through the server: {done.state.value}, not the whole result")
                    del done
                t0 = time.perf_counter()
                json.loads(json.dumps(bench_items.items(n)))
                floor.append(time.perf_counter() - t0)
            rows.append((f"{size / 1e6:.1f} MB result, .remote().result()", got, "items(n), dumps, loads", floor))
            if through:
                rows.append((f"{size / 1e6:.1f} MB, through a server", through, "items(n), dumps, loads", floor))
    finally:
        if served is not None:
            served[1]()
    if args.list:
        from gpulayer.client import connect

        n = int(args.mb[0] * 1_000_000 / ITEM_BYTES)
        gl.wait([remote.remote(n) for _ in range(args.list)], timeout=600)
        gl.wait([gl.remote(bench_items.fails).remote(n) for _ in range(args.list)], timeout=600)
        api = connect().api
        got, floor = [], []
        for _ in range(args.runs):
            for state, samples in (("succeeded", got), ("failed", floor)):  # (in turn)
                t0 = time.perf_counter()
                listed = api.list_jobs(state=state, limit=args.list)
                samples.append(time.perf_counter() - t0)
                if len(listed) != args.list:
                    raise SystemExit(f"list_jobs(state={state!r}) gave {len(listed)} jobs, not {args.list}")
                del listed  # (freed here, not in the next one's time)
        rows.append((f"list_jobs of {args.list} with results", got, f"{args.list} failed (no result)", floor))
    print(table(f"a function's large result, embedded{' and through a server' if args.server else ''}, "
                f"{args.runs} runs each", rows))


def _served(tmp: Path, code: Path, remote: Any) -> tuple[tuple[Any, Callable[[int], Any]], Callable[[], None]]:
    """A ``gpulayer server start`` and a worker joined to it (bench/_served.py): (a client of
    it and the spec of ``items(n)`` for it), and what stops them."""
    client, stop = served_function(tmp, code, remote, 10)
    return (client, lambda n: on_remote(remote.spec(n))), stop


if __name__ == "__main__":
    main()
