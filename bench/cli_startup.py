"""How long the CLI takes to start, as a ratio to ``python -c pass`` measured in the same run.

    python bench/cli_startup.py [-n 9]

Runs each command N times in a fresh ``$GPULAYER_HOME`` (after one warm-up run each, which
also fills the detection cache and keeps the text ``resources detect`` prints there for
its light path, creates the embedded database and writes the bytecode cache, which the
bench keeps in a folder of its own) and prints the median,
the p95, the ``python -c pass`` floor and the ratio of the medians. The goals (issue 11):
``import gpulayer`` <= 2x, ``--help`` and ``jobs list`` <= 3x, ``resources detect`` with
its cache warm <= 3x (and ``jobs logs JOB`` of a job of 200 lines, held to ``jobs list``'s
3x); and ``gpulayer submit -- python -c pass`` (foreground, embedded,
its in-process worker started from the detection cache) <= 2x the floor of ``python -c pass``
plus ``gpulayer --help``: as a user's runs, answered by the CLI server the first command line
started in the background (gpulayer.cli.warm), and in its own process
(``GPULAYER_WARM_CLI=0``). ``gpulayer worker list`` and ``plugins list`` (not goals) are
answered by that CLI server too, and so is ``gpulayer --url URL jobs list`` against a
``gpulayer server start`` on 127.0.0.1 (shown next to the same in its own process).
``gpulayer server start`` is timed to its first answer of ``/healthz`` (a fresh home each
run; its CPU is the server's own at that moment), not a goal: what each server a test or an
operator starts costs.
``import typer`` and ``import typer, pydantic`` are shown for reading:
the least ``gpulayer --help`` can cost, and the least any command that takes an option with
a value can cost (Typer 0.29 coerces every option value that is not a flag through a
pydantic TypeAdapter, so such a command imports pydantic before it runs). ``gpulayer`` runs as
``python -m gpulayer.cli``, which is what the console script does. The CPU time (user + system) of each run is shown too: on a machine
shared with other work it moves less than the wall time. Nothing asserts on these
numbers; they are for reading.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: the row of :func:`server_started`
SERVER = "gpulayer server start -> /healthz"
GOALS = {"import gpulayer": 2.0, "gpulayer --help": 3.0, "gpulayer jobs list": 3.0,
         "gpulayer resources detect": 3.0, "gpulayer jobs logs JOB": 3.0}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run, in ``$GPULAYER_HOME`` (so that the
    current directory, first on ``sys.path``, holds no other copy of GPUlayer)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            cwd=env["GPULAYER_HOME"])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def server_started(home: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall time from ``gpulayer server start`` to its first ``/healthz`` answer, and the
    server's CPU time then; the server is stopped again."""
    import psutil

    from tests.server_support import ServerProc

    server = ServerProc(home, env={"PYTHONPYCACHEPREFIX": env["PYTHONPYCACHEPREFIX"]})
    start = time.perf_counter()
    try:
        server.start()
        wall = time.perf_counter() - start
        assert server.proc is not None
        times = psutil.Process(server.proc.pid).cpu_times()
        return wall, times.user + times.system
    finally:
        server.stop()


