"""How late a running job's output reaches a follower (``handle.follow()``, what ``gpulayer
jobs logs --follow`` and ``gpulayer submit`` show), next to the same process read by hand.

    python bench/follow_latency.py [--lines 20] [--gap 0.4] [--runs 2]

The job prints ``--lines`` lines, each its own wall-clock time, ``--gap`` to ``2 x --gap``
seconds apart (spread, so that a follower's wait is met at every phase); the follower
takes each line's time off its clock when the chunk is in its hands. Two set-ups, in turn
``--runs`` times: embedded (a temporary home, one ``gpulayer worker start`` on it, the
follower in this process: the worker's appends reach it by a nudge), and a ``gpulayer server
start`` on 127.0.0.1 with one ``gpulayer worker start --url`` (the follower over HTTP). The
floor: the same script run by ``subprocess.Popen`` with its stdout a pipe read line by line.
Prints the table of bench/_stats.py (per line: median, p95 of the lateness) and the worst.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

from gpulayer.specs import CommandJob, Placement


def script(lines: int, gap: float) -> list[str]:
    """A process that prints ``lines`` lines of ``time.time()``, spread gaps apart."""
    code = ("import random, sys, time\n"
            f"for _ in range({lines}):\n"
            f"    time.sleep({gap} * (1 + random.random()))\n"
            "    print(repr(time.time()), flush=True)\n")
    return [sys.executable, "-c", code]


def lateness(chunks: object) -> list[float]:
    """Each line's lateness as the follower gets it (``chunks``: the follow iterator)."""
    late, rest = [], ""
    for c in chunks:  # type: ignore[attr-defined]
        now = time.time()
        if c.stream != "stdout":
            raise SystemExit(f"the job wrote to {c.stream}: {c.data!r}")
        *lines, rest = (rest + c.data).split("\n")
        late += [now - float(line) for line in lines]
    return late


def floor(cmd: list[str]) -> list[float]:
    late = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            late.append(time.time() - float(line))
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.4)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    os.environ["GPULAYER_HOME"] = str(tmp / "home")
    from gpulayer.client import connect, http_client
    from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers

    cmd = script(args.lines, args.gap)
    local = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--name", "bench-follow",
                              "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    server = ServerProc(tmp / "server").start()
    remote = None
    try:
        assert local.stdout is not None and local.stdout.readline(), "the bench's worker did not start"
        admin = Api(server.url, server.admin_token)
        remote = start_remote_worker(server.url, admin.token_for("join")["token"], tmp / "worker")
        wait_workers(admin, 1)
        clients = {"embedded, worker start on the home": (connect(), CommandJob(command=cmd)),
                   "a server (HTTP, SQLite)": (
                       http_client(server.url, token=server.admin_token),
                       CommandJob(command=cmd, placement=Placement(target="remote")))}
        got: dict[str, list[float]] = {name: [] for name in clients}
        base: list[float] = []
        for _ in range(args.runs):  # in turn, so that a change of load weighs on all
            for name, (client, spec) in clients.items():
                job = client.submit(spec)
                got[name] += lateness(client.follow(job.id))
                if len(got[name]) % args.lines:
                    raise SystemExit(f"{name}: the follower did not get every line")
            base += floor(cmd)
        print(table(f"a line's lateness at its follower, {args.runs} x {args.lines} lines "
                    f"{args.gap:g}-{2 * args.gap:g} s apart",
                    [(name, late, "a pipe read by hand", base) for name, late in got.items()]))
        for name, late in got.items():
            print(f"  {name}: worst {max(late) * 1e3:.1f} ms")
    finally:
        local.terminate()
        local.wait(60)
        stop_proc(remote)
        server.stop()


if __name__ == "__main__":
    main()
