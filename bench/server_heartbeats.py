"""Many simulated workers against one ``gpulayer server start`` process.

    python bench/server_heartbeats.py [--workers 1000] [--seconds 20] [--interval 1.0] [--jobs 20]

Each simulated worker joins with a shared join token, then heartbeats every ``--interval``
seconds and keeps one long poll (``GET /v1/workers/{id}/tasks?wait=5``) open, all from one
asyncio loop with httpx. Reported: heartbeat latency p50/p99, heartbeats per second, and the
server's CPU use (psutil on its pid). Then, with the simulated fleet gone, submit-to-start
latency of ``--jobs`` sequential jobs through the server with one real remote worker, next
to the same figure for the embedded control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers  # noqa: E402


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def fleet(url: str, join: str, n: int, seconds: float, interval: float, caps: dict) -> dict:
    limits = httpx.Limits(max_connections=4 * n, max_keepalive_connections=4 * n)
    lat: list[float] = []
    errors = 0
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        sem = asyncio.Semaphore(50)

        async def do_join(i: int) -> tuple[str, str]:
            async with sem:
                for attempt in range(5):
                    try:
                        r = await http.post("/v1/workers/join", headers={"authorization": f"Bearer {join}"},
                                            json={"capabilities": caps, "name": f"sim{i}", "cpu_slots": 1})
                        r.raise_for_status()
                        break
                    except httpx.TransportError:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.5)
                d = r.json()
                return d["worker_id"], d["token"]

        t0 = time.perf_counter()
        creds = await asyncio.gather(*(do_join(i) for i in range(n)))
        join_s = time.perf_counter() - t0
        # One small client per simulated worker, as real workers have: a single pool of
        # hundreds of connections costs the client more per request than the server spends.
        # Plain HTTP on loopback: no TLS context per client (building 1000 of them takes long).
        clients = {w: httpx.AsyncClient(base_url=url, timeout=60, verify=False,
                                        limits=httpx.Limits(max_connections=2))
                   for w, _ in creds}
        stop = time.monotonic() + seconds


        async def heartbeats(wid: str, tok: str) -> None:
            nonlocal errors
            http = clients[wid]
            h = {"authorization": f"Bearer {tok}"}
            await asyncio.sleep(interval * (hash(wid) % 1000) / 1000)  # spread the fleet
            while time.monotonic() < stop:
                t = time.perf_counter()
                try:
                    r = await http.post(f"/v1/workers/{wid}/heartbeat", headers=h, json={"running": []})
                    r.raise_for_status()
                    lat.append(time.perf_counter() - t)
                except httpx.HTTPError:
                    errors += 1
                await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t)))

        async def polls(wid: str, tok: str) -> None:
            nonlocal errors
            http = clients[wid]
            h = {"authorization": f"Bearer {tok}"}
            while time.monotonic() < stop:
                try:
                    r = await http.get(f"/v1/workers/{wid}/tasks", headers=h,
                                       params={"wait": min(20.0, max(0.0, stop - time.monotonic()))})
                    r.raise_for_status()
                except httpx.HTTPError:
                    errors += 1
                    await asyncio.sleep(0.5)

        await asyncio.gather(*(heartbeats(w, t) for w, t in creds), *(polls(w, t) for w, t in creds))
        await asyncio.gather(*(c.aclose() for c in clients.values()))
        # leave politely so the next phase sees no phantom workers
        await asyncio.gather(*(http.delete(f"/v1/workers/{w}", headers={"authorization": f"Bearer {t}"})
                               for w, t in creds))
    return {"lat": lat, "errors": errors, "join_s": join_s}


def submit_to_start(client, jobs: int) -> list[float]:  # type: ignore[no-untyped-def]
    from gpulayer.specs import CommandJob, Placement

    out = []
    for _ in range(jobs):
        j = client.submit(CommandJob(command=["true"], placement=Placement(target=client_target(client),
                                                                          on_unschedulable="wait")))
        j = client.wait(j.id, timeout=60)
        t = j.tasks[-1]
        out.append((t.started_at or 0) - j.created_at)
    return out


def client_target(client) -> str:  # type: ignore[no-untyped-def]
    return "local" if client.location == "embedded" else "remote"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--database", default=None)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gl-bench-"))
    srv = ServerProc(tmp / "server", database=args.database,
                     env={"GPULAYER_HEARTBEAT_TIMEOUT": str(max(15.0, args.interval * 10))}).start()
    admin = Api(srv.url, srv.admin_token)
    join = admin.token_for("join")["token"]
    from tests.factories import make_capabilities

    caps = json.loads(make_capabilities().model_dump_json())
    proc = psutil.Process(srv.proc.pid)  # type: ignore[union-attr]
    proc.cpu_percent(None)
    cpu0 = proc.cpu_times()
    t0 = time.perf_counter()
    try:
        res = asyncio.run(fleet(srv.url, join, args.workers, args.seconds, args.interval, caps))
    except BaseException:
        srv.kill()
        raise
    wall = time.perf_counter() - t0
    cpu1 = proc.cpu_times()
    cpu_pct = 100 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / wall
    lat = res["lat"]

    # submit-to-start through the server, one real worker
    from gpulayer.client import embedded_client, http_client

    w = start_remote_worker(srv.url, join, tmp / "worker", cpu_slots=1)
    try:
        wait_workers(admin, 1)
        remote = submit_to_start(http_client(srv.url, token=srv.admin_token), args.jobs)
    finally:
        stop_proc(w, signal.SIGKILL)
        srv.stop()
    os.environ["GPULAYER_HOME"] = str(tmp / "embedded")
    from gpulayer.testing import no_real_devices_env

    os.environ.update(no_real_devices_env())
    emb = embedded_client()
    try:
        embedded = submit_to_start(emb, args.jobs)
    finally:
        emb.close()

    ms = lambda v: f"{v * 1000:8.1f} ms"  # noqa: E731
    print()
    print(f"server: {srv.url} ({'SQLite' if not args.database else 'PostgreSQL'}), "
          f"{args.workers} simulated workers, heartbeat every {args.interval:g} s + one long poll each, "
          f"{args.seconds:g} s")
    print(f"{'figure':<38}{'value':>14}")
    print(f"{'joins (all workers)':<38}{res['join_s']:>11.1f} s")
    print(f"{'heartbeats answered':<38}{len(lat):>14}")
    print(f"{'heartbeats / s':<38}{len(lat) / args.seconds:>14.0f}")
    print(f"{'heartbeat latency p50':<38}{ms(pct(lat, 50)):>14}")
    print(f"{'heartbeat latency p99':<38}{ms(pct(lat, 99)):>14}")
    print(f"{'request errors':<38}{res['errors']:>14}")
    print(f"{'server CPU (one core = 100%)':<38}{cpu_pct:>13.0f}%")
    print(f"{'submit-to-start p50, server':<38}{ms(statistics.median(remote)):>14}")
    print(f"{'submit-to-start p50, embedded':<38}{ms(statistics.median(embedded)):>14}")
    print(f"{'submit-to-start max, server':<38}{ms(max(remote)):>14}")
    print(f"{'submit-to-start max, embedded':<38}{ms(max(embedded)):>14}")


if __name__ == "__main__":
    main()
