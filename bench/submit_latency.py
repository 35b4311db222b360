"""Local job latency and throughput on the embedded control plane, each next to its floor.

    python bench/submit_latency.py [--jobs 50] [--cli 10] [--throughput 1000]

Measured as a user would call it, one job at a time, with the SDK's in-process worker
started beforehand (as in a long session):

* CommandJob ``python -c pass``: ``gl.submit(...).result()``, next to
  ``subprocess.run([sys.executable, "-c", "pass"])``;
* a no-op ``@gl.remote`` function's ``.remote().result()``, next to the same floor;
* ``gpulayer submit -- python -c pass`` (a fresh CLI process each time), next to the floor
  plus the CLI's own start-up (``gpulayer --help``): in the command's own process
  (``GPULAYER_WARM_CLI=0``), answered by the CLI server the first command started (the
  default where no worker runs), and while a ``gpulayer worker start`` runs on the home,
  whose CLI server answers it (Linux);
* a CommandJob submitted by another process that runs no worker of its own (this one's
  runs it): the job's placement and its end cross between processes;
* ``--throughput`` no-op FunctionJobs submitted at once through two local workers (jobs/s),
  next to as many ``subprocess.run`` calls from two threads: workers in this process (the
  SDK's own), then two ``gpulayer worker start`` processes on the same home (with, on
  Linux, the CPU per job of those workers, of their fork servers and of the tasks, read
  from ``/proc``); each both ways: a loop of ``.remote()`` calls, and one
  ``gl.submit_many`` of them all.

Each table row: median and p95, the floor's median and p95, the difference and the ratio.
The two job measures and their floor are taken in turn (a CommandJob, a FunctionJob, a
``subprocess.run``, and again), so a change of the machine's load weighs on all three.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import table

NOOP = "import gpulayer as gl\n\n\n@gl.remote\ndef noop():\n    return None\n"


def timed(fn: object, n: int) -> list[float]:
    return interleaved([fn], n)[0]


def interleaved(fns: list[object], n: int) -> list[list[float]]:
    """``n`` timings of each of ``fns``, taken in turn (one of each, then again): on a shared
    machine a change of load then weighs on a measure and its floor alike."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(n):
        for fn, times in zip(fns, out, strict=True):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
    return out


def floor() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def cpu_seconds() -> float:
    """CPU time of this process and of every process under it (alive, or reaped by one)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def cli() -> list[str]:
    exe = shutil.which("gpulayer")
    return [exe] if exe else [sys.executable, "-m", "gpulayer.cli"]


def submit_all(n: int, noop: object, batch: bool) -> list[object]:
    """Submit ``n`` no-op calls: in a loop of ``.remote()``, or in one ``gl.submit_many``."""
    import gpulayer as gl

    if batch:
        return gl.submit_many([noop.spec() for _ in range(n)])  # type: ignore[attr-defined]
    return [noop.remote() for _ in range(n)]  # type: ignore[attr-defined]


def throughput(n: int, noop: object, batch: bool = False) -> tuple[float, float]:
    """Jobs/s for ``n`` no-op FunctionJobs through two extra local workers, and the floor's
    processes/s from two threads."""
    import gpulayer as gl
    from gpulayer.client import connect
    from gpulayer.worker.agent import Agent

    client = connect()
    assert client.control is not None
    client.ensure_local_worker()  # (its capabilities, without a detection of our own)
    agents = [Agent(client.control, name=f"bench-{i}", capabilities=client._agent.capabilities)
              for i in (1, 2)]
    client._agent.stop(grace=5)  # the two bench workers do the work
    client._agent = agents[0]
    for a in agents:
        a.start()
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    handles = submit_all(n, noop, batch)
    gl.wait(handles, timeout=600)  # type: ignore[arg-type]
    jobs_s = n / (time.perf_counter() - t0)
    print(f"CPU per job (this process, its fork servers and their children): "
          f"{(cpu_seconds() - cpu0) / n * 1e3:.1f} ms")
    for a in agents:
        a.stop(grace=5)
    client._agent = None  # (so the next row's submits look for a live local worker, as a script's do)

    return jobs_s, floor_rate(n)


def floor_rate(n: int) -> float:
    """Processes/s of ``n`` :func:`floor` calls from two threads (the throughput's floor)."""
    left = [n]
    lock = threading.Lock()

    def spawn() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            floor()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=spawn) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return n / (time.perf_counter() - t0)


def proc_times(pid: int) -> list[float]:
    """A process's CPU seconds from ``/proc``: its user and system time, and those of the
    children it reaped."""
    with open(f"/proc/{pid}/stat") as f:
        return [int(x) / os.sysconf("SC_CLK_TCK") for x in f.read().rsplit(")", 1)[1].split()[11:15]]


