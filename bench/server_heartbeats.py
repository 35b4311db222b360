"""A fleet of simulated workers against one ``gpulayer server start`` process.

    python bench/server_heartbeats.py [--workers 1000] [--interval 5] [--seconds 30] [--jobs 5]
        [--database sqlite] [--database postgresql://postgres@127.0.0.1:5432/test]
        [--loop auto|asyncio|uvloop] [--samples FILE] [--pid-file FILE]

Each simulated worker joins with a shared join token (``POST /v1/workers/join``, as
``gpulayer worker start`` does), then does what the real agent does over HTTP
(:mod:`gpulayer.worker.agent`): it heartbeats every ``--interval`` seconds
(``POST /v1/workers/{id}/heartbeat``) and keeps one long poll for work open
(``POST /v1/workers/{id}/work?wait=20``). The load generator is one asyncio process with one
pool of HTTP/1.1 keep-alive connections (h11 parses; one connection per open long poll plus
spare ones for heartbeats), not a client or a thread per worker, so it leaves the server
most of the machine; its own CPU is reported beside the server's. Each worker heartbeats on a
fixed schedule of its own (a burst does not bunch later heartbeats); the pool retires
connections idle longer than the server keeps them; ``--loop`` picks the load generator's
event loop (uvloop when installed, as uvicorn does for the server) and the report says which
parser and loop each side ran on.

httpx's pool is not used here: it scans every connection of the pool (and, for idle ones,
the whole pool again) on each request, so one pool of thousands of connections costs the
load generator more per request than the server spends.

Reported per database, over the steady phase (after the joins and one interval of warm-up,
which includes the fleet's first long polls all arriving at once): heartbeat latency p50,
p95 and p99, heartbeats per second, request errors, the server's and the load generator's
CPU (one core = 100%), the time all joins took, and the floor: ``GET /healthz`` (no token,
no database) sent through the same pool at a steady rate during the same phase, with the
ratio of heartbeat p99 to healthz p99. With ``--jobs N``, submit-to-start of N sequential
jobs through the server with one real remote worker, after the simulated fleet left.

A PostgreSQL URL gets a fresh schema for the run, dropped afterwards (as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import os
import resource
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import h11
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers  # noqa: E402

R = TypeVar("R")
#: an idle connection older than this is not used again: the server closes those idle for
#: 75 s (gpulayer server start's keep-alive timeout)
IDLE_EXPIRY = 60.0
#: how long one long poll waits, as the real agent's over HTTP (gpulayer.http_client.poll_wait)
POLL_WAIT = 20.0


# ---------------------------------------------------------------------------------- one HTTP/1.1 pool


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()

    async def roundtrip(self, method: str, target: str, headers: list[tuple[str, str]],
                        body: bytes) -> tuple[int, bytes]:
        c = self.h11
        out = c.send(h11.Request(method=method, target=target, headers=headers))
        out += c.send(h11.Data(data=body)) if body else b""
        out += c.send(h11.EndOfMessage())
        self.writer.write(out)
        status, data = 0, bytearray()
        while True:
            event = c.next_event()
            if event is h11.NEED_DATA:
                chunk = await self.reader.read(65536)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                c.receive_data(chunk)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                data += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, bytes(data)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("server closed the connection")

    @property
    def reusable(self) -> bool:
        c = self.h11
        if c.our_state is h11.DONE and c.their_state is h11.DONE:
            c.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        self.writer.close()


class Pool:
    """At most ``size`` keep-alive HTTP/1.1 connections to one server; idle ones in a deque
    (taking one is O(1), however many there are)."""

    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.authority = f"{self.host}:{self.port}"
        self.slots = asyncio.Semaphore(size)
        self.idle: collections.deque[_Conn] = collections.deque()

    async def request(self, method: str, path: str, *, token: str | None = None,
                      body: Any = None) -> tuple[int, bytes]:
        raw = json.dumps(body).encode() if body is not None else b""
        headers = [("host", self.authority), ("content-length", str(len(raw)))]
        if body is not None:
            headers.append(("content-type", "application/json"))
        if token is not None:
            headers.append(("authorization", f"Bearer {token}"))
        async with self.slots:
            for attempt in (1, 2):
                conn = self._take_idle()
                reused = conn is not None
                if conn is None:
                    conn = _Conn(*await asyncio.open_connection(self.host, self.port))
                try:
                    status, data = await conn.roundtrip(method, path, headers, raw)
                except (ConnectionError, h11.ProtocolError):
                    conn.close()
                    if reused and attempt == 1:  # the server closed an idle connection: once more
                        continue
                    raise
                except asyncio.CancelledError:  # (a long poll still open when the run ends)
                    conn.close()
                    raise
                if conn.reusable:
                    conn.idle_since = time.monotonic()
                    self.idle.append(conn)
                else:
                    conn.close()
                return status, data
        raise AssertionError("unreachable")

    def _take_idle(self) -> _Conn | None:
        """The idle connection used last; those idle longer than the server keeps them
        (uvicorn's keep-alive timeout) are closed instead (the least used ones, at the left)."""
        while self.idle and time.monotonic() - self.idle[0].idle_since > IDLE_EXPIRY:
            self.idle.popleft().close()
        return self.idle.pop() if self.idle else None

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


# ---------------------------------------------------------------------------------- the fleet


def pool_size(workers: int) -> int:
    """One connection per open long poll, and spare ones for heartbeats and joins."""
    return workers + max(64, workers // 5)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


async def fleet(url: str, join: str, n: int, seconds: float, interval: float, caps: dict[str, Any],
                server: psutil.Process) -> dict[str, Any]:
    pool = Pool(url, size=pool_size(n))
    me = psutil.Process()
    errors: collections.Counter[str] = collections.Counter()
    sem = asyncio.Semaphore(50)

    async def do_join(i: int) -> tuple[str, str]:
        async with sem:
            status, data = await pool.request("POST", "/v1/workers/join", token=join,
                                              body={"capabilities": caps, "name": f"sim{i}", "cpu_slots": 1})
            if status != 201:
                raise RuntimeError(f"join answered {status}: {data[:300]!r}")
            d = json.loads(data)
            return d["worker_id"], d["token"]

    t0 = time.perf_counter()
    creds = await asyncio.gather(*(do_join(i) for i in range(n)))
    join_s = time.perf_counter() - t0

    start = time.monotonic()
    measure_from = start + min(interval, seconds / 3)  # warm-up: the first heartbeats and polls
    stop = start + seconds
    lat: list[float] = []
    floor: list[float] = []
    #: (what, sent at relative to start, latency) of every measured request, for --samples
    samples: list[tuple[str, float, float]] = []
    marks: dict[str, float] = {}

    async def call(what: str, method: str, path: str, token: str | None, body: Any) -> bool:
        try:
            status, _ = await pool.request(method, path, token=token, body=body)
        except (OSError, h11.ProtocolError) as exc:
            errors[f"{what}: {type(exc).__name__}"] += 1
            return False
        if status >= 400:
            errors[f"{what}: HTTP {status}"] += 1
            return False
        return True

    async def heartbeats(i: int, wid: str, tok: str) -> None:
        # spread evenly over one interval, each worker on a fixed schedule of its own: a burst
        # that held some heartbeats back (the fleet's first polls, all at once) must not leave
        # them bunched together for the rest of the run
        due = start + interval * i / n
        while due < stop:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            t = time.monotonic()
            ok = await call("heartbeat", "POST", f"/v1/workers/{wid}/heartbeat", tok, {"running": []})
            if ok and t >= measure_from:
                lat.append(time.monotonic() - t)
                samples.append(("heartbeat", t - start, lat[-1]))
            due += interval

    async def polls(wid: str, tok: str) -> None:
        # each poll waits as long as the agent's, the last ones past the end of the run: polls
        # cut to end with the run would all end at once, a burst of the bench's own
        while (t := time.monotonic()) < stop:
            if not await call("poll", "POST", f"/v1/workers/{wid}/work?wait={POLL_WAIT:g}", tok, {"running": []}):
                await asyncio.sleep(0.5)
            elif t >= measure_from:
                samples.append(("poll", t - start, time.monotonic() - t))

    async def healthz() -> None:
        while (t := time.monotonic()) < stop:
            if await call("healthz", "GET", "/healthz", None, None) and t >= measure_from:
                floor.append(time.monotonic() - t)
                samples.append(("healthz", t - start, floor[-1]))
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - t)))

    async def meter() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        marks.update(t0=time.monotonic(), server0=cpu_seconds(server), me0=cpu_seconds(me))
        await asyncio.sleep(max(0.0, stop - time.monotonic()))
        marks.update(t1=time.monotonic(), server1=cpu_seconds(server), me1=cpu_seconds(me))

    open_polls = [asyncio.ensure_future(polls(w, t)) for w, t in creds]
    await asyncio.gather(*(heartbeats(i, w, t) for i, (w, t) in enumerate(creds)), healthz(), meter())
    # the run is over: the polls still open (each waits up to POLL_WAIT) are let go, not waited for
    for task in open_polls:
        task.cancel()
    await asyncio.gather(*open_polls, return_exceptions=True)
    # leave politely so the next phase sees no phantom workers
    await asyncio.gather(*(call("leave", "DELETE", f"/v1/workers/{w}", t, None) for w, t in creds))
    pool.close()
    span = marks["t1"] - marks["t0"]
    return {"lat": lat, "floor": floor, "samples": samples, "errors": errors, "join_s": join_s, "span": span,
            "server_cpu": 100 * (marks["server1"] - marks["server0"]) / span,
            "loadgen_cpu": 100 * (marks["me1"] - marks["me0"]) / span}


