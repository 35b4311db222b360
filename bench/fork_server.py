"""What a FunctionJob task costs in the fork server alone: no control plane, no worker.

    python bench/fork_server.py [--tasks 300] [--rounds 5]

A :class:`~gpulayer.worker.forking.ForkServer` runs a no-op ``@gl.remote`` function, one
task after another, as the worker starts them (its request sent to a spare, its output
pipes read, its exit heard). Per task: the wall time from ``start()`` to the exit, and the
CPU of the server and of its children (their user and system time, with the exit's), and
the page faults of each (after a fork the server's own writes fault too: each page it
writes is shared with the spare, and is copied). The floor, from the same run: a process with the same imports
(``gpulayer``, ``gpulayer.sdk``), frozen the same way, that forks a child which exits at once.
Each round gives one figure per measure; the table shows their median and p95. The last
line divides this machine's cores by the CPU a task costs here: no FunctionJob throughput
with one process per task can pass that ceiling on it.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import pct

from gpulayer.worker.forking import ForkServer, unsupported

NOOP = "import gpulayer as gl\n\n\n@gl.remote\ndef noop():\n    return None\n"

FLOOR = """
import gc, os, resource, sys
import gpulayer, gpulayer.remote_functions
gpulayer.remote_functions.warm()
gc.collect(); gc.freeze()
n = int(sys.argv[1])
r0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = lambda a, b: (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / n
print(cpu(r0, r1), cpu(c0, c1), (c1.ru_minflt - c0.ru_minflt) / n, (r1.ru_minflt - r0.ru_minflt) / n)
"""

_HZ = os.sysconf("SC_CLK_TCK")


def _server_pid() -> int:
    me = os.getpid()
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                kids = f.read().split()
        except OSError:
            continue
        if kids:
            return int(kids[0])
    raise SystemExit("the fork server is not a child of this process")


def _usage(pid: int) -> tuple[float, float, float, float]:
    """The server's CPU, its (reaped) children's CPU, their minor faults and its own."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) / _HZ for x in fields[11:15])
    return utime + stime, cutime + cstime, float(fields[8]), float(fields[7])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=300, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if unsupported():
        print(f"fork server: not measured ({unsupported()})")
        return
    with tempfile.TemporaryDirectory(prefix="gl-bench-") as folder:
        measure(Path(folder), args.tasks, args.rounds)


def measure(code: Path, tasks: int, rounds: int) -> None:
    (code / "bench_noop.py").write_text(NOOP)
    # as a worker sends a small spec: in the request, no file
    spec = {"function": "bench_noop:noop", "args": [], "kwargs": {}}
    env = dict(os.environ)
    # as a worker gives it: the bundle's folder before the worker's own PYTHONPATH
    task_env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH", "")) if p)}
    server = ForkServer(sys.executable, env)
    try:
        if server.ready() is not None:
            raise SystemExit(f"the fork server did not start: {server.failed}")
        rows = _rounds(server, code, task_env, spec, tasks, rounds)
    finally:
        server.close()
    _report(rows, tasks, rounds)


def _rounds(server: ForkServer, code: Path, task_env: dict[str, str], spec: dict[str, Any], tasks: int,
            rounds: int) -> dict[str, list[float]]:
    pid = _server_pid()

    def task(i: int) -> None:
        child, out, err = server.start(cwd=str(code), env=task_env, spec=spec, result=str(code / f"r{i}.json"))
        try:
            while os.read(out, 65536):
                pass
            while os.read(err, 65536):
                pass
        finally:
            os.close(out)
            os.close(err)
        if child.wait() != 0:
            raise SystemExit(f"the no-op task failed: {(code / f'r{i}.json').read_text()}")

    rows: dict[str, list[float]] = {k: [] for k in ("wall", "server", "children", "faults", "server faults",
                                                    "floor parent", "floor child", "floor faults",
                                                    "floor parent faults")}
    for i in range(20):  # warm: the module's .pyc written, the first spares forked
        task(i)
    for _ in range(rounds):
        gc.collect()
        before = _usage(pid)
        t0 = time.perf_counter()
        for i in range(tasks):
            task(i)
        wall = (time.perf_counter() - t0) / tasks
        after = _usage(pid)
        rows["wall"].append(wall)
        rows["server"].append((after[0] - before[0]) / tasks)
        rows["children"].append((after[1] - before[1]) / tasks)
        rows["faults"].append((after[2] - before[2]) / tasks)
        rows["server faults"].append((after[3] - before[3]) / tasks)
        floor = subprocess.run([sys.executable, "-c", FLOOR, str(tasks)], check=True, capture_output=True,
                               text=True).stdout.split()
        for name, value in zip(("floor parent", "floor child", "floor faults", "floor parent faults"), floor,
                               strict=True):
            rows[name].append(float(value))
    return rows


def _report(rows: dict[str, list[float]], tasks: int, rounds: int) -> None:
    def cell(name: str, scale: float = 1e3, unit: str = " ms") -> str:
        v = rows[name]
        return f"{statistics.median(v) * scale:.2f}{unit} (p95 {pct(v, 95) * scale:.2f})"

    print(f"fork server, one no-op FunctionJob task after another ({tasks} tasks x {rounds} rounds)")
    print(f"{'measure':<40}{'per task':>28}   {'floor: fork + _exit, same imports':>36}")
    print("-" * 106)
    print(f"{'wall, start() to exit heard':<40}{cell('wall'):>28}")
    print(f"{'CPU of the server':<40}{cell('server'):>28}   {cell('floor parent'):>36}")
    print(f"{'CPU of the child, its exit included':<40}{cell('children'):>28}   {cell('floor child'):>36}")
    print(f"{'page faults of the server':<40}{cell('server faults', 1, ''):>28}   "
          f"{cell('floor parent faults', 1, ''):>36}")
    print(f"{'page faults of the child':<40}{cell('faults', 1, ''):>28}   {cell('floor faults', 1, ''):>36}")
    whole = statistics.median(rows["server"]) + statistics.median(rows["children"])
    floor = statistics.median(rows["floor parent"]) + statistics.median(rows["floor child"])
    print(f"server + child: {whole * 1e3:.2f} ms of CPU a task, {whole / floor:.2f}x the floor's {floor * 1e3:.2f} ms")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"ceiling: {cores} core(s) / {whole * 1e3:.2f} ms = {cores / whole:.0f} tasks/s through fork servers, "
          "before any worker or control plane work")


if __name__ == "__main__":
    main()