def _split(workers: list[subprocess.Popen[bytes]]) -> tuple[float, float, float]:
    """The CPU seconds of these worker processes (their own), of their children (the fork
    servers, and the worker's idle CLI server: their own), and of what those reaped (the
    tasks the fork servers forked), from ``/proc``."""
    own = servers = tasks = 0.0
    for w in workers:
        utime, stime, _cu, _cs = proc_times(w.pid)
        own += utime + stime
        for tid in os.listdir(f"/proc/{w.pid}/task"):  # (a fork server is the child of a thread of its own)
            with open(f"/proc/{w.pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    utime, stime, cutime, cstime = proc_times(int(child))
                    servers += utime + stime
                    tasks += cutime + cstime
    return own, servers, tasks


def throughput_processes(n: int, noop: object, code: Path,
                         batch: bool = False) -> tuple[float, float, tuple[float, ...] | None]:
    """Jobs/s for ``n`` no-op FunctionJobs through two ``gpulayer worker start`` processes on
    the same home (this process only submits and waits), this process's CPU per job, and
    (Linux) the CPU per job of the workers, of their fork servers and of the tasks those forked."""
    import gpulayer as gl

    # (the code's folder before what PYTHONPATH held: a run from a checkout that is not the
    # installed one, as in a before/after comparison, has its workers run that checkout too)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p)}
    workers = [subprocess.Popen([*cli(), "worker", "start", "--name", f"bench-process-{i}", "--json"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for i in (1, 2)]
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline(), "a bench worker did not start"
        for _ in range(3):  # their fork servers up
            noop.remote().result(timeout=120)  # type: ignore[attr-defined]
        linux = os.path.exists(f"/proc/{workers[0].pid}/task/{workers[0].pid}/children")
        split0 = _split(workers) if linux else None
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        handles = submit_all(n, noop, batch)
        gl.wait(handles, timeout=600)  # type: ignore[arg-type]
        jobs_s, cpu = n / (time.perf_counter() - t0), (time.process_time() - cpu0) / n
        split = None if split0 is None else tuple((b - a) / n for a, b in zip(split0, _split(workers), strict=True))
        return jobs_s, cpu, split
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)


ELSEWHERE = """
import sys, time
import gpulayer as gl
job = gl.CommandJob(command=[sys.executable, "-c", "pass"])
for _ in range(3):
    gl.submit(job).result(timeout=120)
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    gl.submit(job).result(timeout=120)
    print(time.perf_counter() - t0, flush=True)
"""


def elsewhere(n: int, env: dict[str, str]) -> list[float]:
    """CommandJob round trips submitted by another process, which starts no worker of its
    own (this one's runs): each job's placement and its end cross between processes."""
    out = subprocess.run([sys.executable, "-c", ELSEWHERE, str(n)], env=env, check=True, capture_output=True,
                         text=True, timeout=600)
    return [float(line) for line in out.stdout.split()]


def _socket_fits(warm: object, home: str) -> bool:
    """Whether a CLI server can serve this home: none is started where its socket's path
    would be too long for a Unix socket (a long ``TMPDIR``); said on stdout."""
    path = warm.socket_path(home)  # type: ignore[attr-defined]
    limit = getattr(warm, "MAX_SOCKET_PATH", 100)
    if len(os.fsencode(path)) <= limit:
        return True
    print(f"(no CLI server rows: {path} is over the {limit} bytes a CLI server's socket path may have;"
          " a shorter TMPDIR)")
    return False


def command_server(n: int, run: list[str], env: dict[str, str], home: str) -> list[float] | None:
    """``run`` timings where no worker runs, answered by the CLI server that the first of
    them started in the background (gpulayer.cli.warm), which is then stopped; None where
    commands start none (off Linux, or a GPUlayer from before)."""
    try:
        from gpulayer.cli import warm
    except ImportError:
        return None
    if not sys.platform.startswith("linux") or not hasattr(warm, "server_pid") or not _socket_fits(warm, home):
        return None
    subprocess.run(run, env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(warm.socket_path(home)):
        assert time.monotonic() < deadline, "the first command's CLI server did not start"
        time.sleep(0.05)
    try:
        for _ in range(2):  # warm: the server's first child
            subprocess.run(run, env=env, check=True, capture_output=True)
        return timed(lambda: subprocess.run(run, env=env, check=True, capture_output=True), n)
    finally:
        pid = warm.server_pid(home)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        while os.path.exists(warm.socket_path(home)) and time.monotonic() < deadline + 60:
            time.sleep(0.05)  # (gone before a worker's server takes the home)


def warm_cli(n: int, env: dict[str, str], home: str) -> list[float] | None:
    """``gpulayer submit`` timings while a ``gpulayer worker start`` runs on the home, which
    answers command lines from its warm CLI server (gpulayer.cli.warm); None off Linux."""
    try:
        from gpulayer.cli import warm
    except ImportError:  # (a GPUlayer from before the warm CLI, measured with this file)
        return None
    if not sys.platform.startswith("linux") or not _socket_fits(warm, home):
        return None
    worker = subprocess.Popen([*cli(), "worker", "start", "--name", "bench-cli", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert worker.stdout is not None and worker.stdout.readline(), "the bench worker did not start"
        deadline = time.monotonic() + 60
        while not os.path.exists(warm.socket_path(home)):
            assert time.monotonic() < deadline, "the worker's CLI server did not start"
            time.sleep(0.05)
        run = [*cli(), "submit", "--", sys.executable, "-c", "pass"]
        for _ in range(2):  # warm: the server's first child, the worker's first task
            subprocess.run(run, env=env, check=True, capture_output=True)
        return timed(lambda: subprocess.run(run, env=env, check=True, capture_output=True), n)
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50, help="jobs per latency measurement (default 50)")
    parser.add_argument("--cli", type=int, default=10, help="`gpulayer submit` runs (default 10; 0 skips)")
    parser.add_argument("--throughput", type=int, default=1000, help="jobs for the throughput run (0 skips)")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    os.environ["GPULAYER_HOME"] = home
    code = Path(home) / "code"
    code.mkdir()
    (code / "bench_noop.py").write_text(NOOP)
    sys.path.insert(0, str(code))

    import bench_noop

    import gpulayer as gl
    from gpulayer.client import connect

    client = connect()
    client.ensure_local_worker()  # started once, outside the measurement
    command = gl.CommandJob(command=[sys.executable, "-c", "pass"])
    for _ in range(3):  # warm: imports, the bundle, the fork server
        gl.submit(command).result(timeout=120)
        bench_noop.noop.remote().result(timeout=120)

    n = args.jobs
    cmd, fn, base = interleaved([lambda: gl.submit(command).result(timeout=120),
                                 lambda: bench_noop.noop.remote().result(timeout=120), floor], n)
    rows = [
        ("CommandJob python -c pass", cmd, "subprocess.run(python -c pass)", base),
        ("no-op FunctionJob round trip", fn, "subprocess.run(python -c pass)", base),
    ]
    if args.cli:
        env = {**os.environ, "GPULAYER_HOME": home}
        # GPUlayer's bytecode cached as an installed copy's is (bench/cli_startup.py says why)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("GPULAYER_CLI_SERVER_IDLE", None)  # (the default: a command starts a CLI server)
        run = [*cli(), "submit", "--", sys.executable, "-c", "pass"]
        own = timed(lambda: subprocess.run(run, env={**env, "GPULAYER_WARM_CLI": "0"}, check=True,
                                           capture_output=True), args.cli)
        helps = timed(lambda: subprocess.run([*cli(), "--help"], env=env, check=True, capture_output=True),
                      args.cli)
        base_cli = [b + h for b, h in zip(base, helps, strict=False)]
        rows.append(("gpulayer submit -- python -c pass", own, "python -c pass + gpulayer --help", base_cli))
        started = command_server(args.cli, run, env, home)
        if started is not None:
            rows.append(("the same, a command's CLI server", started, "python -c pass + gpulayer --help",
                         base_cli))
        warm = warm_cli(args.cli, env, home)
        if warm is not None:
            rows.append(("the same, worker start's CLI server", warm, "python -c pass + gpulayer --help", base_cli))
    other = elsewhere(n, {**os.environ, "GPULAYER_HOME": home})
    rows.append(("CommandJob, worker in another process", other, "subprocess.run(python -c pass)", base))
    print(table(f"embedded control plane, SQLite, in-process worker; {n} jobs each, one at a time", rows))
    if args.throughput:
        print()
        for batch, how in ((False, "a loop of .remote()"), (True, "one gl.submit_many")):
            jobs_s, floor_s = throughput(args.throughput, bench_noop.noop, batch)
            print(f"{args.throughput} no-op FunctionJobs, {how}, two local workers: {jobs_s:.0f} jobs/s; "
                  f"floor (subprocess.run from two threads): {floor_s:.0f} processes/s; "
                  f"ratio {jobs_s / floor_s:.2f}x")
            procs_s, cpu, split = throughput_processes(args.throughput, bench_noop.noop, code, batch)
            print(f"{args.throughput} no-op FunctionJobs, {how}, two `gpulayer worker start` processes: "
                  f"{procs_s:.0f} jobs/s; ratio to the floor {procs_s / floor_s:.2f}x; "
                  f"the submitting process's CPU per job: {cpu * 1e3:.1f} ms")
            if split is not None:
                print("  CPU per job: the workers {:.2f} ms, their fork servers (and CLI servers) {:.2f} ms, "
                      "the tasks {:.2f} ms"
                      .format(*(x * 1e3 for x in split)))
    client.close()


if __name__ == "__main__":
    main()