# ---------------------------------------------------------------------------------- one run


def submit_to_start(client: Any, jobs: int) -> list[float]:
    from gpulayer.specs import CommandJob, Placement

    out = []
    for _ in range(jobs):
        target = "local" if client.location == "embedded" else "remote"
        j = client.submit(CommandJob(command=["true"], placement=Placement(target=target, on_unschedulable="wait")))
        j = client.wait(j.id, timeout=60)
        t = j.tasks[-1]
        out.append((t.started_at or 0) - j.created_at)
    return out


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run_loop(loop: str, main: Coroutine[Any, Any, R]) -> R:
    """Run the load generator on asyncio's own loop or on uvloop (--loop)."""
    if loop == "uvloop" or (loop == "auto" and installed("uvloop")):
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


@contextmanager
def database(spec: str) -> Iterator[str | None]:
    """``sqlite`` -> None (the server's own file); a PostgreSQL URL -> it, in a fresh schema."""
    if spec == "sqlite":
        yield None
        return
    import sqlalchemy as sa

    engine = sa.create_engine(spec.replace("postgresql://", "postgresql+psycopg://", 1))
    schema = f"gl_bench_{secrets.token_hex(6)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{spec}{'&' if '?' in spec else '?'}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


def run(args: argparse.Namespace, spec: str, tmp: Path) -> dict[str, Any]:
    from tests.factories import make_capabilities

    caps = json.loads(make_capabilities().model_dump_json())
    with database(spec) as url:
        home = tmp / f"server-{'sqlite' if url is None else 'pg'}"
        srv = ServerProc(home, database=url,
                         env={"GPULAYER_HEARTBEAT_TIMEOUT": str(max(15.0, args.interval * 10))}).start()
        try:
            admin = Api(srv.url, srv.admin_token)
            join = admin.token_for("join")["token"]
            assert srv.proc is not None
            if args.pid_file:
                Path(args.pid_file).write_text(f"{srv.proc.pid}\n")
            res = run_loop(args.loop, fleet(srv.url, join, args.workers, args.seconds, args.interval, caps,
                                            psutil.Process(srv.proc.pid)))
            res["remote"] = []
            if args.samples:
                with open(args.samples, "a") as f:
                    f.writelines(f"{'sqlite' if url is None else 'postgresql'}\t{what}\t{t:.4f}\t{v * 1000:.2f}\n"
                                 for what, t, v in res["samples"])
            if args.jobs:
                from gpulayer.client import http_client

                w = start_remote_worker(srv.url, join, home / "worker", cpu_slots=1)
                try:
                    wait_workers(admin, 1)
                    res["remote"] = submit_to_start(http_client(srv.url, token=srv.admin_token), args.jobs)
                finally:
                    stop_proc(w, signal.SIGKILL)
        finally:
            srv.stop()
    res["database"] = "SQLite" if url is None else "PostgreSQL"
    return res


