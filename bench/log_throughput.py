"""A task that writes a lot of output: a CommandJob's round trip next to the same process
run by hand with its output read from a pipe, embedded, in the same run.

    python bench/log_throughput.py [--runs 5] [--mb 100] [--lines-mb 10]

Two workloads, each a Python process: ``--mb`` MB in 64 kB writes (a tool that dumps
output), and ``--lines-mb`` MB in 100-byte lines, each its own write (a training loop that
prints, unbuffered as a worker runs it: ``PYTHONUNBUFFERED=1``). The job's output goes
through its worker into the control plane's database, where ``gpulayer jobs logs`` reads
it; the floor's goes into ``subprocess.run(..., stdout=PIPE)`` and nowhere else. The
output of the last job is read back once and checked whole.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import table


def writer(mb: float, size: int) -> tuple[list[str], int]:
    """A Python process that writes ``mb`` MB to stdout in ``size``-byte writes, and how
    many bytes it writes."""
    count = int(mb * 1_000_000) // size
    code = (f"import sys\nline = 'x' * {size - 1} + '\\n'\nw = sys.stdout.write\n"
            f"for _ in range({count}): w(line)\n")
    return [sys.executable, "-c", code], count * size


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--lines-mb", type=float, default=10)
    args = parser.parse_args()
    os.environ["GPULAYER_HOME"] = tempfile.mkdtemp(prefix="gpulayer-bench-")
    import gpulayer as gl
    from gpulayer.client import connect

    connect().ensure_local_worker()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rows = []
    for name, (cmd, size) in ((f"{args.mb:g} MB in 64 kB writes", writer(args.mb, 65536)),
                              (f"{args.lines_mb:g} MB in 100-byte lines", writer(args.lines_mb, 100))):
        got, floor = [], []
        handle = None
        for _ in range(args.runs):  # in turn, so that a change of load weighs on both
            t0 = time.perf_counter()
            handle = gl.submit(gl.CommandJob(command=cmd))
            handle.result(timeout=600)
            got.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.PIPE, env=env, check=True)
            floor.append(time.perf_counter() - t0)
        assert handle is not None
        if len(handle.logs()) != size:
            raise SystemExit(f"{name}: the job's output did not come back whole")
        rows.append((name, got, "subprocess.run, stdout=PIPE", floor))
    print(table(f"a task's output through its worker into the database, embedded, {args.runs} runs each", rows))
    connect().close()


if __name__ == "__main__":
    main()
