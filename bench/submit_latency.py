"""Submit-to-start latency and no-op FunctionJob round trip on the embedded control plane.

Each figure is set next to its floor, measured in the same run: spawning the same Python
with ``subprocess`` directly. The goal is a small constant over that floor.

    python bench/submit_latency.py [--jobs 200]

Prints a table: median and p95 in milliseconds, and the difference and ratio to the floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAMP = "import time; print(repr(time.time()), flush=True)"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def floor_start(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-c", STAMP], capture_output=True, text=True, check=True)
        out.append(float(proc.stdout) - t0)
    return out


def floor_roundtrip(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per measurement (default 200)")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    os.environ["GPULAYER_HOME"] = home
    bundle = Path(home) / "code"
    bundle.mkdir()
    (bundle / "noop.py").write_text("def noop():\n    return None\n")

    import gpulayer as gl
    from gpulayer.client import connect

    client = connect()
    client.ensure_local_worker()  # started once, outside the measurement (as in a long session)
    warm = gl.submit(gl.CommandJob(command=[sys.executable, "-c", "pass"]))
    warm.result(timeout=120)

    n = args.jobs
    starts = []
    for _ in range(n):
        t0 = time.time()
        h = gl.submit(gl.CommandJob(command=[sys.executable, "-c", STAMP]))
        h.wait(timeout=120)
        starts.append(float(h.logs()) - t0)
    trips = []
    spec = gl.FunctionJob(function="noop:noop", bundle=str(bundle))
    for _ in range(n):
        t0 = time.perf_counter()
        gl.submit(spec).result(timeout=120)
        trips.append(time.perf_counter() - t0)
    f_start = floor_start(n)
    f_trip = floor_roundtrip(n)

    rows = [
        ("submit -> process start", starts, f_start, "spawn -> process start"),
        ("no-op FunctionJob round trip", trips, f_trip, "subprocess.run(python -c pass)"),
    ]
    print(f"embedded control plane, SQLite, in-process worker; {n} jobs each, one at a time")
    print(f"{'measure':<30}{'median':>9}{'p95':>9}   {'floor':<32}{'median':>9}{'p95':>9}"
          f"{'+median':>9}{'ratio':>7}")
    for name, got, floor, floor_name in rows:
        gm, gp = statistics.median(got) * 1e3, pct(got, 95) * 1e3
        fm, fp = statistics.median(floor) * 1e3, pct(floor, 95) * 1e3
        print(f"{name:<30}{gm:>8.1f}ms{gp:>7.1f}ms   {floor_name:<32}{fm:>7.1f}ms{fp:>7.1f}ms"
              f"{gm - fm:>7.1f}ms{gm / fm:>6.1f}x")
    client.close()


if __name__ == "__main__":
    main()