def embedded_submit_to_start(tmp: Path, jobs: int) -> list[float]:
    from gpulayer.client import embedded_client
    from gpulayer.testing import no_real_devices_env

    os.environ["GPULAYER_HOME"] = str(tmp / "embedded")
    os.environ.update(no_real_devices_env())
    emb = embedded_client()
    try:
        return submit_to_start(emb, jobs)
    finally:
        emb.close()


def report(args: argparse.Namespace, res: dict[str, Any]) -> None:
    ms = lambda v: f"{v * 1000:.1f} ms"  # noqa: E731
    lat, floor = res["lat"], res["floor"]
    print()
    print(f"{res['database']}: {args.workers} simulated workers, a heartbeat every {args.interval:g} s and "
          f"one long poll each; {args.seconds:g} s, measured over the last {res['span']:.0f} s")
    # uvicorn picks httptools and uvloop when they are installed; the server runs in this environment
    server_stack = "uvicorn with " + ("httptools" if installed("httptools") else "h11") + \
        (" on uvloop" if installed("uvloop") else " on asyncio's loop")
    loadgen_loop = "uvloop" if args.loop == "uvloop" or (args.loop == "auto" and installed("uvloop")) else "asyncio"
    print(f"  (server: {server_stack}; load generator: h11 on {loadgen_loop})")
    rows = [
        ("joins (all workers, 50 at a time)", f"{res['join_s']:.1f} s"),
        ("heartbeats answered (measured)", f"{len(lat)}"),
        ("heartbeats / s", f"{len(lat) / res['span']:.0f}"),
        ("heartbeat p50", ms(pct(lat, 50))),
        ("heartbeat p95", ms(pct(lat, 95))),
        ("heartbeat p99", ms(pct(lat, 99))),
        ("floor: GET /healthz p50 / p99", f"{ms(pct(floor, 50))} / {ms(pct(floor, 99))}"),
        ("heartbeat p99 / floor p99", f"{pct(lat, 99) / pct(floor, 99):.1f}x"),
        ("request errors", f"{sum(res['errors'].values())}"
         + (f" ({', '.join(f'{k}: {v}' for k, v in res['errors'].most_common(4))})" if res["errors"] else "")),
        ("server CPU (one core = 100%)", f"{res['server_cpu']:.0f}%"),
        ("load generator CPU", f"{res['loadgen_cpu']:.0f}%"),
    ]
    if res["remote"]:
        rows += [("submit-to-start p50 / max, server",
                  f"{ms(statistics.median(res['remote']))} / {ms(max(res['remote']))}")]
    for name, value in rows:
        print(f"  {name:<36}{value:>24}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--jobs", type=int, default=5, help="submit-to-start jobs after the fleet left (0: none)")
    ap.add_argument("--database", action="append", default=None,
                    help="'sqlite' (the default) or a PostgreSQL URL; repeat to run on each")
    ap.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                    help="the load generator's event loop (auto: uvloop when installed, as the server)")
    ap.add_argument("--samples", default=None,
                    help="append every measured request here: database, what, sent at (s), latency (ms)")
    ap.add_argument("--pid-file", default=None, help="write the server's pid here (to attach a profiler)")
    args = ap.parse_args()
    need = pool_size(args.workers) + 256  # the server holds as many (each process has its own limit)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        raise SystemExit(f"--workers {args.workers} needs about {need} open files here; ulimit -n is {soft} "
                         f"(raise it, up to {hard})")

    tmp = Path(tempfile.mkdtemp(prefix="gl-bench-"))
    results = [run(args, spec, tmp) for spec in args.database or ["sqlite"]]
    embedded = embedded_submit_to_start(tmp, args.jobs) if args.jobs else []
    for res in results:
        report(args, res)
    if embedded:
        print(f"  {'submit-to-start p50, embedded':<36}{statistics.median(embedded) * 1000:>21.1f} ms")


if __name__ == "__main__":
    main()
