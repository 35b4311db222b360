"""A job's artifacts: a command that leaves a file of ``--mb`` MB in ``$GPULAYER_ARTIFACTS_DIR``,
submit to result, then the download, each next to its floor in the same run.

    python bench/artifacts.py [--mb 50 5] [--runs 5] [--no-server]

Embedded (a temporary home, the SDK's own worker): the job copies a prepared file of random
bytes (incompressible, as a checkpoint is) into its artifacts folder; its floor is the same
job copying it into a folder of the bench's, which nothing keeps. The difference (run by run) is
what keeping them costs the job: the worker's zip of the file, its store in the control
plane's database (synced to the disk), before the task's report; its floor is a copy of the
file written and ``fdatasync``'d. Then ``handle.artifacts(to)`` (the listing, the zip read
back, checked and extracted) next to ``shutil.copyfile`` of the same file (what bringing a
file back costs at least on one machine). The first size also through a ``gpulayer server
start`` (HTTP, SQLite) and a ``gpulayer worker start`` joined to it, in turn with the rest
(``--no-server``: not). Prints the table of bench/_stats.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

#: the job: copy the file argv[1] into the folder argv[2] (or $GPULAYER_ARTIFACTS_DIR when "-")
COPY = ("import os, shutil, sys; d = os.environ['GPULAYER_ARTIFACTS_DIR'] if sys.argv[2] == '-' else sys.argv[2]; "
        "shutil.copyfile(sys.argv[1], os.path.join(d, 'ckpt.bin'))")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[50.0, 5.0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--server", action=argparse.BooleanOptionalAction, default=True,
                        help="the first size through a server too (default)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
    os.environ["GPULAYER_HOME"] = str(tmp / "home")
    import gpulayer as gl

    served = _served(tmp) if args.server else None
    gl.submit(gl.CommandJob(command=[sys.executable, "-c", "pass"])).result(timeout=120)  # (the SDK's worker up)
    rows = []
    try:
        for mb in args.mb:
            src = tmp / f"{mb:g}.bin"
            src.write_bytes(os.urandom(int(mb * 2**20)))
            plain = tmp / "plain"
            plain.mkdir(exist_ok=True)
            kept, floor, down, copy, synced, through, through_floor, through_down = [], [], [], [], [], [], [], []
            for i in range(args.runs):  # (in turn, so that a change of load weighs on all)
                t0 = time.perf_counter()
                h = gl.submit(gl.CommandJob(command=[sys.executable, "-c", COPY, str(src), "-"]))
                if h.result(timeout=600) != 0:
                    raise SystemExit(f"{mb:g} MB: the job failed: {h.logs()}")
                kept.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                if gl.submit(gl.CommandJob(command=[sys.executable, "-c", COPY, str(src), str(plain)])).result(
                        timeout=600) != 0:
                    raise SystemExit(f"{mb:g} MB: the floor's job failed")
                floor.append(time.perf_counter() - t0)
                to = tmp / f"down-{mb:g}-{i}"
                t0 = time.perf_counter()
                got = h.artifacts(to)
                down.append(time.perf_counter() - t0)
                if (got / "ckpt.bin").stat().st_size != src.stat().st_size:
                    raise SystemExit(f"{mb:g} MB: the artifacts did not come back whole")
                t0 = time.perf_counter()
                shutil.copyfile(src, tmp / "copied.bin")
                copy.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with open(src, "rb") as r, open(tmp / "synced.bin", "wb") as f:  # (storing them durably, at least)
                    shutil.copyfileobj(r, f)
                    f.flush()
                    os.fdatasync(f.fileno())
                synced.append(time.perf_counter() - t0)
                shutil.rmtree(to)
                if served is not None and mb == args.mb[0]:
                    client = served[0]
                    t0 = time.perf_counter()
                    job = client.wait(client.submit(_on_remote(gl.CommandJob(
                        command=[sys.executable, "-c", COPY, str(src), "-"]))).id, timeout=600)
                    through.append(time.perf_counter() - t0)
                    if job.exit_code != 0:
                        raise SystemExit(f"{mb:g} MB through the server: {job.state.value}")
                    through_job = job.id
                    t0 = time.perf_counter()
                    job = client.wait(client.submit(_on_remote(gl.CommandJob(
                        command=[sys.executable, "-c", COPY, str(src), str(plain)]))).id, timeout=600)
                    through_floor.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    client.artifacts(through_job, tmp / f"through-{i}")
                    through_down.append(time.perf_counter() - t0)
                    shutil.rmtree(tmp / f"through-{i}")
            rows.append((f"{mb:g} MB left as artifacts, job", kept, "the same copy, not kept", floor))
            rows.append((f"{mb:g} MB: what keeping them added", [k - f for k, f in zip(kept, floor, strict=True)],
                         "a copy of the file, fdatasync'd", synced))
            rows.append((f"{mb:g} MB, handle.artifacts()", down, "shutil.copyfile", copy))
            src.unlink()
            if through:
                rows.append((f"{mb:g} MB artifacts, via a server", through, "the same copy, not kept", through_floor))
                rows.append((f"{mb:g} MB, download via a server", through_down, "shutil.copyfile", copy))
    finally:
        if served is not None:
            served[1]()
    print(table(f"a job's artifacts, embedded{' and through a server' if args.server else ''}, "
                f"{args.runs} runs each", rows))


def _served(tmp: Path) -> tuple[Any, Any]:
    """A ``gpulayer server start`` and a worker joined to it: a client of it, and what stops them."""
    from gpulayer.client import http_client
    from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers

    server = ServerProc(tmp / "server").start()
    admin = Api(server.url, server.admin_token)
    worker = start_remote_worker(server.url, admin.token_for("join")["token"], tmp / "worker")

    def stop() -> None:
        stop_proc(worker)
        server.stop()

    try:
        wait_workers(admin, 1)
    except BaseException:
        stop()
        raise
    return http_client(server.url, token=server.admin_token), stop


def _on_remote(spec: Any) -> Any:
    from gpulayer.specs import Placement

    return spec.model_copy(update={"placement": Placement(target="remote")})


if __name__ == "__main__":
    main()
