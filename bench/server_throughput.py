"""Many no-op FunctionJobs through a ``gpulayer server start``, waited for both ways.

    python bench/server_throughput.py [--jobs 1000] [--rounds 3]

A server on 127.0.0.1 (SQLite in a fresh home), two ``gpulayer worker start`` processes
joined to it with a join token, and this process as the client (``GPULAYER_URL`` and the
admin token the server made). Each round submits ``--jobs`` no-op ``@gl.remote`` calls
with one ``gl.submit_many`` and waits for them with ``gl.wait``, then again with ``for h in
gl.as_completed(handles)`` (which asks the server again after each job it hands out, for
those still running). Per way: jobs/s, the server process's CPU a job, and this process's
CPU a job; the median of the rounds. The floor, from the same run: as many
``subprocess.run([sys.executable, "-c", "pass"])`` from two threads (processes/s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from submit_latency import NOOP, cli, floor_rate, proc_times


def _cpu(pid: int) -> float:
    """The process's own CPU (user and system), in seconds."""
    return sum(proc_times(pid)[:2])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a round (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    code = home / "code"
    code.mkdir()
    (code / "bench_noop.py").write_text(NOOP)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # none of the caller's GPULAYER_* (a database URL, a token): the bench's own server and home
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(GPULAYER_HOME=str(home), PYTHONPATH=str(code))
    server = subprocess.Popen([*cli(), "server", "start", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(1200):  # up to 120 s
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, "the server exited as it started"
                time.sleep(0.1)
        else:
            raise SystemExit("the server did not answer /healthz within 120 s")
        env["GPULAYER_URL"] = url
        token = json.loads(subprocess.run([*cli(), "token", "create", "--join", "--json"], env=env, check=True,
                                          capture_output=True, text=True).stdout)["token"]
        workers = [subprocess.Popen([*cli(), "worker", "start", "--name", f"bench-remote-{i}", "--json",
                                     "--token", token], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                   for i in (1, 2)]
        for w in workers:
            assert w.stdout is not None and w.stdout.readline(), "a bench worker did not start"
        os.environ.update(env)
        sys.path.insert(0, str(code))
        measure(server.pid, args.jobs, args.rounds)
    finally:
        for p in [*workers, server]:
            p.terminate()
        for p in [*workers, server]:
            p.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def measure(server: int, n: int, rounds: int) -> None:
    import bench_noop

    import gpulayer as gl

    warm = gl.submit_many([bench_noop.noop.spec() for _ in range(50)])  # warm: the fork servers
    gl.wait(warm, timeout=600)

    def by_wait(handles: list[gl.JobHandle]) -> None:
        gl.wait(handles, timeout=600)

    def by_as_completed(handles: list[gl.JobHandle]) -> None:
        assert sum(1 for _ in gl.as_completed(handles, timeout=600)) == len(handles)

    def succeeded(handles: list[gl.JobHandle]) -> None:
        """(a round whose jobs failed fast would only look fast)"""
        states = {r.state.value for r in gl.wait(handles, timeout=60)}
        assert states == {"succeeded"}, f"the bench's jobs ended {sorted(states)}"

    ways = {"gl.wait": by_wait, "gl.as_completed": by_as_completed}
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    floors = []
    for _ in range(rounds):
        for name, wait in ways.items():  # in turn, so that a change of load weighs on both
            server0, me0, t0 = _cpu(server), time.process_time(), time.perf_counter()
            handles = gl.submit_many([bench_noop.noop.spec() for _ in range(n)])
            wait(handles)
            seconds = time.perf_counter() - t0
            got[name].append((n / seconds, (_cpu(server) - server0) / n, (time.process_time() - me0) / n))
            succeeded(handles)
        floors.append(floor_rate(n))
    base = statistics.median(floors)
    print(f"{n} no-op FunctionJobs (one gl.submit_many) through a server and two `gpulayer worker start` "
          f"processes; median of {rounds} rounds")
    head = f"{'waited for with':<20}{'jobs/s':>8}{'server CPU a job':>19}{'client CPU a job':>19}{'ratio to floor':>16}"
    print(head)
    print("-" * len(head))
    for name, rows in got.items():
        rate = statistics.median(r[0] for r in rows)
        print(f"{name:<20}{rate:>8.0f}{statistics.median(r[1] for r in rows) * 1e3:>16.2f} ms"
              f"{statistics.median(r[2] for r in rows) * 1e3:>16.2f} ms{rate / base:>15.2f}x")
    print(f"floor: subprocess.run(python -c pass) from two threads, {base:.0f} processes/s")


if __name__ == "__main__":
    main()