def p95(runs: list[float]) -> float:
    ordered = sorted(runs)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=9, help="runs per command (default 9)")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    # Bytecode is cached as an installed GPUlayer's is (pip compiles it; an editable install
    # writes it on first import): with PYTHONDONTWRITEBYTECODE set, as in some CI and dev
    # shells, every run would compile GPUlayer's ~80 modules from source (~200 ms of a
    # submit). It goes to a folder of the bench's own, filled by the warm-up runs.
    env = {**os.environ, "GPULAYER_HOME": home, "PYTHONPYCACHEPREFIX": os.path.join(home, "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # (and for the servers, started with this process's)
    env.pop("GPULAYER_URL", None)
    env.pop("GPULAYER_CLI_SERVER_IDLE", None)  # (the default: a command starts a CLI server)
    py = sys.executable
    cli = [py, "-m", "gpulayer.cli"]
    cases = [
        ("python -c pass", [py, "-c", "pass"]),
        ("import gpulayer", [py, "-c", "import gpulayer"]),
        ("gpulayer --help", [*cli, "--help"]),
        ("gpulayer jobs list", [*cli, "jobs", "list"]),
        ("gpulayer jobs logs JOB", [*cli, "jobs", "logs", "JOB"]),  # (JOB: a job with 200 lines, below)
        ("gpulayer resources detect", [*cli, "resources", "detect"]),
        # (not goals; once the first submit below started the home's CLI server, it answers them)
        ("gpulayer worker list", [*cli, "worker", "list"]),
        ("gpulayer plugins list", [*cli, "plugins", "list"]),
        ("import typer", [py, "-c", "import typer"]),
        ("import typer, pydantic", [py, "-c", "import typer, pydantic"]),
        # last: its warm-up finds the detection cache that resources detect filled, and starts
        # the home's CLI server
        ("gpulayer submit -- python -c pass", [*cli, "submit", "--", py, "-c", "pass"]),
        ("the same, own process", ["env", "GPULAYER_WARM_CLI=0", *cli, "submit", "--", py, "-c", "pass"]),
    ]
    from tests.server_support import ServerProc

    server = ServerProc(Path(home) / "server")
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    try:
        server.start()
        url = [*cli, "--url", server.url, "--token", server.admin_token, "jobs", "list"]
        cases += [("gpulayer --url URL jobs list", url),
                  ("--url jobs list, own process", ["env", "GPULAYER_WARM_CLI=0", *url])]
        runs.update({label: [] for label, _ in cases}, **{SERVER: []})
        cpu.update({label: [] for label, _ in cases}, **{SERVER: []})
        chatty = [*cli, "submit", "--detach", "--", py, "-c", "for i in range(200): print('step', i, 'loss', 0.5)"]
        job_id = subprocess.run(chatty, env=env, cwd=home, capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run([*cli, "jobs", "wait", job_id], env=env, cwd=home, capture_output=True, check=True)
        cases = [(label, [job_id if word == "JOB" else word for word in argv]) for label, argv in cases]
        for _, argv in cases:
            timed(argv, env)  # warm the OS file cache, the detection cache and the database
        server_started(Path(home) / "server-warm-up", env)
        deadline = time.monotonic() + 10  # and the CLI server the first submit started
        while not os.path.exists(os.path.join(home, "cli.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(args.n):  # interleaved, so a burst of load hits every command alike
            for label, argv in cases:
                wall, used = timed(argv, env)
                runs[label].append(wall)
                cpu[label].append(used)
            wall, used = server_started(Path(home) / f"server-{i}", env)
            runs[SERVER].append(wall)
            cpu[SERVER].append(used)
    finally:
        server.stop()
        # the CLI server the first command started, and the local worker the first submit
        # started in the background (it would wait 5 minutes idle for a home that is gone)
        from tests.support import stop_strays

        stop_strays(Path(home), below=True)
        shutil.rmtree(home, ignore_errors=True)
    floor = statistics.median(runs["python -c pass"])
    cpu_floor = statistics.median(cpu["python -c pass"])
    labels = [label for label, _ in cases] + [SERVER]
    width = max(len(label) for label in labels)
    print(f"{'command':<{width}}  {'median':>8}  {'p95':>8}  {'floor':>8}  {'ratio':>6}  "
          f"{'cpu':>8}  {'cpu ratio':>9}  goal")
    for label in labels:
        med = statistics.median(runs[label])
        used = statistics.median(cpu[label])
        goal = GOALS.get(label)
        mark = "" if goal is None else f"<= {goal:.0f}x " + ("ok" if med / floor <= goal else "MISSED")
        print(f"{label:<{width}}  {med * 1000:>6.0f}ms  {p95(runs[label]) * 1000:>6.0f}ms  "
              f"{floor * 1000:>6.0f}ms  {med / floor:>5.1f}x  {used * 1000:>6.0f}ms  {used / cpu_floor:>8.1f}x  {mark}")
    floor_cli = floor + statistics.median(runs["gpulayer --help"])
    for label in ("gpulayer submit -- python -c pass", "the same, own process"):
        submit = statistics.median(runs[label])
        print(f"{label}: {submit * 1000:.0f}ms, {submit / floor_cli:.2f}x the floor of "
              f"python -c pass + gpulayer --help ({floor_cli * 1000:.0f}ms)  <= 2x "
              + ("ok" if submit / floor_cli <= 2 else "MISSED"))
    print(f"({args.n} runs each, python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
