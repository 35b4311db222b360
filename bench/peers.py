"""The same three workloads on Ray, Dask and GPUlayer, in one run, next to one floor.

    nox -s peers                 # installs Ray and Dask in their own environment
    python bench/peers.py [--jobs 30] [--throughput 1000] [--only gpulayer,dask,ray]

Workloads, each one at a time except the last:

* spawn: a task that runs ``python -c pass`` (GPUlayer: a CommandJob; Ray and Dask: a
  task that calls ``subprocess.run``); floor: ``subprocess.run`` here;
* no-op: a function that returns None (GPUlayer: ``@gl.remote``); floor: the same spawn;
* throughput: ``--throughput`` no-op tasks submitted at once (GPUlayer: two local workers;
  Ray: a local cluster; Dask: a LocalCluster of two worker processes), in tasks/s: GPUlayer
  and Ray in a loop of ``.remote()`` calls, Dask with ``client.map``; and GPUlayer once more
  with one ``gl.submit_many`` (Dask's ``client.map`` is its own batch already, and Ray has none);
  ``--throughput 0`` leaves it out.

A peer that is not installed is reported as such. Prints medians and p95 in ms, and each
figure's ratio to the floor (throughput: tasks/s, and the ratio to GPUlayer's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import pct

HERE = Path(__file__).resolve().parent


def spawn_pass() -> int:
    return subprocess.run([sys.executable, "-c", "pass"], check=True).returncode


def noop() -> None:
    return None


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


Result = dict[str, Any]


def run_gpulayer(n: int, many: int) -> Result:
    os.environ["GPULAYER_HOME"] = tempfile.mkdtemp(prefix="gpulayer-peers-")
    import submit_latency as sl

    import gpulayer as gl
    from gpulayer.client import connect

    code = Path(os.environ["GPULAYER_HOME"]) / "code"
    code.mkdir()
    (code / "bench_noop.py").write_text(sl.NOOP)
    sys.path.insert(0, str(code))
    import bench_noop

    connect().ensure_local_worker()
    command = gl.CommandJob(command=[sys.executable, "-c", "pass"])
    for _ in range(3):
        gl.submit(command).result(timeout=120)
        bench_noop.noop.remote().result(timeout=120)
    out: Result = {
        "spawn": timed(lambda: gl.submit(command).result(timeout=120), n),
        "no-op": timed(lambda: bench_noop.noop.remote().result(timeout=120), n),
    }
    if many:
        out["throughput"] = sl.throughput(many, bench_noop.noop)[0]
        out["batch"] = sl.throughput(many, bench_noop.noop, batch=True)[0]
    connect().close()
    return out


def run_ray(n: int, many: int) -> Result:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    r_spawn, r_noop = ray.remote(spawn_pass), ray.remote(noop)
    ray.get([r_spawn.remote() for _ in range(3)] + [r_noop.remote() for _ in range(3)])
    out: Result = {"spawn": timed(lambda: ray.get(r_spawn.remote()), n),
                   "no-op": timed(lambda: ray.get(r_noop.remote()), n)}
    if many:
        t0 = time.perf_counter()
        ray.get([r_noop.remote() for _ in range(many)])
        out["throughput"] = many / (time.perf_counter() - t0)
    ray.shutdown()
    return out


def run_dask(n: int, many: int) -> Result:
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.submit(spawn_pass, pure=False).result()
        out: Result = {"spawn": timed(lambda: client.submit(spawn_pass, pure=False).result(), n),
                       "no-op": timed(lambda: client.submit(noop, pure=False).result(), n)}
        if many:
            t0 = time.perf_counter()
            client.gather(client.map(lambda _i: None, range(many), pure=False))
            out["throughput"] = many / (time.perf_counter() - t0)
    return out


def _child(name: str, n: int, many: int) -> None:
    """Run one system's workloads (each in its own process, so none warms another)."""
    import json

    result = {"gpulayer": run_gpulayer, "ray": run_ray, "dask": run_dask}[name](n, many)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    import json

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--throughput", type=int, default=1000)
    parser.add_argument("--only", default="gpulayer,ray,dask")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.jobs, args.throughput)
        return
    results: dict[str, Result | str] = {}
    for name in args.only.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--jobs", str(args.jobs),
                               "--throughput", str(args.throughput)], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            results[name] = json.loads(lines[-1][len("RESULT "):])
        else:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            results[name] = f"not measured: {tail[:100]}"
    floor = timed(spawn_pass, args.jobs)
    fm = statistics.median(floor)
    print(f"floor: subprocess.run(python -c pass) median {fm * 1e3:.1f} ms, p95 {pct(floor, 95) * 1e3:.1f} ms")
    head = f"{'workload':<12}" + "".join(f"{name:>34}" for name in results)
    print(head)
    print("-" * len(head))
    for workload in ("spawn", "no-op"):
        cells = []
        for r in results.values():
            if isinstance(r, str):
                cells.append(r[:32])
                continue
            m, p = statistics.median(r[workload]), pct(r[workload], 95)
            cells.append(f"{m * 1e3:.1f}/{p * 1e3:.1f} ms ({m / fm:.2f}x floor)")
        print(f"{workload:<12}" + "".join(f"{c:>34}" for c in cells))
    if not args.throughput:
        print("cells: median/p95 (ratio of the median to the floor's)")
        return
    ours = results.get("gpulayer")
    cells = []
    for r in results.values():
        if isinstance(r, str):
            cells.append(r[:32])
            continue
        rel = f" ({r['throughput'] / ours['throughput']:.2f}x ours)" if isinstance(ours, dict) else ""
        cells.append(f"{r['throughput']:.0f} tasks/s{rel}")
    print(f"{'throughput':<12}" + "".join(f"{c:>34}" for c in cells))
    if isinstance(ours, dict) and "batch" in ours:
        cells = [f"{ours['batch']:.0f} tasks/s (one submit_many)" if name == "gpulayer" else "(as above)"
                 for name in results]
        print(f"{'batch':<12}" + "".join(f"{c:>34}" for c in cells))
    print("cells: median/p95 (ratio of the median to the floor's)")


if __name__ == "__main__":
    main()
