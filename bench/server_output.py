"""A server's CPU while a job prints and clients wait for jobs, next to the same seconds
with nothing printed.

    python bench/server_output.py [--waiters 50] [--pages 3] [--chunks 300] [--runs 3]

One ``gpulayer server start`` on 127.0.0.1 (SQLite, a temporary home), one worker joined
through the API and driven by hand (it starts a job and appends ``--chunks`` one-line
chunks, 10 ms apart, as a task that prints does), and ``--waiters`` threads each holding
a ``GET /v1/jobs/{id}/wait`` long poll on that job (what ``gpulayer submit`` and
``handle.result()`` hold), asked again as each answers, and ``--pages`` dashboard pages
open on the lists (jobs, overview, workers in turn: their live streams, read as a browser
reads them, with an admin's session). Prints, for each run, the
server's CPU (from ``/proc``) while the chunks arrive and during as many seconds right
after with nothing arriving (the floor), and how long the appends took; then the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.factories import make_capabilities


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(waiters: int, chunks: int, pages: int = 0) -> tuple[float, float, float]:
    """(the server's CPU share while the chunks arrive, the same right after, the seconds
    the appends took)."""
    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = home
    server = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "server", "start", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=home)
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    try:
        for _ in range(1200):  # bounded: a minute
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        admin_token = Path(home, "admin.token").read_text().strip()
        admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {admin_token}"}, timeout=60)
        join = admin.post("/v1/tokens", json={"scope": "join"}).json()["token"]
        joined = httpx.post(url + "/v1/workers/join", headers={"authorization": f"Bearer {join}"}, timeout=60,
                            json={"capabilities": json.loads(make_capabilities().model_dump_json()),
                                  "cpu_slots": 1}).json()
        worker = httpx.Client(base_url=url, headers={"authorization": f"Bearer {joined['token']}"}, timeout=60)
        job = admin.post("/v1/jobs", json={"spec": {"kind": "command", "command": ["x"],
                                                    "placement": {"target": "remote"}}}).json()["id"]
        [task] = worker.get(f"/v1/workers/{joined['worker_id']}/tasks", params={"wait": 10}).json()
        worker.post(f"/v1/tasks/{task['task_id']}/start")

        def wait() -> None:
            with httpx.Client(base_url=url, headers={"authorization": f"Bearer {admin_token}"}, timeout=60) as c:
                while not stop.is_set():
                    c.get(f"/v1/jobs/{job}/wait", params={"timeout": 2})

        def page(path: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as c:
                if c.post("/login", data={"token": admin_token}).status_code != 303:
                    raise SystemExit("the bench could not log in to the dashboard")
                while not stop.is_set():
                    try:
                        with c.stream("GET", path, timeout=httpx.Timeout(60, read=1)) as r:
                            if r.status_code != 200:  # (a refused stream would be asked for again at once)
                                raise SystemExit(f"{path}: HTTP {r.status_code}")
                            for _ in r.iter_bytes():
                                if stop.is_set():
                                    return
                    except httpx.ReadTimeout:
                        continue

        threads = [threading.Thread(target=wait, daemon=True) for _ in range(waiters)]
        threads += [threading.Thread(target=page, args=(("/live/jobs", "/live/overview", "/live/workers")[i % 3],),
                                     daemon=True) for i in range(pages)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every long poll waiting
        c0, t0 = cpu_seconds(server.pid), time.perf_counter()
        for i in range(chunks):
            worker.post(f"/v1/tasks/{task['task_id']}/logs", json={"chunks": [["stdout", f"step {i}\n"]]})
            time.sleep(0.01)
        took = time.perf_counter() - t0
        busy = (cpu_seconds(server.pid) - c0) / took
        c1 = cpu_seconds(server.pid)
        time.sleep(took)
        idle = (cpu_seconds(server.pid) - c1) / took
        return busy, idle, took
    finally:
        stop.set()
        server.terminate()
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--waiters", type=int, default=50)
    parser.add_argument("--pages", type=int, default=3, help="dashboard list pages open (live streams)")
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = []
    print(f"a job printing {args.chunks} chunks, 10 ms apart, {args.waiters} long polls waiting for jobs, "
          f"{args.pages} dashboard list pages open")
    print(f"{'run':>4}  {'server CPU, printing':>21}  {'floor (nothing printed)':>24}  {'appends took':>13}")
    for i in range(args.runs):
        busy, idle, took = one_run(args.waiters, args.chunks, args.pages)
        results.append((busy, idle, took))
        print(f"{i + 1:>4}  {busy * 100:>20.0f}%  {idle * 100:>23.0f}%  {took:>12.1f}s")
    busy, idle, took = (statistics.median(r[k] for r in results) for k in range(3))
    print(f"median: the server {busy * 100:.0f}% of a core while the job prints, {idle * 100:.0f}% with nothing "
          f"printed ({busy / max(idle, 1e-9):.1f}x); the appends took {took:.1f} s "
          f"({args.chunks * 0.01:.1f} s of pauses)")


if __name__ == "__main__":
    main()
